//! The CUDA backend's harness, meant to run on the GPU machine in one go:
//!
//! 1. device info and the measured device-to-device copy bandwidth;
//! 2. each kernel family against its CPU reference on random data (bit-exact for the integer
//!    activation quantization; the GEMV against the CPU twin of its integer arithmetic and
//!    against the exact f32 dot), plus the GEMV's achieved GB/s on 27B-sized matrices;
//! 3. whole-model logits on the tiny and small synthetic presets against `model::Model`,
//!    greedy agreement and determinism;
//! 4. 27B synthetic models: decode tg128, prefill pp512, decode at 32k depth.
//!
//! Writes `cuda-results.md` to the folder given as the first argument (default `.`).
//! `NIWAKI_HARNESS_27B=Q2_0,Q1_0` picks the 27B formats (empty: skip).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use gguf::Gguf;
use model::synth::{self, BlockPool, Preset};
use model::{Logits, Model};
use niwaki_cuda::gpu::Gpu;
use niwaki_cuda::plan::Dims;
use niwaki_cuda::repack::{self, GpuFormat};
use niwaki_cuda::twin::Twin;
use niwaki_cuda::{available, CudaModel};
use quant::Format;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

type R<T> = Result<T, Box<dyn std::error::Error>>;

struct Report {
    md: String,
    failures: Vec<String>,
}

