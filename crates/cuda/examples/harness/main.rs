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
//! Writes `cuda-results.md` to the folder given as the first argument (default `$OUT`, else `.`;
//! made if missing), dated by `NIWAKI_DATE` or the clock, with `NIWAKI_COMMIT`'s commit.
//! `NIWAKI_HARNESS_27B=Q2_0,Q1_0` picks the 27B formats (empty: skip);
//! `NIWAKI_HARNESS_ONLY=gemm` times the prefill GEMMs and nothing else (for a profiler);
//! `NIWAKI_HARNESS_ONLY=gemv-b1` runs the binary decode GEMV's checks alone (the kernel's, then
//! a 27B-wide model's against dp4a and the CPU engine),
//! `NIWAKI_HARNESS_ONLY=gemv1` the dp4a decode GEMV's checks alone,
//! `NIWAKI_HARNESS_ONLY=topk` sampling's top-k selection alone, `NIWAKI_HARNESS_ONLY=fused` the
//! merged decode kernels against the kernels they replace, `NIWAKI_HARNESS_ONLY=ahead` greedy
//! steps run ahead of the host against host-fed passes, `NIWAKI_HARNESS_ONLY=rewind` a sequence
//! rewound to a checkpoint against a fresh one, `NIWAKI_HARNESS_ONLY=steps` short passes run
//! token by token against one call a token, `NIWAKI_HARNESS_ONLY=attention` the
//! attention kernels' checks and decode at depth (`=depth`: decode at depth alone),
//! `NIWAKI_HARNESS_ONLY=prefill` the query-tiled attention's checks and times alone,
//! `NIWAKI_HARNESS_ONLY=determinism` ten identical greedy requests and the q8_0 cache's
//! whole-model checks, `NIWAKI_HARNESS_ONLY=short` the one-kernel short attention against the
//! kernels it replaces (also in `fused`),
//! `NIWAKI_HARNESS_ONLY=chain` the persistent-step probe on the 27B formats,
//! `NIWAKI_HARNESS_ONLY=passes` where a short pass's time goes (host-launched against one
//! graph), `NIWAKI_HARNESS_ONLY=l2` each decode op with its weights in memory and in the L2 cache,
//! `NIWAKI_HARNESS_ONLY=timeline` a decode step's timeline from the kernels' records (with
//! `NIWAKI_CUDA_TRACE`; `NIWAKI_HARNESS_TRACE_CSV` a folder for every record),
//! `NIWAKI_HARNESS_ONLY=pdl` when a dependent kernel's blocks start and whether their copies
//! issued before their wait stream (`pdl.rs`), `NIWAKI_HARNESS_ONLY=27b` the 27B
//! section alone.

use std::fmt::Write as _;

use model::synth::{self, Preset};
use niwaki_cuda::available;
use niwaki_cuda::gpu::Gpu;
use niwaki_cuda::plan::Dims;
use quant::Format;

mod ahead;
mod attention;
mod attention_prefill;
mod bench;
mod chain;
mod gdn;
mod gemm;
mod gemv_b1;
mod kernels;
mod models;
mod passes;
mod pdl;
mod report;
mod rewind;
mod sampling;
mod steps;

use bench::bench_27b;
use gemm::gemm_speed;
use kernels::kernel_checks;
use models::{determinism, fused_recurrence, kv_q8_checks, whole_model, whole_model_rotated};
use report::*;

