//! Short passes run token by token (`plan::short_passes`, `CudaModel::set_step_tokens`): the
//! same bits as the tokens fed one call at a time, and as near the CPU engine as a pass; and
//! short passes multiplied on the tensor cores (`Gpu::set_gemm_min_tokens`, in narrow tiles:
//! `Gpu::set_hgemm_narrow`) as near it.

use model::synth::Preset;
use model::Logits;
use niwaki_cuda::CudaModel;
use quant::Format;

use crate::report::*;

/// The tokens before the short pass: more than a stepped pass takes, so a pass as the model
/// runs it.
const HISTORY: usize = 20;
/// The short passes' lengths, and the longest a stepped pass takes in the check.
const LENGTHS: [usize; 5] = [2, 3, 5, 8, 15];
const STEPPED: usize = 15;

pub(crate) fn step_checks(rep: &mut Report) -> R<()> {
    rep.line(format!("Short passes token by token: after a {HISTORY}-token pass, a pass of n tokens (n in {LENGTHS:?}) with passes of up to {STEPPED} tokens stepped, against the same tokens fed one call each (every logit bit of the last row equal, and the greedy pick of a stepped greedy call equal to the one-call-each pick) and against the CPU engine (relative L2 of the last row under 0.2, the whole-model rule), beside the pass as the model runs it unstepped; and the pass with its matrices multiplied on the tensor cores from two tokens on, in the f16 GEMM's narrowest tiles that hold it, against the CPU engine by the same rule."));
    rep.line("");
    rep.line("| preset | format | result | bits as one call each | picks as one call each | stepped vs CPU (worst) | pass vs CPU (worst) | tensor-core pass vs CPU (worst) |");
    rep.line("|---|---|---|---|---|---|---|---|");
    for (preset, vocab, format) in [
        (Preset::Tiny, 1000usize, Format::Q2_0),
        (Preset::Small, 4096, Format::Q1_0),
        (Preset::Small, 4096, Format::Q2_0),
    ] {
        let m = random_model(&preset.shape(vocab), format, 23)?;
        let g = CudaModel::load(&m)?;
        let tok = |i: usize| ((i * 397 + 11) % vocab) as u32;
        let history: Vec<u32> = (0..HISTORY).map(tok).collect();
        let (mut bits, mut picks) = (0, 0);
        let (mut stepped_cpu, mut pass_cpu, mut gemm_cpu) = (0f64, 0f64, 0f64);
        for n in LENGTHS {
            let short: Vec<u32> = (HISTORY..HISTORY + n).map(tok).collect();
            let mut cs = m.new_state();
            m.forward(&mut cs, &history, Logits::None)?;
            let cpu = m.forward(&mut cs, &short, Logits::Last)?;
            let fresh = || -> R<_> {
                let mut st = g.new_state(256)?;
                g.forward(&mut st, &history, Logits::None)?;
                Ok(st)
            };
            let previous = g.set_step_tokens(0);
            let mut st = fresh()?;
            let pass = g.forward(&mut st, &short, Logits::Last)?;
            let min = g.gpu().set_gemm_min_tokens(2);
            let narrow = g.gpu().set_hgemm_narrow(true);
            let gemm = fresh().and_then(|mut st| Ok(g.forward(&mut st, &short, Logits::Last)?));
            g.gpu().set_gemm_min_tokens(min);
            g.gpu().set_hgemm_narrow(narrow);
            gemm_cpu = gemm_cpu.max(rel_l2(&gemm?, &cpu));
            // One call a token, then the last pick from one-token calls.
            let mut st = fresh()?;
            let mut each = Vec::new();
            for &t in &short {
                each = g.forward(&mut st, &[t], Logits::Last)?;
            }
            let mut st = fresh()?;
            for &t in &short[..n - 1] {
                g.forward(&mut st, &[t], Logits::None)?;
            }
            let each_pick = g.forward_greedy(&mut st, &short[n - 1..])?;
            g.set_step_tokens(STEPPED);
            let mut st = fresh()?;
            let stepped = g.forward(&mut st, &short, Logits::Last);
            let stepped_pick = g.forward_greedy(&mut fresh()?, &short);
            g.set_step_tokens(previous);
            let (stepped, stepped_pick) = (stepped?, stepped_pick?);
            let same_bits = stepped.len() == each.len()
                && stepped
                    .iter()
                    .zip(&each)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
            bits += usize::from(same_bits && st.len() == HISTORY + n);
            picks += usize::from(stepped_pick == each_pick);
            stepped_cpu = stepped_cpu.max(rel_l2(&stepped, &cpu));
            pass_cpu = pass_cpu.max(rel_l2(&pass, &cpu));
        }
        let k = LENGTHS.len();
        let ok = bits == k && picks == k && stepped_cpu < 0.2 && gemm_cpu < 0.2;
        rep.line(format!(
            "| {preset:?} | {format} | {} | {bits}/{k} | {picks}/{k} | {stepped_cpu:.2e} | {pass_cpu:.2e} | {gemm_cpu:.2e} |",
            if ok { "PASS" } else { "FAIL" }
        ));
        rep.check(ok, format!("stepped passes {preset:?} {format}"));
    }
    Ok(())
}
