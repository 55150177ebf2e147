//! What quantizing one token's activations costs (`QuantizedActs::new`), per value, for the
//! 27B's activation widths: the serial step between two GEMMs of a decode token.
//!
//! `cargo run --release -p quant --example act_quant_cost`

use std::time::Instant;

use quant::QuantizedActs;

fn main() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for width in [5120usize, 6144, 17408] {
        let x: Vec<f32> = (0..width)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed % 20001) as f32 / 1000.0 - 10.0
            })
            .collect();
        let reps = 20_000_000 / width;
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let t = Instant::now();
            for _ in 0..reps {
                std::hint::black_box(QuantizedActs::new(std::hint::black_box(&x)));
            }
            best = best.min(t.elapsed().as_secs_f64() / reps as f64);
        }
        println!(
            "{width:6} values: {:7.2} µs a call, {:.3} ns a value (best of 5 rounds of {reps})",
            best * 1e6,
            best * 1e9 / width as f64
        );
    }
}
