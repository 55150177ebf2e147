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
    for blocks in 1..=4 {
        let chain = g.time_gemv_chain(st, true, blocks)?;
        let chain_nodot = g.time_gemv_chain(st, false, blocks)?;
        let (Some(c), Some(nd)) = (chain, chain_nodot) else {
            profiles.push(format!(
                "\n{format} persistent-step probe, {blocks} blocks per multiprocessor: none (the format has no probe kernel, or the blocks and their tiles do not fit)\n"
            ));
            continue;
        };
        rep.check(
            c.differing == 0,
            format!(
                "{format}: the chained GEMVs' LM head ({blocks} blocks per multiprocessor) differs from the decode GEMV's"
            ),
        );
        let warps = if blocks == 1 {
            niwaki_cuda::plan::CHAIN_WARPS
        } else {
            niwaki_cuda::plan::CHAIN_WARPS_SHARED
        };
        profiles.push(format!(
            "\n{format} persistent-step probe (kernels/gemv_chain.cu, tiles of {warps} rows, {blocks} blocks per multiprocessor) on the step's {} GEMVs, ms per replay: launched once per GEMV {:.3} ({:.0} GB/s), all in one launch with a grid barrier between GEMVs {:.3} ({:.0} GB/s); not multiplying: {:.3} against {:.3}; the decode GEMVs {:.3} ({:.0} GB/s); LM head after the chain against the decode GEMV: {} of {} logits differ (must be 0)\n",
            c.gemvs,
            c.each * 1e3,
            wb / c.each / 1e9,
            c.once * 1e3,
            wb / c.once / 1e9,
            nd.each * 1e3,
            nd.once * 1e3,
            gemvs * 1e3,
            wb / gemvs / 1e9,
            c.differing,
            g.vocab()
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
