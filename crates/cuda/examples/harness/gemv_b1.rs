//! The binary-tensor-core decode GEMVs of 1-bit rows (`gemv_b1_*`) and 2-bit rows (`gemv_b2*`)
//! against the integer twin, the bulk-copy dp4a kernel, themselves (determinism) and with the
//! norm fused in (1-bit); then in models of the 27B's widths against dp4a and the CPU engine.

use model::synth::BlockPool;
use model::Logits;
use niwaki_cuda::gpu::{GemvIo, Gpu, ImageUse};
use niwaki_cuda::{repack, CudaModel};
use quant::Format;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::kernels::quant_rms_row1;
use crate::report::*;

/// Formats whose decode GEMVs have binary kernels: one of each GPU layout, and PTQ1_0 (widened
/// to 2-bit codes of which 3 never occurs).
const FORMATS: [Format; 4] = [Format::Q1_0, Format::Q2_0, Format::Q2_0G128, Format::PTQ1_0];

pub(crate) fn gemv_b1_checks(
    rep: &mut Report,
    gpu: &Gpu,
    xq: u64,
    xs: u64,
    rng: &mut ChaCha8Rng,
) -> R<()> {
    if !gpu.gemv1() {
        rep.line("| gemv_b1 (binary tensor cores, decode GEMV) | — | SKIP | needs sm_90 |");
        return Ok(());
    }
    for format in FORMATS {
        // The checks set which matrices get tile images: restored whatever they return.
        let image_use = gpu.image_use();
        let r = format_checks(rep, gpu, xq, xs, rng, format);
        gpu.set_image_use(image_use);
        r?;
        resources(rep, gpu, format);
    }
    Ok(())
}

/// The registers, spilled bytes and blocks a multiprocessor of the binary kernels the plan
/// takes for the 27B's one-token GEMVs (a report, for the next kernel change: a kernel that
/// spills or holds fewer blocks than its plan asks for runs slower than it should).
fn resources(rep: &mut Report, gpu: &Gpu, format: Format) {
    let Some(gf) = repack::GpuFormat::for_format(format) else {
        return;
    };
    let shapes = match crate::attention::b27_dims() {
        Ok(d) => d.decode_gemv_shapes(),
        Err(e) => {
            rep.line(format!("(no 27B shapes for the resource report: {e})"));
            return;
        }
    };
    let mut seen = Vec::new();
    for (rows, cols) in shapes {
        let Some(l) = gpu.b1_launch_shape(gf, rows, cols) else {
            continue;
        };
        // The 2-bit matrices' tiles come from their images where those are on.
        let kernel = l
            .image_kernel
            .filter(|_| gpu.image_use() != ImageUse::Off)
            .unwrap_or(l.kernel);
        let threads = 32 * (niwaki_cuda::plan::GEMV1_WARPS as u32 + 1);
        if let Some((regs, local, blocks)) = gpu.kernel_resources(kernel, threads, l.smem_bytes) {
            seen.push(format!(
                "{rows}×{cols} {kernel}: {regs} registers, {local} B spilled, {blocks} blocks/SM (grid {}, {} stages)",
                l.grid, l.stages
            ));
        }
    }
    rep.line(format!(
        "| binary decode GEMV kernels of the 27B's shapes, {format} (driver's figures) | {} | — | {} |",
        seen.len(),
        seen.join("; ")
    ));
}

/// Each row's integer-twin product and Σ|w·x| (what an error is measured against), the rows
/// spread over the host's threads: the largest shapes are hundreds of millions of values.
fn twin_rows(p: &repack::Packed, x: &[f32], qx: &repack::QuantizedX) -> (Vec<f32>, Vec<f32>) {
    (0..p.rows)
        .into_par_iter()
        .map(|r| {
            let mag = (0..p.cols)
                .map(|c| (p.value(r, c) * x[c]).abs())
                .sum::<f32>();
            (repack::dot_row(p, r, qx), mag)
        })
        .unzip()
}

