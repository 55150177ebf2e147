//! Prompt-lookup drafting in the generation loop, on the tiny oracle model: the same tokens,
//! text, finish and final state as one token a pass, however the generation ends (the token
//! budget, the context, an end token, a stop string, the caller), from an empty state or one
//! that held tokens before; never taken where the device does not verify drafts or the
//! sampling is random.

mod common;

use common::{tiny, Counting};
use engine::{
    generate, generate_with, Backend, DraftStats, FinishReason, Flow, GenerateParams, Hooks,
    LookupConfig, SamplerConfig,
};
use model::{Checkpoint, Logits, Model, State};
use tokenizer::Tokenizer;

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
/// `limit`: a context shorter than the model's, which no pass may run past.
struct Steered<'a> {
    m: &'a Model,
    limit: Option<usize>,
}

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
        self.limit.unwrap_or(self.m.context_length(s))
    }
    fn forward(&self, s: &mut State, t: &[u32], l: Logits) -> engine::Result<Vec<f32>> {
        if let Some(limit) = self.limit {
            assert!(s.len() + t.len() <= limit, "a pass past the context");
        }
        let mut rows = Backend::forward(self.m, s, t, l)?;
        let vocab = self.m.config.vocab;
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
        self.m.save(s, into)
    }
    fn rewind(&self, s: &mut State, to: &Checkpoint) -> engine::Result<()> {
        self.m.rewind(s, to)
    }
}

/// How a generation is ended from outside: the caller's hooks stop it at the `n`th token
/// (`on_token`), at the `n`th piece of text (`on_text`) or by cancelling before the `n`th
/// token; or nothing does.
#[derive(Clone, Copy, Debug)]
enum End {
    Never,
    Token(usize),
    Text(usize),
    Cancel(usize),
}

/// Hooks that end a generation as `End` says, reading no logits.
struct Ender {
    end: End,
    tokens: usize,
    pieces: usize,
}

impl Hooks for Ender {
    fn on_text(&mut self, _: &str) -> Flow {
        self.pieces += 1;
        match self.end {
            End::Text(n) if self.pieces >= n => Flow::Stop,
            _ => Flow::Continue,
        }
    }
    fn on_token(&mut self, _: u32, _: &[f32]) -> Flow {
        self.tokens += 1;
        match self.end {
            End::Token(n) if self.tokens >= n => Flow::Stop,
            _ => Flow::Continue,
        }
    }
    fn cancelled(&self) -> bool {
        matches!(self.end, End::Cancel(n) if self.tokens >= n)
    }
    fn wants_logits(&self) -> bool {
        false
    }
}

/// Generates after `pre` (consumed first) and `prompt` with `p`, one token a pass and with
/// `lookup`, and requires the same tokens, text, finish and final state (every value equal: the
/// rewind copies the recurrent part as saved and zeroes cache positions as a fresh cache holds
/// them, so no ±0 or NaN can differ); what drafting did.
fn same_both_ways(
    b: &Steered,
    tok: &Tokenizer,
    pre: &[u32],
    prompt: &[u32],
    p: &GenerateParams,
    lookup: LookupConfig,
    end: End,
) -> (DraftStats, FinishReason) {
    let what = format!(
        "{} tokens before, budget {}, stops {:?} {:?}, {lookup:?}",
        pre.len(),
        p.max_tokens,
        p.stop_tokens,
        p.stop_strings
    );
    let run = |lookup| {
        let mut st = b.m.new_state();
        if !pre.is_empty() {
            b.m.forward(&mut st, pre, Logits::None).unwrap();
        }
        let mut hooks = Ender {
            end,
            tokens: 0,
            pieces: 0,
        };
        let p = GenerateParams {
            lookup,
            ..p.clone()
        };
        let g = generate_with(b, tok, &mut st, prompt, &p, &mut hooks).unwrap();
        (g, st)
    };
    let (a, sa) = run(None);
    let (c, sc) = run(Some(lookup));
    assert_eq!(a.drafts, DraftStats::default());
    assert_eq!(
        (&a.tokens, &a.text, a.finish),
        (&c.tokens, &c.text, c.finish),
        "{what}, {end:?}"
    );
    assert!(sa == sc, "{what}, {end:?}: the state");
    (c.drafts, c.finish)
}