fn main() {
    let out_dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| std::env::var("OUT").unwrap_or_else(|_| ".".into()));
    // The folder is made (or refused) before minutes of checks, not after them.
    if let Err(e) = std::fs::create_dir_all(&out_dir) {
        eprintln!("cannot write the report to {out_dir}: {e}");
        std::process::exit(2);
    }
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
        std::env::var("NIWAKI_DATE")
            .unwrap_or_else(|_| httpdate::fmt_http_date(std::time::SystemTime::now()))
    ));
    rep.line(format!("Device: {info}"));
    // A decode step's timeline alone (the kernels' records), with no program compiled for the
    // small models first.
    if std::env::var("NIWAKI_HARNESS_ONLY").as_deref() == Ok("timeline") {
        return bench::timeline_section(rep, &formats_27b("Q2_0,Q1_0"));
    }
    // Where a short pass's time goes, host-launched and in one graph.
    if std::env::var("NIWAKI_HARNESS_ONLY").as_deref() == Ok("passes") {
        return passes::pass_section(rep, &formats_27b("Q1_0,Q2_0"));
    }
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
        "Kernels: NVRTC {} in {:.2} s, loaded by the driver in {:.2} s ({} of the parts as device code)",
        if gpu.from_cache {
            "cache hit"
        } else {
            "compile"
        },
        gpu.compile_secs,
        gpu.load_secs,
        gpu.device_code_parts
    ));
    match std::env::var("NIWAKI_HARNESS_ONLY").as_deref() {
        // Whether copies issued before a kernel's wait stream during the kernel before it.
        Ok("pdl") => return pdl::pdl_section(rep, &gpu),
        // For a profiler: the GEMM timings alone.
        Ok("gemm") => return gemm_speed(rep, &gpu),
        // A new GEMM kernel's first run: its checks, then its timings.
        // The binary decode GEMV's checks alone (with its NIWAKI_CUDA_B1_* knobs).
        Ok("gemv-b1") => {
            let (xq, xs) = decode_gemv_inputs(rep, &gpu)?;
            let mut rng = rand::SeedableRng::seed_from_u64(7);
            gemv_b1::gemv_b1_checks(rep, &gpu, xq.ptr, xs.ptr, &mut rng)?;
            drop(gpu);
            return gemv_b1::wide_model_b1(rep);
        }
        // The dp4a decode GEMV's checks alone (every activation staging).
        Ok("gemv1") => {
            let (xq, xs) = decode_gemv_inputs(rep, &gpu)?;
            let mut rng = rand::SeedableRng::seed_from_u64(7);
            return kernels::gemv1_checks(rep, &gpu, xq.ptr, xs.ptr, &mut rng);
        }
        Ok("topk") => {
            kernel_table(rep);
            let timing =
                sampling::topk_checks(rep, &gpu, &mut rand::SeedableRng::seed_from_u64(5))?;
            rep.line(format!("\n{timing}\n"));
            return sampling::model_topk(rep);
        }
        // The query-tiled attention's checks and times alone (both shapes).
        Ok("prefill") => {
            kernel_table(rep);
            attention_prefill::prefill_checks(rep, &gpu, &dims)?;
            drop(gpu);
            let d27 = attention::b27_dims()?;
            return attention_prefill::prefill_checks(rep, &Gpu::new(&d27)?, &d27);
        }
        // Ten identical greedy requests, then the q8_0 cache's whole-model checks.
        Ok("determinism") => {
            drop(gpu);
            determinism(rep)?;
            return kv_q8_checks(rep);
        }
        // A sequence rewound to a checkpoint against a fresh one, bit for bit.
        Ok("rewind") => {
            drop(gpu);
            return rewind::rewind_checks(rep);
        }
        // Short passes token by token against one call a token, bit for bit.
        Ok("steps") => {
            drop(gpu);
            return steps::step_checks(rep);
        }
        // Greedy steps run ahead of the host against host-fed passes, bit for bit.
        Ok("ahead") => {
            drop(gpu);
            return ahead::greedy_ahead(rep);
        }
        // The merged decode kernels against the kernels they replace, bit for bit.
        Ok("fused") => {
            drop(gpu);
            return fused_recurrence(rep);
        }
        // The 1-bit GEMVs on plane words against on codes, bit for bit.
        Ok("planes") => {
            drop(gpu);
            return models::plane_words(rep);
        }
        // The one-kernel short attention against the kernels it replaces.
        Ok("short") => {
            drop(gpu);
            return models::short_attention(rep);
        }
        // The attention kernels' checks (both shapes, the q8_0 cache in whole models), then
        // decode at depth on a 27B model (`NIWAKI_HARNESS_27B`, default Q2_0).
        Ok("attention") => {
            kernel_table(rep);
            attention::attention_checks(rep, &gpu, &dims)?;
            attention_prefill::prefill_checks(rep, &gpu, &dims)?;
            drop(gpu);
            let d27 = attention::b27_dims()?;
            let g27 = Gpu::new(&d27)?;
            attention::attention_checks(rep, &g27, &d27)?;
            attention_prefill::prefill_checks(rep, &g27, &d27)?;
            drop(g27);
            rep.line("");
            rep.line("| preset | format | result | f16 KV vs CPU | q8_0 KV vs CPU | q8_0 vs f16 | q8_0 GPU vs its twin | greedy as f16 |");
            rep.line("|---|---|---|---|---|---|---|---|");
            kv_q8_checks(rep)?;
            return depth_section(rep);
        }
        // Decode at depth alone.
        Ok("depth") => {
            drop(gpu);
            return depth_section(rep);
        }
        // The persistent-step probe alone, on the 27B formats `NIWAKI_HARNESS_27B` names.
        Ok("chain") => {
            drop(gpu);
            return chain::chain_section(rep, &formats_27b("Q2_0,Q1_0"));
        }
        // Each decode op with its weights in memory against in the L2 cache.
        Ok("l2") => {
            drop(gpu);
            return bench::l2_section(rep, &formats_27b("Q1_0,Q2_0"));
        }
        Ok("gemm-checks") => {
            kernel_table(rep);
            gemm::gemm_checks(rep, &gpu, &mut rand::SeedableRng::seed_from_u64(7))?;
            return gemm_speed(rep, &gpu);
        }
        _ => {}
    }
    let bw = gpu.copy_bandwidth(2 << 30)?;
    rep.line(format!(
        "Device-to-device copy: {:.0} GB/s (read + write)",
        bw / 1e9
    ));
    // The 27B decode, prefill and per-op figures alone (for comparing settings quickly).
    if std::env::var("NIWAKI_HARNESS_ONLY").as_deref() == Ok("27b") {
        drop(gpu);
        return bench_27b_section(rep, bw);
    }
    // What a persistent decode kernel would pay per dependence instead of a kernel boundary
    // (a decode step's small kernels take 0.7-1.8 µs each inside its graph).
    let us = |per_sm| -> R<String> {
        Ok(kernels::barrier_us(&gpu, per_sm)?
            .map_or("— (not all resident)".into(), |v| format!("{v:.2} µs")))
    };
    rep.line(format!(
        "Grid-wide barrier (release add + acquire spin, every block resident): {} with one block of 256 threads per multiprocessor, {} with two",
        us(1)?,
        us(2)?
    ));
    rep.line("");
    rep.line("## Kernels against the CPU reference");
    rep.line("");
    kernel_table(rep);
    kernel_checks(rep, &gpu, bw)?;
    attention::attention_checks(rep, &gpu, &dims)?;
    attention_prefill::prefill_checks(rep, &gpu, &dims)?;
    gdn::gdn_chunk_checks(rep, &gpu, &dims)?;
    let topk_timing = sampling::topk_checks(rep, &gpu, &mut rand::SeedableRng::seed_from_u64(5))?;
    {
        // The same on kernels compiled for the 27B shapes (head dim 256, GQA 6; 48 value
        // heads over 16 key heads).
        let d27 = attention::b27_dims()?;
        let g27 = Gpu::new(&d27)?;
        attention::attention_checks(rep, &g27, &d27)?;
        attention_prefill::prefill_checks(rep, &g27, &d27)?;
        gdn::gdn_chunk_checks(rep, &g27, &d27)?;
    }
    drop(gpu);
    rep.line("");
    rep.line(topk_timing);

    rep.line("");
    rep.line("## Whole model against `model::Model::forward` (CPU)");
    rep.line("");
    rep.line("20-token prefill (all logits) + 12 teacher-forced decode steps. *GPU vs twin*: relative L2 error of the logits against `niwaki_cuda::twin`, the CPU twin of the GPU arithmetic (same int8 activations, integer dots, f16 KV cache; tiny only) — must be < 2e-3 (float rounding), or < 0.3× the *twin vs CPU* error where a 1-ulp difference upstream (expf, sqrtf, the GEMV's summation order) moved an activation across an int8 rounding boundary and the flip propagated, or else *GPU vs CPU* must be no larger than *twin vs CPU* (the GPU no further from exact f32 than its twin). *twin vs CPU* and *GPU vs CPU*: the cost of int8 activations (per 64 values) on these random models, against `model::Model` in f32 — must be < 0.2; max |Δ|; argmax flips with the CPU's top-1/top-2 gap (allowed only where the gap is under 4× the max |Δ|); free-running greedy agreement over 16 tokens. The prefill and decode compared with the twin run on the int8 GEMM and the token-by-token recurrence (the twin's arithmetic); *f16-GEMM prefill vs CPU*: the same 20-token prefill on the GEMM and recurrence the model uses on this device (f16 warpgroup MMA on sm_90a, — elsewhere) against the CPU, must be < 0.2; the free-running greedy run uses them too.");
    rep.line("");
    rep.line("| preset | format | result | GPU vs twin | twin vs CPU | GPU vs CPU | f16-GEMM prefill vs CPU | max abs | argmax flips | greedy agreement |");
    rep.line("|---|---|---|---|---|---|---|---|---|---|");
    whole_model(rep, Preset::Tiny, 1000)?;
    whole_model(rep, Preset::Small, 4096)?;
    whole_model_rotated(rep)?;
    rep.line("");
    rep.line("q8_0 KV cache (llama.cpp's block format) against the f16 cache: relative L2 of the logits over a 20-token prefill and 12 teacher-forced steps, each against the CPU engine (f32) and q8_0 against f16; greedy tokens equal to the f16 cache's over 16 free-running steps.");
    rep.line("");
    rep.line("| preset | format | result | f16 KV vs CPU | q8_0 KV vs CPU | q8_0 vs f16 | q8_0 GPU vs its twin | greedy as f16 |");
    rep.line("|---|---|---|---|---|---|---|---|");
    kv_q8_checks(rep)?;
    rep.line("");
    fused_recurrence(rep)?;
    rep.line("");
    determinism(rep)?;
    rep.line("");
    ahead::greedy_ahead(rep)?;
    rep.line("");
    rewind::rewind_checks(rep)?;
    rep.line("");
    steps::step_checks(rep)?;
    rep.line("");
    sampling::model_topk(rep)?;
    rep.line("");
    rep.line("| check | shape | result | error |");
    rep.line("|---|---|---|---|");
    gemv_b1::wide_model_b1(rep)?;

    bench_27b_section(rep, bw)?;
    let _ = writeln!(rep.md);
    Ok(())
}

