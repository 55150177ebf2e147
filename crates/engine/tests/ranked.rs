//! Sampling with a top-k limit from the k candidates a device selected
//! (`Backend::forward_top_k`) against sampling from the whole row: the same tokens, draw for
//! draw, and the device path taken only where nothing needs the logits.

use std::cell::Cell;
use std::path::PathBuf;

use engine::{
    generate, generate_with, Backend, Flow, GenerateParams, Hooks, Ranked, Sampler, SamplerConfig,
};
use model::{Logits, Model, State};
use tokenizer::Tokenizer;

fn tiny() -> (Model, Tokenizer) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/oracle/tiny-exact-q1.Q1_0.gguf");
    let model = Model::open(path).unwrap();
    let spec = tokenizer::spec_from_metadata(model.file().metadata()).unwrap();
    (model, Tokenizer::new(&spec).unwrap())
}

/// xorshift rows with few distinct values (ties), some NaN, some rows with ±∞.
fn rows(n: usize, len: usize, seed: u32) -> Vec<Vec<f32>> {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        s
    };
    (0..n)
        .map(|r| {
            (0..len)
                .map(|_| match next() % 1000 {
                    0 => f32::NAN,
                    1 if r % 4 == 3 => f32::INFINITY,
                    2 if r % 4 == 2 => f32::NEG_INFINITY,
                    v => (v % 53) as f32 * 0.37 - 9.0,
                })
                .collect()
        })
        .collect()
}

#[test]
fn a_draw_from_the_top_k_is_the_draw_from_the_row() {
    let configs = [
        (20, 0.6, 0.95, 0.0),
        (1, 1.0, 1.0, 0.0),
        (5, 1.3, 1.0, 0.05),
        (300, 0.8, 0.9, 0.01),
        (4000, 2.0, 1.0, 0.0),
    ];
    let mut ranked_draws = 0;
    for (i, &(top_k, temperature, top_p, min_p)) in configs.iter().enumerate() {
        let cfg = SamplerConfig {
            temperature,
            top_k,
            top_p,
            min_p,
            seed: 7 + i as u64,
            ..SamplerConfig::default()
        };
        let mut whole = Sampler::new(cfg.clone()).unwrap();
        let mut ranked = Sampler::new(cfg).unwrap();
        let (k, t) = ranked.ranked_draw().unwrap();
        assert_eq!((k, t), (top_k, temperature));
        for mut row in rows(40, 3000, 11 + i as u32) {
            let got = match Ranked::of_row(row.clone(), k, t) {
                Ranked::Top(top) => {
                    ranked_draws += 1;
                    ranked.sample_ranked(&top).unwrap()
                }
                Ranked::Row(mut r) => ranked.sample(&mut r, &[]).unwrap(),
            };
            assert_eq!(got, whole.sample(&mut row, &[]).unwrap());
        }
    }
    assert!(ranked_draws > 100, "{ranked_draws}");
    // No finite logit: both refuse.
    let mut s = Sampler::new(SamplerConfig {
        temperature: 1.0,
        top_k: 3,
        ..SamplerConfig::default()
    })
    .unwrap();
    let top = match Ranked::of_row(vec![f32::NAN; 4], 3, 1.0) {
        Ranked::Top(top) => top,
        Ranked::Row(_) => panic!("a row of NaN has no infinity"),
    };
    assert!(s.sample_ranked(&top).is_err());
    assert!(s.sample(&mut [f32::NAN; 4], &[]).is_err());
}

#[test]
fn only_random_draws_with_a_top_k_and_no_penalties_are_ranked_draws() {
    let with = |f: fn(&mut SamplerConfig)| {
        let mut c = SamplerConfig {
            temperature: 0.7,
            top_k: 20,
            ..SamplerConfig::default()
        };
        f(&mut c);
        Sampler::new(c).unwrap().ranked_draw()
    };
    assert_eq!(with(|_| {}), Some((20, 0.7)));
    assert_eq!(with(|c| c.temperature = 0.0), None);
    assert_eq!(with(|c| c.top_k = 0), None);
    assert_eq!(with(|c| c.repetition_penalty = 1.1), None);
    assert_eq!(with(|c| c.presence_penalty = 0.5), None);
    assert_eq!(with(|c| c.frequency_penalty = -0.5), None);
}

/// The CPU model as a device that selects the top k itself, counting the calls.
struct Selecting<'a> {
    m: &'a Model,
    rows: Cell<usize>,
    ranked: Cell<usize>,
}

impl Backend for Selecting<'_> {
    type State = State;
    fn state_len(&self, s: &State) -> usize {
        s.len()
    }
    fn context_length(&self, s: &State) -> usize {
        self.m.context_length(s)
    }
    fn forward(&self, s: &mut State, t: &[u32], l: Logits) -> engine::Result<Vec<f32>> {
        self.rows.set(self.rows.get() + 1);
        Backend::forward(self.m, s, t, l)
    }
    fn forward_top_k(
        &self,
        s: &mut State,
        t: &[u32],
        k: usize,
        temperature: f32,
    ) -> engine::Result<Ranked> {
        self.ranked.set(self.ranked.get() + 1);
        let row = Backend::forward(self.m, s, t, Logits::Last)?;
        Ok(Ranked::of_row(row, k, temperature))
    }
}

/// Text-only hooks that nonetheless read the logits (as logprobs or a grammar would).
struct ReadsLogits;

impl Hooks for ReadsLogits {
    fn on_text(&mut self, _: &str) -> Flow {
        Flow::Continue
    }
}

#[test]
fn generation_from_device_candidates_equals_generation_from_rows() {
    let (m, tok) = tiny();
    let prompt = tok.encode("Once upon a time", false).unwrap();
    let params = GenerateParams {
        max_tokens: 32,
        sampler: SamplerConfig {
            temperature: 1.2,
            top_k: 40,
            top_p: 0.95,
            seed: 3,
            ..SamplerConfig::default()
        },
        ..GenerateParams::default()
    };
    let b = Selecting {
        m: &m,
        rows: Cell::new(0),
        ranked: Cell::new(0),
    };
    let mut st = m.new_state();
    let fast = generate(&b, &tok, &mut st, &prompt, &params, |_| Flow::Continue).unwrap();
    assert!(fast.tokens.len() > 4, "{:?}", fast.tokens);
    // The prompt's logits come as a row; every later draw from the device's candidates.
    assert_eq!(b.rows.get(), 1);
    assert!(b.ranked.get() + 1 >= fast.tokens.len());

    let mut st = m.new_state();
    let plain = generate(&m, &tok, &mut st, &prompt, &params, |_| Flow::Continue).unwrap();
    assert_eq!(fast.tokens, plain.tokens);
    assert_eq!(fast.text, plain.text);

    // Hooks that read the logits keep the rows.
    b.ranked.set(0);
    let mut st = m.new_state();
    let read = generate_with(&b, &tok, &mut st, &prompt, &params, &mut ReadsLogits).unwrap();
    assert_eq!(b.ranked.get(), 0);
    assert_eq!(read.tokens, plain.tokens);
}