/// Sums drafting statistics.
fn add(a: DraftStats, b: DraftStats) -> DraftStats {
    DraftStats {
        passes: a.passes + b.passes,
        drafted: a.drafted + b.drafted,
        accepted: a.accepted + b.accepted,
    }
}

#[test]
fn drafting_gives_the_same_tokens_text_and_state_in_fewer_passes() {
    let (m, tok) = tiny();
    let b = Steered { m: &m, limit: None };
    let prompt = tok.encode("one two three four", false).unwrap();
    let small = LookupConfig {
        max_draft: 3,
        ngram_max: 2,
        ngram_min: 1,
    };
    let check = |b: &Steered, pre: &[u32], p: &GenerateParams, lookup, end| {
        same_both_ways(b, &tok, pre, &prompt, p, lookup, end)
    };
    let (d, _) = check(
        &b,
        &[],
        &params(80, None),
        LookupConfig::default(),
        End::Never,
    );
    // Drafts taken, and some refused: both the accepting and the rewinding path ran.
    assert!(
        d.passes > 0 && d.accepted > 0 && d.accepted < d.drafted,
        "{d:?}"
    );

    // Every budget, from an empty state and from one that held 13 tokens before the prompt.
    let pre: Vec<u32> = (0..13).map(|i| 20 + 3 * i).collect();
    for max_tokens in 1..=81 {
        let p = params(max_tokens, None);
        for (before, lookup) in [
            (&[][..], LookupConfig::default()),
            (&[][..], small),
            (&pre[..], small),
        ] {
            check(&b, before, &p, lookup, End::Never);
        }
    }

    // Ends inside an accepted draft, where the state holds drafted tokens the one-token loop
    // would not have consumed (the token just shown, or more) and must be taken back.
    for make in [End::Token, End::Text, End::Cancel] {
        let mut total = DraftStats::default();
        for n in 1..80 {
            // From the state with tokens before the prompt on every other count.
            let befores = if n % 2 == 0 {
                &[&[][..], &pre[..]][..]
            } else {
                &[&[][..]][..]
            };
            for &before in befores {
                let (d, _) = check(&b, before, &params(80, None), small, make(n));
                total = add(total, d);
            }
        }
        assert!(total.accepted > 0, "{:?}: {total:?}", make(1));
    }

    // A context that ends at each position: no pass runs past it (Steered asserts so).
    let plain_len = prompt.len();
    for room in 1..=81 {
        let short = Steered {
            m: &m,
            limit: Some(plain_len + room),
        };
        check(
            &short,
            &[],
            &params(80, None),
            LookupConfig::default(),
            End::Never,
        );
    }

    // An end token inside the runs that come back: drafts are cut before it, and it ends the
    // generation unconsumed as it does one token a pass.
    let mut st = m.new_state();
    let plain = generate(&b, &tok, &mut st, &prompt, &params(80, None), |_| {
        Flow::Continue
    })
    .unwrap();
    for &end in &plain.tokens[30..40] {
        let mut p = params(80, None);
        p.stop_tokens = vec![end];
        let (d, finish) = check(&b, &[], &p, LookupConfig::default(), End::Never);
        assert_eq!(finish, FinishReason::Stop);
        assert!(d.accepted > 0, "{d:?}");
    }

    // Stop strings: each token's text in turn.
    let texts: Vec<String> = plain
        .tokens
        .iter()
        .map(|&t| tok.decode(&[t]).unwrap())
        .filter(|t| !t.trim().is_empty())
        .collect();
    for stop in texts {
        let mut p = params(80, None);
        p.stop_strings = vec![stop.clone()];
        check(&b, &[], &p, LookupConfig::default(), End::Never);
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
