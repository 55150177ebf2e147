//! A CPU twin of the GPU forward pass: the same re-tiled weights, the same int8 activation
//! quantization and integer dot products, the same f16 KV cache, in plain f32 elsewhere. It
//! separates what the GPU's arithmetic choices cost (twin against `model::Model`) from kernel
//! bugs (GPU against twin, which must agree to float rounding). Slow: for the small presets.

use gguf::Gguf;
use model::ops::{l2_norm, rms_norm, rms_norm_heads, rope_neox, sigmoid, silu, softplus};
use model::{LayerKind, Model, ModelError};

use crate::error::{CudaError, Result};
use crate::plan::{Dims, KvCache};
use crate::repack::{self, Packed, QuantizedX};

struct Gdn {
    inp: Packed,
    out: Packed,
    conv: Vec<f32>,
    dt_bias: Vec<f32>,
    a: Vec<f32>,
    norm: Vec<f32>,
}

struct Attn {
    inp: Packed,
    out: Packed,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
}

enum Mix {
    Gdn(Gdn),
    Attn(Attn),
}

struct Layer {
    attn_norm: Vec<f32>,
    post_norm: Vec<f32>,
    mix: Mix,
    ffn_in: Packed,
    ffn_down: Packed,
}

enum LayerState {
    Gdn { conv: Vec<f32>, ssm: Vec<f32> },
    Attn { k: Vec<f32>, v: Vec<f32> },
}

pub struct Twin<'m> {
    model: &'m Model,
    d: Dims,
    layers: Vec<Layer>,
    output: Packed,
    output_norm: Vec<f32>,
    state: Vec<LayerState>,
    pos: usize,
    kv: KvCache,
}

fn vector(f: &Gguf, name: &str) -> Result<Vec<f32>> {
    let t = f
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
    Ok(t.to_f32().map_err(|source| ModelError::Decode {
        name: name.into(),
        source,
    })?)
}

fn packed(f: &Gguf, names: &[String]) -> Result<Packed> {
    let mut parts = Vec::new();
    for name in names {
        let t = f
            .tensor(name)
            .ok_or_else(|| ModelError::MissingTensor(name.clone()))?;
        let p = repack::repack(
            name,
            t.format(),
            t.data,
            t.info.rows() as usize,
            t.info.row_len() as usize,
        )?;
        parts.push((name.clone(), t.format(), p));
    }
    Ok(repack::concat(parts)?)
}

fn matvec(p: &Packed, x: &QuantizedX) -> Vec<f32> {
    (0..p.rows).map(|r| repack::dot_row(p, r, x)).collect()
}

