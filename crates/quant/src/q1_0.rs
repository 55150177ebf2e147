//! Q1_0: `{f16 d; u8 qs[16]}`, 128 values; bit j = `(qs[j/8] >> (j%8)) & 1`, w = bit ? +d : −d.

use crate::codec::Codec;
use crate::num::{f16_is_non_finite, f32_to_f16_bits, read_f16};
use crate::Format;

pub(crate) struct Q1_0;

const QK: usize = 128;

/// For each byte, the eight sign masks that turn `x` into `bit ? x : −x` by XOR on the float bits.
static SIGN_FLIP: [[u32; 8]; 256] = {
    let mut t = [[0u32; 8]; 256];
    let mut b = 0;
    while b < 256 {
        let mut k = 0;
        while k < 8 {
            if (b >> k) & 1 == 0 {
                t[b][k] = 0x8000_0000;
            }
            k += 1;
        }
        b += 1;
    }
    t
};

impl Codec for Q1_0 {
    const FORMAT: Format = Format::Q1_0;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = read_f16(block, 0);
        let neg_d = -d;
        for (j, o) in out[..QK].iter_mut().enumerate() {
            *o = if (block[2 + j / 8] >> (j % 8)) & 1 != 0 {
                d
            } else {
                neg_d
            };
        }
    }

    /// `quantize_row_q1_0_ref`: d = (Σ|x| left to right in f32) / 128, bit = (x >= 0); −0 sets the
    /// bit, NaN clears it.
    fn quantize_block(x: &[f32], out: &mut [u8]) {
        let x = &x[..QK];
        let mut sum_abs = 0.0f32;
        for v in x {
            sum_abs += v.abs();
        }
        let d = sum_abs / QK as f32;
        out[..2].copy_from_slice(&f32_to_f16_bits(d).to_le_bytes());
        for (byte, xs) in out[2..2 + QK / 8].iter_mut().zip(x.chunks_exact(8)) {
            let mut b = 0u8;
            for (k, &v) in xs.iter().enumerate() {
                b |= u8::from(v >= 0.0) << k;
            }
            *byte = b;
        }
    }

    /// `d · Σ ±x`: the sign is applied by flipping the float's sign bit (branch-free, exact), eight
    /// lane accumulators (lane k takes bit k of every byte), reduced pairwise.
    fn dot_block(block: &[u8], x: &[f32]) -> f32 {
        let d = read_f16(block, 0);
        let qs = &block[2..2 + QK / 8];
        let x = &x[..QK];
        let mut acc = [0.0f32; 8];
        for (&b, xs) in qs.iter().zip(x.chunks_exact(8)) {
            let flip = &SIGN_FLIP[usize::from(b)];
            for k in 0..8 {
                acc[k] += f32::from_bits(xs[k].to_bits() ^ flip[k]);
            }
        }
        d * crate::num::reduce_lanes(acc)
    }

    fn non_finite(block: &[u8]) -> u64 {
        u64::from(f16_is_non_finite(block, 0))
    }
}