/// The header of the kernel checks' table.
fn kernel_table(rep: &mut Report) {
    rep.line("| kernel | shape | result | error |");
    rep.line("|---|---|---|---|");
}

/// The kernel checks' table header, and activation buffers (int8 codes and group pairs) for the
/// decode GEMVs' checks alone, as wide as the 27B's widest input (17408 values).
fn decode_gemv_inputs(
    rep: &mut Report,
    gpu: &Gpu,
) -> R<(niwaki_cuda::gpu::DevBuf, niwaki_cuda::gpu::DevBuf)> {
    kernel_table(rep);
    Ok((gpu.alloc(17408, "xq")?, gpu.alloc(8 * 17408 / 64, "xs")?))
}

/// The 27B formats `NIWAKI_HARNESS_27B` names (names separated by commas; empty: none), or
/// `default`'s where it is unset.
fn formats_27b(default: &str) -> Vec<Format> {
    std::env::var("NIWAKI_HARNESS_27B")
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter(|s| !s.is_empty())
        .filter_map(Format::from_name)
        .collect()
}

/// Decode at depth on 27B models of the formats `NIWAKI_HARNESS_27B` names (default Q2_0).
fn depth_section(rep: &mut Report) -> R<()> {
    for f in formats_27b("Q2_0") {
        bench::depth_27b(rep, f)?;
    }
    Ok(())
}

