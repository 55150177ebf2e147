//! A prompt whose start the state already holds (`generate_after`), on the tiny oracle model:
//! the same reply as from a fresh state, penalties and drafts reading the whole prompt.

mod common;

use common::tiny;
use engine::{
    generate, generate_after, prefill, EngineError, Flow, GenerateParams, Hooks, LookupConfig,
    SamplerConfig,
};

/// Text ignored, the logits unread (so a greedy device picks, and drafts are looked up).
struct Quiet;

impl Hooks for Quiet {
    fn on_text(&mut self, _: &str) -> Flow {
        Flow::Continue
    }
    fn wants_logits(&self) -> bool {
        false
    }
}

/// 48 tokens, the first 30 all different and none of them among the rest.
fn prompt() -> Vec<u32> {
    (0..48u32)
        .map(|i| if i < 30 { 40 + i } else { 20 + (i * 5) % 11 })
        .collect()
}

fn penalized() -> GenerateParams {
    GenerateParams {
        max_tokens: 24,
        sampler: SamplerConfig {
            repetition_penalty: 1.5,
            presence_penalty: 0.5,
            frequency_penalty: 0.5,
            ..SamplerConfig::default()
        },
        ..GenerateParams::default()
    }
}

#[test]
fn a_cached_start_gives_the_reply_a_fresh_state_gives() {
    let (m, tok) = tiny();
    let prompt = prompt();
    for params in [
        penalized(),
        GenerateParams {
            max_tokens: 24,
            lookup: Some(LookupConfig::default()),
            ..GenerateParams::default()
        },
    ] {
        let mut fresh = m.new_state();
        let want = generate(&m, &tok, &mut fresh, &prompt, &params, |_| Flow::Continue).unwrap();
        for cached in [1, 30, prompt.len() - 1] {
            let mut st = m.new_state();
            prefill(&m, &mut st, &prompt[..cached], params.prefill_chunk).unwrap();
            let got =
                generate_after(&m, &tok, &mut st, &prompt, cached, &params, &mut Quiet).unwrap();
            assert_eq!(got.tokens, want.tokens, "{cached} cached");
            assert_eq!(got.text, want.text);
            assert_eq!(
                (got.prompt_tokens, got.cached_tokens),
                (prompt.len(), cached)
            );
            assert_eq!(st.len(), fresh.len());
        }
    }
}

#[test]
fn the_penalties_read_the_cached_tokens_too() {
    // Fed the rest alone as a prompt of its own, the penalties miss the start, and the reply
    // moves: what the cached form must not do.
    let (m, tok) = tiny();
    let prompt = prompt();
    let params = penalized();
    let mut fresh = m.new_state();
    let want = generate(&m, &tok, &mut fresh, &prompt, &params, |_| Flow::Continue).unwrap();
    let mut st = m.new_state();
    prefill(&m, &mut st, &prompt[..30], params.prefill_chunk).unwrap();
    let rest = generate(&m, &tok, &mut st, &prompt[30..], &params, |_| {
        Flow::Continue
    })
    .unwrap();
    assert_ne!(rest.tokens, want.tokens);
}

#[test]
fn what_cannot_be_skipped_is_refused() {
    let (m, tok) = tiny();
    let prompt = prompt();
    let mut hooks = Quiet;
    let mut st = m.new_state();
    prefill(&m, &mut st, &prompt[..10], 256).unwrap();
    let params = GenerateParams::default();
    // The whole prompt cached: nothing left to give the first token's logits.
    let e = generate_after(&m, &tok, &mut st, &prompt[..10], 10, &params, &mut hooks);
    assert!(matches!(
        e,
        Err(EngineError::CachedPrompt { cached: 10, .. })
    ));
    // More cached than the state holds.
    let e = generate_after(&m, &tok, &mut st, &prompt, 11, &params, &mut hooks);
    assert!(matches!(e, Err(EngineError::CachedPrompt { held: 10, .. })));
    assert_eq!(st.len(), 10);
}
