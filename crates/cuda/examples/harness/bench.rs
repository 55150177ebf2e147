//! 27B synthetic models: decode under several settings, prefill, decode at depth, per-op
//! profiles.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use gguf::Gguf;
use model::synth::{self, Preset};
use model::{Logits, Model};
use niwaki_cuda::plan::{ClusterFold, NormFusion, Op};
use niwaki_cuda::repack::GpuFormat;
use niwaki_cuda::{CudaModel, KvCache};
use quant::Format;

use crate::report::*;

/// A markdown table of per-op times (`Model::profile`), under `title`.
pub(crate) fn op_table(title: &str, per: &str, prof: &[(String, usize, f64)]) -> String {
    let total: f64 = prof.iter().map(|p| p.1 as f64 * p.2).sum();
    let mut t = format!(
        "\n{title}\n\n| op | per {per} | µs each | µs per {per} | share |\n|---|---|---|---|---|\n"
    );
    for (name, n, secs) in prof {
        let _ = writeln!(
            t,
            "| {name} | {n} | {:.2} | {:.0} | {:.0}% |",
            secs * 1e6,
            *n as f64 * secs * 1e6,
            100.0 * *n as f64 * secs / total
        );
    }
    t
}

/// Every record of a traced decode step's replays, one line each, for reading a launch block
/// by block: op, block, multiprocessor, then the global timer (ns) at the block's wait's start
/// and end, its marks and its end.
fn write_trace_csv(
    records: &[(niwaki_cuda::gpu::TraceRecord, String)],
    path: &std::path::Path,
) -> R<()> {
    let mut text =
        String::from("op,block,sm,wait0,wait1,mark0,mark1,mark2,mark3,mark4,mark5,end\n");
    for (r, name) in records {
        let [m0, m1, m2, m3, m4, m5] = r.marks;
        writeln!(
            text,
            "{name},{},{},{},{},{m0},{m1},{m2},{m3},{m4},{m5},{}",
            r.block, r.sm, r.wait0, r.wait1, r.end
        )?;
    }
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(())
}

/// The decode step's timeline (`niwaki_cuda::timeline`) as a table, per token: the LM head
/// runs once a token, so its launches count the replays.
fn timeline_table(format: Format, ops: &[niwaki_cuda::timeline::OpTimes]) -> String {
    let replays = ops
        .iter()
        .find(|o| o.name == "Gemv Output")
        .map_or(1, |o| o.launches.max(1));
    let mut t = format!(
        "\n{format} decode step from the kernels' timestamps (`NIWAKI_CUDA_TRACE`, {replays} replays of the step's graph; GEMVs by matrix, other ops by kernel; untraced kernels fall into the gaps): per launch, *run* from its first block's wait ending to its last block's end, *ready* to its median block holding its activations, *tile* to its first block's consumers taking their first tile (after their activations; the tile may have arrived before) and *rows* to its last block's rows written (the GEMVs' marks; the rest of *run* is its fold and its records), *gap* from the previous launch's last block ending to that wait ending, *early* how long its first block was resident before, *SMs* the multiprocessors a launch's blocks ran on (mean) and *most* the most blocks one of them ran in any launch\n\n| op | per token | run µs | ready µs | tile µs | rows µs | gap µs | early µs | SMs | most | (run + gap) per token µs |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    let mut total = 0.0;
    for o in ops {
        let per = o.launches as f64 / replays as f64;
        let sum = per * (o.active_us + o.gap_us);
        total += sum;
        let opt = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.2}"));
        t += &format!(
            "| {} | {per:.0} | {:.2} | {} | {} | {} | {:.2} | {:.2} | {:.1} | {} | {sum:.0} |\n",
            o.name,
            o.active_us,
            opt(o.ready_us),
            opt(o.tile_us),
            opt(o.rows_us),
            o.gap_us,
            o.early_us,
            o.sms,
            o.most_on_one_sm
        );
    }
    t + &format!("| all | | | | | | | | | | {total:.0} |\n") + &marks_tables(ops)
}

