//! The unquantized formats: F32, F16 and BF16 (one value per "block", little-endian).

use crate::codec::Codec;
use crate::num::{bf16_bits_to_f32, f16_bits_to_f32, f32_to_bf16_bits, f32_to_f16_bits};
use crate::Format;

/// Values per run in the fast dot: eight lane accumulators, reduced pairwise at the end of the row.
const LANES: usize = 8;

pub(crate) struct F32;
pub(crate) struct F16;
pub(crate) struct BF16;

/// A 16-or-32-bit float format read value by value.
trait Element {
    const SIZE: usize;
    fn load(bytes: &[u8]) -> f32;
}

impl Element for F32 {
    const SIZE: usize = 4;
    #[inline(always)]
    fn load(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl Element for F16 {
    const SIZE: usize = 2;
    #[inline(always)]
    fn load(b: &[u8]) -> f32 {
        f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]))
    }
}

impl Element for BF16 {
    const SIZE: usize = 2;
    #[inline(always)]
    fn load(b: &[u8]) -> f32 {
        bf16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]))
    }
}

/// Eight lane sums (lane `k` takes values `8i + k`), reduced pairwise; the tail that does not fill
/// a run is added left to right after the reduction.
#[inline(always)]
fn dot_lanes<E: Element>(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let runs = row.chunks_exact(E::SIZE * LANES);
    let xs = x.chunks_exact(LANES);
    let (row_tail, x_tail) = (runs.remainder(), xs.remainder());
    for (bytes, xs) in runs.zip(xs) {
        for k in 0..LANES {
            acc[k] += E::load(&bytes[k * E::SIZE..]) * xs[k];
        }
    }
    let mut sum = crate::num::reduce_lanes(acc);
    for (bytes, x) in row_tail.chunks_exact(E::SIZE).zip(x_tail) {
        sum += E::load(bytes) * x;
    }
    sum
}

macro_rules! float_codec {
    ($t:ty, $format:expr, $store:expr, $non_finite:expr) => {
        impl Codec for $t {
            const FORMAT: Format = $format;

            fn dequantize_block(block: &[u8], out: &mut [f32]) {
                out[0] = <$t as Element>::load(block);
            }

            fn quantize_block(x: &[f32], out: &mut [u8]) {
                let store: fn(f32, &mut [u8]) = $store;
                store(x[0], out);
            }

            fn dot_block(block: &[u8], x: &[f32]) -> f32 {
                <$t as Element>::load(block) * x[0]
            }

            fn non_finite(block: &[u8]) -> u64 {
                let is: fn(&[u8]) -> bool = $non_finite;
                u64::from(is(block))
            }

            fn dot_row(row: &[u8], x: &[f32]) -> f32 {
                dot_lanes::<$t>(row, x)
            }
        }
    };
}

float_codec!(
    F32,
    Format::F32,
    |v, out| out[..4].copy_from_slice(&v.to_le_bytes()),
    |b| !F32::load(b).is_finite()
);
float_codec!(
    F16,
    Format::F16,
    |v, out| out[..2].copy_from_slice(&f32_to_f16_bits(v).to_le_bytes()),
    |b| crate::num::f16_is_non_finite(b, 0)
);
float_codec!(
    BF16,
    Format::BF16,
    |v, out| out[..2].copy_from_slice(&f32_to_bf16_bits(v).to_le_bytes()),
    |b| u16::from_le_bytes([b[0], b[1]]) & 0x7f80 == 0x7f80
);
