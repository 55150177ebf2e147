//! Each kernel family against its CPU reference on random data: activation quantization, the
//! GEMVs (multi-token and bulk-copy decode), with their bandwidth on 27B-sized matrices.

use model::synth::BlockPool;
use niwaki_cuda::gpu::{Arg, DevMat, GemvIo, Gpu, NormIn};
use niwaki_cuda::plan::{Gemv1Tuning, RowLanes};
use niwaki_cuda::repack::{self, GpuFormat, FORMATS};
use quant::Format;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::gemm::{gemm_checks, gemm_speed};
use crate::gemv_b1::gemv_b1_checks;
use crate::report::*;

pub(crate) fn kernel_checks(rep: &mut Report, gpu: &Gpu, bw: f64) -> R<()> {
    let s = &gpu.stream;
    let mut rng = ChaCha8Rng::seed_from_u64(42);

    // Activation quantization: bit-exact against the CPU twin.
    let (cols, ntok) = (17408, 3);
    let x: Vec<f32> = (0..cols * ntok)
        .map(|i| {
            if i % 997 < 64 {
                0.0
            } else {
                rng.gen_range(-4.0..4.0) * rng.gen_range(0.0f32..1.0).powi(3)
            }
        })
        .collect();
    let xd = gpu.upload(&x, "x")?;
    // Sized for the largest use below (17408×3 here, 5120×13 in the GEMV checks).
    let xq = gpu.alloc(cols * 16, "xq")?;
    let xs = gpu.alloc(8 * cols * 16 / 64, "xs")?;
    let xh = gpu.alloc(2 * cols * ntok, "xh")?;
    gpu.quantize(s, xd.ptr, cols, ntok, xq.ptr, xs.ptr, Some(xh.ptr))?;
    let mut q = vec![0i8; cols * ntok];
    let mut g = vec![[0f32; 2]; cols * ntok / 64];
    let mut h = vec![0u16; cols * ntok];
    gpu.read(s, xq.ptr, &mut q)?;
    gpu.read(s, xs.ptr, &mut g)?;
    gpu.read(s, xh.ptr, &mut h)?;
    let want = repack::quantize_x(&x);
    let bad_q = q.iter().zip(&want.q).filter(|(a, b)| a != b).count();
    let bad_g = g
        .iter()
        .zip(&want.groups)
        .filter(|(a, b)| a[0].to_bits() != b[0].to_bits() || a[1].to_bits() != b[1].to_bits())
        .count();
    let bad_h = h
        .iter()
        .zip(repack::f16_acts(&x))
        .filter(|(a, b)| **a != *b)
        .count();
    rep.line(format!(
        "| quantize x (int8, 64-groups; f16 in the f16 GEMM's order) | {cols}×{ntok} | {} | mismatching int8: {bad_q}, scales: {bad_g}, f16: {bad_h} (must be 0) |",
        if bad_q + bad_g + bad_h == 0 { "PASS" } else { "FAIL" }
    ));
    rep.check(
        bad_q + bad_g + bad_h == 0,
        "activation quantization not bit-exact".into(),
    );
    rotated_quant_checks(rep, gpu, &x, cols, ntok, &mut rng)?;

    // GEMV correctness, every format, 1..13 tokens, a row count that is not a multiple of 4.
    let (rows, cols) = (1001, 5120);
    for format in FORMATS {
        let pool = BlockPool::new(format, cols, 7)?;
        let data = pool.fill(format.row_bytes(cols)? * rows, 3);
        let p = repack::repack("m", format, &data, rows, cols)?;
        let m = gpu.upload_packed(&p, "m")?;
        let mut worst_twin = 0f64;
        let mut worst_exact = 0f64;
        for ntok in [1usize, 5, 13] {
            let x: Vec<f32> = (0..ntok * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let xd = gpu.upload(&x, "x")?;
            gpu.quantize(s, xd.ptr, cols, ntok, xq.ptr, xs.ptr, None)?;
            let out = gpu.alloc(4 * rows * ntok, "out")?;
            let io = GemvIo {
                ntok,
                out_stride: rows,
                ..GemvIo::one(xq.ptr, xs.ptr, out.ptr)
            };
            gpu.gemv(s, &m, &io)?;
            let mut got = vec![0f32; rows * ntok];
            gpu.read(s, out.ptr, &mut got)?;
            let rb = format.row_bytes(cols)?;
            for t in 0..ntok {
                let xt = &x[t * cols..(t + 1) * cols];
                let qx = repack::quantize_x(xt);
                for r in 0..rows {
                    let twin = repack::dot_row(&p, r, &qx);
                    let row = &data[r * rb..(r + 1) * rb];
                    let exact = quant::dot_scalar(format, row, xt);
                    let mut w = vec![0f32; cols];
                    quant::dequantize(format, row, &mut w)?;
                    let mag: f32 = w.iter().zip(xt).map(|(a, b)| (a * b).abs()).sum();
                    let v = got[t * rows + r];
                    worst_twin = worst_twin.max(((v - twin).abs() / mag) as f64);
                    worst_exact = worst_exact.max(((v - exact).abs() / mag) as f64);
                }
            }
        }
        let ok = worst_twin < 1e-5 && worst_exact < 1e-2;
        rep.line(format!(
            "| gemv {format} → {:?} | {rows}×{cols}, 1/5/13 tokens | {} | vs integer twin {worst_twin:.1e} (tol 1e-5), vs exact f32 {worst_exact:.1e} (tol 1e-2), as a fraction of Σ|w·x| |",
            p.format,
            if ok { "PASS" } else { "FAIL" }
        ));
        rep.check(ok, format!("gemv {format}"));
    }

    gemv1_checks(rep, gpu, xq.ptr, xs.ptr, &mut rng)?;
    gemv_b1_checks(rep, gpu, xq.ptr, xs.ptr, &mut rng)?;
    gemm_checks(rep, gpu, &mut rng)?;
    // GEMV throughput on 27B shapes, rotating over copies so that L2 (60 MB) does not serve it:
    // the register-streaming kernel, the bulk-copy kernel with its default tuning, and the best
    // of a sweep over its knobs.
    rep.line("");
    rep.line("| GEMV (1 token) | shape | bytes/call | plain t1: µs, of copy bw | gemv1 default: µs, GB/s, of copy bw | best gemv1 (rows/warp, smem KiB, blocks/SM): µs, of copy bw |");
    rep.line("|---|---|---|---|---|---|");
    for (format, shapes) in [
        (
            Format::Q2_0,
            [
                (34816usize, 5120usize),
                (16480, 5120),
                (5120, 6144),
                (5120, 17408),
                (248320, 5120),
            ],
        ),
        (
            Format::Q1_0,
            [
                (34816, 5120),
                (16480, 5120),
                (5120, 6144),
                (5120, 17408),
                (248320, 5120),
            ],
        ),
        (
            Format::PQ2_0,
            [
                (34816, 5120),
                (16480, 5120),
                (5120, 6144),
                (5120, 17408),
                (248320, 5120),
            ],
        ),
    ] {
        for (rows, cols) in shapes {
            let pool = BlockPool::new(format, cols, 1)?;
            let copies = if rows > 100_000 { 1 } else { 4 };
            let mut mats = Vec::new();
            for c in 0..copies {
                let data = pool.fill(format.row_bytes(cols)? * rows, c as u64);
                let p = repack::repack("m", format, &data, rows, cols)?;
                mats.push(gpu.upload_packed(&p, "bench")?);
            }
            let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let xd = gpu.upload(&x, "x")?;
            gpu.quantize(s, xd.ptr, cols, 1, xq.ptr, xs.ptr, None)?;
            let out = gpu.alloc(4 * rows, "out")?;
            let bytes = mats[0].bytes() as f64;
            let frac = |secs: f64| 100.0 * bytes / secs / bw;
            let io = GemvIo::one(xq.ptr, xs.ptr, out.ptr);
            let mut i = 0;
            let plain = gpu.time(s, 60, || {
                i += 1;
                let m = &mats[i % copies];
                gpu.gemv_plain(s, m, &io)
            })?;
            let time1 = |t: Gemv1Tuning, i: &mut usize| -> R<Option<f64>> {
                let m0: &DevMat = &mats[0];
                if !gpu.gemv1_tuned(s, m0, &io, t, None)? {
                    return Ok(None);
                }
                Ok(Some(gpu.time(s, 60, || {
                    *i += 1;
                    let m = &mats[*i % copies];
                    gpu.gemv1_tuned(s, m, &io, t, None).map(|_| ())
                })?))
            };
            let gf = GpuFormat::for_format(format).unwrap();
            let def = time1(Gemv1Tuning::for_shape(gf, cols), &mut i)?;
            let mut best: Option<(f64, Gemv1Tuning)> = None;
            for (rows_per_warp, lanes) in LANE_SHAPES {
                for kib in [48, 100, 160, 200] {
                    for blocks_per_sm in [1, 2] {
                        let t = Gemv1Tuning {
                            rows_per_warp,
                            lanes,
                            smem_budget: kib << 10,
                            blocks_per_sm,
                        };
                        if let Some(secs) = time1(t, &mut i)? {
                            if best.is_none_or(|b| secs < b.0) {
                                best = Some((secs, t));
                            }
                        }
                    }
                }
            }
            let show = |v: Option<f64>| {
                v.map_or("—".to_string(), |secs| {
                    format!(
                        "{:.1}, {:.0}, {:.0}%",
                        secs * 1e6,
                        bytes / secs / 1e9,
                        frac(secs)
                    )
                })
            };
            rep.line(format!(
                "| {format} ({}) | {rows}×{cols} | {:.1} MB | {:.1}, {:.0}% | {} | {} |",
                gf.kernel_name(),
                bytes / 1e6,
                plain * 1e6,
                frac(plain),
                show(def),
                best.map_or("—".to_string(), |(secs, t)| format!(
                    "({}{}, {}, {}): {:.1}, {:.0}%",
                    t.rows_per_warp,
                    if t.lanes == RowLanes::Shared { "s" } else { "" },
                    t.smem_budget >> 10,
                    t.blocks_per_sm,
                    secs * 1e6,
                    frac(secs)
                ))
            ));
        }
    }
    gemm_speed(rep, gpu)?;
    Ok(())
}

/// The decode GEMV's rows per warp and how its lanes take them: one row, two rows split between
/// the lanes, two rows every lane takes (sharing the activations' loads).
const LANE_SHAPES: [(usize, RowLanes); 3] = [
    (1, RowLanes::Split),
    (2, RowLanes::Split),
    (2, RowLanes::Shared),
];

/// The bulk-copy decode GEMV against the CPU twin: every format, partial last tiles, rows wider
/// than a stage of the small budget, blocks that wrap around their ring many times, both rows per
/// warp, accumulation into existing values and the argmax.
/// `quant_rms` of row 1 of the two-row residual `x` (norm weights `nw`, eps 1e-6) into `xq`,
/// `xs`, and the same input as a decode GEMV's fused norm takes it.
pub(crate) fn quant_rms_row1(
    gpu: &Gpu,
    x: u64,
    nw: u64,
    cols: usize,
    xq: u64,
    xs: u64,
) -> R<NormIn> {
    gpu.launch(
        &gpu.stream,
        "quant_rms",
        (cols.div_ceil(1024) as u32, 1, 1),
        (256, 1, 1),
        &[
            Arg::Ptr(x),
            Arg::I32(cols as i32),
            Arg::I32(1),
            Arg::Ptr(nw),
            Arg::F32(1e-6),
            Arg::Ptr(xq),
            Arg::Ptr(xs),
            Arg::Ptr(0),
            Arg::Ptr(0),
            Arg::Ptr(0),
        ],
    )?;
    Ok(NormIn {
        x,
        tok0: 1,
        weight: nw,
        eps: 1e-6,
    })
}

pub(crate) fn gemv1_checks(
    rep: &mut Report,
    gpu: &Gpu,
    xq: u64,
    xs: u64,
    rng: &mut ChaCha8Rng,
) -> R<()> {
    let s = &gpu.stream;
    if !gpu.gemv1() {
        rep.line("| gemv1 (bulk-copy decode GEMV) | — | SKIP | needs sm_90 |");
        return Ok(());
    }
    for format in FORMATS {
        let mut worst = 0f64;
        let mut runs = 0;
        let mut argmax_ok = true;
        let (mut fused_diff, mut fused_runs) = (0usize, 0usize);
        let (mut order_diff, mut order_runs) = (0usize, 0usize);
        // Launches asked to take the tensor map's copy, and those that did; launches asked
        // not to that took it anyway. The plan no longer takes it by default, so these
        // forced launches are what checks the swizzled kernels.
        let (mut x_asked, mut x_took, mut x_unasked) = (0usize, 0usize, 0usize);
        // Launches of the shared-lanes kernels among those compared with gemv_t1.
        let mut shared_runs = 0usize;
        let gf = GpuFormat::for_format(format).unwrap();
        for (rows, cols) in [(1001usize, 5120usize), (77, 17408), (20000, 256)] {
            let pool = BlockPool::new(format, cols, 11)?;
            let data = pool.fill(format.row_bytes(cols)? * rows, 5);
            let p = repack::repack("m", format, &data, rows, cols)?;
            let m = gpu.upload_packed(&p, "m")?;
            let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let xd = gpu.upload(&x, "x")?;
            gpu.quantize(s, xd.ptr, cols, 1, xq, xs, None)?;
            let qx = repack::quantize_x(&x);
            let prior: Vec<f32> = (0..rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let twin: Vec<f32> = (0..rows).map(|r| repack::dot_row(&p, r, &qx)).collect();
            let mag: Vec<f32> = (0..rows)
                .map(|r| (0..cols).map(|c| (p.value(r, c) * x[c]).abs()).sum::<f32>())
                .collect();
            // Same bits as the register-streaming kernel the multi-token passes use, so that
            // decode and chunked prefill agree.
            let plain = gpu.alloc(4 * rows, "out")?;
            gpu.gemv_plain(s, &m, &GemvIo::one(xq, xs, plain.ptr))?;
            let mut want = vec![0u32; rows];
            gpu.read(s, plain.ptr, &mut want)?;
            // Activations staged by the tensor map (swizzled) and by the threads (piece-major),
            // in turn, so that a swizzled launch finds the other layout's bytes in shared memory
            // rather than its own from the launch before.
            for ((rows_per_warp, lanes), copy) in LANE_SHAPES
                .into_iter()
                .flat_map(|l| [(l, true), (l, false)])
            {
                let copy = Some(copy);
                // The shared lanes in their own budget, which their 16-row tiles of 17408-wide
                // rows fit (one block).
                let t = Gemv1Tuning {
                    rows_per_warp,
                    ..match lanes {
                        RowLanes::Shared => Gemv1Tuning::shared_wide(),
                        RowLanes::Split => Gemv1Tuning::split_lanes(gf, cols),
                    }
                };
                let o = gpu.alloc(4 * rows, "out")?;
                let was = gpu.set_x_copy(copy);
                let before = gpu.x_copy_launches();
                let ran = gpu.gemv1_tuned(s, &m, &GemvIo::one(xq, xs, o.ptr), t, None);
                gpu.set_x_copy(was);
                if ran? {
                    let took = gpu.x_copy_launches() - before;
                    if copy == Some(true) {
                        x_asked += 1;
                        x_took += took;
                    } else {
                        x_unasked += took;
                    }
                    let mut got = vec![0u32; rows];
                    gpu.read(s, o.ptr, &mut got)?;
                    order_diff += got.iter().zip(&want).filter(|(a, b)| a != b).count();
                    order_runs += 1;
                    shared_runs += usize::from(lanes == RowLanes::Shared);
                }
            }
            for (rows_per_warp, lanes) in LANE_SHAPES {
                for kib in [48, 100, 224] {
                    let t = Gemv1Tuning {
                        rows_per_warp,
                        lanes,
                        smem_budget: kib << 10,
                        blocks_per_sm: 1,
                    };
                    let out = gpu.upload(&prior, "out")?;
                    let amax = gpu.upload(&[0u64], "argmax")?;
                    let io = GemvIo {
                        accumulate: true,
                        argmax: Some(amax.ptr),
                        ..GemvIo::one(xq, xs, out.ptr)
                    };
                    if !gpu.gemv1_tuned(s, &m, &io, t, None)? {
                        continue;
                    }
                    runs += 1;
                    let mut got = vec![0f32; rows];
                    gpu.read(s, out.ptr, &mut got)?;
                    let mut key = [0u64];
                    gpu.read(s, amax.ptr, &mut key)?;
                    for r in 0..rows {
                        let want = prior[r] + twin[r];
                        let e = ((got[r] - want).abs() / mag[r].max(1e-30)) as f64;
                        worst = worst.max(if got[r].is_nan() { f64::INFINITY } else { e });
                    }
                    argmax_ok &= model::ops::argmax(&got) == Some(!(key[0] as u32) as usize);
                }
            }
            // Norm + quantize inside the GEMV against quant_rms then the GEMV: the same bits.
            let res: Vec<f32> = (0..2 * cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let nw: Vec<f32> = (0..cols).map(|_| rng.gen_range(0.5..1.5)).collect();
            let (resd, nwd) = (gpu.upload(&res, "x")?, gpu.upload(&nw, "norm")?);
            for t in [
                Gemv1Tuning::split_lanes(gf, cols),
                Gemv1Tuning::shared_wide(),
            ] {
                let (a, b) = (gpu.alloc(4 * rows, "out")?, gpu.alloc(4 * rows, "out")?);
                let pre = quant_rms_row1(gpu, resd.ptr, nwd.ptr, cols, xq, xs)?;
                if gpu.gemv1_tuned(s, &m, &GemvIo::one(xq, xs, a.ptr), t, None)?
                    && gpu.gemv1_tuned(s, &m, &GemvIo::one(0, 0, b.ptr), t, Some(pre))?
                {
                    let (mut va, mut vb) = (vec![0f32; rows], vec![0f32; rows]);
                    gpu.read(s, a.ptr, &mut va)?;
                    gpu.read(s, b.ptr, &mut vb)?;
                    fused_diff += va
                        .iter()
                        .zip(&vb)
                        .filter(|(x, y)| x.to_bits() != y.to_bits())
                        .count();
                    fused_runs += 1;
                }
            }
        }
        // The tensor map's kernels ran wherever forced (every shape, at least one rows per
        // warp each) and nowhere else.
        let ok = worst < 1e-5
            && x_took == x_asked
            && x_asked >= 3
            && x_unasked == 0
            && argmax_ok
            && runs >= 8
            && fused_diff == 0
            && fused_runs >= 4
            && order_diff == 0
            && order_runs >= 12
            && shared_runs >= 6;
        rep.line(format!(
            "| gemv1 {format} (bulk-copy, 1 token, += prior, argmax; norm fused) | 1001×5120, 77×17408, 20000×256; 1–2 rows/warp, lanes split or shared; 48/100/224 KiB | {} | vs integer twin {worst:.1e} (tol 1e-5) as a fraction of Σ|w·x|; argmax {}; {runs} launches; fused norm vs quant_rms + GEMV: {fused_diff} differing outputs in {fused_runs} shapes (must be 0); vs the multi-token kernel (gemv_t1), activations by tensor map ({x_took} of {x_asked} launches asked to take it, {x_unasked} of the others) and by threads: {order_diff} differing outputs in {order_runs} launches (must be 0), {shared_runs} of them shared lanes |",
            if ok { "PASS" } else { "FAIL" },
            if argmax_ok { "matches" } else { "WRONG" }
        ));
        rep.check(ok, format!("gemv1 {format}"));
    }
    Ok(())
}

/// Microseconds one grid-wide barrier (`grid_barrier_rounds`) takes with `per_sm` resident
/// blocks of 256 threads per multiprocessor: 2,000 barriers in one launch against none. `None`
/// where that many blocks would not all be resident (the barrier would never open).
pub(crate) fn barrier_us(gpu: &Gpu, per_sm: usize) -> R<Option<f64>> {
    if gpu.blocks_per_sm("grid_barrier_rounds", 256, 0)? < per_sm {
        return Ok(None);
    }
    let s = &gpu.stream;
    let blocks = per_sm * gpu.info.multiprocessors.max(1) as usize;
    let count = gpu.alloc(4, "barrier count")?;
    let run = |rounds: i32| -> R<f64> {
        Ok(gpu.time(s, 5, || {
            gpu.write(s, count.ptr, &[0u32])?;
            gpu.launch(
                s,
                "grid_barrier_rounds",
                (blocks as u32, 1, 1),
                (256, 1, 1),
                &[Arg::Ptr(count.ptr), Arg::I32(rounds)],
            )
        })?)
    };
    let (none, many) = (run(0)?, run(2000)?);
    Ok(Some((many - none) / 2000.0 * 1e6))
}

/// Quantization with the Hadamard rotation inside (Ternary-Bonsai-2): the plain quantization of
/// R·x bit for bit against the CPU (signs, FWHT and 1/32 in the CPU's order, then the twin's
/// quantization), and the RMS norm's against the CPU's norm then rotation (float sums in another
/// order: int8 values within one step), one token per 1024-value block (decode) and one block per
/// token (prefill) giving the same bits.
fn rotated_quant_checks(
    rep: &mut Report,
    gpu: &Gpu,
    x: &[f32],
    cols: usize,
    ntok: usize,
    rng: &mut ChaCha8Rng,
) -> R<()> {
    let s = &gpu.stream;
    let signs: Vec<f32> = (0..cols)
        .map(|_| if rng.gen() { 1.0 } else { -1.0 })
        .collect();
    let rotate = |row: &[f32]| -> Vec<f32> {
        let mut v: Vec<f32> = row.iter().zip(&signs).map(|(a, b)| a * b).collect();
        for b in v.chunks_mut(1024) {
            model::hadamard::fwht(b);
            b.iter_mut().for_each(|x| *x *= 0.03125);
        }
        v
    };
    let sd = gpu.upload(&signs, "signs")?;
    let xd = gpu.upload(x, "x")?;
    let xq = gpu.alloc(cols * ntok, "xq")?;
    let xs = gpu.alloc(8 * cols * ntok / 64, "xs")?;
    gpu.quantize_rotated(
        s,
        xd.ptr,
        cols,
        ntok,
        xq.ptr,
        xs.ptr,
        None,
        Some(sd.ptr),
        None,
    )?;
    let (mut q, mut g) = (vec![0i8; cols * ntok], vec![[0f32; 2]; cols * ntok / 64]);
    gpu.read(s, xq.ptr, &mut q)?;
    gpu.read(s, xs.ptr, &mut g)?;
    let want = repack::quantize_x(&x.chunks(cols).flat_map(rotate).collect::<Vec<f32>>());
    let bad = q.iter().zip(&want.q).filter(|(a, b)| a != b).count()
        + g.iter()
            .zip(&want.groups)
            .filter(|(a, b)| a[0].to_bits() != b[0].to_bits() || a[1].to_bits() != b[1].to_bits())
            .count();
    rep.line(format!(
        "| quantize R·x (Hadamard, 1024-blocks) | {cols}×{ntok} | {} | mismatching int8 or scales: {bad} (must be 0) |",
        if bad == 0 { "PASS" } else { "FAIL" }
    ));
    rep.check(bad == 0, "rotated quantization not bit-exact".into());

    // The norm: 5120 wide (five blocks), two tokens.
    let (cols, ntok) = (5120, 2);
    let res: Vec<f32> = (0..cols * ntok).map(|_| rng.gen_range(-2.0..2.0)).collect();
    let nw: Vec<f32> = (0..cols).map(|_| rng.gen_range(0.5..1.5)).collect();
    let (resd, nwd) = (gpu.upload(&res, "x")?, gpu.upload(&nw, "norm")?);
    let sd = gpu.upload(&signs[..cols], "signs")?;
    let mut runs = Vec::new();
    for (blocks, tokens, tok0) in [(cols / 1024, 1, 0), (cols / 1024, 1, 1), (1, ntok, 0)] {
        gpu.launch(
            s,
            "quant_rms",
            (blocks as u32, tokens as u32, 1),
            (256, 1, 1),
            &[
                Arg::Ptr(resd.ptr),
                Arg::I32(cols as i32),
                Arg::I32(tok0),
                Arg::Ptr(nwd.ptr),
                Arg::F32(1e-6),
                Arg::Ptr(xq.ptr),
                Arg::Ptr(xs.ptr),
                Arg::Ptr(0),
                Arg::Ptr(sd.ptr),
                Arg::Ptr(0),
            ],
        )?;
        let (mut q, mut g) = (
            vec![0i8; cols * tokens],
            vec![[0f32; 2]; cols * tokens / 64],
        );
        gpu.read(s, xq.ptr, &mut q)?;
        gpu.read(s, xs.ptr, &mut g)?;
        runs.push((q, g));
    }
    // Decode launches (one token each) against the prefill launch (both tokens at once).
    let same = runs[0].0[..] == runs[2].0[..cols]
        && runs[1].0[..] == runs[2].0[cols..]
        && runs[0]
            .1
            .iter()
            .chain(&runs[1].1)
            .zip(&runs[2].1)
            .all(|(a, b)| a[0].to_bits() == b[0].to_bits() && a[1].to_bits() == b[1].to_bits());
    let want: Vec<f32> = res
        .chunks(cols)
        .flat_map(|row| {
            let ss: f64 = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            let scale = 1.0 / (ss / cols as f64 + 1e-6).sqrt();
            let normed: Vec<f32> = row
                .iter()
                .zip(&nw)
                .map(|(&v, &w)| (f64::from(v) * scale) as f32 * w)
                .collect();
            rotate(&normed)
        })
        .collect();
    let want = repack::quantize_x(&want);
    let (q, g) = &runs[2];
    let far = q
        .iter()
        .zip(&want.q)
        .filter(|(a, b)| (i32::from(**a) - i32::from(**b)).abs() > 1)
        .count();
    let scale_err = g
        .iter()
        .zip(&want.groups)
        .map(|(a, b)| ((a[0] - b[0]).abs() / b[0].abs().max(1e-30)) as f64)
        .fold(0f64, f64::max);
    let ok = same && far == 0 && scale_err < 1e-5;
    rep.line(format!(
        "| RMS norm + R·x + quantize | {cols}×{ntok} | {} | int8 off by more than one step from the CPU's: {far} (must be 0), worst scale {scale_err:.1e} (tol 1e-5); decode and prefill grids identical: {same} |",
        if ok { "PASS" } else { "FAIL" }
    ));
    rep.check(ok, "rotated RMS norm quantization".into());
    Ok(())
}