impl Report {
    fn line(&mut self, s: impl AsRef<str>) {
        println!("{}", s.as_ref());
        self.md.push_str(s.as_ref());
        self.md.push('\n');
    }
    fn check(&mut self, ok: bool, what: String) {
        if !ok {
            self.failures.push(what);
        }
    }
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn top2(x: &[f32]) -> (usize, f32) {
    let i = model::ops::argmax(x).unwrap_or(0);
    let second = x
        .iter()
        .enumerate()
        .filter(|&(j, _)| j != i)
        .map(|(_, v)| *v)
        .fold(f32::NEG_INFINITY, f32::max);
    (i, x[i] - second)
}

fn open(w: &gguf::GgufWriter) -> R<Model> {
    Ok(Model::from_gguf(Arc::new(Gguf::from_bytes(
        w.to_bytes()?,
    )?))?)
}

fn kernel_checks(rep: &mut Report, gpu: &Gpu, bw: f64) -> R<()> {
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
    gpu.quantize(s, xd.ptr, cols, ntok, xq.ptr, xs.ptr)?;
    let mut q = vec![0i8; cols * ntok];
    let mut g = vec![[0f32; 2]; cols * ntok / 64];
    gpu.read(s, xq.ptr, &mut q)?;
    gpu.read(s, xs.ptr, &mut g)?;
    let want = repack::quantize_x(&x);
    let bad_q = q.iter().zip(&want.q).filter(|(a, b)| a != b).count();
    let bad_g = g
        .iter()
        .zip(&want.groups)
        .filter(|(a, b)| a[0].to_bits() != b[0].to_bits() || a[1].to_bits() != b[1].to_bits())
        .count();
    rep.line(format!(
        "| quantize x (int8, 64-groups) | {cols}×{ntok} | {} | mismatching int8: {bad_q}, scales: {bad_g} (must be 0) |",
        if bad_q + bad_g == 0 { "PASS" } else { "FAIL" }
    ));
    rep.check(
        bad_q + bad_g == 0,
        "activation quantization not bit-exact".into(),
    );

    // GEMV correctness, every format, 1..13 tokens, a row count that is not a multiple of 4.
    let (rows, cols) = (1001, 5120);
    for format in [
        Format::Q1_0,
        Format::Q2_0,
        Format::Q2_0G128,
        Format::PQ2_0,
        Format::PTQ1_0,
    ] {
        let pool = BlockPool::new(format, cols, 7)?;
        let data = pool.fill(format.row_bytes(cols)? * rows, 3);
        let p = repack::repack("m", format, &data, rows, cols)?;
        let m = gpu.upload_packed(&p, "m")?;
        let mut worst_twin = 0f64;
        let mut worst_exact = 0f64;
        for ntok in [1usize, 5, 13] {
            let x: Vec<f32> = (0..ntok * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let xd = gpu.upload(&x, "x")?;
            gpu.quantize(s, xd.ptr, cols, ntok, xq.ptr, xs.ptr)?;
            let out = gpu.alloc(4 * rows * ntok, "out")?;
            gpu.gemv(s, &m, xq.ptr, xs.ptr, ntok, out.ptr, rows, false, None)?;
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

    // GEMV throughput on 27B shapes, rotating over copies so that L2 (60 MB) does not serve it.
    rep.line("");
    rep.line("| GEMV (1 token) | shape | bytes/call | µs/call | GB/s | of copy bandwidth |");
    rep.line("|---|---|---|---|---|---|");
    for (format, shapes) in [
        (
            Format::Q2_0,
            [(34816usize, 5120usize), (5120, 17408), (248320, 5120)],
        ),
        (Format::Q1_0, [(34816, 5120), (5120, 17408), (248320, 5120)]),
        (
            Format::PQ2_0,
            [(34816, 5120), (5120, 17408), (248320, 5120)],
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
            gpu.quantize(s, xd.ptr, cols, 1, xq.ptr, xs.ptr)?;
            let out = gpu.alloc(4 * rows, "out")?;
            let mut i = 0;
            let secs = gpu.time(s, 60, || {
                i += 1;
                gpu.gemv(
                    s,
                    &mats[i % copies],
                    xq.ptr,
                    xs.ptr,
                    1,
                    out.ptr,
                    rows,
                    false,
                    None,
                )
            })?;
            let bytes = mats[0].bytes();
            let gbs = bytes as f64 / secs / 1e9;
            rep.line(format!(
                "| {format} ({}) | {rows}×{cols} | {:.1} MB | {:.1} | {gbs:.0} | {:.0}% |",
                GpuFormat::for_format(format).unwrap().kernel_name(),
                bytes as f64 / 1e6,
                secs * 1e6,
                100.0 * gbs * 1e9 / bw
            ));
        }
    }
    Ok(())
}

fn whole_model(rep: &mut Report, preset: Preset, vocab: usize) -> R<()> {
    for format in [
        Format::Q1_0,
        Format::Q2_0,
        Format::Q2_0G128,
        Format::PQ2_0,
        Format::PTQ1_0,
    ] {
        let shape = preset.shape(vocab);
        let t = synth::random_f32_tensors(&shape, format, 5);
        let m = open(&synth::writer_from_f32(&shape, &t, format, "h")?)?;
        let g = CudaModel::load(&m)?;
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let prompt: Vec<u32> = (0..20).map(|_| rng.gen_range(0..vocab as u32)).collect();
        let mut cs = m.new_state();
        let mut gs = g.new_state(256)?;
        let a = m.forward(&mut cs, &prompt, Logits::All)?;
        let b = g.forward(&mut gs, &prompt, Logits::All)?;
        let mut worst = rel_l2(&b, &a);
        let mut worst_abs = max_abs(&b, &a);
        let mut flips = Vec::new();
        // The CPU twin of the GPU arithmetic (tiny only: it is slow). GPU vs twin must agree to
        // float rounding; twin vs CPU is what int8 activations cost.
        let mut twin = (preset == Preset::Tiny)
            .then(|| Twin::new(&m))
            .transpose()?;
        let (mut gpu_twin, mut twin_cpu) = (0f64, 0f64);
        if let Some(tw) = twin.as_mut() {
            for (i, &p) in prompt.iter().enumerate() {
                let l = tw.step(p)?;
                gpu_twin = gpu_twin.max(rel_l2(&b[i * vocab..(i + 1) * vocab], &l));
                twin_cpu = twin_cpu.max(rel_l2(&l, &a[i * vocab..(i + 1) * vocab]));
            }
        }
        let mut tok = top2(&a[a.len() - vocab..]).0 as u32;
        // Teacher-forced decode: both sides get the CPU's greedy token.
        for step in 0..12 {
            let a = m.forward(&mut cs, &[tok], Logits::Last)?;
            let b = g.forward(&mut gs, &[tok], Logits::Last)?;
            if let Some(tw) = twin.as_mut() {
                let l = tw.step(tok)?;
                gpu_twin = gpu_twin.max(rel_l2(&b, &l));
                twin_cpu = twin_cpu.max(rel_l2(&l, &a));
            }
            worst = worst.max(rel_l2(&b, &a));
            let d = max_abs(&b, &a);
            worst_abs = worst_abs.max(d);
            let (ia, gap) = top2(&a);
            let ib = top2(&b).0;
            if ia != ib {
                flips.push((step, gap, d));
            }
            tok = ia as u32;
        }
        // Free-running greedy on both, GPU argmax on the device.
        let mut cs = m.new_state();
        let mut gs = g.new_state(256)?;
        let mut last = m.forward(&mut cs, &prompt, Logits::Last)?;
        let mut ca = top2(&last).0 as u32;
        let mut gb = g.forward_greedy(&mut gs, &prompt)?;
        let mut same = 0;
        let mut diverge = None;
        for _ in 0..16 {
            if ca != gb {
                diverge = Some(top2(&last).1);
                break;
            }
            same += 1;
            last = m.forward(&mut cs, &[ca], Logits::Last)?;
            ca = top2(&last).0 as u32;
            gb = g.forward_greedy(&mut gs, &[gb])?;
        }
        let near_ties = flips.iter().all(|&(_, gap, d)| gap < 4.0 * d);
        // Identical arithmetic can still differ where a 1-ulp difference upstream (expf, sqrtf)
        // moves an activation across an int8 rounding boundary; such a flip propagates, but stays
        // far inside the quantization noise itself (twin vs CPU).
        let twin_ok = twin.is_none() || gpu_twin < 2e-3 || gpu_twin < 0.3 * twin_cpu;
        let ok = worst < 0.2 && near_ties && twin_ok;
        let twin_col = if twin.is_some() {
            format!("{gpu_twin:.1e} | {twin_cpu:.2e}")
        } else {
            "— | —".to_string()
        };
        rep.line(format!(
            "| {preset:?} | {format} | {} | {twin_col} | {worst:.2e} | {worst_abs:.2e} | {} | {same}/16{} |",
            if ok { "PASS" } else { "FAIL" },
            if flips.is_empty() {
                "none".to_string()
            } else {
                flips
                    .iter()
                    .map(|(s, gap, d)| format!("step {s}: gap {gap:.2e}, err {d:.2e}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            },
            diverge.map_or(String::new(), |gap| format!(" (CPU top-2 gap {gap:.2e})"))
        ));
        rep.check(ok, format!("whole model {preset:?} {format}"));
    }
    Ok(())
}

fn determinism(rep: &mut Report) -> R<()> {
    let vocab = 4096;
    let shape = Preset::Small.shape(vocab);
    let t = synth::random_f32_tensors(&shape, Format::Q2_0, 8);
    let m = open(&synth::writer_from_f32(&shape, &t, Format::Q2_0, "h")?)?;
    let g = CudaModel::load(&m)?;
    let prompt: Vec<u32> = (0..37).map(|i| (i * 101 % vocab) as u32).collect();
    let mut runs = Vec::new();
    let mut logits = Vec::new();
    for _ in 0..10 {
        let mut st = g.new_state(512)?;
        let mut out = vec![g.forward_greedy(&mut st, &prompt)?];
        for _ in 0..32 {
            let next = g.forward_greedy(&mut st, &[*out.last().unwrap()])?;
            out.push(next);
        }
        logits.push(g.forward(&mut st, &[1], Logits::Last)?);
        runs.push(out);
    }
    let same = runs.iter().all(|r| *r == runs[0]);
    let same_logits = logits.iter().all(|l| {
        l.iter()
            .zip(&logits[0])
            .all(|(a, b)| a.to_bits() == b.to_bits())
    });
    rep.line(format!(
        "Determinism (small, Q2_0, 37-token prompt + 32 greedy tokens, 10 runs): tokens identical: {same}; final logits bit-identical: {same_logits}"
    ));
    rep.check(same && same_logits, "determinism".into());
    Ok(())
}

fn bench_27b(rep: &mut Report, format: Format, bw: f64) -> R<()> {
    let vocab = 248_320;
    let shape = Preset::B27.shape(vocab);
    let t0 = Instant::now();
    let w = synth::random_packed(&shape, format, 27, "bench")?;
    let m = Model::from_gguf(Arc::new(Gguf::from_bytes(w.to_bytes()?)?))?;
    drop(w);
    let t_gen = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let g = CudaModel::load(&m)?;
    let t_load = t1.elapsed().as_secs_f64();
    let wb = g.weight_bytes() as f64;

    // Decode: GPU argmax (8 bytes back per token), graph per token.
    let mut st = g.new_state(4096)?;
    let mut tok = g.forward_greedy(&mut st, &[1, 2, 3, 4])?;
    for _ in 0..8 {
        tok = g.forward_greedy(&mut st, &[tok])?;
    }
    let t = Instant::now();
    for _ in 0..128 {
        tok = g.forward_greedy(&mut st, &[tok])?;
    }
    let tg = 128.0 / t.elapsed().as_secs_f64();
    // Decode returning the full logits to the host (the `forward` API).
    let t = Instant::now();
    for _ in 0..32 {
        let l = g.forward(&mut st, &[tok], Logits::Last)?;
        tok = model::ops::argmax(&l).unwrap_or(0) as u32;
    }
    let tg_logits = 32.0 / t.elapsed().as_secs_f64();
    // Decode at 32k depth (cache contents are zeros; the reads are what matters).
    let mut deep = g.new_state(32768 + 256)?;
    deep.bench_seek(32768);
    let mut dt = g.forward_greedy(&mut deep, &[tok])?;
    for _ in 0..4 {
        dt = g.forward_greedy(&mut deep, &[dt])?;
    }
    let t = Instant::now();
    for _ in 0..64 {
        dt = g.forward_greedy(&mut deep, &[dt])?;
    }
    let tg32k = 64.0 / t.elapsed().as_secs_f64();
    drop(deep);
    // Prefill pp512 (after a warm-up).
    let prompt: Vec<u32> = (0..512).map(|i| (i * 7919 % vocab) as u32).collect();
    let mut warm = g.new_state(1024)?;
    g.forward(&mut warm, &prompt[..128], Logits::Last)?;
    drop(warm);
    let mut pst = g.new_state(1024)?;
    let t = Instant::now();
    g.forward(&mut pst, &prompt, Logits::Last)?;
    let pp = 512.0 / t.elapsed().as_secs_f64();

    let state_rw = 2.0 * (48.0 * 48.0 * 128.0 * 128.0 * 4.0);
    let floor = bw / (wb + state_rw);
    // llama.cpp 0c1e570 on this H200 (the table): tg128, pp512.
    let peer = match format {
        Format::Q2_0 => "117.3 / 2874",
        Format::Q1_0 => "120.7 / 2685",
        _ => "not supported",
    };
    rep.line(format!(
        "| {format} | {:.2} GB | {tg:.1} | {:.0}% | {tg_logits:.1} | {pp:.0} | {tg32k:.1} ({:.2}) | {:.0} | {peer} |",
        wb / 1e9,
        100.0 * tg / floor,
        tg32k / tg,
        floor
    ));
    println!(
        "   ({format}: synth {t_gen:.1}s, load+repack+upload {t_load:.1}s, kernels compiled in {:.2}s)",
        g.compile_secs()
    );
    Ok(())
}

fn main() {
    let out_dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| std::env::var("OUT").unwrap_or_else(|_| ".".into()));
    let mut rep = Report {
        md: String::new(),
        failures: Vec::new(),
    };
    let res = run(&mut rep);
    if let Err(e) = &res {
        rep.line(format!("\n**Harness error:** {e}"));
        rep.failures.push(e.to_string());
    }
    rep.line(format!(
        "\nResult: {}",
        if rep.failures.is_empty() {
            "all checks passed".to_string()
        } else {
            format!("FAILED: {}", rep.failures.join(", "))
        }
    ));
    let path = std::path::Path::new(&out_dir).join("cuda-results.md");
    if let Err(e) = std::fs::write(&path, &rep.md) {
        eprintln!("could not write {}: {e}", path.display());
    }
    std::process::exit(i32::from(!rep.failures.is_empty()));
}

fn run(rep: &mut Report) -> R<()> {
    let info = available()?;
    rep.line("# niwaki CUDA backend: harness results");
    rep.line("");
    rep.line(format!(
        "Commit: {}; date: {}",
        std::env::var("NIWAKI_COMMIT").unwrap_or_else(|_| "unknown".into()),
        std::env::var("NIWAKI_DATE").unwrap_or_else(|_| "unknown".into())
    ));
    rep.line(format!("Device: {info}"));
    let small_shape = Preset::Small.shape(4096);
    let t = synth::random_f32_tensors(&small_shape, Format::Q2_0, 1);
    let small = open(&synth::writer_from_f32(
        &small_shape,
        &t,
        Format::Q2_0,
        "h",
    )?)?;
    let dims = Dims::from_config(&small.config)?;
    let gpu = Gpu::new(&dims)?;
    rep.line(format!(
        "Kernels: NVRTC {} in {:.2} s",
        if gpu.from_cache {
            "cache hit"
        } else {
            "compile"
        },
        gpu.compile_secs
    ));
    let bw = gpu.copy_bandwidth(2 << 30)?;
    rep.line(format!(
        "Device-to-device copy: {:.0} GB/s (read + write)",
        bw / 1e9
    ));
    rep.line("");
    rep.line("## Kernels against the CPU reference");
    rep.line("");
    rep.line("| kernel | shape | result | error |");
    rep.line("|---|---|---|---|");
    kernel_checks(rep, &gpu, bw)?;
    drop(gpu);

    rep.line("");
    rep.line("## Whole model against `model::Model::forward` (CPU)");
    rep.line("");
    rep.line("20-token prefill (all logits) + 12 teacher-forced decode steps. *GPU vs twin*: relative L2 error of the logits against `niwaki_cuda::twin`, the CPU twin of the GPU arithmetic (same int8 activations, integer dots, f16 KV cache; tiny only) — must be < 2e-3 (float rounding), or < 0.3× the *twin vs CPU* error where a 1-ulp difference upstream (expf, sqrtf) moved an activation across an int8 rounding boundary and the flip propagated. *twin vs CPU* and *GPU vs CPU*: the cost of int8 activations (per 64 values) on these random models, against `model::Model` in f32 — must be < 0.2; max |Δ|; argmax flips with the CPU's top-1/top-2 gap (allowed only where the gap is under 4× the max |Δ|); free-running greedy agreement over 16 tokens.");
    rep.line("");
    rep.line("| preset | format | result | GPU vs twin | twin vs CPU | GPU vs CPU | max abs | argmax flips | greedy agreement |");
    rep.line("|---|---|---|---|---|---|---|---|---|");
    whole_model(rep, Preset::Tiny, 1000)?;
    whole_model(rep, Preset::Small, 4096)?;
    rep.line("");
    determinism(rep)?;

    let formats = std::env::var("NIWAKI_HARNESS_27B").unwrap_or_else(|_| "Q2_0,Q1_0".into());
    let formats: Vec<Format> = formats
        .split(',')
        .filter(|s| !s.is_empty())
        .filter_map(Format::from_name)
        .collect();
    if !formats.is_empty() {
        rep.line("");
        rep.line("## 27B synthetic models (random weights in the Bonsai 27B shapes)");
        rep.line("");
        rep.line("tg128: 128 greedy decode steps after a 4-token prompt, argmax on the GPU; floor = copy bandwidth / (weight bytes + recurrent state read and written).");
        rep.line("");
        rep.line("| format | weights on GPU | tg128 tok/s | of floor | decode with host logits tok/s | pp512 tok/s | decode at 32k depth tok/s (ratio) | floor tok/s | llama.cpp tg128 / pp512 |");
        rep.line("|---|---|---|---|---|---|---|---|---|");
        for f in formats {
            bench_27b(rep, f, bw)?;
        }
    }
    let _ = writeln!(rep.md);
    Ok(())
}
