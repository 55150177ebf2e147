//! Round trips: quantize → dequantize → quantize is a fixed point, and values a format represents
//! exactly survive quantize → dequantize unchanged.

mod common;

use proptest::prelude::*;
use quant::Format;
use rand::Rng;

fn decode(format: Format, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0.0; n];
    quant::dequantize(format, bytes, &mut out).expect("valid row");
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Scales stay well inside fp16's normal range, where a decoded block re-encodes to itself.
    #[test]
    fn requantizing_a_decoded_row_gives_the_same_bytes(
        blocks in 1usize..5,
        seed in any::<u64>(),
        scale in 1e-2f32..1e3,
    ) {
        let mut rng = common::rng(seed);
        for format in Format::ALL {
            let n = blocks * format.block_len().max(16);
            let x = common::values(&mut rng, n, scale);
            let q = quant::quantize(format, &x).expect("whole blocks");
            let y = decode(format, &q, n);
            let q2 = quant::quantize(format, &y).expect("whole blocks");
            prop_assert_eq!(&q, &q2, "{}", format);
        }
    }

    #[test]
    fn sign_patterns_at_an_fp16_scale_survive_q1_0(seed in any::<u64>(), e in -14i32..15) {
        let mut rng = common::rng(seed);
        let d = half::f16::from_f32(2f32.powi(e) * rng.gen_range(1.0f32..2.0)).to_f32();
        let x: Vec<f32> = (0..256).map(|_| if rng.gen() { d } else { -d }).collect();
        let q = quant::quantize(Format::Q1_0, &x).expect("whole blocks");
        prop_assert_eq!(bits(&decode(Format::Q1_0, &q, x.len())), bits(&x));
    }

    #[test]
    fn ternary_values_at_an_fp16_scale_survive(seed in any::<u64>(), e in -14i32..15) {
        let mut rng = common::rng(seed);
        for format in [Format::Q2_0, Format::Q2_0G128, Format::PQ2_0, Format::PTQ1_0] {
            let n = 2 * format.block_len();
            let d = half::f16::from_f32(2f32.powi(e) * rng.gen_range(1.0f32..2.0)).to_f32();
            let mut x: Vec<f32> = (0..n).map(|_| [-d, 0.0, d][rng.gen_range(0..3)]).collect();
            for block in x.chunks_exact_mut(format.block_len()) {
                block[rng.gen_range(0..block.len())] = d; // every block reaches ±d
            }
            let q = quant::quantize(format, &x).expect("whole blocks");
            prop_assert_eq!(bits(&decode(format, &q, n)), bits(&x), "{}", format);
        }
    }

    #[test]
    fn q8_0_multiples_of_an_fp16_scale_survive(seed in any::<u64>(), e in -14i32..8) {
        let mut rng = common::rng(seed);
        let d = half::f16::from_f32(2f32.powi(e) * rng.gen_range(1.0f32..2.0)).to_f32();
        let mut x: Vec<f32> = (0..64).map(|_| f32::from(rng.gen_range(-127i8..=127)) * d).collect();
        x[3] = 127.0 * d;
        x[40] = -127.0 * d;
        let q = quant::quantize(Format::Q8_0, &x).expect("whole blocks");
        prop_assert_eq!(bits(&decode(Format::Q8_0, &q, 64)), bits(&x));
    }

    #[test]
    fn q4_1_grid_values_survive(seed in any::<u64>(), e in -10i32..5, m in -2000i32..2000) {
        let mut rng = common::rng(seed);
        // d a power of two and m a multiple of d/16: every grid value is exact in f32 and fp16.
        let d = 2f32.powi(e);
        let min = m as f32 * d / 16.0;
        let mut x: Vec<f32> = (0..32).map(|_| f32::from(rng.gen_range(0u8..16)) * d + min).collect();
        x[5] = min;
        x[17] = 15.0 * d + min;
        let q = quant::quantize(Format::Q4_1, &x).expect("whole blocks");
        prop_assert_eq!(bits(&decode(Format::Q4_1, &q, 32)), bits(&x));
    }

    #[test]
    fn float_formats_keep_their_own_values(seed in any::<u64>()) {
        let mut rng = common::rng(seed);
        let raw: Vec<u32> = (0..64).map(|_| rng.gen()).collect();
        let f32s: Vec<f32> = raw.iter().map(|&b| f32::from_bits(b)).filter(|v| !v.is_nan()).collect();
        let f16s: Vec<f32> = raw.iter()
            .map(|&b| half::f16::from_bits(b as u16).to_f32()).filter(|v| !v.is_nan()).collect();
        let bf16s: Vec<f32> = raw.iter()
            .map(|&b| f32::from_bits(b & 0xffff_0000)).filter(|v| !v.is_nan()).collect();
        for (format, x) in [(Format::F32, f32s), (Format::F16, f16s), (Format::BF16, bf16s)] {
            let q = quant::quantize(format, &x).expect("whole blocks");
            prop_assert_eq!(bits(&decode(format, &q, x.len())), bits(&x), "{}", format);
        }
    }
}
