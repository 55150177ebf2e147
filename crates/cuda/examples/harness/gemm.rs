//! The tensor-core prefill GEMM: checks against the integer twin, and its speed on the 27B shapes.

use model::synth::BlockPool;
use niwaki_cuda::gpu::{GemvIo, Gpu};
use niwaki_cuda::repack::{self, FORMATS};
use quant::Format;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::report::*;

/// The tensor-core GEMM against the CPU twin: every format, partial row and token tiles, a
/// 1-bit row of an odd number of chunks, accumulation into existing values.
pub(crate) fn gemm_checks(rep: &mut Report, gpu: &Gpu, rng: &mut ChaCha8Rng) -> R<()> {
    use rayon::prelude::*;
    let s = &gpu.stream;
    if !gpu.mma() {
        rep.line("| gemm (tensor cores) | — | SKIP | needs sm_80 |");
        return Ok(());
    }
    let part_floats = niwaki_cuda::plan::GEMM_MAX_SPLITS * 256 * 5120;
    let part = gpu.alloc(4 * part_floats, "gemm partial sums")?;
    for format in FORMATS {
        let mut worst = 0f64;
        let mut vs_dp4a = 0f64;
        let mut launches = 0;
        for (rows, cols, ntoks) in [
            (1001usize, 5120usize, &[17usize, 256][..]),
            (77, 17408, &[100][..]),
            (300, 384, &[16, 64][..]),
        ] {
            let pool = BlockPool::new(format, cols, 13)?;
            let data = pool.fill(format.row_bytes(cols)? * rows, 9);
            let p = repack::repack("m", format, &data, rows, cols)?;
            let m = gpu.upload_packed(&p, "m")?;
            let w: Vec<f32> = (0..rows * cols)
                .into_par_iter()
                .map(|i| p.value(i / cols, i % cols))
                .collect();
            for &ntok in ntoks {
                let x: Vec<f32> = (0..ntok * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let xd = gpu.upload(&x, "x")?;
                let xq = gpu.alloc(ntok * cols, "xq")?;
                let xs = gpu.alloc(8 * ntok * cols / 64, "xs")?;
                gpu.quantize(s, xd.ptr, cols, ntok, xq.ptr, xs.ptr)?;
                let prior: Vec<f32> = (0..rows * ntok).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let out = gpu.upload(&prior, "out")?;
                let io = GemvIo {
                    ntok,
                    out_stride: rows,
                    accumulate: true,
                    ..GemvIo::one(xq.ptr, xs.ptr, out.ptr)
                };
                // Both variants, whole and split along K (these small shapes always split when
                // allowed to), each from the prior values.
                let mut got = vec![0f32; rows * ntok];
                let mut both = Vec::new();
                for mi in niwaki_cuda::plan::GEMM_MI {
                    for split in [None, Some((part.ptr, part_floats))] {
                        gpu.write(s, out.ptr, &prior)?;
                        let io = GemvIo {
                            split_scratch: split,
                            ..io
                        };
                        gpu.gemm_with(s, &m, &io, mi)?;
                        launches += 1;
                        gpu.read(s, out.ptr, &mut got)?;
                        both.push(got.clone());
                    }
                }
                let dp4a = gpu.upload(&prior, "out")?;
                gpu.gemv_plain(
                    s,
                    &m,
                    &GemvIo {
                        out: dp4a.ptr,
                        ..io
                    },
                )?;
                let mut other = vec![0f32; rows * ntok];
                gpu.read(s, dp4a.ptr, &mut other)?;
                let mut errs: Vec<(f64, f64)> = Vec::new();
                for got in &both {
                    errs.extend(
                        (0..ntok)
                            .into_par_iter()
                            .flat_map_iter(|t| {
                                let xt = &x[t * cols..(t + 1) * cols];
                                let qx = repack::quantize_x(xt);
                                let (w, p, got, other, prior) = (&w, &p, &got, &other, &prior);
                                (0..rows).map(move |r| {
                                    let twin = repack::dot_row(p, r, &qx);
                                    let mag: f32 = w[r * cols..(r + 1) * cols]
                                        .iter()
                                        .zip(xt)
                                        .map(|(a, b)| (a * b).abs())
                                        .sum();
                                    let i = t * rows + r;
                                    let v = got[i];
                                    let e = if v.is_nan() {
                                        f64::INFINITY
                                    } else {
                                        ((v - (prior[i] + twin)).abs() / mag.max(1e-30)) as f64
                                    };
                                    (e, ((v - other[i]).abs() / mag.max(1e-30)) as f64)
                                })
                            })
                            .collect::<Vec<_>>(),
                    );
                }
                for (e, d) in errs {
                    worst = worst.max(e);
                    vs_dp4a = vs_dp4a.max(d);
                }
            }
        }
        let ok = worst < 1e-5 && launches == 20;
        rep.line(format!(
            "| gemm {format} (tensor cores, += prior; 1 and 2 tiles/warp, whole and split K) | 1001×5120 17/256 tokens, 77×17408 100, 300×384 16/64 | {} | vs integer twin {worst:.1e} (tol 1e-5), vs the dp4a kernel {vs_dp4a:.1e}, as a fraction of Σ|w·x| |",
            if ok { "PASS" } else { "FAIL" }
        ));
        rep.check(ok, format!("gemm {format}"));
    }
    Ok(())
}

/// Multi-token GEMM throughput on the 27B shapes at one prefill pass (`MAX_CHUNK` tokens):
/// the tensor-core kernel against the dp4a kernels.
pub(crate) fn gemm_speed(rep: &mut Report, gpu: &Gpu) -> R<()> {
    let s = &gpu.stream;
    let ntok = niwaki_cuda::plan::MAX_CHUNK;
    rep.line("");
    rep.line(format!("| GEMM ({ntok} tokens) | shape | dp4a kernels µs | tensor cores, 1 tile/warp µs | tensor cores, 2 tiles/warp µs | best T int8-MAC/s | speed-up |"));
    rep.line("|---|---|---|---|---|---|---|");
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    // Split along K where the model would (its scratch holds this much).
    let part_floats = niwaki_cuda::plan::GEMM_MAX_SPLITS * ntok * 5120;
    let part = gpu.alloc(4 * part_floats, "gemm partial sums")?;
    for format in [Format::Q2_0, Format::Q1_0, Format::PQ2_0] {
        for (rows, cols) in [
            (34816usize, 5120usize),
            (16480, 5120),
            (5120, 6144),
            (5120, 17408),
        ] {
            let pool = BlockPool::new(format, cols, 1)?;
            let data = pool.fill(format.row_bytes(cols)? * rows, 2);
            let p = repack::repack("m", format, &data, rows, cols)?;
            let m = gpu.upload_packed(&p, "bench")?;
            let x: Vec<f32> = (0..ntok * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let xd = gpu.upload(&x, "x")?;
            let xq = gpu.alloc(ntok * cols, "xq")?;
            let xs = gpu.alloc(8 * ntok * cols / 64, "xs")?;
            gpu.quantize(s, xd.ptr, cols, ntok, xq.ptr, xs.ptr)?;
            let out = gpu.alloc(4 * rows * ntok, "out")?;
            let io = GemvIo {
                ntok,
                out_stride: rows,
                split_scratch: Some((part.ptr, part_floats)),
                ..GemvIo::one(xq.ptr, xs.ptr, out.ptr)
            };
            let dp4a = gpu.time(s, 5, || gpu.gemv_plain(s, &m, &io))?;
            let m1 = gpu.time(s, 20, || gpu.gemm_with(s, &m, &io, 1))?;
            let m2 = gpu.time(s, 20, || gpu.gemm_with(s, &m, &io, 2))?;
            let best = m1.min(m2);
            let macs = (rows * cols * ntok) as f64;
            rep.line(format!(
                "| {format} | {rows}×{cols} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1}× |",
                dp4a * 1e6,
                m1 * 1e6,
                m2 * 1e6,
                macs / best / 1e12,
                dp4a / best
            ));
        }
    }
    Ok(())
}
