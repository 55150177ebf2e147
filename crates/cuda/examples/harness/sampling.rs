//! The top-k selection of sampling on the GPU (`kernels/topk.cu`) against
//! `model::rank::top_k`, and its time against the host's selection from a copied row.

use std::time::Instant;

use niwaki_cuda::gpu::Gpu;
use niwaki_cuda::plan::{topk_scratch_keys, weight_chunks, TOPK_MAX};
use niwaki_cuda::{Selected, TopkJob, TopkScratch};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::report::*;

fn job(logits: u64, n: usize, k: usize, temperature: f32) -> TopkJob {
    TopkJob {
        logits,
        n,
        k,
        temperature,
    }
}

/// A row of `n` logits: normal-ish values on a coarse grid (many exact ties), some NaN.
fn row(n: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
    (0..n)
        .map(|_| match rng.gen_range(0..1000) {
            0 => f32::NAN,
            _ => (rng.gen_range(-60..60) + rng.gen_range(-60..60)) as f32 * 0.125,
        })
        .collect()
}

/// The checks' table row, then the timing as a line for after the table.
pub(crate) fn topk_checks(rep: &mut Report, gpu: &Gpu, rng: &mut ChaCha8Rng) -> R<String> {
    let s = &gpu.stream;
    let vocab = 248_320;
    let half = topk_scratch_keys(vocab, TOPK_MAX);
    let keys = gpu.alloc(2 * 8 * half, "topk keys")?;
    let flag = gpu.alloc(4, "topk flag")?;
    let chunks = gpu.alloc(8 * weight_chunks(vocab), "weight chunks")?;
    let scratch = TopkScratch {
        keys: [keys.ptr, keys.ptr + 8 * half as u64],
        flag: flag.ptr,
        chunks: chunks.ptr,
    };
    let (mut runs, mut wrong) = (0, Vec::new());
    for n in [vocab, 5001, 2048, 7] {
        let x = row(n, rng);
        let xd = gpu.upload(&x, "logits")?;
        for k in [1, 20, 64, 1000, TOPK_MAX] {
            for t in [0.6f32, 1.0, 1.7] {
                runs += 1;
                let want = model::rank::top_k(&x, k, t);
                match gpu.top_k(s, job(xd.ptr, n, k, t), scratch)? {
                    Selected::Top(got) => {
                        let same = got.len() == want.len()
                            && got
                                .iter()
                                .zip(&want)
                                .all(|(a, b)| a.0 == b.0 && a.1.to_bits() == b.1.to_bits());
                        if !same {
                            wrong.push(format!("n {n} k {k} t {t}"));
                        }
                    }
                    Selected::Infinite => wrong.push(format!("n {n} k {k} t {t}: infinite?")),
                }
            }
        }
    }
    // The weight sums (a draw without a top-k limit) against model::rank::weight_sums.
    let mut sums_runs = 0;
    for n in [vocab, 5001, 1000] {
        let x = row(n, rng);
        let xd = gpu.upload(&x, "logits")?;
        for (t, floor) in [(1.0f32, 0.0f32), (0.7, 0.05), (2.3, 1e-4)] {
            sums_runs += 1;
            let (sel, total, kept) = gpu.top_k_sums(s, job(xd.ptr, n, 256, t), floor, scratch)?;
            let want_top = model::rank::top_k(&x, 256, t);
            let (wt, wk) = model::rank::weight_sums(&x, t, want_top[0].1, floor);
            let same = sel == Selected::Top(want_top)
                && total.to_bits() == wt.to_bits()
                && kept.to_bits() == wk.to_bits();
            if !same {
                wrong.push(format!(
                    "sums n {n} t {t} floor {floor}: {total} / {kept} against {wt} / {wk}"
                ));
            }
        }
    }
    runs += sums_runs;
    // A row with ±∞ anywhere is reported, not ranked.
    for (at, v) in [(5, f32::INFINITY), (248_000, f32::NEG_INFINITY)] {
        runs += 1;
        let mut x = row(vocab, rng);
        x[at] = v;
        let xd = gpu.upload(&x, "logits")?;
        if gpu.top_k(s, job(xd.ptr, vocab, 20, 0.7), scratch)? != Selected::Infinite {
            wrong.push(format!("{v} at {at} not reported"));
        }
    }
    let ok = wrong.is_empty();
    rep.line(format!(
        "| topk (sampling's top-k selection, and the weight sums of a draw without one) | {runs} rows and settings: 248,320 / 5001 / 2048 / 7 logits with ties and NaN, k 1–{TOPK_MAX}, temperature 0.6–1.7; {sums_runs} weight sums (k 256, floors 0–0.05); rows with ±∞ | {} | {} |",
        if ok { "PASS" } else { "FAIL" },
        if ok {
            "ids and scaled logits equal to `model::rank::top_k`'s, sums to `model::rank::weight_sums`'s, in every bit".to_string()
        } else {
            wrong.join("; ")
        }
    ));
    rep.check(ok, "topk".into());

    // Per token: the selection on the GPU (k keys back) against the row copied back and
    // selected on the host.
    let x = row(vocab, rng);
    let xd = gpu.upload(&x, "logits")?;
    let mut host_row = vec![0f32; vocab];
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut line = String::from("Top-k selection per token, 248,320 logits, median of 50:");
    let sums = gpu.time(s, 20, || {
        gpu.top_k_enqueue(s, job(xd.ptr, vocab, 256, 0.6), scratch)?;
        gpu.weight_sums_enqueue(s, job(xd.ptr, vocab, 256, 0.6), 0.0, scratch)
    })?;
    line.push_str(&format!(
        " k 256 with the weight sums (a draw without a top-k limit): its kernels {:.1} µs;",
        sums * 1e6
    ));
    for k in [20, 64, 1000] {
        let mut dev = Vec::new();
        let mut host = Vec::new();
        for _ in 0..50 {
            let t = Instant::now();
            gpu.top_k(s, job(xd.ptr, vocab, k, 0.6), scratch)?;
            dev.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            gpu.read(s, xd.ptr, &mut host_row)?;
            std::hint::black_box(model::rank::top_k(&host_row, k, 0.6));
            host.push(t.elapsed().as_secs_f64());
        }
        let kernels = gpu.time(s, 20, || {
            gpu.top_k_enqueue(s, job(xd.ptr, vocab, k, 0.6), scratch)
                .map(|_| ())
        })?;
        line.push_str(&format!(
            " k {k}: GPU {:.1} µs (its kernels {:.1} µs), host (copy + select) {:.1} µs;",
            median(dev) * 1e6,
            kernels * 1e6,
            median(host) * 1e6
        ));
    }
    Ok(line)
}

