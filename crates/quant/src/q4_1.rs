//! Q4_1: `{f16 d; f16 m; u8 qs[16]}`, w[j] = d·(qs[j] & 15) + m, w[j + 16] = d·(qs[j] >> 4) + m.

use crate::codec::Codec;
use crate::num::{c_trunc_i32, f16_is_non_finite, f32_to_f16_bits, read_f16};
use crate::Format;

pub(crate) struct Q4_1;

const QK: usize = 32;

impl Codec for Q4_1 {
    const FORMAT: Format = Format::Q4_1;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = read_f16(block, 0);
        let m = read_f16(block, 2);
        let (lo, hi) = out[..QK].split_at_mut(QK / 2);
        for ((&q, l), h) in block[4..4 + QK / 2].iter().zip(lo).zip(hi) {
            *l = f32::from(q & 15) * d + m;
            *h = f32::from(q >> 4) * d + m;
        }
    }

    /// `quantize_row_q4_1_ref`: min/max by `<`/`>` from ±FLT_MAX, d = (max − min)/15,
    /// q = MIN(15, (int8_t)((x − min)·(1/d) + 0.5)).
    fn quantize_block(x: &[f32], out: &mut [u8]) {
        let x = &x[..QK];
        let mut min = f32::MAX;
        let mut max = -f32::MAX;
        for &v in x {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out[..2].copy_from_slice(&f32_to_f16_bits(d).to_le_bytes());
        out[2..4].copy_from_slice(&f32_to_f16_bits(min).to_le_bytes());
        let code = |v: f32| -> u8 {
            let q = c_trunc_i32((v - min) * id + 0.5) as i8;
            (if 15 < q { 15 } else { q }) as u8
        };
        for j in 0..QK / 2 {
            out[4 + j] = code(x[j]) | (code(x[j + QK / 2]) << 4);
        }
    }

    /// `Σ (d·q + m)·x`: each weight is formed exactly as the decoder forms it, eight lanes per half
    /// block, reduced pairwise.
    fn dot_block(block: &[u8], x: &[f32]) -> f32 {
        let d = read_f16(block, 0);
        let m = read_f16(block, 2);
        let qs = &block[4..4 + QK / 2];
        let (xlo, xhi) = x[..QK].split_at(QK / 2);
        let mut acc = [0.0f32; 8];
        for ((q, l), h) in qs
            .chunks_exact(8)
            .zip(xlo.chunks_exact(8))
            .zip(xhi.chunks_exact(8))
        {
            for k in 0..8 {
                acc[k] += (f32::from(q[k] & 15) * d + m) * l[k];
                acc[k] += (f32::from(q[k] >> 4) * d + m) * h[k];
            }
        }
        crate::num::reduce_lanes(acc)
    }

    fn non_finite(block: &[u8]) -> u64 {
        u64::from(f16_is_non_finite(block, 0)) + u64::from(f16_is_non_finite(block, 2))
    }
}
