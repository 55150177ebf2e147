//! `dot` (the fast path) against `dot_scalar` (its plain twin), and `matvec` against `dot`.

mod common;

use proptest::prelude::*;
use quant::Format;

/// Both sides sum n products in f32 in different orders; each is within (n+2)·u·Σ|w·x| of the
/// exact value (u = ε/2, the extra terms cover the product and the scale multiply), so their
/// difference is within 2·(n+4)·ε·Σ|w·x| with room to spare. The absolute floor covers underflow.
fn tolerance(n: usize, abs_dot: f64) -> f64 {
    2.0 * (n as f64 + 4.0) * f64::from(f32::EPSILON) * abs_dot + 1e-30
}

fn check(format: Format, blocks: usize, seed: u64, wscale: f32, xscale: f32) {
    let mut rng = common::rng(seed);
    // Float formats have one-value blocks: use a length that leaves a tail after the 8-lane runs.
    let n = if format.block_len() == 1 {
        blocks * 37
    } else {
        blocks * format.block_len()
    };
    let row = common::random_row(format, n, wscale, &mut rng);
    let x = common::values(&mut rng, n, xscale);
    let fast = quant::dot(format, &row, &x);
    let slow = quant::dot_scalar(format, &row, &x);
    let bound = tolerance(n, common::abs_dot(format, &row, &x));
    assert!(
        (f64::from(fast) - f64::from(slow)).abs() <= bound,
        "{format}: dot {fast} vs scalar {slow} (bound {bound}, {n} values)"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn dot_matches_the_scalar_twin(
        blocks in 1usize..9,
        seed in any::<u64>(),
        wscale in 1e-3f32..100.0,
        xscale in 1e-3f32..100.0,
    ) {
        for format in Format::ALL {
            check(format, blocks, seed, wscale, xscale);
        }
    }
}

#[test]
fn dot_of_an_exact_row_is_exact() {
    // Weights ±1 and activations small integers: every partial sum is exact in f32.
    for format in [
        Format::Q1_0,
        Format::Q2_0,
        Format::PQ2_0,
        Format::PTQ1_0,
        Format::Q8_0,
    ] {
        let n = 4 * format.block_len();
        let w: Vec<f32> = (0..n)
            .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
            .collect();
        let x: Vec<f32> = (0..n).map(|i| (i % 7) as f32 - 3.0).collect();
        let row = quant::quantize(format, &w).expect("whole blocks");
        let mut back = vec![0.0; n];
        quant::dequantize(format, &row, &mut back).expect("valid row");
        let want: f32 = back.iter().zip(&x).map(|(a, b)| a * b).sum();
        assert_eq!(quant::dot(format, &row, &x), want, "{format}");
        assert_eq!(quant::dot_scalar(format, &row, &x), want, "{format}");
    }
}

#[test]
fn matvec_calls_dot_per_row() {
    let mut rng = common::rng(7);
    for format in Format::ALL {
        let (rows, cols) = (5, 2 * format.block_len().max(32));
        let weights = common::random_row(format, rows * cols, 1.0, &mut rng);
        let x = common::values(&mut rng, cols, 1.0);
        let mut out = vec![f32::NAN; rows];
        quant::matvec(format, &weights, rows, cols, &x, &mut out);
        let row_bytes = format.row_bytes(cols).expect("whole blocks");
        for (r, &o) in out.iter().enumerate() {
            let row = &weights[r * row_bytes..(r + 1) * row_bytes];
            assert_eq!(
                o.to_bits(),
                quant::dot(format, row, &x).to_bits(),
                "{format} row {r}"
            );
        }
    }
}

#[test]
#[should_panic(expected = "does not hold")]
fn dot_refuses_a_row_of_the_wrong_length() {
    quant::dot(Format::Q1_0, &[0u8; 17], &[0.0; 128]);
}