/// The marks of the ops whose kernels name theirs (`TraceKind::mark_names`: not the GEMVs'),
/// a table an op: µs from the first block's wait ending to each mark's median block.
fn marks_tables(ops: &[niwaki_cuda::timeline::OpTimes]) -> String {
    let mut t = String::new();
    for o in ops.iter().filter(|o| !o.kind.mark_names().is_empty()) {
        let names = o.kind.mark_names();
        t += &format!(
            "\n{}'s marks, µs from its first block's wait ending to each mark's median block (mean over {} launches):\n\n| op | {} |\n|---|{}\n| {} |",
            o.name,
            o.launches,
            names.iter().map(|n| n.1).collect::<Vec<_>>().join(" | "),
            "---|".repeat(names.len()),
            o.name
        );
        for &(k, _) in names {
            let us = o.marks_us.get(k).copied().flatten();
            t += &us.map_or(" — |".to_string(), |v| format!(" {v:.2} |"));
        }
        t += "\n";
    }
    t
}

pub(crate) fn bench_27b(
    rep: &mut Report,
    format: Format,
    bw: f64,
    profiles: &mut Vec<String>,
    decode_variants: &mut Vec<String>,
) -> R<()> {
    let vocab = 248_320;
    let shape = Preset::B27.shape(vocab);
    let t0 = Instant::now();
    let w = synth::random_packed(&shape, format, 27, "bench")?;
    let m = Model::from_gguf(Arc::new(Gguf::from_bytes(w.to_bytes()?)?))?;
    drop(w);
    let t_gen = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut g = CudaModel::load(&m)?;
    let t_load = t1.elapsed().as_secs_f64();
    let wb = g.weight_bytes() as f64;

    // Decode: GPU argmax (8 bytes back per token), graph per token; first with the sm_90 paths
    // off (the previous kernels), then the bulk-copy GEMV alone, then with PDL too (the default,
    // left on for everything after).
    // Decode: GPU argmax (8 bytes back per token), graph per token, under several settings of
    // the sm_90 paths (the previous kernels first); the defaults are set again afterwards.
    let decode =
        |pdl: bool, gemv1: bool, knobs: (NormFusion, usize, usize)| -> R<(f64, Vec<u32>)> {
            g.gpu().set_fast_paths(pdl, gemv1);
            g.gpu().set_gemv1_knobs(knobs.0, knobs.1, knobs.2);
            let mut st = g.new_state(4096)?;
            let mut toks = vec![g.forward_greedy(&mut st, &[1, 2, 3, 4])?];
            for _ in 0..8 {
                toks.push(g.forward_greedy(&mut st, &[*toks.last().unwrap()])?);
            }
            let t = Instant::now();
            for _ in 0..128 {
                toks.push(g.forward_greedy(&mut st, &[*toks.last().unwrap()])?);
            }
            Ok((128.0 / t.elapsed().as_secs_f64(), toks))
        };
    let (tg_plain, _) = decode(false, false, (NormFusion::Apart, 0, 0))?;
    let (tg_gemv1, toks_serial) = decode(false, true, (NormFusion::Apart, 0, 0))?;
    let mut variants = String::new();
    // The next GEMV's first bytes pulled into the L2 cache by each decode GEMV (0: off), and
    // the norms folded into the GEMVs; the tokens must not change.
    // None: each matrix's default (plan::default_prefetch_bytes).
    let default_prefetch = g.gpu().prefetch_setting();
    for (fuse, mb) in [
        (NormFusion::Binary, None),
        (NormFusion::Apart, Some(0)),
        (NormFusion::Apart, Some(8)),
        (NormFusion::Apart, Some(16)),
        (NormFusion::All, None),
    ] {
        g.gpu().set_prefetch(mb.map(|mb| mb << 20));
        let (v, toks) = decode(true, true, (fuse, 0, 0))?;
        let mb = mb.map_or("by matrix".to_string(), |mb| format!("{mb} MB"));
        rep.check(
            toks == toks_serial,
            format!("{format}: decode tokens differ with prefetch {mb}, norms {fuse:?}"),
        );
        let _ = write!(
            variants,
            "{}norm {}, L2 prefetch {mb}: {v:.1}",
            if variants.is_empty() { "" } else { "; " },
            match fuse {
                NormFusion::Apart => "separate",
                NormFusion::Binary => "in the binary GEMVs",
                NormFusion::All => "in every GEMV",
            }
        );
    }
    g.gpu().set_prefetch(default_prefetch);
    // Each merged decode kernel run as the kernels it replaces (the recurrence as conv, step
    // and gated norm; the attention merge and its quantization as two): the same arithmetic,
    // so the same tokens.
    let toggles: [(&str, &dyn Fn(bool) -> bool); 2] = [
        ("recurrence in three kernels", &|on| {
            g.gpu().set_fuse_gdn(on)
        }),
        ("attention merge and quantization apart", &|on| {
            g.gpu().set_fuse_attn(on)
        }),
    ];
    for (what, set) in toggles {
        let merged = set(false);
        let apart = decode(true, true, (NormFusion::Apart, 0, 0));
        set(merged);
        let (v, toks) = apart?;
        rep.check(
            toks == toks_serial,
            format!("{format}: decode tokens differ with the {what}"),
        );
        let _ = write!(variants, "; {what}: {v:.1}");
    }
    // The norms after the residual GEMVs folded into them or not, whichever is not the default
    // (activations quantized before the 1/rms rather than after: the tokens may differ at a
    // near-tie, so they are counted, not compared).
    let folds = g.gpu().fusion().fold;
    let was = g.gpu().set_fold_norm(!folds);
    let flipped = decode(true, true, (NormFusion::Apart, 0, 0));
    g.gpu().set_fold_norm(was);
    let (v, toks) = flipped?;
    // Settings of the same arithmetic, each run the other way from its default: the SwiGLU
    // folded into the gate | up GEMV (slower; opt-in), the folded norms' pieces gathered in
    // clusters (the default for Q2_0 g64 rows alone; their kernels take tiles of 16 rows, so
    // with them on the 1-bit rows' default of 32 gives way to 16: the same bits). The same
    // tokens; run on with the norms folded, they must have launched. Labels: run off, run on;
    // then the setter (taking on or off, giving whether the setting before took this model's
    // rows) and the launches that took it.
    let (rows, clusters) = (g.gpu().b1_tile_rows(), g.gpu().fold_cluster());
    let gpu_format = GpuFormat::for_format(format);
    type Flip<'a> = (
        &'a str,
        &'a str,
        &'a dyn Fn(bool) -> bool,
        &'a dyn Fn() -> usize,
    );
    let flips: [Flip; 2] = [
        (
            "SwiGLU apart from the gate | up GEMV",
            "SwiGLU folded into the gate | up GEMV",
            &|on| g.gpu().set_fold_swiglu(on),
            &|| g.gpu().swiglu_launches(),
        ),
        (
            "folded norms by counters, not clusters",
            "folded norms gathered in clusters",
            &|on| {
                g.gpu().set_b1_tile_rows(if on { 16 } else { rows });
                let c = if on {
                    ClusterFold::All
                } else {
                    ClusterFold::Off
                };
                let was = g.gpu().set_fold_cluster(c);
                gpu_format.is_some_and(|f| was.takes(f))
            },
            &|| g.gpu().cluster_fold_launches(),
        ),
    ];
    for (off, on, set, launches) in flips {
        let (was, launches0) = (set(false), launches());
        set(!was);
        let flipped = decode(true, true, (NormFusion::Apart, 0, 0));
        set(was);
        let (vf, toks_flipped) = flipped?;
        let what = if was { off } else { on };
        rep.check(
            toks_flipped == toks_serial,
            format!("{format}: decode tokens differ with the {what}"),
        );
        // Both settings act on folded norms only.
        rep.check(
            was || !folds || launches() > launches0,
            format!("{format}: no launch took the {what}"),
        );
        let _ = write!(variants, "; {what}: {vf:.1}");
    }
    // Each setting back as the backend chose it (the flips restore on or off).
    g.gpu().set_b1_tile_rows(rows);
    g.gpu().set_fold_cluster(clusters);
    let same = toks
        .iter()
        .zip(&toks_serial)
        .take_while(|(a, b)| a == b)
        .count();
    let _ = write!(
        variants,
        "; norms {} the residual GEMVs: {v:.1} (first {same} of {} tokens as the default's)",
        if folds { "apart from" } else { "folded into" },
        toks.len()
    );
    // Three dp4a GEMV blocks of 72 KiB per multiprocessor for every matrix they take (the
    // 6144-wide ones then fit in one round of blocks; 1-bit matrices on the binary kernel keep
    // its own plan); the tokens must not change.
    let (v, toks) = decode(true, true, (NormFusion::Apart, 3, 72 << 10))?;
    rep.check(
        toks == toks_serial,
        format!("{format}: decode tokens differ with three GEMV blocks per multiprocessor"),
    );
    let _ = write!(variants, "; three GEMV blocks of 72 KiB per SM: {v:.1}");
    // 1-bit matrices on dp4a alone (the binary kernels sum in another order: the tokens may
    // differ at a near-tie, so they are not compared).
    if format == Format::Q1_0 {
        let b1 = g.gpu().set_b1(false);
        let off = decode(true, true, (NormFusion::Apart, 0, 0));
        g.gpu().set_b1(b1);
        let _ = write!(variants, "; binary GEMVs off (dp4a only): {:.1}", off?.0);
    } else {
        // 2-bit matrices on the binary kernels flipped from the default (their float sums run
        // in another order than dp4a's: tokens not compared). Turned on here after a load with
        // NIWAKI_CUDA_B2=0, they have no tile images: the figure is the tensor map's.
        let on = g.gpu().b2();
        g.gpu().set_b2(!on);
        let flipped_to = g.gpu().b2();
        let flipped = decode(true, true, (NormFusion::Apart, 0, 0));
        g.gpu().set_b2(on);
        let state = if flipped_to { "on" } else { "off" };
        let _ = write!(variants, "; 2-bit binary GEMVs {state}: {:.1}", flipped?.0);
    }
    // The host back on the critical path: each step launched only after the previous pick was
    // read, then also its row embedded by the host; the same arithmetic, so the same tokens.
    for (what, embed, ahead) in [
        ("steps not run ahead of the host", true, false),
        ("and rows embedded by the host", false, false),
    ] {
        let (was_embed, was_ahead) = (g.set_device_embed(embed), g.set_run_ahead(ahead));
        let r = decode(true, true, (NormFusion::Apart, 0, 0));
        g.set_device_embed(was_embed);
        g.set_run_ahead(was_ahead);
        let (v, toks) = r?;
        rep.check(
            toks == toks_serial,
            format!("{format}: decode tokens differ with {what}"),
        );
        let _ = write!(variants, "; {what}: {v:.1}");
    }
    // The defaults (PDL, gemv1, separate norms, the recurrence in one kernel, blocks per SM and
    // shared memory by format as the plan chooses) last: every figure below uses them.
    let (tg, toks) = decode(true, true, (NormFusion::Apart, 0, 0))?;
    variants.push_str(&format!("; defaults: {tg:.1}"));
    decode_variants.push(format!("{format}: {variants}"));
    // PDL changes when kernels start, never what they compute: the tokens must be identical.
    rep.check(
        toks == toks_serial,
        format!("{format}: decode tokens differ with and without PDL"),
    );
    let mut tok = *toks.last().unwrap();
    // Where the decode step's time goes (ops timed inside graphs).
    let mut pst = g.new_state(4096)?;
    g.forward_greedy(&mut pst, &[1, 2, 3, 4])?;
    let prof = g.profile(&mut pst, 1, 20)?;
    drop(pst);
    let total: f64 = prof.iter().map(|p| p.1 as f64 * p.2).sum();
    profiles.push(op_table(
        &format!(
            "{format} decode step by op (each timed inside a graph of 20 launches cycling over the layers' ops of that kind): sum {:.2} ms/token against {:.2} ms measured",
            total * 1e3,
            1e3 / tg
        ),
        "token",
        &prof,
    ));
    // The same step's graph cut down: the GEMVs back to back as decode runs them, against
    // every other op; and the GEMVs streaming their weights without multiplying (a probe).
    let mut sst = g.new_state(4096)?;
    g.forward_greedy(&mut sst, &[1, 2, 3, 4])?;
    let is_gemv = crate::chain::is_gemv;
    let every = g.time_decode_subset(&mut sst, &|_| true)?;
    let gemvs = g.time_decode_subset(&mut sst, &is_gemv)?;
    let rest = g.time_decode_subset(&mut sst, &|op| !is_gemv(op))?;
    // Every op but the norms before the GEMVs: what removing those launches could save at most.
    let no_norms = g.time_decode_subset(&mut sst, &|op| !matches!(op, Op::NormQuant { .. }))?;
    // The kernels' own timestamps, where they keep them (`NIWAKI_CUDA_TRACE`).
    if let Some(ops) = g.trace_decode(&mut sst)? {
        profiles.push(timeline_table(format, &ops));
    }
    let prev = g.gpu().set_gemv1_probe(true);
    let nodot = g.time_decode_subset(&mut sst, &is_gemv);
    g.gpu().set_gemv1_probe(prev);
    let nodot = nodot?;
    // The persistent-step probe on the same GEMVs: a launch each against one launch for all.
    crate::chain::chain_probe(rep, &g, &mut sst, format, wb, gemvs, profiles)?;
    drop(sst);
    profiles.push(format!(
        "\n{format} decode step's graph cut down (ms per replay): every op {:.3}; the GEMVs alone {:.3} ({:.0} GB/s of weights); the GEMVs streaming without multiplying {:.3} ({:.0} GB/s); every other op alone {:.3}; every op but the norms {:.3}\n",
        every * 1e3,
        gemvs * 1e3,
        wb / gemvs / 1e9,
        nodot * 1e3,
        wb / nodot / 1e9,
        rest * 1e3,
        no_norms * 1e3
    ));
    let mut st = g.new_state(4096)?;
    g.forward_greedy(&mut st, &[1, 2, 3, 4])?;
    // Decode returning the full logits to the host (the `forward` API).
    let t = Instant::now();
    for _ in 0..32 {
        let l = g.forward(&mut st, &[tok], Logits::Last)?;
        tok = model::ops::argmax(&l).unwrap_or(0) as u32;
    }
    let tg_logits = 32.0 / t.elapsed().as_secs_f64();
    // Decode at 32k depth (cache contents are zeros; the reads are what matters).
    let mut depth_lines = Vec::new();
    let default_tile = g.gpu().attn_tile();
    let mut at_depth = |kv: KvCache| -> R<f64> {
        g.kv_cache = kv;
        let (tps, mut deep) = decode_at_depth(&g, 32768, tok)?;
        // The attention kernels at this depth (each tile variant), and the cache bytes the
        // split reads per layer.
        let d = &shape;
        let row = d.head_dim * kv.value_bytes() + kv.scale_bytes(d.head_dim);
        let bytes = (deep.len() + 1) * d.n_head_kv * row * 2;
        let mut line = format!(
            "{format}, {kv:?} cache at depth {} (decode {tps:.1} tok/s):",
            deep.len()
        );
        for tile in niwaki_cuda::plan::ATTN_TILES {
            g.gpu().set_attn_tile(tile);
            let prof = g.profile(&mut deep, 1, 20)?;
            let us = |k: &str| prof.iter().find(|p| p.0 == k).map_or(0.0, |p| p.2 * 1e6);
            let _ = write!(
                line,
                " tiles of {tile}{}: AttnSplit {:.1} µs per layer ({:.0} GB/s of cache read), AttnCombine {:.1} µs;",
                if tile == 16 { " (tensor cores)" } else { "" },
                us("AttnSplit"),
                bytes as f64 / us("AttnSplit").max(1e-3) / 1e3,
                us("AttnCombine"),
            );
        }
        g.gpu().set_attn_tile(default_tile);
        depth_lines.push(line);
        Ok(tps)
    };
    let tg32k = at_depth(KvCache::F16)?;
    let tg32k_q8 = at_depth(KvCache::Q8_0)?;
    for l in depth_lines {
        profiles.push(format!("\n{l}"));
    }
    g.kv_cache = KvCache::F16;
    // Prefill pp512 (after a warm-up).
    let prompt: Vec<u32> = (0..512).map(|i| (i * 7919 % vocab) as u32).collect();
    let mut warm = g.new_state(1024)?;
    g.forward(&mut warm, &prompt[..128], Logits::Last)?;
    drop(warm);
    use niwaki_cuda::plan::GemmKernel;
    let pp512 = |mma: bool, kernel: Option<GemmKernel>| -> R<f64> {
        g.gpu().set_mma(mma);
        g.gpu().set_gemm_kernel(kernel);
        let mut pst = g.new_state(1024)?;
        let t = Instant::now();
        g.forward(&mut pst, &prompt, Logits::Last)?;
        Ok(512.0 / t.elapsed().as_secs_f64())
    };
    let pp_dp4a = pp512(false, None)?;
    let int8 = GemmKernel::INT8;
    let pp_int8 = pp512(true, Some(int8))?;
    let chunked = g.gpu().set_gdn_chunked(true);
    let pp_chunks = pp512(true, None)?;
    g.gpu().set_gdn_chunked(chunked);
    let rows = g.gpu().gdn_rows();
    let mut pp_rows = Vec::new();
    for r in niwaki_cuda::plan::GDN_STEP_ROWS {
        g.gpu().set_gdn_rows(r);
        pp_rows.push(format!("{r}: {:.0}", pp512(true, None)?));
    }
    g.gpu().set_gdn_rows(rows);
    let pp = pp512(true, None)?;
    let pp_again = pp512(true, None)?;
    // Where a prefill pass's time goes (a full chunk, ops timed inside graphs).
    let mut pst = g.new_state(4096)?;
    g.forward(&mut pst, &prompt[..64], Logits::Last)?;
    let chunk = niwaki_cuda::plan::MAX_CHUNK;
    let prof = g.profile(&mut pst, chunk, 4)?;
    drop(pst);
    let total: f64 = prof.iter().map(|p| p.1 as f64 * p.2).sum();
    profiles.push(op_table(
        &format!(
            "{format} prefill pass of {chunk} tokens by op (each timed inside a graph of 4 launches cycling over the layers' ops of that kind): sum {:.1} ms = {:.0} tok/s; pp512 measured {pp:.0} and {pp_again:.0} tok/s (GEMMs: {}; the recurrence {}, {rows} key rows per lane; by rows per lane {}; in {}-token chunks: {pp_chunks:.0}; the int8 GEMM, {int8:?}, for every matrix: {pp_int8:.0}; dp4a kernels only: {pp_dp4a:.0})",
            total * 1e3,
            chunk as f64 / total,
            if g.gpu().info.wgmma() {
                "f16 (wgmma), warpgroups per block by matrix"
            } else {
                "int8"
            },
            if chunked {
                "in chunks"
            } else {
                "token by token"
            },
            pp_rows.join(", "),
            niwaki_cuda::plan::GDN_CHUNK
        ),
        "pass",
        &prof,
    ));

    let state_rw = 2.0 * (48.0 * 48.0 * 128.0 * 128.0 * 4.0);
    let floor = bw / (wb + state_rw);
    // llama.cpp 0c1e570 on this H200 (the table): tg128, pp512.
    let peer = match format {
        Format::Q2_0 => "117.3 / 2874",
        Format::Q1_0 => "120.7 / 2685",
        _ => "not supported",
    };
    rep.line(format!(
        "| {format} | {:.2} GB | {tg:.1} | {:.0}% | {tg_gemv1:.1} | {tg_plain:.1} | {tg_logits:.1} | {pp:.0} | {tg32k:.1} ({:.2}) | {tg32k_q8:.1} ({:.2}) | {:.0} | {peer} |",
        wb / 1e9,
        100.0 * tg / floor,
        tg32k / tg,
        tg32k_q8 / tg,
        floor
    ));
    println!(
        "   ({format}: synth {t_gen:.1}s, load+repack+upload {t_load:.1}s, kernels compiled in {:.2}s)",
        g.compile_secs()
    );
    Ok(())
}