fn f16_round(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

/// A cache row as the GPU stores and reads it back: f16, or q8_0 blocks of 32 (d = max|x| / 127
/// rounded to f16 for the read, q = x · (1/d) rounded to nearest even), in kernels/attention.cu's
/// operations.
fn kv_round(row: &[f32], kv: KvCache) -> Vec<f32> {
    match kv {
        KvCache::F16 => row.iter().map(|&x| f16_round(x)).collect(),
        KvCache::Q8_0 => row
            .chunks(32)
            .flat_map(|b| {
                let d = b.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
                let id = if d > 0.0 { 1.0 / d } else { 0.0 };
                let dh = f16_round(d);
                b.iter().map(move |&x| (x * id).round_ties_even() * dh)
            })
            .collect(),
    }
}

impl<'m> Twin<'m> {
    pub fn new(model: &'m Model) -> Result<Twin<'m>> {
        Twin::with_kv_cache(model, KvCache::F16)
    }

    /// The twin of a GPU sequence with the given KV cache type.
    pub fn with_kv_cache(model: &'m Model, kv: KvCache) -> Result<Twin<'m>> {
        if model.hadamard().is_some() {
            return Err(CudaError::Unsupported(
                "the CPU twin has no Hadamard rotation (check rotated files against the CPU engine)"
                    .into(),
            ));
        }
        let d = Dims::from_config(&model.config)?;
        let f = &**model.file();
        let mut layers = Vec::new();
        let mut state = Vec::new();
        for (il, kind) in d.layers.iter().enumerate() {
            let n = |s: &str| format!("blk.{il}.{s}");
            let mix = match kind {
                LayerKind::Recurrent => {
                    state.push(LayerState::Gdn {
                        conv: vec![0.0; (d.conv_kernel - 1) * d.conv_channels()],
                        ssm: vec![0.0; d.value_heads * d.key_dim * d.value_dim],
                    });
                    Mix::Gdn(Gdn {
                        inp: packed(
                            f,
                            &[
                                n("attn_qkv.weight"),
                                n("attn_gate.weight"),
                                n("ssm_alpha.weight"),
                                n("ssm_beta.weight"),
                            ],
                        )?,
                        out: packed(f, &[n("ssm_out.weight")])?,
                        conv: vector(f, &n("ssm_conv1d.weight"))?,
                        dt_bias: vector(f, &n("ssm_dt.bias"))?,
                        a: vector(f, &n("ssm_a"))?,
                        norm: vector(f, &n("ssm_norm.weight"))?,
                    })
                }
                LayerKind::Attention => {
                    state.push(LayerState::Attn {
                        k: Vec::new(),
                        v: Vec::new(),
                    });
                    Mix::Attn(Attn {
                        inp: packed(
                            f,
                            &[n("attn_q.weight"), n("attn_k.weight"), n("attn_v.weight")],
                        )?,
                        out: packed(f, &[n("attn_output.weight")])?,
                        q_norm: vector(f, &n("attn_q_norm.weight"))?,
                        k_norm: vector(f, &n("attn_k_norm.weight"))?,
                    })
                }
            };
            layers.push(Layer {
                attn_norm: vector(f, &n("attn_norm.weight"))?,
                post_norm: vector(f, &n("post_attention_norm.weight"))?,
                mix,
                ffn_in: packed(f, &[n("ffn_gate.weight"), n("ffn_up.weight")])?,
                ffn_down: packed(f, &[n("ffn_down.weight")])?,
            });
        }
        Ok(Twin {
            model,
            output: packed(f, &["output.weight".to_string()])?,
            output_norm: vector(f, "output_norm.weight")?,
            d,
            layers,
            state,
            pos: 0,
            kv,
        })
    }

    /// One token; returns its logits.
    pub fn step(&mut self, token: u32) -> Result<Vec<f32>> {
        let d = &self.d;
        let e = d.hidden;
        let f = &**self.model.file();
        let embd = f
            .tensor("token_embd.weight")
            .ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
        let rb = embd.format().row_bytes(e).expect("embedding rows");
        let mut x = vec![0f32; e];
        quant::dequantize(
            embd.format(),
            &embd.data[token as usize * rb..(token as usize + 1) * rb],
            &mut x,
        )
        .expect("embedding row");
        let eps = d.rms_eps;
        let mut h = vec![0f32; e];
        for (lw, ls) in self.layers.iter().zip(self.state.iter_mut()) {
            rms_norm(&x, &lw.attn_norm, eps, &mut h);
            let proj = matvec(
                match &lw.mix {
                    Mix::Gdn(g) => &g.inp,
                    Mix::Attn(a) => &a.inp,
                },
                &repack::quantize_x(&h),
            );
            let mixed = match (&lw.mix, ls) {
                (Mix::Gdn(w), LayerState::Gdn { conv, ssm }) => {
                    let ch = d.conv_channels();
                    let vd = d.gdn_inner();
                    let k = d.conv_kernel;
                    let mut c = vec![0f32; ch];
                    for (cc, out) in c.iter_mut().enumerate() {
                        let mut acc = 0f32;
                        for j in 0..k - 1 {
                            acc += w.conv[cc * k + j] * conv[j * ch + cc];
                        }
                        acc += w.conv[cc * k + k - 1] * proj[cc];
                        *out = silu(acc);
                    }
                    conv.copy_within(ch.., 0);
                    conv[(k - 2) * ch..].copy_from_slice(&proj[..ch]);
                    let (q, rest) = c.split_at_mut(d.key_heads * d.key_dim);
                    let (kk, v) = rest.split_at_mut(d.key_heads * d.key_dim);
                    q.chunks_mut(d.key_dim).for_each(|x| l2_norm(x, 1e-6));
                    kk.chunks_mut(d.key_dim).for_each(|x| l2_norm(x, 1e-6));
                    let (dk, dv) = (d.key_dim, d.value_dim);
                    let scale = 1.0 / (dk as f32).sqrt();
                    let mut o = vec![0f32; vd];
                    for head in 0..d.value_heads {
                        let kh = head % d.key_heads;
                        let g =
                            (w.a[head] * softplus(proj[ch + vd + head] + w.dt_bias[head])).exp();
                        let b = sigmoid(proj[ch + vd + d.value_heads + head]);
                        let s = &mut ssm[head * dk * dv..(head + 1) * dk * dv];
                        s.iter_mut().for_each(|x| *x *= g);
                        for j in 0..dv {
                            let mut m = 0f32;
                            for i in 0..dk {
                                m += s[i * dv + j] * kk[kh * dk + i];
                            }
                            let delta = (v[head * dv + j] - m) * b;
                            let mut acc = 0f32;
                            for i in 0..dk {
                                s[i * dv + j] += kk[kh * dk + i] * delta;
                                acc += s[i * dv + j] * (q[kh * dk + i] * scale);
                            }
                            o[head * dv + j] = acc;
                        }
                    }
                    rms_norm_heads(&mut o, &w.norm, eps);
                    for (ov, zv) in o.iter_mut().zip(&proj[ch..ch + vd]) {
                        *ov *= silu(*zv);
                    }
                    matvec(&w.out, &repack::quantize_x(&o))
                }
                (Mix::Attn(w), LayerState::Attn { k: kc, v: vc }) => {
                    let (nh, hd, nkv) = (d.n_head, d.head_dim, d.n_head_kv);
                    let kvw = nkv * hd;
                    let mut q = vec![0f32; nh * hd];
                    let mut gate = vec![0f32; nh * hd];
                    for head in 0..nh {
                        q[head * hd..(head + 1) * hd]
                            .copy_from_slice(&proj[head * 2 * hd..head * 2 * hd + hd]);
                        gate[head * hd..(head + 1) * hd]
                            .copy_from_slice(&proj[head * 2 * hd + hd..(head + 1) * 2 * hd]);
                    }
                    let mut k = proj[2 * nh * hd..2 * nh * hd + kvw].to_vec();
                    let v = &proj[2 * nh * hd + kvw..2 * nh * hd + 2 * kvw];
                    rms_norm_heads(&mut q, &w.q_norm, eps);
                    rms_norm_heads(&mut k, &w.k_norm, eps);
                    q.chunks_mut(hd)
                        .for_each(|x| rope_neox(x, self.pos, d.rope_dims, d.rope_base));
                    k.chunks_mut(hd)
                        .for_each(|x| rope_neox(x, self.pos, d.rope_dims, d.rope_base));
                    for (kr, vr) in k.chunks(hd).zip(v.chunks(hd)) {
                        kc.extend(kv_round(kr, self.kv));
                        vc.extend(kv_round(vr, self.kv));
                    }
                    let n_ctx = self.pos + 1;
                    let scale = 1.0 / (hd as f32).sqrt();
                    let group = nh / nkv;
                    let mut att = vec![0f32; nh * hd];
                    for head in 0..nh {
                        let kvh = head / group;
                        let qh = &q[head * hd..(head + 1) * hd];
                        let sc: Vec<f32> = (0..n_ctx)
                            .map(|p| {
                                let kp = &kc[p * kvw + kvh * hd..p * kvw + (kvh + 1) * hd];
                                qh.iter().zip(kp).map(|(a, b)| a * b).sum::<f32>() * scale
                            })
                            .collect();
                        let mx = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                        let ex: Vec<f32> = sc.iter().map(|s| (s - mx).exp()).collect();
                        let sum: f32 = ex.iter().sum();
                        let out = &mut att[head * hd..(head + 1) * hd];
                        for (p, &wgt) in ex.iter().enumerate() {
                            let vp = &vc[p * kvw + kvh * hd..p * kvw + (kvh + 1) * hd];
                            out.iter_mut()
                                .zip(vp)
                                .for_each(|(o, &x)| *o += wgt / sum * x);
                        }
                        let gh = &gate[head * hd..(head + 1) * hd];
                        out.iter_mut().zip(gh).for_each(|(o, &g)| *o *= sigmoid(g));
                    }
                    matvec(&w.out, &repack::quantize_x(&att))
                }
                _ => unreachable!("state follows the layer kinds"),
            };
            x.iter_mut().zip(&mixed).for_each(|(a, b)| *a += b);
            rms_norm(&x, &lw.post_norm, eps, &mut h);
            let gu = matvec(&lw.ffn_in, &repack::quantize_x(&h));
            let act: Vec<f32> = (0..d.ffn).map(|i| silu(gu[i]) * gu[d.ffn + i]).collect();
            let down = matvec(&lw.ffn_down, &repack::quantize_x(&act));
            x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
        }
        self.pos += 1;
        rms_norm(&x, &self.output_norm, eps, &mut h);
        Ok(matvec(&self.output, &repack::quantize_x(&h)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::synth::{self, Preset};
    use model::Logits;
    use quant::Format;
    use std::sync::Arc;

    fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
        let n: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
        let d: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
        (n / d).sqrt()
    }

    /// What int8 activations cost on a random tiny model: measured here, reported by the harness.
    #[test]
    fn the_twin_tracks_the_cpu_engine_within_activation_quantization_error() {
        let shape = Preset::Tiny.shape(300);
        for format in [Format::Q1_0, Format::Q2_0] {
            let t = synth::random_f32_tensors(&shape, format, 5);
            let w = synth::writer_from_f32(&shape, &t, format, "t").unwrap();
            let m = Model::from_gguf(Arc::new(Gguf::from_bytes(w.to_bytes().unwrap()).unwrap()))
                .unwrap();
            let mut tw = Twin::new(&m).unwrap();
            let mut st = m.new_state();
            let mut worst = 0f64;
            for i in 0..12u32 {
                let tok = (i * 37 + 11) % 300;
                let a = m.forward(&mut st, &[tok], Logits::Last).unwrap();
                let b = tw.step(tok).unwrap();
                worst = worst.max(rel_l2(&b, &a));
            }
            eprintln!("{format}: twin vs CPU rel L2 {worst:.3e}");
            assert!(worst < 0.2, "{format}: {worst}");
        }
    }

    #[test]
    fn a_q8_0_row_keeps_each_value_within_half_a_step_of_its_block() {
        let row: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.173)
            .collect();
        let r = kv_round(&row, KvCache::Q8_0);
        for (b, rb) in row.chunks(32).zip(r.chunks(32)) {
            let amax = b.iter().fold(0f32, |m, x| m.max(x.abs()));
            let step = f16_round(amax / 127.0);
            for (x, y) in b.iter().zip(rb) {
                // Half a step from rounding q, plus the f16 rounding of d times |q| ≤ 127.
                assert!((x - y).abs() <= 0.5 * step + 127.0 * (step - amax / 127.0).abs() + 1e-6);
            }
            // The largest value maps to ±127 steps.
            assert!(rb.iter().any(|y| (y.abs() - 127.0 * step).abs() < 1e-6));
        }
        assert_eq!(kv_round(&[0.0; 32], KvCache::Q8_0), vec![0.0; 32]);
    }

    /// A q8_0 cache costs little beyond the f16 one on a random tiny model.
    #[test]
    fn a_q8_0_cache_twin_stays_near_the_f16_one() {
        let shape = Preset::Tiny.shape(300);
        let format = Format::Q2_0;
        let t = synth::random_f32_tensors(&shape, format, 5);
        let w = synth::writer_from_f32(&shape, &t, format, "t").unwrap();
        let m =
            Model::from_gguf(Arc::new(Gguf::from_bytes(w.to_bytes().unwrap()).unwrap())).unwrap();
        let mut f16 = Twin::new(&m).unwrap();
        let mut q8 = Twin::with_kv_cache(&m, KvCache::Q8_0).unwrap();
        let mut st = m.new_state();
        let (mut vs_f16, mut vs_cpu) = (0f64, 0f64);
        for i in 0..24u32 {
            let tok = (i * 53 + 7) % 300;
            let a = m.forward(&mut st, &[tok], Logits::Last).unwrap();
            let b = f16.step(tok).unwrap();
            let c = q8.step(tok).unwrap();
            vs_f16 = vs_f16.max(rel_l2(&c, &b));
            vs_cpu = vs_cpu.max(rel_l2(&c, &a));
        }
        eprintln!("q8_0 twin: vs f16 twin {vs_f16:.3e}, vs CPU {vs_cpu:.3e}");
        assert!(vs_cpu < 0.2, "{vs_cpu}");
        assert!(vs_f16 < 0.05, "{vs_f16}");
    }
}
