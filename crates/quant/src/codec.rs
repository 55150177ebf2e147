//! The per-format contract: every block format implements [`Codec`] for one block at a time, and
//! the row-level public functions in `lib.rs` loop over blocks through it.

use crate::Format;

/// Largest [`Format::block_len`]; sizes the scratch buffer of the scalar dot.
pub(crate) const MAX_BLOCK_LEN: usize = 128;

/// One block format. `block` slices are exactly `FORMAT.block_bytes()` long and value slices
/// exactly `FORMAT.block_len()` long; the row-level callers guarantee this.
pub(crate) trait Codec {
    const FORMAT: Format;
    const LEN: usize = Self::FORMAT.block_len();
    const BYTES: usize = Self::FORMAT.block_bytes();

    /// Decodes one block, bit-for-bit as ggml's `dequantize_row_*`.
    fn dequantize_block(block: &[u8], out: &mut [f32]);

    /// Encodes one block with the reference quantizer.
    fn quantize_block(x: &[f32], out: &mut [u8]);

    /// The fast dot product of one block with its activations.
    fn dot_block(block: &[u8], x: &[f32]) -> f32;

    /// Non-finite scale fields (or values, for the float formats) in one block.
    fn non_finite(block: &[u8]) -> u64;

    /// Codes equal to 3 in one block; only the 2-bit ternary containers can hold one.
    fn count_code3(_block: &[u8]) -> u64 {
        0
    }

    /// The fast dot of a whole row: per-block f32 sums, added to the row total in block order.
    /// Float formats override this to work on runs of values instead of one-value blocks.
    fn dot_row(row: &[u8], x: &[f32]) -> f32 {
        let mut sum = 0.0f32;
        for (block, xs) in row.chunks_exact(Self::BYTES).zip(x.chunks_exact(Self::LEN)) {
            sum += Self::dot_block(block, xs);
        }
        sum
    }

    /// The plain twin: decode a block, then `Σ w·x` left to right in f32; blocks added in order.
    fn dot_row_scalar(row: &[u8], x: &[f32]) -> f32 {
        let mut w = [0.0f32; MAX_BLOCK_LEN];
        let w = &mut w[..Self::LEN];
        let mut sum = 0.0f32;
        for (block, xs) in row.chunks_exact(Self::BYTES).zip(x.chunks_exact(Self::LEN)) {
            Self::dequantize_block(block, w);
            let mut s = 0.0f32;
            for (a, b) in w.iter().zip(xs) {
                s += a * b;
            }
            sum += s;
        }
        sum
    }

    fn dequantize_row(src: &[u8], dst: &mut [f32]) {
        for (block, out) in src
            .chunks_exact(Self::BYTES)
            .zip(dst.chunks_exact_mut(Self::LEN))
        {
            Self::dequantize_block(block, out);
        }
    }

    fn quantize_row(src: &[f32], dst: &mut [u8]) {
        for (x, out) in src
            .chunks_exact(Self::LEN)
            .zip(dst.chunks_exact_mut(Self::BYTES))
        {
            Self::quantize_block(x, out);
        }
    }
}