fn format_checks(
    rep: &mut Report,
    gpu: &Gpu,
    xq: u64,
    xs: u64,
    rng: &mut ChaCha8Rng,
    format: Format,
) -> R<()> {
    let s = &gpu.stream;
    let one_bit = format == Format::Q1_0;
    let (mut worst, mut worst_dp4a) = (0f64, 0f64);
    let (mut runs, mut argmax_ok, mut repeat_diff, mut fused_diff) = (0, true, 0usize, 0usize);
    let (mut tiles32_diff, mut tiles32_runs, mut dp4a_runs) = (0usize, 0usize, 0usize);
    let (mut staged_diff, mut staged_runs) = (0usize, 0usize);
    let mut refused = Vec::new();
    let (mut fused_runs, mut fused_refused) = (0usize, Vec::new());
    let (mut image_runs, mut image_diff, mut image_out_diff) = (0usize, 0usize, 0usize);
    let mut image_launched = 0usize;
    // Images of every shape the plan takes, preferred or not (where they are on at all).
    let images = gpu.image_use() != ImageUse::Off && !one_bit;
    if images {
        gpu.set_image_use(ImageUse::Every);
    }
    // 20×256 is refused (rows of whole 128-byte boxes only). 34816×5120 (the 27B's gate | up)
    // gives each block more tiles than its ring has stages, so stages are refilled and their
    // barriers change parity; 1-bit rows a multiple of 32 are also run on tiles of two row
    // groups, which must give the same bits. 9216 1-bit columns (nine chunks a warp) take the
    // guarded kernel of up to 17 chunks, whose loads past a warp's last chunk are clamped; 4096
    // 2-bit ones (eight) the guarded kernel of up to 12. 2-bit rows of 17408 (ffn_down, 34
    // chunks a warp) are refused, and 2-bit kernels never fold the norm in. On the H200,
    // 34816×5120, and 26016×6144, 17600×9216 and 8800×17408 of 1-bit rows, 13600×6144 and
    // 26000×4096 of 2-bit ones, have a few dozen tiles past their blocks' first fills at least,
    // in every kernel family.
    let shapes: &[(usize, usize)] = if one_bit {
        &[
            (34816, 5120),
            (1001, 5120),
            (992, 5120),
            (320, 6144),
            (77, 17408),
            (333, 6144),
            (40, 1024),
            (77, 9216),
            (20, 256),
            (26016, 6144),
            (17600, 9216),
            (8800, 17408),
        ]
    } else {
        &[
            (34816, 5120),
            (1001, 5120),
            (320, 6144),
            (333, 6144),
            (40, 1024),
            (77, 4096),
            (77, 17408),
            (20, 256),
            (13600, 6144),
            (26000, 4096),
        ]
    };
    // 77×17408, 77×9216, 17600×9216 and 8800×17408 take the kernels with staged activations.
    let want_staged = if one_bit { 4 } else { 0 };
    let (want_refused, want_fused_refused, want_tiles32): (&[&str], &[&str], usize) = if one_bit {
        // 34816×5120, 992×5120, 320×6144 and 26016×6144 take 32-row tiles.
        (
            &["20×256"],
            &["77×17408", "77×9216", "17600×9216", "8800×17408"],
            4,
        )
    } else {
        (
            &["77×17408", "20×256"],
            &[
                "34816×5120",
                "1001×5120",
                "320×6144",
                "333×6144",
                "40×1024",
                "77×4096",
                "13600×6144",
                "26000×4096",
            ],
            0,
        )
    };
    for &(rows, cols) in shapes {
        let pool = BlockPool::new(format, cols, 13)?;
        let data = pool.fill(format.row_bytes(cols)? * rows, 7);
        let p = repack::repack("m", format, &data, rows, cols)?;
        let m = gpu.upload_packed(&p, "m")?;
        // The 2-bit tiles come from images unless NIWAKI_CUDA_B1_IMAGE=0: each against its
        // twin, and the kernels' outputs against those of the same matrix without one.
        let plain = if let Some((shape, img)) = gpu.tile_image_bytes(&m)? {
            image_runs += 1;
            let zero = [0u8; 16];
            image_diff += img
                .chunks_exact(16)
                .enumerate()
                .filter(|&(q, got)| {
                    let want = shape
                        .source(q)
                        .and_then(|src| p.codes.get(16 * src..16 * src + 16))
                        .unwrap_or(&zero);
                    got != want
                })
                .count();
            gpu.set_image_use(ImageUse::Off);
            let plain = gpu.upload_packed(&p, "m");
            gpu.set_image_use(ImageUse::Every);
            Some(plain?)
        } else {
            None
        };
        // Activations with a few large values, as normed hidden states have.
        let x: Vec<f32> = (0..cols)
            .map(|i| rng.gen_range(-1.0..1.0) * if i % 331 == 0 { 20.0 } else { 1.0 })
            .collect();
        let xd = gpu.upload(&x, "x")?;
        gpu.quantize(s, xd.ptr, cols, 1, xq, xs, None)?;
        let qx = repack::quantize_x(&x);
        let (twin, mag) = twin_rows(&p, &x, &qx);
        let prior: Vec<f32> = (0..rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let out = gpu.upload(&prior, "out")?;
        let amax = gpu.upload(&[0u64], "argmax")?;
        let io = GemvIo {
            accumulate: true,
            argmax: Some(amax.ptr),
            ..GemvIo::one(xq, xs, out.ptr)
        };
        if !gpu.gemv_b1(s, &m, &io, None)? {
            refused.push(format!("{rows}×{cols}"));
            continue;
        }
        runs += 1;
        let mut got = vec![0f32; rows];
        gpu.read(s, out.ptr, &mut got)?;
        let mut key = [0u64];
        gpu.read(s, amax.ptr, &mut key)?;
        for r in 0..rows {
            let e = ((got[r] - prior[r] - twin[r]).abs() / mag[r].max(1e-30)) as f64;
            worst = worst.max(if got[r].is_nan() { f64::INFINITY } else { e });
        }
        argmax_ok &= model::ops::argmax(&got) == Some(!(key[0] as u32) as usize);

        // Twice the same launch: the same bits. Against the dp4a kernel: f32 rounding apart.
        let (a, b, c) = (
            gpu.alloc(4 * rows, "out")?,
            gpu.alloc(4 * rows, "out")?,
            gpu.alloc(4 * rows, "out")?,
        );
        let launched = gpu.image_launches();
        gpu.gemv_b1(s, &m, &GemvIo::one(xq, xs, a.ptr), None)?;
        image_launched += gpu.image_launches() - launched;
        gpu.gemv_b1(s, &m, &GemvIo::one(xq, xs, b.ptr), None)?;
        let t = niwaki_cuda::plan::Gemv1Tuning::for_shape(p.format, cols);
        let dp4a = gpu.gemv1_tuned(s, &m, &GemvIo::one(xq, xs, c.ptr), t, None)?;
        let (mut va, mut vb, mut vc) = (vec![0f32; rows], vec![0f32; rows], vec![0f32; rows]);
        gpu.read(s, a.ptr, &mut va)?;
        gpu.read(s, b.ptr, &mut vb)?;
        gpu.read(s, c.ptr, &mut vc)?;
        let differ = |x: &[f32], y: &[f32]| {
            x.iter()
                .zip(y)
                .filter(|(p, q)| p.to_bits() != q.to_bits())
                .count()
        };
        repeat_diff += differ(&va, &vb);
        if let Some(plain) = &plain {
            gpu.gemv_b1(s, plain, &GemvIo::one(xq, xs, b.ptr), None)?;
            gpu.read(s, b.ptr, &mut vb)?;
            image_out_diff += differ(&va, &vb);
        }
        // The H200's plan for tiles of that many rows.
        let h200_plan = |tile_rows| {
            niwaki_cuda::plan::gemv_b1_launch(
                p.format,
                rows,
                cols,
                132,
                227 << 10,
                false,
                (0, 0),
                tile_rows,
            )
        };
        // The same launch on the other tile height (32 rows where the plan takes them, or 16
        // where 32 is the setting).
        let prev = gpu.set_b1_tile_rows(if gpu.b1_tile_rows() == 32 { 16 } else { 32 });
        let wide = h200_plan(32).is_some_and(|l| l.tile_rows == 32);
        let ran = wide && gpu.gemv_b1(s, &m, &GemvIo::one(xq, xs, b.ptr), None)?;
        gpu.set_b1_tile_rows(prev);
        if ran {
            gpu.read(s, b.ptr, &mut vb)?;
            tiles32_diff += differ(&va, &vb);
            tiles32_runs += 1;
        }
        // The activations staged in shared memory by bulk copies, or loaded by each warp, as the
        // setting is not (the widest 1-bit kernels): the same bits.
        let staged = h200_plan(16)
            .and_then(|l| niwaki_cuda::plan::x_staged(l, cols))
            .is_some();
        if staged {
            let prev = gpu.set_x_stage(!gpu.x_stage());
            let ran = gpu.gemv_b1(s, &m, &GemvIo::one(xq, xs, b.ptr), None);
            gpu.set_x_stage(prev);
            ran?;
            gpu.read(s, b.ptr, &mut vb)?;
            staged_diff += differ(&va, &vb);
            staged_runs += 1;
        }
        if dp4a {
            dp4a_runs += 1;
            for r in 0..rows {
                worst_dp4a = worst_dp4a.max(((va[r] - vc[r]).abs() / mag[r].max(1e-30)) as f64);
            }
        }

        // Norm + quantize inside the kernel (its consumer warps, in registers) against
        // quant_rms then the kernel: the same bits. Taken up to six chunks a warp of 1-bit
        // rows; the 2-bit kernels must refuse it.
        let res: Vec<f32> = (0..2 * cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let nw: Vec<f32> = (0..cols).map(|_| rng.gen_range(0.5..1.5)).collect();
        let (resd, nwd) = (gpu.upload(&res, "x")?, gpu.upload(&nw, "norm")?);
        let pre = quant_rms_row1(gpu, resd.ptr, nwd.ptr, cols, xq, xs)?;
        gpu.gemv_b1(s, &m, &GemvIo::one(xq, xs, a.ptr), None)?;
        if gpu.gemv_b1(s, &m, &GemvIo::one(0, 0, b.ptr), Some(pre))? {
            gpu.read(s, a.ptr, &mut va)?;
            gpu.read(s, b.ptr, &mut vb)?;
            fused_diff += differ(&va, &vb);
            fused_runs += 1;
        } else {
            fused_refused.push(format!("{rows}×{cols}"));
        }
    }
    let ok = worst < 1e-5
        && worst_dp4a < 1e-5
        && dp4a_runs == runs
        && argmax_ok
        && runs == shapes.len() - want_refused.len()
        && refused == want_refused
        && repeat_diff == 0
        && fused_diff == 0
        && fused_refused == want_fused_refused
        && tiles32_runs == want_tiles32
        && tiles32_diff == 0
        && staged_runs == want_staged
        && staged_diff == 0
        && image_runs == if images { runs } else { 0 }
        && image_launched == image_runs
        && image_diff == 0
        && image_out_diff == 0;
    let taken: Vec<String> = shapes
        .iter()
        .map(|(r, c)| format!("{r}×{c}"))
        .filter(|sh| !refused.contains(sh))
        .collect();
    rep.line(format!(
        "| gemv_b1 {format} (binary tensor cores, 1 token, += prior, argmax; norm {}) | {} (refused: {}) | {} | vs integer twin {worst:.1e} (tol 1e-5), vs the dp4a kernel {worst_dp4a:.1e} (tol 1e-5) in {dp4a_runs} shapes, as a fraction of Σ|w·x|; argmax {}; {runs} shapes; repeated launch: {repeat_diff} differing outputs, fused norm vs quant_rms + kernel: {fused_diff} in {fused_runs} shapes (refused: {}), 32-row tiles vs 16 in {tiles32_runs} shapes: {tiles32_diff}, activations staged by bulk copies vs loaded by the warps in {staged_runs} shapes: {staged_diff}, tile images vs their twin in {image_runs} shapes ({image_launched} launched from them): {image_diff} differing units, the kernel from them vs from the tensor map: {image_out_diff} differing outputs (all must be 0) |",
        if one_bit { "fused" } else { "refused" },
        taken.join(", "),
        refused.join(", "),
        if ok { "PASS" } else { "FAIL" },
        if argmax_ok { "matches" } else { "WRONG" },
        fused_refused.join(", "),
    ));
    rep.check(ok, format!("gemv_b1 {format}"));
    Ok(())
}

/// Models of the 27B's widths and vocabulary but four layers (three recurrent, one attention),
/// 1-bit and 2-bit, so that their gate | up, recurrent and attention inputs and LM head take the
/// binary kernels as the 27B's do: six prompt tokens, then four decode steps, each step's logits
/// with the binary kernels on and off against each other and against the CPU engine.
pub(crate) fn wide_model_b1(rep: &mut Report) -> R<()> {
    wide_model(rep, Format::Q1_0)?;
    wide_model(rep, Format::Q2_0)
}

fn wide_model(rep: &mut Report, format: Format) -> R<()> {
    let vocab = 248_320;
    let m = wide_27b(vocab, format, 31)?;
    let g = CudaModel::load(&m)?;
    let prompt = [11u32, 222, 3333, 44_444, 5, 66];
    let steps = [7u32, 888, 9999, 123_456];
    let mut cs = m.new_state();
    m.forward(&mut cs, &prompt, Logits::Last)?;
    let cpu: Vec<Vec<f32>> = steps
        .iter()
        .map(|&t| m.forward(&mut cs, &[t], Logits::Last))
        .collect::<Result<_, _>>()?;
    let set = |on: bool| {
        if format == Format::Q1_0 {
            g.gpu().set_b1(on)
        } else {
            g.gpu().set_b2(on)
        }
    };
    let gpu = |on: bool| -> R<Vec<Vec<f32>>> {
        let prev = set(on);
        let run = || -> R<Vec<Vec<f32>>> {
            let mut st = g.new_state(64)?;
            g.forward(&mut st, &prompt, Logits::Last)?;
            steps
                .iter()
                .map(|&t| Ok(g.forward(&mut st, &[t], Logits::Last)?))
                .collect()
        };
        let out = run();
        set(prev);
        out
    };
    let (bin, dp4a) = (gpu(true)?, gpu(false)?);
    let (mut vs_dp4a, mut bin_cpu, mut dp4a_cpu, mut same_top) = (0f64, 0f64, 0f64, 0);
    let mut flips = Vec::new();
    for ((b, d), c) in bin.iter().zip(&dp4a).zip(&cpu) {
        vs_dp4a = vs_dp4a.max(rel_l2(b, d));
        bin_cpu = bin_cpu.max(rel_l2(b, c));
        dp4a_cpu = dp4a_cpu.max(rel_l2(d, c));
        let (top, gap) = top2(d);
        if top2(b).0 == top {
            same_top += 1;
        } else {
            // Where the top token differs: dp4a's top-1/top-2 gap against the largest change.
            flips.push(format!("gap {gap:.3} against max |Δ| {:.3}", max_abs(b, d)));
        }
    }
    // Float rounding apart (the binary kernel sums in another order), or within 5% of dp4a's
    // distance from the CPU where a rounding moved an int8 activation and the change propagated.
    // Identical logits would mean the binary kernel never ran.
    let ok = vs_dp4a > 0.0 && (vs_dp4a < 2e-3 || bin_cpu <= 1.05 * dp4a_cpu);
    rep.check(ok, format!("wide {format} model: binary GEMVs {vs_dp4a:.2e} from dp4a, {bin_cpu:.2e} from the CPU (dp4a {dp4a_cpu:.2e})"));
    rep.line(format!(
        "| binary GEMVs in a {format} model of the 27B's widths, 4 layers, vocabulary {vocab} | 4 decode steps after 6 tokens | {} | binary vs dp4a {vs_dp4a:.2e}, binary vs CPU {bin_cpu:.2e}, dp4a vs CPU {dp4a_cpu:.2e} (relative L2 of the logits, worst step); top-1 equal in {same_top} of {} steps{} |",
        if ok { "PASS" } else { "FAIL" },
        steps.len(),
        if flips.is_empty() { String::new() } else { format!(" ({})", flips.join("; ")) }
    ));
    Ok(())
}
