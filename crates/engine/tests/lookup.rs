//! Prompt-lookup drafting in the generation loop, on the tiny oracle model: the same tokens,
//! text and final state as one token a pass, whatever the token budget cuts, with drafts
//! accepted; never taken where the device does not verify drafts or someone reads the logits.

mod common;

use common::{tiny, Counting};
use engine::{
    generate, generate_with, Backend, FinishReason, Flow, GenerateParams, Generation, Hooks,
    LookupConfig, SamplerConfig,
};
use model::{Checkpoint, Logits, Model, State};

fn params(max_tokens: usize, lookup: Option<LookupConfig>) -> GenerateParams {
    GenerateParams {
        max_tokens,
        lookup,
        ..GenerateParams::default()
    }
}

/// The CPU model with its logits steered: after a token t with t % 3 ≠ 0, the token
/// 100 + (7t + 3) mod 50 is raised far above the rest, so that the greedy output falls into
/// runs that come back (the tiny random model's own rarely do) while every third token or so is
/// still the model's pick. The steer depends on the row's own input token alone, so several-token
/// passes still give one-token passes' rows, and drafts are verified on the model's real state.
struct Steered<'a>(&'a Model);

fn steer(t: u32) -> Option<u32> {
    (!t.is_multiple_of(3)).then(|| 100 + (7 * t + 3) % 50)
}

impl Backend for Steered<'_> {
    type State = State;
    type Checkpoint = Checkpoint;
    fn state_len(&self, s: &State) -> usize {
        s.len()
    }
    fn context_length(&self, s: &State) -> usize {
        self.0.context_length(s)
    }
    fn forward(&self, s: &mut State, t: &[u32], l: Logits) -> engine::Result<Vec<f32>> {
        let mut rows = Backend::forward(self.0, s, t, l)?;
        let vocab = self.0.config.vocab;
        let inputs = match l {
            Logits::All => t,
            Logits::Last => &t[t.len() - 1..],
            Logits::None => &[],
        };
        for (row, &input) in rows.chunks_exact_mut(vocab).zip(inputs) {
            if let Some(to) = steer(input) {
                row[to as usize] += 1000.0;
            }
        }
        Ok(rows)
    }
    fn verifies_drafts(&self) -> bool {
        true
    }
    fn save(&self, s: &State, into: &mut Checkpoint) -> engine::Result<()> {
        self.0.save(s, into)
    }
    fn rewind(&self, s: &mut State, to: &Checkpoint) -> engine::Result<()> {
        self.0.rewind(s, to)
    }
}

#[test]
fn drafting_gives_the_same_tokens_text_and_state_in_fewer_passes() {
    let (m, tok) = tiny();
    let b = Steered(&m);
    let prompt = tok.encode("one two three four", false).unwrap();
    let run = |max_tokens, lookup| {
        let mut st = m.new_state();
        let g = generate(
            &b,
            &tok,
            &mut st,
            &prompt,
            &params(max_tokens, lookup),
            |_| Flow::Continue,
        )
        .unwrap();
        (g, st)
    };
    let (plain, plain_state) = run(80, None);
    assert!(plain.tokens.len() > 40, "{:?}", plain.tokens);
    assert_eq!(plain.drafts, Default::default());
    let (drafted, drafted_state) = run(80, Some(LookupConfig::default()));
    let same = |a: &Generation, b: &Generation| {
        a.tokens == b.tokens && a.text == b.text && a.finish == b.finish
    };
    assert!(
        same(&plain, &drafted),
        "{:?}\n{:?}",
        plain.tokens,
        drafted.tokens
    );
    assert_eq!(plain_state, drafted_state);
    let d = drafted.drafts;
    // Drafts taken, and some refused: both the accepting and the rewinding path ran.
    assert!(
        d.passes > 0 && d.accepted > 0 && d.accepted < d.drafted,
        "{d:?}"
    );

    // Every budget: the generation may end inside an accepted draft, where the state holds
    // drafted tokens the one-token loop would not have consumed, and must be taken back.
    for max_tokens in 1..=plain.tokens.len() + 1 {
        for config in [
            LookupConfig::default(),
            LookupConfig {
                max_draft: 3,
                ngram_max: 2,
                ngram_min: 1,
            },
        ] {
            let (a, sa) = run(max_tokens, None);
            let (b, sb) = run(max_tokens, Some(config));
            assert!(same(&a, &b), "budget {max_tokens}, {config:?}");
            assert_eq!(sa, sb, "budget {max_tokens}, {config:?}: the state");
        }
    }

    // Ends the budget cannot foresee: a stop string (each token's text in turn; here their
    // first occurrences come before the output repeats), and the caller stopping after each
    // count of tokens, inside accepted drafts too. The state must hold what the one-token
    // loop's does.
    let texts: Vec<String> = plain
        .tokens
        .iter()
        .map(|&t| tok.decode(&[t]).unwrap())
        .filter(|t| !t.trim().is_empty())
        .collect();
    for stop in texts {
        let run_stop = |lookup| {
            let mut p = params(80, lookup);
            p.stop_strings = vec![stop.clone()];
            let mut st = m.new_state();
            let g = generate(&b, &tok, &mut st, &prompt, &p, |_| Flow::Continue).unwrap();
            (g, st)
        };
        let (a, sa) = run_stop(None);
        let (c, sc) = run_stop(Some(LookupConfig::default()));
        assert!(same(&a, &c), "stop {stop:?}");
        assert_eq!(sa, sc, "stop {stop:?}: the state");
    }
    for after in 1..plain.tokens.len() {
        let run_cancel = |lookup| {
            let mut st = m.new_state();
            let mut hooks = StopAfter(after);
            let g =
                generate_with(&b, &tok, &mut st, &prompt, &params(80, lookup), &mut hooks).unwrap();
            (g, st)
        };
        let (a, sa) = run_cancel(None);
        let (c, sc) = run_cancel(Some(LookupConfig::default()));
        assert!(
            same(&a, &c) && a.finish == FinishReason::Cancelled,
            "after {after}"
        );
        assert_eq!(sa, sc, "cancelled after {after}: the state");
    }
}

/// Stops generation when the given number of tokens have been taken, reading no logits.
struct StopAfter(usize);

impl Hooks for StopAfter {
    fn on_text(&mut self, _: &str) -> Flow {
        Flow::Continue
    }
    fn on_token(&mut self, _: u32, _: &[f32]) -> Flow {
        if self.0 == 0 {
            return Flow::Stop;
        }
        self.0 -= 1;
        Flow::Continue
    }
    fn wants_logits(&self) -> bool {
        false
    }
}

#[test]
fn drafting_stays_off_where_it_cannot_leave_the_output_unchanged() {
    let (m, tok) = tiny();
    let prompt = tok.encode("a b a b a b a b", false).unwrap();
    // A device that does not verify drafts: picked one token a pass.
    let b = Counting::new(&m);
    let mut st = m.new_state();
    let g = generate(
        &b,
        &tok,
        &mut st,
        &prompt,
        &params(16, Some(LookupConfig::default())),
        |_| Flow::Continue,
    )
    .unwrap();
    assert_eq!(g.drafts, Default::default());
    assert_eq!(b.rows.get(), 1);
    // Sampling at a temperature: every token drawn from its own row.
    let mut hot = params(16, Some(LookupConfig::default()));
    hot.sampler = SamplerConfig {
        temperature: 0.8,
        seed: 5,
        ..SamplerConfig::default()
    };
    let mut st = m.new_state();
    let g = generate(&m, &tok, &mut st, &prompt, &hot, |_| Flow::Continue).unwrap();
    assert_eq!(g.drafts, Default::default());
}
