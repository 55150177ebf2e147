//! Block formats of the Bonsai weight types.
//!
//! Each format has a plain decoder, a reference quantizer and a dot product against f32
//! activations; the CPU kernels of later layers are tested against these.
//!
//! - [`dequantize`] and [`quantize`] reproduce ggml's reference C (`dequantize_row_*`,
//!   `quantize_row_*_ref`) bit-for-bit, including rounding, the zero-scale case and C's x86-64
//!   float→int conversion on NaN; the fixtures in `fixtures/quant/` pin this against llama.cpp.
//! - [`dot`] is the fast path, [`dot_scalar`] its plain twin and test oracle. Both sum each block
//!   in f32 and add the block sums to the row total in block order; they differ only in the order
//!   of additions inside a block (see each format's `dot_block`), so they agree to within
//!   rounding: `|dot − dot_scalar| ≤ 2·(n + 4)·ε·Σ|w·x|` for a row of n values.
//! - [`gemm_rows`] is what a model's matrix multiplies run on: rows × tokens against
//!   [`QuantizedActs`] (int8 activations in 16-value groups with f32 scales), integer dot products
//!   on AVX-512 VNNI or AVX2 chosen at run time ([`Isa`]), with [`gemm_rows_scalar`] as the plain
//!   twin the SIMD kernels are tested against. See the `gemm` and `acts` module docs.
//! - [`TiledMatrix`] re-tiles a Bonsai-format matrix into 16-row panels for the AVX-512, AVX2
//!   and NEON kernels of [`gemm_tiled`] (bit-identical to [`gemm_rows_scalar`]); see the `tiled`
//!   module docs.
//! - [`count_code3`], [`count_non_finite_scales`] and [`count_noncanonical`] are the scans a
//!   loader's validation runs over packed tensors.

mod acts;
mod codec;
mod error;
mod float;
mod format;
mod gemm;
mod num;
mod ptq1_0;
mod q1_0;
mod q2_0;
mod q4_1;
mod q8_0;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the AVX2 Q1_0 kernels' tables
mod sign_tables;
pub mod simd;
mod tiled;

pub use acts::{act_group, QuantizedActs, ACT_GROUP};
use codec::Codec;
pub use error::QuantError;
pub use format::Format;
pub use gemm::{gemm_rows, gemm_rows_scalar, gemm_rows_with, gemv_rows, Isa};
pub use simd::Simd;
pub use tiled::{
    gemm_tiled, gemm_tiled_avx2, gemm_tiled_scalar, Q1Bits, Ternary, TileError, TiledMatrix, PANEL,
};

/// Calls `$body` with `C` bound to the codec type of `$format`.
macro_rules! with_codec {
    ($format:expr, |$c:ident| $body:expr) => {
        match $format {
            Format::F32 => {
                type $c = float::F32;
                $body
            }
            Format::F16 => {
                type $c = float::F16;
                $body
            }
            Format::BF16 => {
                type $c = float::BF16;
                $body
            }
            Format::Q8_0 => {
                type $c = q8_0::Q8_0;
                $body
            }
            Format::Q4_1 => {
                type $c = q4_1::Q4_1;
                $body
            }
            Format::Q1_0 => {
                type $c = q1_0::Q1_0;
                $body
            }
            Format::Q2_0 => {
                type $c = q2_0::Q2_0;
                $body
            }
            Format::Q2_0G128 => {
                type $c = q2_0::Q2_0G128;
                $body
            }
            Format::PQ2_0 => {
                type $c = q2_0::PQ2_0;
                $body
            }
            Format::PTQ1_0 => {
                type $c = ptq1_0::PTQ1_0;
                $body
            }
        }
    };
}

/// Decodes `src` (whole blocks of `format`) into `dst`, one f32 per value.
///
/// Errors when `dst.len()` is not a whole number of blocks or `src` is not exactly the bytes that
/// many values take.
pub fn dequantize(format: Format, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let expected = format.row_bytes(dst.len())?;
    if src.len() != expected {
        return Err(QuantError::ByteLength {
            format,
            values: dst.len(),
            expected,
            got: src.len(),
        });
    }
    with_codec!(format, |C| C::dequantize_row(src, dst));
    Ok(())
}

/// Encodes `src` with the reference quantizer of `format` (whole blocks only).
pub fn quantize(format: Format, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    let mut out = vec![0u8; format.row_bytes(src.len())?];
    with_codec!(format, |C| C::quantize_row(src, &mut out));
    Ok(out)
}

