//! Greedy decoding where the device picks the token (`Backend::forward_argmax`) against greedy
//! sampling from the logits, on the tiny oracle model: the same tokens, and the device path taken
//! only where nothing needs the logits.

mod common;

use common::{tiny, Counting};
use engine::{
    generate, generate_with, Backend, FinishReason, Flow, GenerateParams, Hooks, SamplerConfig,
};
use model::Logits;

/// Text-only hooks that nonetheless read the logits (as logprobs or a grammar would).
struct ReadsLogits(usize);

impl Hooks for ReadsLogits {
    fn on_text(&mut self, _: &str) -> Flow {
        Flow::Continue
    }
    fn on_token(&mut self, _: u32, logits: &[f32]) -> Flow {
        self.0 = logits.len();
        Flow::Continue
    }
}

fn params(sampler: SamplerConfig) -> GenerateParams {
    GenerateParams {
        max_tokens: 24,
        sampler,
        ..GenerateParams::default()
    }
}

#[test]
fn the_device_picks_greedy_tokens_only_where_no_one_reads_the_logits() {
    let (m, tok) = tiny();
    let prompt = tok.encode("The quick brown fox", false).unwrap();
    let b = Counting::new(&m);
    let greedy = params(SamplerConfig::default());

    let mut st = m.new_state();
    let fast = generate(&b, &tok, &mut st, &prompt, &greedy, |_| Flow::Continue).unwrap();
    assert!(fast.tokens.len() > 1, "{:?}", fast.tokens);
    // One forward for the prompt (one chunk), then the device picks every later token (an
    // end-of-generation token that stopped it included).
    assert_eq!(b.rows.get(), 1);
    let ended = usize::from(fast.finish == FinishReason::Stop);
    assert_eq!(b.picked.get(), fast.tokens.len() - 1 + ended);

    b.rows.set(0);
    b.picked.set(0);
    let mut st = m.new_state();
    let mut hooks = ReadsLogits(0);
    let slow = generate_with(&b, &tok, &mut st, &prompt, &greedy, &mut hooks).unwrap();
    assert_eq!(b.picked.get(), 0);
    assert_eq!(hooks.0, m.config.vocab);
    assert_eq!(slow.tokens, fast.tokens);
    assert_eq!(slow.text, fast.text);

    // Penalties change the pick: the logits path again.
    b.picked.set(0);
    let mut st = m.new_state();
    let penalized = params(SamplerConfig {
        repetition_penalty: 1.3,
        ..SamplerConfig::default()
    });
    generate(&b, &tok, &mut st, &prompt, &penalized, |_| Flow::Continue).unwrap();
    assert_eq!(b.picked.get(), 0);
}

/// A device whose logits are fixed.
struct Fixed(Vec<f32>);

impl Backend for Fixed {
    type State = ();
    type Checkpoint = ();
    fn state_len(&self, _: &()) -> usize {
        0
    }
    fn context_length(&self, _: &()) -> usize {
        1
    }
    fn forward(&self, _: &mut (), _: &[u32], _: Logits) -> engine::Result<Vec<f32>> {
        Ok(self.0.clone())
    }
}

#[test]
fn the_default_pick_skips_nan_and_takes_the_lowest_id_of_a_tie() {
    let pick = |v: Vec<f32>| Fixed(v).forward_argmax(&mut (), &[0]);
    assert_eq!(pick(vec![f32::NAN, 0.5, 2.0, 2.0]).unwrap(), 2);
    assert_eq!(pick(vec![f32::NEG_INFINITY, f32::NAN]).unwrap(), 0);
    assert!(pick(vec![f32::NAN, f32::NAN]).is_err());
}
