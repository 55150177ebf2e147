//! Random sampling from the best candidates a device selected (`Backend::forward_top_k`: with a
//! top-k limit its k best, without one 256 and the row's weight sums) against sampling from the
//! whole row: the same tokens, draw for draw, and the device path taken only where nothing
//! needs the logits.

mod common;

use common::{tiny, Counting};
use engine::{
    generate, generate_with, Drawn, Flow, GenerateParams, Hooks, Ranked, RankedRequest, Sampler,
    SamplerConfig,
};

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
                    // Half the rows peaked: a few logits far above the rest.
                    3..=5 if r % 2 == 0 => 25.0 + (r % 3) as f32,
                    v => (v % 53) as f32 * 0.37 - 9.0,
                })
                .collect()
        })
        .collect()
}

/// A draw as the generation loop makes it from what a device returns for `row`.
fn device_draw(s: &mut Sampler, row: &[f32], counts: &mut [usize; 3]) -> u32 {
    let request = s.ranked_draw().unwrap();
    match request.answer(row) {
        Ranked::Top { top, sums } => match s.sample_ranked(&top, sums).unwrap() {
            Drawn::Token(id) => {
                counts[0] += 1;
                id
            }
            Drawn::NeedsRow => {
                counts[1] += 1;
                s.sample_from_row(row).unwrap()
            }
        },
        Ranked::Row(mut r) => {
            counts[2] += 1;
            s.sample(&mut r, &[]).unwrap()
        }
    }
}

#[test]
fn a_draw_from_the_best_candidates_is_the_draw_from_the_row() {
    // (top_k, temperature, top_p, min_p); top_k 0: the candidates and the weight sums.
    let configs = [
        (20, 0.6, 0.95, 0.0),
        (1, 1.0, 1.0, 0.0),
        (5, 1.3, 1.0, 0.05),
        (300, 0.8, 0.9, 0.01),
        (4000, 2.0, 1.0, 0.0),
        (0, 1.0, 1.0, 0.0),
        (0, 0.7, 0.8, 0.0),
        (0, 0.5, 0.95, 0.02),
        (0, 1.5, 1.0, 0.001),
        // Flat: most draws read past the candidates.
        (0, 4.0, 1.0, 0.0),
        (0, 3.0, 0.99, 0.0),
    ];
    let mut counts = [0usize; 3];
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
        for mut row in rows(40, 3000, 11 + i as u32) {
            let got = device_draw(&mut ranked, &row, &mut counts);
            assert_eq!(got, whole.sample(&mut row, &[]).unwrap(), "config {i}");
        }
    }
    // Every way a draw can go was taken: from the candidates alone, past them to the row, and
    // the whole row for rows with ±∞.
    assert!(counts.iter().all(|&c| c > 20), "{counts:?}");
    // No finite logit: both refuse.
    let mut s = Sampler::new(SamplerConfig {
        temperature: 1.0,
        top_k: 3,
        ..SamplerConfig::default()
    })
    .unwrap();
    let request = s.ranked_draw().unwrap();
    let Ranked::Top { top, sums } = request.answer(&[f32::NAN; 4]) else {
        panic!("a row of NaN has no infinity");
    };
    assert!(s.sample_ranked(&top, sums).is_err());
    assert!(s.sample(&mut [f32::NAN; 4], &[]).is_err());
}

#[test]
fn only_random_draws_without_penalties_are_ranked_draws() {
    let with = |f: fn(&mut SamplerConfig)| {
        let mut c = SamplerConfig {
            temperature: 0.7,
            top_k: 20,
            ..SamplerConfig::default()
        };
        f(&mut c);
        Sampler::new(c).unwrap().ranked_draw()
    };
    let top_k = |k, floor| {
        Some(RankedRequest {
            k,
            temperature: 0.7,
            floor,
        })
    };
    assert_eq!(with(|_| {}), top_k(20, None));
    assert_eq!(with(|c| c.temperature = 0.0), None);
    assert_eq!(
        with(|c| {
            c.top_k = 0;
            c.min_p = 0.1;
        }),
        top_k(engine::RANKED_CANDIDATES, Some(0.1))
    );
    assert_eq!(with(|c| c.repetition_penalty = 1.1), None);
    assert_eq!(with(|c| c.presence_penalty = 0.5), None);
    assert_eq!(with(|c| c.frequency_penalty = -0.5), None);
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
    let b = Counting::new(&m);
    let mut last_rows = 0;
    // With a top-k limit; without one (candidates and weight sums, this tiny random model's
    // flat rows sending some draws past the candidates to the row).
    for (top_k, temperature) in [(40, 1.2), (0, 1.0), (0, 0.3)] {
        let params = GenerateParams {
            max_tokens: 32,
            sampler: SamplerConfig {
                temperature,
                top_k,
                top_p: 0.95,
                seed: 3,
                ..SamplerConfig::default()
            },
            ..GenerateParams::default()
        };
        b.rows.set(0);
        b.ranked.set(0);
        let mut st = m.new_state();
        let fast = generate(&b, &tok, &mut st, &prompt, &params, |_| Flow::Continue).unwrap();
        assert!(fast.tokens.len() > 4, "{:?}", fast.tokens);
        // The prompt's logits come as a row; every later draw from the device's candidates.
        assert_eq!(b.rows.get(), 1);
        assert!(b.ranked.get() + 1 >= fast.tokens.len());
        last_rows += b.last_rows.get();

        let mut st = m.new_state();
        let plain = generate(&m, &tok, &mut st, &prompt, &params, |_| Flow::Continue).unwrap();
        assert_eq!(
            fast.tokens, plain.tokens,
            "top-k {top_k}, temperature {temperature}"
        );
        assert_eq!(fast.text, plain.text);

        // Hooks that read the logits keep the rows.
        b.ranked.set(0);
        let mut st = m.new_state();
        let read = generate_with(&b, &tok, &mut st, &prompt, &params, &mut ReadsLogits).unwrap();
        assert_eq!(b.ranked.get(), 0);
        assert_eq!(read.tokens, plain.tokens);
    }
    assert!(last_rows > 0);
}
