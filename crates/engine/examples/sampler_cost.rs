//! What one random draw costs the host on a row of 248,320 logits (the Bonsai vocabulary), by
//! sampler setting: median of 30 draws. A peaked row (a few logits far above uniform noise), as
//! a trained model's usually are.
//!
//! `cargo run --release -p engine --example sampler_cost`

use std::time::Instant;

use engine::{Sampler, SamplerConfig};

fn main() {
    let mut s = 0x1234_5678u32;
    let row: Vec<f32> = (0..248_320)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let u = (s % 10_000) as f32 / 10_000.0;
            (u - 0.5) * 6.0 + if i % 9973 == 0 { 12.0 } else { 0.0 }
        })
        .collect();
    let settings = [
        (
            "temperature 0.6, top-k 20, top-p 0.95 (the CLI's)",
            0.6,
            20,
            0.95,
        ),
        ("temperature 1, top-p 1, no top-k (OpenAI's)", 1.0, 0, 1.0),
        ("temperature 0.7, top-p 0.8, no top-k", 0.7, 0, 0.8),
        ("temperature 0.7, top-p 0.95, no top-k", 0.7, 0, 0.95),
    ];
    for (name, temperature, top_k, top_p) in settings {
        let mut sampler = Sampler::new(SamplerConfig {
            temperature,
            top_k,
            top_p,
            ..SamplerConfig::default()
        })
        .expect("valid settings");
        let mut times: Vec<f64> = (0..30)
            .map(|_| {
                let mut r = row.clone();
                let t = Instant::now();
                std::hint::black_box(sampler.sample(&mut r, &[]).expect("finite logits"));
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        times.sort_by(f64::total_cmp);
        println!("{name}: {:.0} µs", times[15]);
    }
}
