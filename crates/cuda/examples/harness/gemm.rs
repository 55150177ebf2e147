//! The tensor-core prefill GEMMs: checks against their twins, and their speed on the 27B shapes.

use model::synth::BlockPool;
use niwaki_cuda::gpu::{DevBuf, DevMat, GemvIo, Gpu};
use niwaki_cuda::plan::{GemmKernel, HGEMM_WIDEST};
use niwaki_cuda::repack::{self, GpuFormat, FORMATS};
use quant::Format;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::report::*;

/// `ntok` rows of `cols` activations on the GPU, quantized as a multi-token pass quantizes
/// them: int8 with their group scales, and f16 in the f16 GEMM's order.
struct Acts {
    _x: DevBuf,
    xq: DevBuf,
    xs: DevBuf,
    xh: DevBuf,
    ntok: usize,
}

impl Acts {
    fn new(gpu: &Gpu, x: &[f32], cols: usize, ntok: usize) -> R<Acts> {
        let xd = gpu.upload(x, "x")?;
        let xq = gpu.alloc(ntok * cols, "xq")?;
        let xs = gpu.alloc(8 * ntok * cols / 64, "xs")?;
        let xh = gpu.alloc(2 * ntok * cols, "xh")?;
        gpu.quantize(
            &gpu.stream,
            xd.ptr,
            cols,
            ntok,
            xq.ptr,
            xs.ptr,
            Some(xh.ptr),
        )?;
        Ok(Acts {
            _x: xd,
            xq,
            xs,
            xh,
            ntok,
        })
    }

    /// A product of these activations into `out` (`out_stride` floats per token).
    fn io(&self, out: u64, out_stride: usize) -> GemvIo {
        GemvIo {
            ntok: self.ntok,
            out_stride,
            xh: Some(self.xh.ptr),
            ..GemvIo::one(self.xq.ptr, self.xs.ptr, out)
        }
    }
}

/// K splits the GEMM checks force beside the plan's: the short passes' rule.
const SIX: usize = niwaki_cuda::plan::SHORT_PASS_SPLITS;

/// The tensor-core GEMMs against their CPU twins: every format, partial row and token tiles, a
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
        // Per kernel: worst error against its twin, against the dp4a kernel, launches.
        let kernels = gpu.gemm_kernels();
        let mut worst = vec![0f64; kernels.len()];
        let mut vs_dp4a = vec![0f64; kernels.len()];
        let mut launches = 0;
        // Passes as short as two tokens: a pass may take the GEMM from
        // `Gpu::gemm_min_tokens` on.
        let shapes = [
            (1001usize, 5120usize, &[3usize, 17, 256][..]),
            (77, 17408, &[100][..]),
            (300, 1024, &[2, 5, 9, 16, 64][..]),
        ];
        let cases: usize = shapes.iter().map(|(_, _, n)| n.len()).sum();
        for (rows, cols, ntoks) in shapes {
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
                let acts = Acts::new(gpu, &x, cols, ntok)?;
                let prior: Vec<f32> = (0..rows * ntok).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let out = gpu.upload(&prior, "out")?;
                let io = GemvIo {
                    accumulate: true,
                    ..acts.io(out.ptr, rows)
                };
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
                // Per (token, row): the integer twin (int8 activations), the f16 twin (f16
                // activations times the f16-exact weights, in f64) and Σ|w·x|.
                let twins: Vec<(f32, f64, f32)> = (0..ntok)
                    .into_par_iter()
                    .flat_map_iter(|t| {
                        let xt = &x[t * cols..(t + 1) * cols];
                        let qx = repack::quantize_x(xt);
                        let xr: Vec<f64> =
                            xt.iter().map(|&v| repack::f16_act(v).to_f64()).collect();
                        let (w, p) = (&w, &p);
                        (0..rows).map(move |r| {
                            let wr = &w[r * cols..(r + 1) * cols];
                            let f16: f64 = wr.iter().zip(&xr).map(|(&a, b)| a as f64 * b).sum();
                            let mag: f32 = wr.iter().zip(xt).map(|(a, b)| (a * b).abs()).sum();
                            (repack::dot_row(p, r, &qx), f16, mag)
                        })
                    })
                    .collect();
                // Every kernel, whole, split along K as the plan splits it (these small shapes
                // always split when allowed to) and six ways (the short passes' rule,
                // plan::SHORT_PASS_SPLITS, wherever six fit), each from the prior values.
                let mut got = vec![0f32; rows * ntok];
                for (ki, &kernel) in kernels.iter().enumerate() {
                    let scratch = Some((part.ptr, part_floats));
                    for (split, forced) in [(None, 0), (scratch, 0), (scratch, SIX)] {
                        gpu.write(s, out.ptr, &prior)?;
                        let io = GemvIo {
                            split_scratch: split,
                            ..io
                        };
                        let before = gpu.set_gemm_splits(forced);
                        let ran = gpu.gemm_with(s, &m, &io, kernel);
                        gpu.set_gemm_splits(before);
                        ran?;
                        launches += 1;
                        gpu.read(s, out.ptr, &mut got)?;
                        for (i, &(int8, f16, mag)) in twins.iter().enumerate() {
                            let v = got[i];
                            let twin = match kernel {
                                GemmKernel::F16 { .. } => prior[i] as f64 + f16,
                                GemmKernel::Int8 { .. } => (prior[i] + int8) as f64,
                            };
                            let mag = mag.max(1e-30) as f64;
                            let e = if v.is_nan() {
                                f64::INFINITY
                            } else {
                                (v as f64 - twin).abs() / mag
                            };
                            worst[ki] = worst[ki].max(e);
                            vs_dp4a[ki] = vs_dp4a[ki].max((v - other[i]).abs() as f64 / mag);
                        }
                    }
                }
            }
        }
        for (ki, kernel) in kernels.iter().enumerate() {
            let (name, twin) = match kernel {
                GemmKernel::F16 { .. } => ("f16", "f16 twin (f16 activations, f64 sums)"),
                GemmKernel::Int8 { .. } => ("int8", "integer twin"),
            };
            // The f16 kernel must also stay within the int8 activations' own error of the dp4a
            // kernel (≈ 3e-4 of Σ|w·x| against exact products).
            let ok =
                worst[ki] < 1e-5 && vs_dp4a[ki] < 1e-2 && launches == 3 * cases * kernels.len();
            rep.line(format!(
                "| gemm {format} ({name} tensor cores, {kernel:?}, += prior, whole, split K and split six ways) | 1001×5120 3/17/256 tokens, 77×17408 100, 300×1024 2/5/9/16/64 | {} | vs {twin} {:.1e} (tol 1e-5), vs the dp4a kernel {:.1e} (tol 1e-2), as a fraction of Σ|w·x| |",
                if ok { "PASS" } else { "FAIL" },
                worst[ki],
                vs_dp4a[ki]
            ));
            rep.check(ok, format!("gemm {format} {kernel:?}"));
        }
    }
    occupancy_check(rep, gpu)
}

