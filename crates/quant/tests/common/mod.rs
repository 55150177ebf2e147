//! Shared generators for the integration tests.
#![allow(dead_code)]

use quant::Format;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// Byte offsets of the fp16 scale fields inside one block.
pub fn scale_offsets(format: Format) -> &'static [usize] {
    match format {
        Format::Q8_0 | Format::Q1_0 | Format::Q2_0 | Format::Q2_0G128 | Format::PQ2_0 => &[0],
        Format::Q4_1 => &[0, 2],
        Format::PTQ1_0 => &[26],
        Format::F32 | Format::F16 | Format::BF16 => &[],
    }
}

/// `n` values uniform in `[-scale, scale]`.
pub fn values(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-scale..=scale)).collect()
}

/// A packed row of `n` values: random code bytes (every code pattern, non-canonical PTQ1_0 bytes
/// included) with finite scales of magnitude up to `scale`; float formats hold encoded values.
pub fn random_row(format: Format, n: usize, scale: f32, rng: &mut StdRng) -> Vec<u8> {
    match format {
        Format::F32 | Format::F16 | Format::BF16 => {
            let v = values(rng, n, scale);
            quant::quantize(format, &v).expect("whole blocks")
        }
        _ => {
            let bytes = format.row_bytes(n).expect("whole blocks");
            let mut row: Vec<u8> = (0..bytes).map(|_| rng.gen()).collect();
            for block in row.chunks_exact_mut(format.block_bytes()) {
                for &at in scale_offsets(format) {
                    let s = half::f16::from_f32(rng.gen_range(-scale..=scale));
                    block[at..at + 2].copy_from_slice(&s.to_bits().to_le_bytes());
                }
            }
            row
        }
    }
}

/// Σ|w·x| in f64 over the decoded row.
pub fn abs_dot(format: Format, row: &[u8], x: &[f32]) -> f64 {
    let mut w = vec![0.0f32; x.len()];
    quant::dequantize(format, row, &mut w).expect("valid row");
    w.iter()
        .zip(x)
        .map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs())
        .sum()
}
