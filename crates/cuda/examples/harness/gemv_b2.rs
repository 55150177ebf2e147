//! The binary-tensor-core decode GEMV of 2-bit rows (`gemv_b2_*`) against the integer twin, the
//! bulk-copy dp4a kernel and itself (determinism), in both 2-bit layouts.

use model::synth::BlockPool;
use niwaki_cuda::gpu::{GemvIo, Gpu};
use niwaki_cuda::repack;
use quant::Format;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::report::*;

pub(crate) fn gemv_b2_checks(
    rep: &mut Report,
    gpu: &Gpu,
    xq: u64,
    xs: u64,
    rng: &mut ChaCha8Rng,
) -> R<()> {
    let s = &gpu.stream;
    if !gpu.gemv1() {
        rep.line("| gemv_b2 (binary tensor cores, 2-bit decode GEMV) | — | SKIP | needs sm_90 |");
        return Ok(());
    }
    // 34816×5120 (the 27B's gate | up) refills every block's stages; rows not a multiple of
    // 16 leave a partial last tile. The last two widths are refused (no kernel: dp4a's).
    let shapes = [
        (34816usize, 5120usize),
        (1001, 5120),
        (320, 6144),
        (333, 6144),
        (77, 17408),
        (40, 1024),
    ];
    // Q2_0 g64, and PQ2_0 for the g128 layout (legacy g128 and widened PTQ1_0 share it).
    for format in [Format::Q2_0, Format::PQ2_0] {
        let (mut worst, mut worst_dp4a) = (0f64, 0f64);
        let (mut runs, mut argmax_ok, mut repeat_diff) = (0, true, 0usize);
        let mut refused = Vec::new();
        for (rows, cols) in shapes {
            let pool = BlockPool::new(format, cols, 13)?;
            let data = pool.fill(format.row_bytes(cols)? * rows, 7);
            let p = repack::repack("m", format, &data, rows, cols)?;
            let m = gpu.upload_packed(&p, "m")?;
            let x: Vec<f32> = (0..cols)
                .map(|i| rng.gen_range(-1.0..1.0) * if i % 331 == 0 { 20.0 } else { 1.0 })
                .collect();
            let xd = gpu.upload(&x, "x")?;
            gpu.quantize(s, xd.ptr, cols, 1, xq, xs, None)?;
            let qx = repack::quantize_x(&x);
            let twin: Vec<f32> = (0..rows).map(|r| repack::dot_row(&p, r, &qx)).collect();
            let mag: Vec<f32> = (0..rows)
                .map(|r| (0..cols).map(|c| (p.value(r, c) * x[c]).abs()).sum::<f32>())
                .collect();
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
            gpu.gemv_b1(s, &m, &GemvIo::one(xq, xs, a.ptr), None)?;
            gpu.gemv_b1(s, &m, &GemvIo::one(xq, xs, b.ptr), None)?;
            let t = niwaki_cuda::plan::Gemv1Tuning::for_shape(p.format, cols);
            let dp4a = gpu.gemv1_tuned(s, &m, &GemvIo::one(xq, xs, c.ptr), t, None)?;
            let (mut va, mut vb, mut vc) = (vec![0f32; rows], vec![0f32; rows], vec![0f32; rows]);
            gpu.read(s, a.ptr, &mut va)?;
            gpu.read(s, b.ptr, &mut vb)?;
            gpu.read(s, c.ptr, &mut vc)?;
            repeat_diff += va
                .iter()
                .zip(&vb)
                .filter(|(p, q)| p.to_bits() != q.to_bits())
                .count();
            if dp4a {
                for r in 0..rows {
                    worst_dp4a = worst_dp4a.max(((va[r] - vc[r]).abs() / mag[r].max(1e-30)) as f64);
                }
            }
        }
        let ok = worst < 1e-5
            && worst_dp4a < 1e-5
            && argmax_ok
            && runs == shapes.len() - 2
            && refused == ["77×17408", "40×1024"]
            && repeat_diff == 0;
        let taken: Vec<String> = shapes[..shapes.len() - 2]
            .iter()
            .map(|(r, c)| format!("{r}×{c}"))
            .collect();
        rep.line(format!(
            "| gemv_b2 {format} (binary tensor cores, 1 token, += prior, argmax) | {} (refused: {}) | {} | vs integer twin {worst:.1e} (tol 1e-5), vs the dp4a kernel {worst_dp4a:.1e} (tol 1e-5), as a fraction of Σ|w·x|; argmax {}; {runs} shapes; repeated launch: {repeat_diff} differing outputs (must be 0) |",
            taken.join(", "),
            refused.join(", "),
            if ok { "PASS" } else { "FAIL" },
            if argmax_ok { "matches" } else { "WRONG" }
        ));
        rep.check(ok, format!("gemv_b2 {format}"));
    }
    Ok(())
}