/// Greedy decode tok/s of a fresh state whose cache holds `depth` positions (their contents
/// zeros: the reads are what matters), from token `first`: 64 steps after 5 of warm-up. The
/// state comes back for profiling.
fn decode_at_depth(g: &CudaModel, depth: usize, first: u32) -> R<(f64, niwaki_cuda::CudaState)> {
    let mut st = g.new_state(depth + 256)?;
    st.bench_seek(depth);
    let mut t = g.forward_greedy(&mut st, &[first])?;
    for _ in 0..4 {
        t = g.forward_greedy(&mut st, &[t])?;
    }
    let t0 = Instant::now();
    for _ in 0..64 {
        t = g.forward_greedy(&mut st, &[t])?;
    }
    Ok((64.0 / t0.elapsed().as_secs_f64(), st))
}

/// A synthetic 27B model of `format` (the bench's seed), on the GPU.
pub(crate) fn load_27b(format: Format) -> R<CudaModel> {
    let shape = Preset::B27.shape(248_320);
    let w = synth::random_packed(&shape, format, 27, "bench")?;
    let m = Model::from_gguf(Arc::new(Gguf::from_bytes(w.to_bytes()?)?))?;
    drop(w);
    Ok(CudaModel::load(&m)?)
}

/// Decode at depth alone (`NIWAKI_HARNESS_ONLY=depth`): a 27B model of `format`, decode tok/s
/// (64 greedy steps, argmax on the GPU) near depth 0 and at 16k, 32k and 128k for each cache type
/// and attention tile (the cache type's default first), with the split kernel's µs per layer.
pub(crate) fn depth_27b(rep: &mut Report, format: Format) -> R<()> {
    let shape = Preset::B27.shape(248_320);
    let mut g = load_27b(format)?;
    rep.line(format!(
        "\n### {format}: decode at depth (64 greedy steps, GPU argmax)\n"
    ));
    rep.line("| cache | tile | depth | tok/s | of depth 0 | AttnSplit µs per layer | GB/s of cache read |");
    rep.line("|---|---|---|---|---|---|---|");
    let by_cache = g.gpu().attn_tile();
    for kv in [KvCache::F16, KvCache::Q8_0] {
        g.kv_cache = kv;
        let mut base = 0.0;
        for depth in [64usize, 16384, 32768, 131072] {
            let tiles = [by_cache, 8, 16];
            for tile in tiles {
                g.gpu().set_attn_tile(tile);
                // A fresh state: its decode graphs are built with this tile's kernel.
                let (tps, mut deep) = decode_at_depth(&g, depth, 1)?;
                if depth == 64 && tile == by_cache {
                    base = tps;
                }
                let prof = g.profile(&mut deep, 1, 20)?;
                let us = prof
                    .iter()
                    .find(|p| p.0 == "AttnSplit")
                    .map_or(0.0, |p| p.2 * 1e6);
                let row = shape.head_dim * kv.value_bytes() + kv.scale_bytes(shape.head_dim);
                let bytes = (deep.len() + 1) * shape.n_head_kv * row * 2;
                rep.line(format!(
                    "| {kv:?} | {} | {} | {tps:.1} | {:.3} | {us:.1} | {:.0} |",
                    if tile == by_cache {
                        "default".to_string()
                    } else {
                        tile.to_string()
                    },
                    deep.len(),
                    tps / base,
                    bytes as f64 / us.max(1e-3) / 1e3,
                ));
            }
            g.gpu().set_attn_tile(by_cache);
        }
    }
    Ok(())
}