/// Every GEMM kernel holds on a multiprocessor at least the blocks its grids and splits are
/// planned on (`GemmKernel::blocks_per_sm`: two of the 16-token f16 tiles of three
/// warpgroups), by the driver's occupancy query: a kernel grown past the registers or shared
/// memory that allow them would leave the split passes' second wave waiting.
fn occupancy_check(rep: &mut Report, gpu: &Gpu) -> R<()> {
    let mut short = Vec::new();
    let kernels = gpu.gemm_kernels();
    for f in GpuFormat::ALL {
        for &k in &kernels {
            let name = k.name(f);
            let planned = k.blocks_per_sm();
            let held = gpu.blocks_per_sm(&name, k.threads(), k.smem_bytes())?;
            if held < planned {
                short.push(format!("{name} holds {held}, planned {planned}"));
            }
        }
    }
    let ok = short.is_empty();
    rep.line(format!(
        "| gemm occupancy (the driver's, against the plan's blocks a multiprocessor) | {} kernels × {} layouts | {} | {} |",
        kernels.len(),
        GpuFormat::ALL.len(),
        if ok { "PASS" } else { "FAIL" },
        if ok { "each holds what the plan counts on".to_string() } else { short.join("; ") }
    ));
    rep.check(ok, "gemm occupancy".into());
    Ok(())
}

/// Multi-token GEMM throughput on the 27B shapes at one prefill pass (`MAX_CHUNK` tokens):
/// the tensor-core kernel against the dp4a kernels.
pub(crate) fn gemm_speed(rep: &mut Report, gpu: &Gpu) -> R<()> {
    let s = &gpu.stream;
    let ntok = niwaki_cuda::plan::MAX_CHUNK;
    rep.line("");
    // The widest f16 tiles here; the narrower ones in the short passes' table below.
    let kernels: Vec<GemmKernel> = gpu
        .gemm_kernels()
        .into_iter()
        .filter(|k| !matches!(k, GemmKernel::F16 { tokens, .. } if *tokens != HGEMM_WIDEST))
        .collect();
    let names: Vec<String> = kernels
        .iter()
        .map(|k| match k {
            GemmKernel::Int8 { mi } => format!("int8, {mi} tile(s)/warp µs"),
            GemmKernel::F16 { wg, tokens } => {
                format!("f16 wgmma, {wg} warpgroups × {tokens} tokens µs")
            }
        })
        .collect();
    rep.line(format!(
        "| GEMM ({ntok} tokens) | shape | dp4a kernels µs | {} | best T MAC/s | speed-up over dp4a | best over best int8 | preferred |",
        names.join(" | ")
    ));
    rep.line(format!(
        "|---|---|---|{}---|---|---|---|",
        "---|".repeat(kernels.len())
    ));
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    // Split along K where the model would (its scratch holds this much).
    let part_floats = niwaki_cuda::plan::GEMM_MAX_SPLITS * ntok * 5120;
    let part = gpu.alloc(4 * part_floats, "gemm partial sums")?;
    for format in [Format::Q2_0, Format::Q1_0, Format::PQ2_0] {
        for (rows, cols) in SHAPES_27B {
            let m = random_matrix(gpu, format, rows, cols)?;
            let (_acts, _out, io) =
                random_io(gpu, &mut rng, (rows, cols, ntok), &part, part_floats)?;
            let dp4a = gpu.time(s, 5, || gpu.gemv_plain(s, &m, &io))?;
            let mut line = format!("| {format} | {rows}×{cols} | {:.0} |", dp4a * 1e6);
            let mut best = f64::INFINITY;
            let mut int8_best = f64::INFINITY;
            for &kernel in &kernels {
                let t = gpu.time(s, 20, || gpu.gemm_with(s, &m, &io, kernel))?;
                line.push_str(&format!(" {:.0} |", t * 1e6));
                best = best.min(t);
                if matches!(kernel, GemmKernel::Int8 { .. }) {
                    int8_best = int8_best.min(t);
                }
            }
            let macs = (rows * cols * ntok) as f64;
            let preferred = preferred_for(gpu, &m, ntok, part_floats);
            line.push_str(&format!(
                " {:.0} | {:.1}× | {:.2}× | {preferred:?} |",
                macs / best / 1e12,
                dp4a / best,
                int8_best / best
            ));
            rep.line(line);
        }
    }
    short_gemm_speed(rep, gpu, &part, part_floats)
}

