//! Q8_0: `{f16 d; i8 qs[32]}`, w = q·d.

use crate::codec::Codec;
use crate::num::{c_max, c_trunc_i32, f16_is_non_finite, f32_to_f16_bits, read_f16};
use crate::Format;

pub(crate) struct Q8_0;

const QK: usize = 32;

impl Codec for Q8_0 {
    const FORMAT: Format = Format::Q8_0;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = read_f16(block, 0);
        for (o, &q) in out[..QK].iter_mut().zip(&block[2..2 + QK]) {
            *o = f32::from(q as i8) * d;
        }
    }

    /// `quantize_row_q8_0_ref`: amax by ggml's `MAX`, d = amax/127, q = roundf(x·(1/d)) (half away
    /// from zero), id = 0 when d = 0.
    fn quantize_block(x: &[f32], out: &mut [u8]) {
        let x = &x[..QK];
        let amax = x.iter().fold(0.0f32, |m, v| c_max(m, v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out[..2].copy_from_slice(&f32_to_f16_bits(d).to_le_bytes());
        for (o, &v) in out[2..2 + QK].iter_mut().zip(x) {
            // C converts the rounded float to int8_t through a 32-bit truncation.
            *o = c_trunc_i32((v * id).round()) as u8;
        }
    }

    /// `d · Σ q·x` with eight lane accumulators reduced pairwise.
    fn dot_block(block: &[u8], x: &[f32]) -> f32 {
        let d = read_f16(block, 0);
        let qs = &block[2..2 + QK];
        let x = &x[..QK];
        let mut acc = [0.0f32; 8];
        for (q, xs) in qs.chunks_exact(8).zip(x.chunks_exact(8)) {
            for k in 0..8 {
                acc[k] += f32::from(q[k] as i8) * xs[k];
            }
        }
        d * crate::num::reduce_lanes(acc)
    }

    fn non_finite(block: &[u8]) -> u64 {
        u64::from(f16_is_non_finite(block, 0))
    }
}
