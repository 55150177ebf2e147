//! Flash-decoding attention (split and merge kernels) against an f64 reference on random
//! caches of both formats: short contexts (one split), long ones (every split), the partial
//! last tile of a split, several tokens of a pass attending to different lengths.

use half::f16;
use niwaki_cuda::gpu::{Arg, Gpu};
use niwaki_cuda::plan::{self, Dims};
use niwaki_cuda::KvCache;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{max_abs, rel_l2, Report, R};

/// The 27B model's shapes (head dim 256, 6 query heads per kv head), for the attention checks
/// on kernels compiled for them.
pub fn b27_dims() -> R<Dims> {
    let vocab = 248_320;
    let mut w = gguf::GgufWriter::new();
    model::synth::Preset::B27
        .shape(vocab)
        .write_metadata(&mut w, "shapes");
    let file = gguf::Gguf::from_bytes(w.to_bytes()?)?;
    Ok(Dims::from_config(&model::Config::from_metadata(
        file.metadata(),
        vocab,
    )?)?)
}

/// A cache in the device layout ([pos][kv head][dim] values, then per 32 values one f16 scale
/// for q8_0) and the values the kernels read back from it.
pub(crate) struct Cache {
    pub(crate) values: Vec<u8>,
    pub(crate) scales: Vec<u8>,
    pub(crate) read: Vec<f32>,
}

pub(crate) fn store(x: &[f32], kv: KvCache) -> Cache {
    match kv {
        KvCache::F16 => Cache {
            values: x
                .iter()
                .flat_map(|&v| f16::from_f32(v).to_bits().to_le_bytes())
                .collect(),
            scales: Vec::new(),
            read: x.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
        },
        KvCache::Q8_0 => {
            let mut c = Cache {
                values: Vec::with_capacity(x.len()),
                scales: Vec::new(),
                read: Vec::with_capacity(x.len()),
            };
            for block in x.chunks(32) {
                let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = f16::from_f32(amax / 127.0);
                let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
                c.scales.extend(d.to_bits().to_le_bytes());
                for &v in block {
                    let q = (v * id).round().clamp(-127.0, 127.0) as i8;
                    c.values.push(q as u8);
                    c.read.push(q as f32 * d.to_f32());
                }
            }
            c
        }
    }
}

/// The gated attention output of token `t` (context `n_ctx`) in f64: 0.5 · softmax(q·k·scale)·v
/// (the gates are zero, and sigmoid(0) = 0.5 exactly).
#[allow(clippy::too_many_arguments)]
fn reference(d: &Dims, q: &[f32], k: &[f32], v: &[f32], t: usize, n_ctx: usize, out: &mut [f32]) {
    let (hd, nh, nkv) = (d.head_dim, d.n_head, d.n_head_kv);
    let scale = 1.0 / (hd as f64).sqrt();
    for h in 0..nh {
        let kvh = h / (nh / nkv);
        let qh = &q[(t * nh + h) * hd..][..hd];
        let s: Vec<f64> = (0..n_ctx)
            .map(|p| {
                let kr = &k[(p * nkv + kvh) * hd..][..hd];
                qh.iter()
                    .zip(kr)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let l: f64 = w.iter().sum();
        for i in 0..hd {
            let a: f64 = (0..n_ctx)
                .map(|p| w[p] * v[(p * nkv + kvh) * hd + i] as f64)
                .sum();
            out[(t * nh + h) * hd + i] = (0.5 * a / l) as f32;
        }
    }
}

/// Random cache values for `n` positions (uniform in ±1); with `wide`, each 32-value block
/// scaled by its own magnitude, 2^-12 .. 2^4 or (one in eight) zero.
pub(crate) fn random_cache(rng: &mut ChaCha8Rng, n: usize, d: &Dims, wide: bool) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n * d.n_head_kv * d.head_dim)
        .map(|_| rng.gen_range(-1.0..1.0))
        .collect();
    if wide {
        for block in x.chunks_mut(32) {
            let m = match rng.gen_range(0..8) {
                0 => 0.0,
                _ => 2f32.powi(rng.gen_range(-12..=4)),
            };
            block.iter_mut().for_each(|v| *v *= m);
        }
    }
    x
}

/// Whether two outputs are the same bits.
pub(crate) fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The relative L2 error (infinite where a value is not finite) and the largest absolute error
/// of a pass's output `got` (`ntok` tokens after `pos` cached positions) against the f64
/// reference.
pub(crate) fn error_vs_reference(
    d: &Dims,
    q: &[f32],
    k: &Cache,
    v: &Cache,
    pos: usize,
    got: &[f32],
) -> (f64, f32) {
    let mut want = vec![0f32; got.len()];
    for t in 0..got.len() / (d.n_head * d.head_dim) {
        reference(d, q, &k.read, &v.read, t, pos + t + 1, &mut want);
    }
    let rel = if got.iter().all(|v| v.is_finite()) {
        rel_l2(got, &want)
    } else {
        f64::INFINITY
    };
    (rel, max_abs(got, &want))
}

