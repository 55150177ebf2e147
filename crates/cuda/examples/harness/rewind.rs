//! A sequence rewound to a checkpoint (`CudaModel::save`, `CudaModel::rewind`) against a fresh
//! one fed the same tokens, bit for bit.

use model::synth::Preset;
use model::Logits;
use niwaki_cuda::{CudaModel, CudaState, KvCache};
use quant::Format;

use crate::report::*;

const PROMPT: usize = 40;
const FREE_STEPS: usize = 12;

/// What the calls after the checkpoint gave: greedy picks (each step feeding the previous
/// pick, so that the steps run ahead of the host), a 5-token pass's and a one-token pass's
/// last rows of logits (their bits), and the state's length after them.
#[derive(PartialEq)]
struct After {
    picks: Vec<u32>,
    logits: Vec<u32>,
    len: usize,
}

fn after(g: &CudaModel, st: &mut CudaState, vocab: usize) -> R<After> {
    let mut picks = vec![g.forward_greedy(st, &[7])?];
    for _ in 0..FREE_STEPS {
        let t = *picks.last().ok_or("no pick")?;
        picks.push(g.forward_greedy(st, &[t])?);
    }
    let five: Vec<u32> = (0..5).map(|i| ((i * 131 + 3) % vocab) as u32).collect();
    let mut logits = g.forward(st, &five, Logits::Last)?;
    logits.extend(g.forward(st, &[11], Logits::Last)?);
    Ok(After {
        picks,
        logits: logits.iter().map(|x| x.to_bits()).collect(),
        len: st.len(),
    })
}

pub(crate) fn rewind_checks(rep: &mut Report) -> R<()> {
    rep.line(format!("A sequence rewound to a checkpoint against a fresh one, bit for bit: a {PROMPT}-token prompt, a checkpoint, then {} greedy steps (run ahead of the host), a 5-token pass and a one-token pass; rewound and run again twice, each run equal to the fresh sequence's in every pick and logit bit and in its length; a rewind to a later position than the state's is refused.", FREE_STEPS + 1));
    rep.line("");
    rep.line(
        "| preset | format | cache | result | runs equal to the fresh one | later rewind refused |",
    );
    rep.line("|---|---|---|---|---|---|");
    for (preset, vocab, format, kv) in [
        (Preset::Tiny, 1000usize, Format::Q2_0, KvCache::F16),
        (Preset::Small, 4096, Format::Q1_0, KvCache::F16),
        (Preset::Small, 4096, Format::Q2_0, KvCache::Q8_0),
    ] {
        let m = random_model(&preset.shape(vocab), format, 21)?;
        let mut g = CudaModel::load(&m)?;
        g.kv_cache = kv;
        // On for the check whatever the default (plan::CHECKPOINTS).
        g.set_checkpoints(true);
        let prompt: Vec<u32> = (0..PROMPT)
            .map(|i| ((i * 397 + 1) % vocab) as u32)
            .collect();
        let mut fresh = g.new_state(256)?;
        g.forward(&mut fresh, &prompt, Logits::Last)?;
        let want = after(&g, &mut fresh, vocab)?;
        let mut st = g.new_state(256)?;
        g.forward(&mut st, &prompt, Logits::Last)?;
        let mut at = None;
        g.save(&st, &mut at)?;
        let at = at.ok_or("no checkpoint saved")?;
        let mut equal = 0;
        for run in 0..3 {
            if run > 0 {
                g.rewind(&mut st, &at)?;
            }
            equal += usize::from(after(&g, &mut st, vocab)? == want);
        }
        let mut short = g.new_state(256)?;
        g.forward(&mut short, &prompt[..PROMPT / 2], Logits::Last)?;
        let refused = g.rewind(&mut short, &at).is_err();
        let ok = equal == 3 && refused;
        rep.line(format!(
            "| {preset:?} | {format} | {kv:?} | {} | {equal}/3 | {refused} |",
            if ok { "PASS" } else { "FAIL" }
        ));
        rep.check(ok, format!("rewind {preset:?} {format} {kv:?}"));
    }
    Ok(())
}