/// The 27B's matrices' shapes (rows × cols): gate | up, the recurrent in-projection, the
/// recurrent out-projection, the down projection.
const SHAPES_27B: [(usize, usize); 4] = [(34816, 5120), (16480, 5120), (5120, 6144), (5120, 17408)];

/// A `rows × cols` matrix of random blocks of `format` on the GPU.
fn random_matrix(gpu: &Gpu, format: Format, rows: usize, cols: usize) -> R<DevMat> {
    let pool = BlockPool::new(format, cols, 1)?;
    let data = pool.fill(format.row_bytes(cols)? * rows, 2);
    let p = repack::repack("m", format, &data, rows, cols)?;
    Ok(gpu.upload_packed(&p, "bench")?)
}

/// Random activations of `ntok` tokens for a `rows × cols` GEMM, its output, and the io that
/// multiplies them, split along K into `part` (`part_floats` floats) where the model would. The
/// io points into the activations and the output, which must outlive it.
fn random_io(
    gpu: &Gpu,
    rng: &mut ChaCha8Rng,
    (rows, cols, ntok): (usize, usize, usize),
    part: &DevBuf,
    part_floats: usize,
) -> R<(Acts, DevBuf, GemvIo)> {
    let x: Vec<f32> = (0..ntok * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let acts = Acts::new(gpu, &x, cols, ntok)?;
    let out = gpu.alloc(4 * rows * ntok, "out")?;
    let io = GemvIo {
        split_scratch: Some((part.ptr, part_floats)),
        ..acts.io(out.ptr, rows)
    };
    Ok((acts, out, io))
}

/// Short passes' GEMMs on the 27B shapes: the dp4a kernels, the f16 GEMM in its widest tiles
/// and in the tiles [`GemmKernel::preferred`] takes for the pass (µs, mean of 20).
fn short_gemm_speed(rep: &mut Report, gpu: &Gpu, part: &DevBuf, part_floats: usize) -> R<()> {
    let s = &gpu.stream;
    rep.line("");
    rep.line("| short pass GEMM | shape | tokens | dp4a kernels µs | f16, 128-token tiles µs | preferred µs | preferred |");
    rep.line("|---|---|---|---|---|---|---|");
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for format in [Format::Q1_0, Format::Q2_0] {
        for (rows, cols) in SHAPES_27B {
            let m = random_matrix(gpu, format, rows, cols)?;
            for ntok in [2usize, 4, 8, 16, 32, 64] {
                let (_acts, _out, io) =
                    random_io(gpu, &mut rng, (rows, cols, ntok), part, part_floats)?;
                let preferred = preferred_for(gpu, &m, ntok, part_floats);
                let wide = preferred.widest();
                let dp4a = gpu.time(s, 20, || gpu.gemv_plain(s, &m, &io))?;
                let t_wide = gpu.time(s, 20, || gpu.gemm_with(s, &m, &io, wide))?;
                let t_pref = gpu.time(s, 20, || gpu.gemm_with(s, &m, &io, preferred))?;
                rep.line(format!(
                    "| {format} | {rows}×{cols} | {ntok} | {:.1} | {:.1} | {:.1} | {preferred:?} |",
                    dp4a * 1e6,
                    t_wide * 1e6,
                    t_pref * 1e6
                ));
            }
        }
    }
    Ok(())
}

/// The GEMM kernel a pass of `ntok` tokens takes for `m` on this device.
fn preferred_for(gpu: &Gpu, m: &DevMat, ntok: usize, part_floats: usize) -> GemmKernel {
    let sms = gpu.info.multiprocessors as usize;
    GemmKernel::preferred(gpu.info.wgmma(), m.rows, m.cols, ntok, sms, part_floats)
}
