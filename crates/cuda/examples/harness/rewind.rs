//! A sequence rewound to a checkpoint (`CudaModel::save`, `CudaModel::rewind`) against fresh
//! ones fed the same tokens, bit for bit.

use model::synth::Preset;
use model::Logits;
use niwaki_cuda::{CudaModel, CudaState, KvCache};
use quant::Format;

use crate::report::*;

/// Greedy steps before the checkpoint: the last one leaves a step run ahead when it is saved.
const BEFORE: usize = 3;

/// What the calls after the checkpoint gave: greedy picks (each step feeding the previous
/// pick, so that the steps run ahead of the host), a 20-token pass's (the chunked recurrence)
/// and a one-token pass's last rows of logits (their bits), more greedy picks (the last step
/// left run ahead), and the state's length.
#[derive(PartialEq)]
struct After {
    picks: Vec<u32>,
    logits: Vec<u32>,
    len: usize,
}

/// Greedy steps from `first`, each feeding the previous pick.
fn greedy(g: &CudaModel, st: &mut CudaState, first: u32, n: usize) -> R<Vec<u32>> {
    let mut picks = vec![g.forward_greedy(st, &[first])?];
    while picks.len() < n {
        let t = *picks.last().ok_or("no pick")?;
        picks.push(g.forward_greedy(st, &[t])?);
    }
    Ok(picks)
}

/// A state after the prompt and the greedy steps before the checkpoint.
fn before(g: &CudaModel, prompt: &[u32], ctx: usize) -> R<CudaState> {
    let mut st = g.new_state(ctx)?;
    g.forward(&mut st, prompt, Logits::Last)?;
    greedy(g, &mut st, 7, BEFORE)?;
    Ok(st)
}

/// The calls after the checkpoint, their tokens set by `seed` (runs with other seeds feed
/// other tokens than the ones the rewound state saw).
fn after(g: &CudaModel, st: &mut CudaState, vocab: usize, seed: usize) -> R<After> {
    let tok = |i: usize| ((i * 131 + seed * 977 + 3) % vocab) as u32;
    let mut picks = greedy(g, st, tok(0), 6)?;
    let pass: Vec<u32> = (1..21).map(tok).collect();
    let mut logits = g.forward(st, &pass, Logits::Last)?;
    logits.extend(g.forward(st, &[tok(21)], Logits::Last)?);
    picks.extend(greedy(g, st, tok(22), 4)?);
    Ok(After {
        picks,
        logits: logits.iter().map(|x| x.to_bits()).collect(),
        len: st.len(),
    })
}

pub(crate) fn rewind_checks(rep: &mut Report) -> R<()> {
    rep.line(format!("A sequence rewound to a checkpoint against fresh ones, bit for bit: a prompt, {BEFORE} greedy steps (the last run ahead of the host when saved), a checkpoint; then 6 greedy steps, a 20-token pass, a one-token pass and 4 greedy steps (the last run ahead when rewound), their tokens from a seed; rewound, the same with another seed, rewound, the first seed again. Each run must equal a fresh sequence fed the same tokens in every pick and logit bit and in its length; a checkpoint of another sequence is refused, and so is one the sequence has gone back below since (saved after the runs, then back to the first checkpoint and three other tokens), while the first still holds; and so is the row of logits of a token a rewind forgot. Prompts of 40 positions (the short attention), 400 (the split kernels) and 3,200 (the tensor-core split)."));
    rep.line("");
    rep.line("| preset | format | cache | prompt | result | runs equal to fresh ones | ahead when saved | another sequence's refused | one gone below refused | forgotten row refused |");
    rep.line("|---|---|---|---|---|---|---|---|---|---|");
    let ctx = 4096;
    for (preset, vocab, format, kv, prompt_len) in [
        (Preset::Tiny, 1000usize, Format::Q2_0, KvCache::F16, 40usize),
        (Preset::Small, 4096, Format::Q1_0, KvCache::F16, 3200),
        (Preset::Small, 4096, Format::Q2_0, KvCache::Q8_0, 400),
    ] {
        let m = random_model(&preset.shape(vocab), format, 21)?;
        let mut g = CudaModel::load(&m)?;
        g.kv_cache = kv;
        // On for the check whatever the default (plan::CHECKPOINTS).
        g.set_checkpoints(true);
        let prompt: Vec<u32> = (0..prompt_len)
            .map(|i| ((i * 397 + 1) % vocab) as u32)
            .collect();
        let mut want = Vec::new();
        for seed in [1, 2] {
            let mut fresh = before(&g, &prompt, ctx)?;
            want.push(after(&g, &mut fresh, vocab, seed)?);
        }
        let mut st = before(&g, &prompt, ctx)?;
        let ahead = st.ahead_pending();
        let mut at = None;
        g.save(&st, &mut at)?;
        let at = at.ok_or("no checkpoint saved")?;
        let mut equal = 0;
        // A rewound state has no row of logits until its next pass.
        let mut rows_refused = true;
        for (run, seed) in [1usize, 2, 1].into_iter().enumerate() {
            if run > 0 {
                g.rewind(&mut st, &at)?;
                rows_refused &= g.last_row(&mut st).is_err();
            }
            equal += usize::from(after(&g, &mut st, vocab, seed)? == want[seed - 1]);
        }
        let mut short = g.new_state(ctx)?;
        g.forward(&mut short, &prompt[..prompt_len / 2], Logits::Last)?;
        let refused = g.rewind(&mut short, &at).is_err();
        let mut past = None;
        g.save(&st, &mut past)?;
        let past = past.ok_or("no checkpoint saved")?;
        g.rewind(&mut st, &at)?;
        g.forward(&mut st, &prompt[..3], Logits::Last)?;
        let below = g.rewind(&mut st, &past).is_err() && g.rewind(&mut st, &at).is_ok();
        let ok = equal == 3 && refused && below && rows_refused;
        rep.line(format!(
            "| {preset:?} | {format} | {kv:?} | {prompt_len} | {} | {equal}/3 | {ahead} | {refused} | {below} | {rows_refused} |",
            if ok { "PASS" } else { "FAIL" }
        ));
        rep.check(ok, format!("rewind {preset:?} {format} {kv:?}"));
    }
    Ok(())
}