pub fn attention_checks(rep: &mut Report, gpu: &Gpu, d: &Dims) -> R<()> {
    let s = &gpu.stream;
    let (hd, nh, nkv) = (d.head_dim, d.n_head, d.n_head_kv);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    // (cached positions before the pass, tokens in the pass, whether each 32-value block of the
    // keys and values has its own magnitude: 2^-12 .. 2^4, one in eight zero, so that q8_0
    // scales differ within a tile by up to 2^16 and the tensor-core kernel's per-block power
    // of two changes from tile to tile)
    let cases = [
        (0usize, 1usize, false),
        (3, 1, false),
        (40, 1, false),
        (299, 1, false),
        (4097, 1, false),
        (5000, 3, false),
        (100, 17, false),
        (3001, 1, true),
        (700, 5, true),
    ];
    for (kv, tile, a) in [KvCache::F16, KvCache::Q8_0]
        .into_iter()
        .flat_map(|kv| plan::ATTN_TILES.map(|t| (kv, t)))
        // The tensor-core kernels (tiles of 16) need sm_80.
        .map(|(kv, t)| (kv, t, plan::attn_split_launch(d, kv, t, gpu.attn_ring())))
        .filter(|(_, _, a)| gpu.attn_runs(a.kernel))
    {
        let (mut worst, mut worst_abs, mut repeat_ok, mut rows_same) = (0f64, 0f32, true, true);
        for (pos, ntok, wide) in cases {
            let n = pos + ntok;
            // An uneven split count, as a device's one-wave figure may be.
            let nsplit = plan::attn_splits(n, ntok, 99);
            let kx = random_cache(&mut rng, n, d, wide);
            let vx = random_cache(&mut rng, n, d, wide);
            let q: Vec<f32> = (0..ntok * nh * hd)
                .map(|_| rng.gen_range(-3.0..3.0))
                .collect();
            let (kc, vc) = (store(&kx, kv), store(&vx, kv));
            let kd = gpu.upload(&kc.values, "k cache")?;
            let vd = gpu.upload(&vc.values, "v cache")?;
            let scales = match kv {
                KvCache::F16 => None,
                KvCache::Q8_0 => Some((
                    gpu.upload(&kc.scales, "k scales")?,
                    gpu.upload(&vc.scales, "v scales")?,
                )),
            };
            let qd = gpu.upload(&q, "q")?;
            let posd = gpu.upload(&[pos as u32, 0u32], "pos")?;
            let part = gpu.alloc(4 * ntok * nh * nsplit * (hd + 2), "partials")?;
            let stride = 2 * nh * hd;
            let proj = gpu.upload(&vec![0f32; ntok * stride], "gates")?;
            let out = gpu.alloc(4 * ntok * nh * hd, "out")?;
            let out_rows = gpu.alloc(4 * ntok * nh * hd, "out (merged by rows)")?;
            let run = || -> R<(Vec<f32>, Vec<f32>)> {
                gpu.launch_smem(
                    s,
                    a.kernel,
                    gpu.attn_split_grid(nkv, nsplit, ntok),
                    (a.threads as u32, 1, 1),
                    a.smem_bytes as u32,
                    &[
                        Arg::Ptr(qd.ptr),
                        Arg::Ptr(kd.ptr),
                        Arg::Ptr(vd.ptr),
                        Arg::Ptr(scales.as_ref().map_or(0, |s| s.0.ptr)),
                        Arg::Ptr(scales.as_ref().map_or(0, |s| s.1.ptr)),
                        Arg::Ptr(posd.ptr),
                        Arg::F32(1.0 / (hd as f32).sqrt()),
                        Arg::I32(nsplit as i32),
                        Arg::Ptr(part.ptr),
                    ],
                )?;
                // The merge into `out`; the multi-token passes' kernel must give the same bits.
                // (attn_combine_rows also takes a split length: 0, the split kernels' rule.)
                let merge = |kernel, grid, block, out: u64| {
                    let rows = kernel == "attn_combine_rows";
                    let len = rows.then_some(Arg::I32(0));
                    let args = [
                        Some(Arg::Ptr(part.ptr)),
                        Some(Arg::I32(nsplit as i32)),
                        len,
                        Some(Arg::Ptr(posd.ptr)),
                        Some(Arg::Ptr(proj.ptr)),
                        Some(Arg::I32(stride as i32)),
                        Some(Arg::Ptr(out)),
                    ];
                    let args: Vec<Arg> = args.into_iter().flatten().collect();
                    gpu.launch(s, kernel, grid, block, &args)
                };
                let heads = nh as u32;
                merge(
                    "attn_combine",
                    (heads, ntok as u32, (hd / 32) as u32),
                    (256, 1, 1),
                    out.ptr,
                )?;
                merge(
                    "attn_combine_rows",
                    (heads, ntok as u32, 1),
                    (hd as u32, 1, 1),
                    out_rows.ptr,
                )?;
                let mut got = vec![0f32; ntok * nh * hd];
                let mut rows = vec![0f32; ntok * nh * hd];
                gpu.read(s, out.ptr, &mut got)?;
                gpu.read(s, out_rows.ptr, &mut rows)?;
                Ok((got, rows))
            };
            let (got, rows) = run()?;
            let (again, _) = run()?;
            rows_same &= same_bits(&got, &rows);
            repeat_ok &= same_bits(&got, &again);
            let (rel, abs) = error_vs_reference(d, &q, &kc, &vc, pos, &got);
            worst = worst.max(rel);
            worst_abs = worst_abs.max(abs);
        }
        let ok = worst < 2e-5 && repeat_ok && rows_same;
        rep.line(format!(
            "| attention split + merge ({}, {}) | contexts 1..5003, 1/3/5/17 tokens, blocks of one magnitude and of 2^-12..2^4, HD {hd}, {nh}/{nkv} heads | {} | rel L2 vs f64 {worst:.1e} (tol 2e-5), max abs {worst_abs:.1e}; repeated launch bit-identical: {repeat_ok}; the multi-token merge (attn_combine_rows) bit-identical: {rows_same} |",
            match kv {
                KvCache::F16 => "f16 cache",
                KvCache::Q8_0 => "q8_0 cache",
            },
            a.kernel,
            if ok { "PASS" } else { "FAIL" }
        ));
        rep.check(ok, format!("attention {kv:?} tile {tile}"));
    }
    Ok(())
}