/// Panics unless `row` holds exactly `x.len()` values of `format`: a precondition, since callers
/// validate tensor shapes when a model loads.
fn check_row(format: Format, row: &[u8], x: &[f32]) {
    let expected = format.row_bytes(x.len());
    assert!(
        expected == Ok(row.len()),
        "{format}: a row of {} bytes does not hold {} values",
        row.len(),
        x.len()
    );
}

/// Dot product of one packed row with f32 activations: the fast CPU path.
///
/// Each block is summed in f32 (lane accumulators reduced pairwise, see the format's
/// `dot_block`), and block sums are added to the total in block order; the float formats use
/// eight lanes over the whole row instead. Matches [`dot_scalar`] to within
/// `2·(n + 4)·ε·Σ|w·x|`.
///
/// # Panics
/// When `row.len()` is not the byte size of `x.len()` values of `format`.
pub fn dot(format: Format, row: &[u8], x: &[f32]) -> f32 {
    check_row(format, row, x);
    with_codec!(format, |C| C::dot_row(row, x))
}

/// The deliberately plain twin of [`dot`], used as its oracle: decode each block, sum `w·x`
/// left to right in f32, add block sums in order.
///
/// # Panics
/// As [`dot`].
pub fn dot_scalar(format: Format, row: &[u8], x: &[f32]) -> f32 {
    check_row(format, row, x);
    with_codec!(format, |C| C::dot_row_scalar(row, x))
}

/// `out[r] = dot(row r of weights, x)` for a row-major `rows × cols` packed matrix.
///
/// # Panics
/// When `x.len() != cols`, `out.len() != rows` or `weights` is not `rows` rows of `cols` values.
pub fn matvec(
    format: Format,
    weights: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    out: &mut [f32],
) {
    assert_eq!(
        x.len(),
        cols,
        "matvec: activations do not match the column count"
    );
    assert_eq!(
        out.len(),
        rows,
        "matvec: output does not match the row count"
    );
    let row_bytes = match format.row_bytes(cols) {
        Ok(n) => n,
        Err(e) => panic!("matvec: {e}"),
    };
    assert!(
        rows.checked_mul(row_bytes) == Some(weights.len()),
        "{format}: {} bytes are not {rows} rows of {cols} values",
        weights.len()
    );
    if row_bytes == 0 {
        out.fill(0.0);
        return;
    }
    with_codec!(format, |C| {
        for (row, o) in weights.chunks_exact(row_bytes).zip(out.iter_mut()) {
            *o = C::dot_row(row, x);
        }
    })
}

/// Panics unless `src` is whole blocks of `format`.
fn check_blocks(format: Format, src: &[u8]) {
    assert!(
        src.len().is_multiple_of(format.block_bytes()),
        "{format}: {} bytes are not whole {}-byte blocks",
        src.len(),
        format.block_bytes()
    );
}

/// Codes equal to 3 (the value +2·d) in a Q2_0, Q2_0 g128 or PQ2_0 tensor. A ternary pack never
/// writes one, so a non-zero count means a ternary-only kernel would decode the tensor wrongly.
/// Zero for every other format: PTQ1_0 stores base-3 digits and cannot express a fourth code (every
/// byte decodes to trits 0..=2; see [`count_noncanonical`]).
///
/// # Panics
/// When `src` is not whole blocks.
pub fn count_code3(format: Format, src: &[u8]) -> u64 {
    check_blocks(format, src);
    with_codec!(format, |C| src
        .chunks_exact(C::BYTES)
        .map(C::count_code3)
        .sum())
}

/// Non-finite (NaN or ±inf) fp16 scale fields of a block format (Q4_1 counts `d` and `m`
/// separately), or non-finite values of F32, F16 and BF16.
///
/// # Panics
/// When `src` is not whole blocks.
pub fn count_non_finite_scales(format: Format, src: &[u8]) -> u64 {
    check_blocks(format, src);
    with_codec!(format, |C| src
        .chunks_exact(C::BYTES)
        .map(C::non_finite)
        .sum())
}

/// PTQ1_0 packed bytes that no encoder writes (13 of the 256 five-trit bytes, 175 of the 256
/// four-trit `qh` bytes). They still decode deterministically, so this is a diagnostic, not an
/// error: a file from the reference quantizer has none. Zero for every other format.
///
/// # Panics
/// When `src` is not whole blocks.
pub fn count_noncanonical(format: Format, src: &[u8]) -> u64 {
    check_blocks(format, src);
    match format {
        Format::PTQ1_0 => src
            .chunks_exact(format.block_bytes())
            .map(ptq1_0::count_noncanonical_block)
            .sum(),
        _ => 0,
    }
}
