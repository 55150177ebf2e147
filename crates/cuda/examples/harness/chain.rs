//! The persistent-step probe on a 27B model's decode step (`CudaModel::time_gemv_chain`),
//! checked and reported, in the 27B section or alone (`NIWAKI_HARNESS_ONLY=chain`).

use niwaki_cuda::plan::Op;
use niwaki_cuda::{CudaModel, CudaState};
use quant::Format;

use crate::report::*;

/// Whether an op of the decode step is one of its GEMVs.
pub(crate) fn is_gemv(op: &Op) -> bool {
    matches!(
        op,
        Op::Gemv { .. } | Op::NormGemv { .. } | Op::GemvFold { .. } | Op::GemvScaled { .. }
    )
}

/// The probe on `st`'s decode step (whose contents it overwrites), the chain's LM head checked
/// against the decode kernel's, with a line for `profiles`. `wb`: weight bytes; `gemvs`:
/// seconds of the decode GEMVs alone in the cut-down graph, which the probe is set against.
pub(crate) fn chain_probe(
    rep: &mut Report,
    g: &CudaModel,
    st: &mut CudaState,
    format: Format,
    wb: f64,
    gemvs: f64,
    profiles: &mut Vec<String>,
) -> R<()> {
    use niwaki_cuda::ChainMode;
    let chain = g.time_gemv_chain(st, ChainMode::Dot)?;
    let synced = g.time_gemv_chain(st, ChainMode::Synced)?;
    let free = g.time_gemv_chain(st, ChainMode::Free)?;
    let flow = g.time_gemv_chain(st, ChainMode::Flow)?;
    let flow_synced = g.time_gemv_chain(st, ChainMode::FlowSynced)?;
    let binary = g.time_gemv_chain(st, ChainMode::Binary)?;
    // The binary chain runs wherever the others do; a skipped one must not pass unseen.
    rep.check(
        binary.is_some() || chain.is_none(),
        format!("{format}: the binary chain did not run (its ring or block does not fit)"),
    );
    if let Some(b) = binary {
        // The binary chain's sums run in another order than the binary decode GEMV's (16 warps'
        // partial sums where it adds 8): float rounding, far below this bound, which any wrong
        // product or row would exceed.
        rep.check(
            b.relative < 1e-4,
            format!(
                "{format}: the binary chain's LM head is {:.2e} (of its largest logit) from the binary decode GEMV's (must be < 1e-4)",
                b.relative
            ),
        );
        profiles.push(format!(
            "\n{format} persistent-step probe with the decode's binary arithmetic (kernels/gemv_chain.cu CHAIN_BIN: binary MMAs against plane words, a warp's chunks of every row of a tile, a grid barrier between GEMVs), ms per replay: launched once per GEMV {:.3} ({:.0} GB/s), all in one launch {:.3} ({:.0} GB/s); the LM head after it {:.2e} of its largest logit from the binary decode GEMV's (must be < 1e-4)\n",
            b.each * 1e3,
            wb / b.each / 1e9,
            b.once * 1e3,
            wb / b.once / 1e9,
            b.relative
        ));
    }
    if let (Some(c), Some(nd), Some(fr), Some(fl), Some(fs)) =
        (chain, synced, free, flow, flow_synced)
    {
        rep.check(
            c.differing == 0,
            format!("{format}: the chained GEMVs' LM head differs from the decode GEMV's"),
        );
        rep.check(
            fl.differing == 0,
            format!("{format}: the dataflow chain's LM head differs from the decode GEMV's"),
        );
        profiles.push(format!(
            "\n{format} persistent-step probe (kernels/gemv_chain.cu, tiles of {} rows, one block per multiprocessor) on the step's {} GEMVs, ms per replay: launched once per GEMV {:.3} ({:.0} GB/s), all in one launch with a grid barrier between GEMVs {:.3} ({:.0} GB/s); in one launch without the barriers, each GEMV's input taken by segments of 32 chunks as the previous GEMV's tiles that would produce them are counted done {:.3} ({:.0} GB/s; launched once per GEMV {:.3}); not multiplying: {:.3} against {:.3} (by segments: {:.3}, launched once per GEMV {:.3}); streaming alone (no barriers, no staging): {:.3} against {:.3} ({:.0} GB/s in one launch); the decode GEMVs {:.3} ({:.0} GB/s); LM head after the chain against the decode GEMV: {} of {} logits differ (must be 0), after the dataflow chain {}\n",
            niwaki_cuda::plan::CHAIN_WARPS,
            c.gemvs,
            c.each * 1e3,
            wb / c.each / 1e9,
            c.once * 1e3,
            wb / c.once / 1e9,
            fl.once * 1e3,
            wb / fl.once / 1e9,
            fl.each * 1e3,
            nd.each * 1e3,
            nd.once * 1e3,
            fs.once * 1e3,
            fs.each * 1e3,
            fr.each * 1e3,
            fr.once * 1e3,
            wb / fr.once / 1e9,
            gemvs * 1e3,
            wb / gemvs / 1e9,
            c.differing,
            g.vocab(),
            fl.differing
        ));
        profiles.push(format!(
            "\n{format}: where one launch of the chain's blocks waited, µs a block, mean / largest\n\n| mode | block | producer waiting for room | consumer warp 0 in the barriers (block and grid) | its staging activations | its waiting for tiles | tiles | signaller's fences | clock GHz |\n|---|---|---|---|---|---|---|---|---|\n{}",
            [
                ("multiplying", c),
                ("multiplying, by segments (barriers: the segments' waits)", fl),
                ("not multiplying", nd),
                ("not multiplying, by segments", fs),
                ("streaming alone", fr),
            ]
                .into_iter()
                .chain(binary.map(|b| ("multiplying, binary MMAs", b)))
                .map(|(name, t)| {
                    let w = &t.waits;
                    let f = |v: [f64; 2]| format!("{:.1} / {:.1}", v[0], v[1]);
                    format!(
                        "| {name} | {} | {} | {} | {} | {} | {} | {} | {:.3} / {:.3} |\n",
                        f(w.block),
                        f(w.producer),
                        f(w.barrier),
                        f(w.staging),
                        f(w.tile_wait),
                        f(w.tiles),
                        f(w.fences),
                        w.clock_ghz[0],
                        w.clock_ghz[1]
                    )
                })
                .collect::<String>()
        ));
    }
    Ok(())
}

/// The probe alone on 27B models of `formats`: each model's decode GEMVs in the cut-down
/// graph, then the probe.
pub(crate) fn chain_section(rep: &mut Report, formats: &[Format]) -> R<()> {
    let mut profiles = Vec::new();
    for &format in formats {
        let g = crate::bench::load_27b(format)?;
        let wb = g.weight_bytes() as f64;
        let mut st = g.new_state(4096)?;
        g.forward_greedy(&mut st, &[1, 2, 3, 4])?;
        let gemvs = g.time_decode_subset(&mut st, &is_gemv)?;
        chain_probe(rep, &g, &mut st, format, wb, gemvs, &mut profiles)?;
    }
    for p in profiles {
        rep.line(p);
    }
    Ok(())
}
