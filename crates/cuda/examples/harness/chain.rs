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
    if let (Some(c), Some(nd), Some(fr)) = (chain, synced, free) {
        rep.check(
            c.differing == 0,
            format!("{format}: the chained GEMVs' LM head differs from the decode GEMV's"),
        );
        profiles.push(format!(
            "\n{format} persistent-step probe (kernels/gemv_chain.cu, tiles of {} rows, one block per multiprocessor) on the step's {} GEMVs, ms per replay: launched once per GEMV {:.3} ({:.0} GB/s), all in one launch with a grid barrier between GEMVs {:.3} ({:.0} GB/s); not multiplying: {:.3} against {:.3}; streaming alone (no barriers, no staging): {:.3} against {:.3} ({:.0} GB/s in one launch); the decode GEMVs {:.3} ({:.0} GB/s); LM head after the chain against the decode GEMV: {} of {} logits differ (must be 0)\n",
            niwaki_cuda::plan::CHAIN_WARPS,
            c.gemvs,
            c.each * 1e3,
            wb / c.each / 1e9,
            c.once * 1e3,
            wb / c.once / 1e9,
            nd.each * 1e3,
            nd.once * 1e3,
            fr.each * 1e3,
            fr.once * 1e3,
            wb / fr.once / 1e9,
            gemvs * 1e3,
            wb / gemvs / 1e9,
            c.differing,
            g.vocab()
        ));
        profiles.push(format!(
            "\n{format}: where one launch of the chain's blocks waited, µs a block, mean / largest\n\n| mode | block | producer waiting for room | consumer warp 0 in the barriers (block and grid) | its staging activations | its waiting for tiles | tiles | clock GHz |\n|---|---|---|---|---|---|---|---|\n{}",
            [("multiplying", c), ("not multiplying", nd), ("streaming alone", fr)]
                .iter()
                .map(|(name, t)| {
                    let w = &t.waits;
                    let f = |v: [f64; 2]| format!("{:.1} / {:.1}", v[0], v[1]);
                    format!(
                        "| {name} | {} | {} | {} | {} | {} | {} | {:.3} / {:.3} |\n",
                        f(w.block),
                        f(w.producer),
                        f(w.barrier),
                        f(w.staging),
                        f(w.tile_wait),
                        f(w.tiles),
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