/// `CudaModel::forward_top_k` against the top k of `CudaModel::forward`'s row on a second state
/// fed the same tokens (small Q2_0 model, a 37-token prompt then 16 steps).
pub(crate) fn model_topk(rep: &mut Report) -> R<()> {
    use model::rank::Ranked;
    use model::synth::{self, Preset};
    use model::Logits;
    use niwaki_cuda::CudaModel;
    use quant::Format;

    let vocab = 4096;
    let shape = Preset::Small.shape(vocab);
    let t = synth::random_f32_tensors(&shape, Format::Q2_0, 8);
    let m = open(&synth::writer_from_f32(&shape, &t, Format::Q2_0, "h")?)?;
    let g = CudaModel::load(&m)?;
    // On for the check whatever the environment says (NIWAKI_CUDA_TOPK_SUMS=0 turns them off).
    g.gpu().set_topk_sums(true);
    let mut next: Vec<u32> = (0..37).map(|i| (i * 101 % vocab) as u32).collect();
    let (mut a, mut b) = (g.new_state(512)?, g.new_state(512)?);
    let (mut steps, mut equal) = (0, 0);
    for _ in 0..17 {
        let row = g.forward(&mut b, &next, Logits::Last)?;
        steps += 1;
        // Alternate steps ask for the weight sums too (with 256 candidates).
        let (k, floor) = if steps % 2 == 0 {
            (40, None)
        } else {
            (256, Some(0.01))
        };
        let want = model::rank::top_k(&row, k, 0.8);
        let want_sums = floor.map(|f| model::rank::weight_sums(&row, 0.8, want[0].1, f));
        let bits = |v: Option<(f32, f32)>| v.map(|(a, b)| (a.to_bits(), b.to_bits()));
        if let Ranked::Top { top, sums } = g.forward_top_k(&mut a, &next, k, 0.8, floor)? {
            if top.len() == k
                && top
                    .iter()
                    .zip(&want)
                    .all(|(x, y)| x.0 == y.0 && x.1.to_bits() == y.1.to_bits())
                && bits(sums) == bits(want_sums)
            {
                equal += 1;
            }
        }
        next = vec![want[steps % 3].0];
    }
    let ok = equal == steps;
    rep.line(format!(
        "Sampling's candidates on the GPU (small, Q2_0, `forward_top_k` at temperature 0.8 against `forward`'s row on the host: k 40, and k 256 with the weight sums at min-p 0.01, on alternate steps; a 37-token prompt and 16 steps): {equal} of {steps} steps equal in every bit"
    ));
    if std::env::var("NIWAKI_HARNESS_TOPK_TIMING").as_deref() == Ok("0") {
        return Ok(());
    }
    // Wall time per decode step, each way of getting what the draw needs, on a tiny model with
    // the 27B vocabulary (the row is what differs).
    let shape = Preset::Tiny.shape(248_320);
    let t = synth::random_f32_tensors(&shape, Format::Q2_0, 9);
    let m = open(&synth::writer_from_f32(&shape, &t, Format::Q2_0, "h")?)?;
    drop(t);
    let g = CudaModel::load(&m)?;
    g.gpu().set_topk_sums(true);
    let per_step = |f: &mut dyn FnMut(&mut niwaki_cuda::CudaState) -> R<()>| -> R<f64> {
        let mut st = g.new_state(512)?;
        g.forward_greedy(&mut st, &[1, 2, 3])?;
        for _ in 0..8 {
            f(&mut st)?;
        }
        let t = std::time::Instant::now();
        for _ in 0..200 {
            f(&mut st)?;
        }
        Ok(t.elapsed().as_secs_f64() / 200.0 * 1e6)
    };
    let greedy = per_step(&mut |st| {
        g.forward_greedy(st, &[5])?;
        Ok(())
    })?;
    let row = per_step(&mut |st| {
        let r = g.forward(st, &[5], Logits::Last)?;
        std::hint::black_box(model::rank::top_k(&r, 40, 0.8));
        Ok(())
    })?;
    let top = per_step(&mut |st| {
        std::hint::black_box(g.forward_top_k(st, &[5], 40, 0.8, None)?);
        Ok(())
    })?;
    let unlimited = per_step(&mut |st| {
        std::hint::black_box(g.forward_top_k(st, &[5], 256, 0.8, Some(0.0))?);
        Ok(())
    })?;
    rep.line(format!(
        "Per decode step of a tiny model with the 248,320-token vocabulary (µs, 200 steps): argmax on the GPU {greedy:.1}; row to the host and its top 40 there {row:.1}; top 40 on the GPU {top:.1}; 256 candidates and the weight sums on the GPU {unlimited:.1}"
    ));
    rep.check(ok, "forward_top_k".into());
    Ok(())
}
