//! The 2-bit containers `{f16 d; u8 qs[QK/4]}`: mainline Q2_0 (QK = 64), the legacy PrismML
//! Q2_0 g128 and PQ2_0 (QK = 128, same layout). Code j = `(qs[j/4] >> 2·(j%4)) & 3`,
//! w = (code − 1)·d, so codes {0,1,2,3} mean {−1, 0, +1, +2}.

use crate::codec::Codec;
use crate::num::{c_trunc_i32, f16_is_non_finite, f32_to_f16_bits, read_f16};
use crate::Format;

pub(crate) struct Q2_0;
pub(crate) struct Q2_0G128;
pub(crate) struct PQ2_0;

/// For each byte, its four codes minus one, as floats.
static CODE_VALUES: [[f32; 4]; 256] = {
    let mut t = [[0.0f32; 4]; 256];
    let mut b = 0;
    while b < 256 {
        let mut k = 0;
        while k < 4 {
            t[b][k] = ((b >> (2 * k)) & 3) as f32 - 1.0;
            k += 1;
        }
        b += 1;
    }
    t
};

fn dequantize<const QK: usize>(block: &[u8], out: &mut [f32]) {
    let d = read_f16(block, 0);
    for (j, o) in out[..QK].iter_mut().enumerate() {
        let q = (block[2 + j / 4] >> (2 * (j % 4))) & 3;
        *o = (i32::from(q) - 1) as f32 * d;
    }
}

/// `quantize_row_q2_0_ref`: d = max|x| (by `>`, so NaN is skipped), id = 1/d or 0 when d is not
/// positive, code = clamp((int)roundf(x·id) + 1, 0, 3) with C's x86 int conversion (NaN → code 0).
fn quantize<const QK: usize>(x: &[f32], out: &mut [u8]) {
    let x = &x[..QK];
    let mut amax = 0.0f32;
    for v in x {
        let a = v.abs();
        if a > amax {
            amax = a;
        }
    }
    let d = amax;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    out[..2].copy_from_slice(&f32_to_f16_bits(d).to_le_bytes());
    for (byte, xs) in out[2..2 + QK / 4].iter_mut().zip(x.chunks_exact(4)) {
        let mut b = 0u8;
        for (k, &v) in xs.iter().enumerate() {
            let q = c_trunc_i32((v * id).round()).wrapping_add(1).clamp(0, 3);
            b |= (q as u8) << (2 * k);
        }
        *byte = b;
    }
}

/// `d · Σ (code − 1)·x`: codes decoded four per byte by table, eight lane accumulators (two bytes
/// per step), reduced pairwise.
fn dot<const QK: usize>(block: &[u8], x: &[f32]) -> f32 {
    let d = read_f16(block, 0);
    let qs = &block[2..2 + QK / 4];
    let x = &x[..QK];
    let mut acc = [0.0f32; 8];
    for (q, xs) in qs.chunks_exact(2).zip(x.chunks_exact(8)) {
        let lo = &CODE_VALUES[usize::from(q[0])];
        let hi = &CODE_VALUES[usize::from(q[1])];
        for k in 0..4 {
            acc[k] += lo[k] * xs[k];
            acc[k + 4] += hi[k] * xs[k + 4];
        }
    }
    d * crate::num::reduce_lanes(acc)
}

fn count_code3<const QK: usize>(block: &[u8]) -> u64 {
    block[2..2 + QK / 4]
        .iter()
        .map(|&b| {
            // A code is 3 when both of its bits are set.
            let both = b & (b >> 1) & 0b0101_0101;
            u64::from(both.count_ones())
        })
        .sum()
}

macro_rules! two_bit_codec {
    ($t:ty, $format:expr, $qk:expr) => {
        impl Codec for $t {
            const FORMAT: Format = $format;

            fn dequantize_block(block: &[u8], out: &mut [f32]) {
                dequantize::<$qk>(block, out)
            }

            fn quantize_block(x: &[f32], out: &mut [u8]) {
                quantize::<$qk>(x, out)
            }

            fn dot_block(block: &[u8], x: &[f32]) -> f32 {
                dot::<$qk>(block, x)
            }

            fn non_finite(block: &[u8]) -> u64 {
                u64::from(f16_is_non_finite(block, 0))
            }

            fn count_code3(block: &[u8]) -> u64 {
                count_code3::<$qk>(block)
            }
        }
    };
}

two_bit_codec!(Q2_0, Format::Q2_0, 64);
two_bit_codec!(Q2_0G128, Format::Q2_0G128, 128);
two_bit_codec!(PQ2_0, Format::PQ2_0, 128);