/// A decode step's timeline alone (`NIWAKI_HARNESS_ONLY=timeline`, with `NIWAKI_CUDA_TRACE`):
/// per op as the 27B section gives it, and every record where `NIWAKI_HARNESS_TRACE_CSV` names
/// a folder. `NIWAKI_HARNESS_TIMELINE_MATS` (a comma list of matrix kinds, as `GdnIn,FfnDown`)
/// keeps only the GEMVs of those matrices in the step: how they run back to back, without the
/// kernels between them (the results meaningless).
pub(crate) fn timeline_section(rep: &mut Report, formats: &[Format]) -> R<()> {
    let mats = std::env::var("NIWAKI_HARNESS_TIMELINE_MATS").ok();
    let kinds: Option<Vec<&str>> = mats
        .as_deref()
        .map(|m| m.split(',').map(str::trim).collect());
    // Every matrix kind the step multiplies by, as `keep` sees the step's ops.
    let seen = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let keep = |op: &Op| {
        let kind = op.matrix().map(|m| m.kind());
        seen.borrow_mut().extend(kind);
        match &kinds {
            None => true,
            Some(k) => kind.is_some_and(|m| k.contains(&m)),
        }
    };
    if let Some(k) = &kinds {
        rep.line(format!(
            "\nThe decode step's GEMVs of {} alone:",
            k.join(", ")
        ));
    }
    for &format in formats {
        let g = load_27b(format)?;
        let mut st = g.new_state(4096)?;
        g.forward_greedy(&mut st, &[1, 2, 3, 4])?;
        // One set of replays gives the table and, where asked, every record.
        let Some(records) = g.trace_decode_records(&mut st, &keep)? else {
            rep.line("no timeline: the kernels keep no records (set NIWAKI_CUDA_TRACE)");
            return Ok(());
        };
        // A kind the step does not multiply by (a misspelling) would leave nothing to read.
        if let Some(missing) = kinds.iter().flatten().find(|k| !seen.borrow().contains(*k)) {
            return Err(format!(
                "NIWAKI_HARNESS_TIMELINE_MATS: the {format} decode step has no {missing} matrix \
                 (its matrices: {})",
                seen.borrow().iter().copied().collect::<Vec<_>>().join(", ")
            )
            .into());
        }
        rep.line(timeline_table(
            format,
            &niwaki_cuda::timeline::summarize_named(&records),
        ));
        if let Some(dir) = std::env::var_os("NIWAKI_HARNESS_TRACE_CSV") {
            write_trace_csv(
                &records,
                &std::path::Path::new(&dir).join(format!("{format}.csv")),
            )?;
        }
    }
    Ok(())
}