/// The 27B section: decode, prefill, depth and per-op profiles of each format;
/// `NIWAKI_HARNESS_27B` names (default Q2_0 and Q1_0; empty: none).
fn bench_27b_section(rep: &mut Report, bw: f64) -> R<()> {
    let formats = formats_27b("Q2_0,Q1_0");
    if !formats.is_empty() {
        rep.line("");
        rep.line("## 27B synthetic models (random weights in the Bonsai 27B shapes)");
        rep.line("");
        rep.line("tg128: 128 greedy decode steps after a 4-token prompt, argmax on the GPU; floor = copy bandwidth / (weight bytes + recurrent state read and written).");
        rep.line("");
        rep.line("| format | weights on GPU | tg128 tok/s | of floor | tg128 gemv1 without PDL (separate norms) | tg128 previous kernels (no PDL, no gemv1) | decode with host logits tok/s | pp512 tok/s | decode at 32k depth tok/s (ratio) | same, q8_0 KV cache | floor tok/s | llama.cpp tg128 / pp512 |");
        rep.line("|---|---|---|---|---|---|---|---|---|---|---|---|");
        let (mut profiles, mut variants) = (Vec::new(), Vec::new());
        for f in formats {
            bench_27b(rep, f, bw, &mut profiles, &mut variants)?;
        }
        rep.line("");
        rep.line("Decode tg128 tok/s with PDL and gemv1 under other settings (norm fusion, L2 prefetch of the next matrix):");
        rep.line("");
        for v in variants {
            rep.line(format!("- {v}"));
        }
        for p in profiles {
            rep.line(p);
        }
    }
    Ok(())
}
