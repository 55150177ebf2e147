//! The gated delta net mixer, over a chunk of tokens processed in order.

use crate::config::Config;
use crate::hadamard::{Hadamard, Input};
use crate::ops::{l2_norm, matmul, rms_norm_heads, sigmoid, silu, softplus};
use crate::weights::GdnWeights;

/// Same epsilon as the reference implementation's q/k L2 normalisation.
const L2_EPS: f32 = 1e-6;

/// `h`: `[tokens][hidden]` normalised inputs; returns `[tokens][hidden]` mixer outputs.
pub fn forward(
    c: &Config,
    w: &GdnWeights,
    hd: Option<&Hadamard>,
    conv_state: &mut [f32],
    ssm: &mut [f32],
    h: &[f32],
    tokens: usize,
) -> Vec<f32> {
    let ch = c.gdn_conv_channels();
    let vd = c.gdn_inner();
    let hv = c.gdn_value_heads;
    let hk = c.gdn_key_heads;
    let dk = c.gdn_key_dim;
    let dv = c.gdn_value_dim;
    let kern = c.conv_kernel;

    let mut qkv = vec![0f32; tokens * ch];
    let mut z = vec![0f32; tokens * vd];
    let mut alpha = vec![0f32; tokens * hv];
    let mut beta = vec![0f32; tokens * hv];
    let input = Input::new(h, tokens, hd);
    matmul(&w.qkv, input.for_matrix(&w.qkv), tokens, &mut qkv);
    matmul(&w.gate, input.for_matrix(&w.gate), tokens, &mut z);
    matmul(&w.alpha, input.for_matrix(&w.alpha), tokens, &mut alpha);
    matmul(&w.beta, input.for_matrix(&w.beta), tokens, &mut beta);

    let scale = 1.0 / (dk as f32).sqrt();
    let mut o = vec![0f32; tokens * vd];
    let mut conv_out = vec![0f32; ch];
    let mut kv_mem = vec![0f32; dv];
    let mut delta = vec![0f32; dv];
    for t in 0..tokens {
        let x = &qkv[t * ch..(t + 1) * ch];
        // Causal depthwise conv over the previous kernel−1 inputs and this one, then SiLU.
        for (cc, out) in conv_out.iter_mut().enumerate() {
            let taps = &w.conv[cc * kern..(cc + 1) * kern];
            let mut acc = 0f32;
            for (j, &tap) in taps[..kern - 1].iter().enumerate() {
                acc += tap * conv_state[j * ch + cc];
            }
            acc += taps[kern - 1] * x[cc];
            *out = silu(acc);
        }
        conv_state.copy_within(ch.., 0);
        conv_state[(kern - 2) * ch..].copy_from_slice(x);

        let (q, rest) = conv_out.split_at_mut(hk * dk);
        let (k, v) = rest.split_at_mut(hk * dk);
        q.chunks_mut(dk).for_each(|h| l2_norm(h, L2_EPS));
        k.chunks_mut(dk).for_each(|h| l2_norm(h, L2_EPS));

        for head in 0..hv {
            // Value heads are stored tiled: value head `head` reads key head `head % hk`.
            let kh = head % hk;
            let qh = &q[kh * dk..(kh + 1) * dk];
            let khv = &k[kh * dk..(kh + 1) * dk];
            let vh = &v[head * dv..(head + 1) * dv];
            let a = alpha[t * hv + head];
            let g = (w.a[head] * softplus(a + w.dt_bias[head])).exp();
            let b = sigmoid(beta[t * hv + head]);
            let s = &mut ssm[head * dk * dv..(head + 1) * dk * dv];
            s.iter_mut().for_each(|x| *x *= g);
            kv_mem.fill(0.0);
            for (i, &ki) in khv.iter().enumerate() {
                for (m, &sv) in kv_mem.iter_mut().zip(&s[i * dv..(i + 1) * dv]) {
                    *m += sv * ki;
                }
            }
            for j in 0..dv {
                delta[j] = (vh[j] - kv_mem[j]) * b;
            }
            let oh = &mut o[t * vd + head * dv..t * vd + (head + 1) * dv];
            oh.fill(0.0);
            for i in 0..dk {
                let row = &mut s[i * dv..(i + 1) * dv];
                let (ki, qi) = (khv[i], qh[i] * scale);
                for j in 0..dv {
                    row[j] += ki * delta[j];
                    oh[j] += row[j] * qi;
                }
            }
        }
    }

    // Gated per-head norm, then the output projection.
    rms_norm_heads(&mut o, &w.norm, c.rms_eps);
    for (ov, &zv) in o.iter_mut().zip(&z) {
        *ov *= silu(zv);
    }
    let mut out = vec![0f32; tokens * c.hidden];
    let values = Input::gdn_values(&o, tokens, hd);
    matmul(&w.out, values.for_matrix(&w.out), tokens, &mut out);
    out
}