/// Each decode op's launch with its weights in memory against the same launch with them in the
/// L2 cache (`NIWAKI_HARNESS_ONLY=l2`): for each kind of op, 20 launches inside a graph cycling
/// over the layers' ops (`CudaModel::profile`) against 20 of the kind's first op
/// (`CudaModel::profile_hot`, whose matrix, where the cache holds it, is read from there by all
/// launches but the first). What the hot launch still costs is the GEMV's ramp, tail and
/// arithmetic: the part that weights streamed on chip ahead of time could not take away.
pub(crate) fn l2_section(rep: &mut Report, formats: &[Format]) -> R<()> {
    for &format in formats {
        let g = load_27b(format)?;
        let mut st = g.new_state(4096)?;
        g.forward_greedy(&mut st, &[1, 2, 3, 4])?;
        let cold = g.profile(&mut st, 1, 20)?;
        let hot = g.profile_hot(&mut st, 20)?;
        rep.line(format!(
            "\n{format} decode ops, µs a launch inside a graph of 20: the layers' ops in turn (weights from memory) against the first op 20 times (weights from the L2 cache where it holds them)\n"
        ));
        rep.line("| op | per token | layers' ops in turn µs | first op 20 times µs | hot / cold | per token saved µs |");
        rep.line("|---|---|---|---|---|---|");
        let (mut cold_sum, mut hot_sum) = (0.0, 0.0);
        for ((name, n, c), (_, _, h)) in cold.iter().zip(&hot) {
            cold_sum += *n as f64 * c;
            hot_sum += *n as f64 * h;
            rep.line(format!(
                "| {name} | {n} | {:.2} | {:.2} | {:.2} | {:.0} |",
                c * 1e6,
                h * 1e6,
                h / c,
                *n as f64 * (c - h) * 1e6
            ));
        }
        rep.line(format!(
            "| all | | {:.0} per token | {:.0} per token | {:.2} | {:.0} |",
            cold_sum * 1e6,
            hot_sum * 1e6,
            hot_sum / cold_sum,
            (cold_sum - hot_sum) * 1e6
        ));
    }
    Ok(())
}
