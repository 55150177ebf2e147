//! Re-tiling of packed weights for the GPU's dp4a kernels, and the CPU twins of the GPU's
//! integer arithmetic (activation quantization and the packed dot product).
//!
//! Every Bonsai weight format becomes one of three GPU layouts. A row is a run of 16-byte
//! *chunks*, each covering 128 values (1-bit) or 64 values (2-bit), with the block scales stored
//! apart as f16 in their own array. Inside a chunk the codes are reordered so that one shift and
//! one mask put four *consecutive* values into the four bytes of a word, ready for `dp4a`
//! against four int8 activations:
//!
//! - 1-bit (`Q1`): word `w` of a chunk holds values `32w + 4k + b` at bit `8b + k`.
//! - 2-bit (`Q2G64`, `Q2G128`): word `w` holds the code of value `16w + 4k + b` at bits
//!   `8b + 2k`; codes 0..=3 mean (code − 1)·d.
//!
//! PTQ1_0 (base-3, 1.75 bits a value) is widened to 2-bit codes with the same scale: exact, but
//! 34 instead of 28 bytes per 128 values.

use quant::Format;
use rayon::prelude::*;

/// Every file format that has a GPU layout.
pub const FORMATS: [Format; 5] = [
    Format::Q1_0,
    Format::Q2_0,
    Format::Q2_0G128,
    Format::PQ2_0,
    Format::PTQ1_0,
];

/// Values per activation quantization group (one f32 scale each).
pub const X_GROUP: usize = 64;

/// The GPU layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuFormat {
    /// Q1_0: 128 values per chunk and per scale.
    Q1,
    /// Q2_0 g64: 64 values per chunk and per scale.
    Q2G64,
    /// Legacy Q2_0 g128, PQ2_0 and widened PTQ1_0: 64 values per chunk, 128 per scale.
    Q2G128,
}

impl GpuFormat {
    pub const ALL: [GpuFormat; 3] = [GpuFormat::Q1, GpuFormat::Q2G64, GpuFormat::Q2G128];

    /// The layout a file format is re-tiled into, or `None` when the GPU has no kernel for it.
    pub fn for_format(f: Format) -> Option<GpuFormat> {
        match f {
            Format::Q1_0 => Some(GpuFormat::Q1),
            Format::Q2_0 => Some(GpuFormat::Q2G64),
            Format::Q2_0G128 | Format::PQ2_0 | Format::PTQ1_0 => Some(GpuFormat::Q2G128),
            _ => None,
        }
    }

    pub const fn chunk_values(self) -> usize {
        match self {
            GpuFormat::Q1 => 128,
            GpuFormat::Q2G64 | GpuFormat::Q2G128 => 64,
        }
    }

    pub const fn scale_values(self) -> usize {
        match self {
            GpuFormat::Q1 | GpuFormat::Q2G128 => 128,
            GpuFormat::Q2G64 => 64,
        }
    }

    /// Name of the kernel family (`gemv_<name>_t<tokens>`).
    pub const fn kernel_name(self) -> &'static str {
        match self {
            GpuFormat::Q1 => "q1",
            GpuFormat::Q2G64 => "q2g64",
            GpuFormat::Q2G128 => "q2g128",
        }
    }

    /// Whether a row of `cols` values can be re-tiled (whole scale blocks).
    pub fn fits(self, cols: usize) -> bool {
        cols > 0 && cols.is_multiple_of(self.scale_values()) && cols.is_multiple_of(X_GROUP)
    }
}

/// A re-tiled matrix on the host, ready to upload.
#[derive(Clone, Debug, PartialEq)]
pub struct Packed {
    pub format: GpuFormat,
    pub rows: usize,
    pub cols: usize,
    /// `rows × chunks_per_row × 16` bytes.
    pub codes: Vec<u8>,
    /// `rows × cols / scale_values` f16 bits.
    pub scales: Vec<u16>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RepackError {
    #[error("{name}: format {format} has no GPU kernel (supported: Q1_0, Q2_0, Q2_0_g128, PQ2_0, PTQ1_0)")]
    Unsupported { name: String, format: Format },
    #[error("{name}: {cols} columns are not whole {format} blocks of the GPU layout")]
    Shape {
        name: String,
        format: Format,
        cols: usize,
    },
    #[error("{name}: {got} bytes, expected {expected} for {rows}×{cols} {format}")]
    Bytes {
        name: String,
        format: Format,
        rows: usize,
        cols: usize,
        expected: usize,
        got: usize,
    },
    #[error("{name}: format {format} differs from {first}, the format of the matrices it is concatenated with")]
    MixedFormats {
        name: String,
        format: Format,
        first: Format,
    },
}

impl Packed {
    pub fn chunks_per_row(&self) -> usize {
        self.cols / self.format.chunk_values()
    }

    pub fn bytes(&self) -> usize {
        self.codes.len() + 2 * self.scales.len()
    }

    /// The value at (row, col) as the GPU layout encodes it: the oracle of the layout.
    pub fn value(&self, row: usize, col: usize) -> f32 {
        let cv = self.format.chunk_values();
        let chunk = &self.codes[(row * self.chunks_per_row() + col / cv) * 16..][..16];
        let v = col % cv;
        let scale = half::f16::from_bits(
            self.scales
                [row * (self.cols / self.format.scale_values()) + col / self.format.scale_values()],
        )
        .to_f32();
        match self.format {
            GpuFormat::Q1 => {
                let (w, k, b) = (v / 32, (v % 32) / 4, v % 4);
                let bit = (chunk[4 * w + b] >> k) & 1;
                if bit != 0 {
                    scale
                } else {
                    -scale
                }
            }
            GpuFormat::Q2G64 | GpuFormat::Q2G128 => {
                let (w, k, b) = (v / 16, (v % 16) / 4, v % 4);
                let code = (chunk[4 * w + b] >> (2 * k)) & 3;
                (f32::from(code) - 1.0) * scale
            }
        }
    }
}

/// Trit `n` (0 = most significant) of a PTQ1_0 byte: `((u8)(b·3ⁿ)·3) >> 8`.
fn trit(b: u8, n: usize) -> u8 {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    ((u16::from(b.wrapping_mul(POW3[n])) * 3) >> 8) as u8
}

/// Element index held by trit `n` of PTQ1_0 byte `byte` (see the quant crate's layout notes).
const fn ptq_element(byte: usize, n: usize) -> usize {
    if byte < 16 {
        16 * n + byte
    } else if byte < 24 {
        80 + 8 * n + (byte - 16)
    } else {
        120 + 2 * n + (byte - 24)
    }
}

/// Codes (0..=3 for 2-bit, 0..=1 for 1-bit) and the f16 scale bits of one file block.
fn decode_block(format: Format, block: &[u8], codes: &mut [u8]) -> u16 {
    match format {
        Format::Q1_0 => {
            for (j, c) in codes[..128].iter_mut().enumerate() {
                *c = (block[2 + j / 8] >> (j % 8)) & 1;
            }
            u16::from_le_bytes([block[0], block[1]])
        }
        Format::Q2_0 | Format::Q2_0G128 | Format::PQ2_0 => {
            let n = format.block_len();
            for (j, c) in codes[..n].iter_mut().enumerate() {
                *c = (block[2 + j / 4] >> (2 * (j % 4))) & 3;
            }
            u16::from_le_bytes([block[0], block[1]])
        }
        Format::PTQ1_0 => {
            for (byte, &b) in block[..26].iter().enumerate() {
                let trits = if byte < 24 { 5 } else { 4 };
                for n in 0..trits {
                    codes[ptq_element(byte, n)] = trit(b, n);
                }
            }
            u16::from_le_bytes([block[26], block[27]])
        }
        _ => unreachable!("checked by GpuFormat::for_format"),
    }
}

/// Writes the codes of one chunk (`chunk_values` values) in the GPU order.
fn encode_chunk(format: GpuFormat, codes: &[u8], out: &mut [u8]) {
    out[..16].fill(0);
    match format {
        GpuFormat::Q1 => {
            for (v, &c) in codes[..128].iter().enumerate() {
                let (w, k, b) = (v / 32, (v % 32) / 4, v % 4);
                out[4 * w + b] |= c << k;
            }
        }
        GpuFormat::Q2G64 | GpuFormat::Q2G128 => {
            for (v, &c) in codes[..64].iter().enumerate() {
                let (w, k, b) = (v / 16, (v % 16) / 4, v % 4);
                out[4 * w + b] |= c << (2 * k);
            }
        }
    }
}

/// Re-tiles one `rows × cols` matrix of `format`.
pub fn repack(
    name: &str,
    format: Format,
    data: &[u8],
    rows: usize,
    cols: usize,
) -> Result<Packed, RepackError> {
    let gf = GpuFormat::for_format(format).ok_or_else(|| RepackError::Unsupported {
        name: name.into(),
        format,
    })?;
    if !gf.fits(cols) || !cols.is_multiple_of(format.block_len()) {
        return Err(RepackError::Shape {
            name: name.into(),
            format,
            cols,
        });
    }
    let row_bytes = cols / format.block_len() * format.block_bytes();
    if data.len() != rows * row_bytes {
        return Err(RepackError::Bytes {
            name: name.into(),
            format,
            rows,
            cols,
            expected: rows * row_bytes,
            got: data.len(),
        });
    }
    let chunks = cols / gf.chunk_values();
    let blocks = cols / format.block_len();
    let mut codes = vec![0u8; rows * chunks * 16];
    let mut scales = vec![0u16; rows * blocks];
    codes
        .par_chunks_mut(chunks * 16)
        .zip(scales.par_chunks_mut(blocks))
        .enumerate()
        .for_each(|(r, (out_codes, out_scales))| {
            let row = &data[r * row_bytes..(r + 1) * row_bytes];
            let mut vals = vec![0u8; cols];
            for (b, block) in row.chunks_exact(format.block_bytes()).enumerate() {
                let bl = format.block_len();
                out_scales[b] = decode_block(format, block, &mut vals[b * bl..(b + 1) * bl]);
            }
            let cv = gf.chunk_values();
            for (c, out) in out_codes.chunks_exact_mut(16).enumerate() {
                encode_chunk(gf, &vals[c * cv..(c + 1) * cv], out);
            }
        });
    Ok(Packed {
        format: gf,
        rows,
        cols,
        codes,
        scales,
    })
}

/// Stacks matrices that read the same input into one (rows concatenated in order).
pub fn concat(parts: Vec<(String, Format, Packed)>) -> Result<Packed, RepackError> {
    let mut it = parts.into_iter();
    let (_, first_format, mut acc) = it.next().expect("concat of nothing");
    for (name, format, p) in it {
        if p.format != acc.format || p.cols != acc.cols {
            return Err(RepackError::MixedFormats {
                name,
                format,
                first: first_format,
            });
        }
        acc.rows += p.rows;
        acc.codes.extend_from_slice(&p.codes);
        acc.scales.extend_from_slice(&p.scales);
    }
    Ok(acc)
}

/// Activations quantized as the GPU does it: int8 per value and, per group of 64 values,
/// `(d, d·Σq)` with `d = max|x| / 127` and `q = round_half_even(x / d)` (computed as `x·(1/d)`).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedX {
    pub q: Vec<i8>,
    pub groups: Vec<[f32; 2]>,
}

/// The CPU twin of the GPU's activation quantization (bit-exact by construction: the same IEEE
/// operations in the same order).
pub fn quantize_x(x: &[f32]) -> QuantizedX {
    assert!(
        x.len().is_multiple_of(X_GROUP),
        "activations must be whole groups of 64"
    );
    let mut q = vec![0i8; x.len()];
    let mut groups = Vec::with_capacity(x.len() / X_GROUP);
    for (xs, qs) in x.chunks_exact(X_GROUP).zip(q.chunks_exact_mut(X_GROUP)) {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (o, &v) in qs.iter_mut().zip(xs) {
            let qv = (v * id).round_ties_even() as i32;
            *o = qv as i8;
            sum += qv;
        }
        groups.push([d, d * sum as f32]);
    }
    QuantizedX { q, groups }
}

/// The plane words the 1-bit binary GEMV's lanes take for int8 activations `q` (whole chunks
/// of 128; the twin of `quant128`'s `xp_tok`, kernels/quant.cu): word `32c + 4g + t` is plane
/// `g` (bit `g` of the two's-complement code) of values `32t … 32t + 31` of chunk `c`, value
/// `32t + 4k + b` at bit `8b + k`, where a 1-bit row has that value's weight in word `t` of its
/// chunk ([`Packed`]), so that AND and popcount of the two count the plane under the row's ones.
pub fn plane_words(q: &[i8]) -> Vec<u32> {
    assert!(
        q.len().is_multiple_of(128),
        "plane words are of whole chunks of 128"
    );
    let mut out = vec![0u32; q.len() / 4];
    for (chunk, words) in q.chunks_exact(128).zip(out.chunks_exact_mut(32)) {
        for (i, word) in words.iter_mut().enumerate() {
            let (g, t) = (i / 4, i % 4);
            for k in 0..8 {
                for b in 0..4 {
                    let bit = (chunk[32 * t + 4 * k + b] as u8 >> g) & 1;
                    *word |= u32::from(bit) << (8 * b + k);
                }
            }
        }
    }
    out
}

/// An activation as the f16 GEMM sees it: rounded to f16, finite values beyond its range
/// clamped to its largest (the twin of `f16_sat` in kernels/quant.cu).
pub fn f16_act(v: f32) -> half::f16 {
    half::f16::from_f32(if v.abs() > 65504.0 {
        65504f32.copysign(v)
    } else {
        v
    })
}

/// The f16 activations the quantization kernels write for the f16 GEMM: every value as
/// [`f16_act`], each 64-value block in [`crate::plan::hgemm_slot`] order.
pub fn f16_acts(x: &[f32]) -> Vec<u16> {
    assert!(
        x.len().is_multiple_of(X_GROUP),
        "activations must be whole groups of 64"
    );
    let mut out = vec![0u16; x.len()];
    for (i, &v) in x.iter().enumerate() {
        let block = i - i % X_GROUP;
        out[block + crate::plan::hgemm_slot(i % X_GROUP)] = f16_act(v).to_bits();
    }
    out
}

/// The CPU twin of the GPU's packed dot for one row: exact integer sums per chunk, scaled in f32.
/// The GPU adds the per-chunk terms in another order, so the two agree to f32 rounding.
pub fn dot_row(p: &Packed, row: usize, x: &QuantizedX) -> f32 {
    let cv = p.format.chunk_values();
    let mut total = 0f32;
    for c in 0..p.chunks_per_row() {
        let d = half::f16::from_bits(
            p.scales[row * (p.cols / p.format.scale_values()) + c * cv / p.format.scale_values()],
        )
        .to_f32();
        match p.format {
            GpuFormat::Q1 => {
                let mut term = 0f32;
                let mut bias = 0f32;
                for g in 0..2 {
                    let gi = c * 2 + g;
                    let mut acc = 0i32;
                    for v in 0..64 {
                        let col = c * 128 + g * 64 + v;
                        let bit = i32::from(p.value(row, col) > 0.0);
                        acc += bit * i32::from(x.q[col]);
                    }
                    term += x.groups[gi][0] * acc as f32;
                    bias += x.groups[gi][1];
                }
                total += d * (2.0 * term - bias);
            }
            GpuFormat::Q2G64 | GpuFormat::Q2G128 => {
                let chunk = &p.codes[(row * p.chunks_per_row() + c) * 16..][..16];
                let mut acc = 0i32;
                for v in 0..64 {
                    let (w, k, b) = (v / 16, (v % 16) / 4, v % 4);
                    let code = i32::from((chunk[4 * w + b] >> (2 * k)) & 3);
                    acc += code * i32::from(x.q[c * 64 + v]);
                }
                total += d * (x.groups[c][0] * acc as f32 - x.groups[c][1]);
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn random_rows(format: Format, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let x: Vec<f32> = (0..rows * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
        quant::quantize(format, &x).unwrap()
    }

    #[test]
    fn retiled_values_equal_the_file_decoder_in_every_format() {
        for format in FORMATS {
            let (rows, cols) = (3, 512);
            let data = random_rows(format, rows, cols, 7);
            let p = repack("m", format, &data, rows, cols).unwrap();
            let mut want = vec![0f32; rows * cols];
            quant::dequantize(format, &data, &mut want).unwrap();
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(p.value(r, c), want[r * cols + c], "{format} ({r},{c})");
                }
            }
            assert_eq!(p.codes.len(), rows * cols / p.format.chunk_values() * 16);
        }
    }

    #[test]
    fn plane_words_count_the_codes_under_a_rows_ones() {
        // What a binary MMA does with a row's words and the plane words: per 64-value group,
        // Σ over planes of 2^p (the sign plane −128) × popcount(weights AND plane) must be Σq
        // over the values whose weight is +d, read from the layout's oracle.
        let cols = 512;
        let p = repack(
            "m",
            Format::Q1_0,
            &random_rows(Format::Q1_0, 1, cols, 5),
            1,
            cols,
        )
        .unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(6);
        let q: Vec<i8> = (0..cols).map(|_| rng.gen()).collect();
        let planes = plane_words(&q);
        for c in 0..cols / 128 {
            for group in 0..2 {
                let want: i32 = (0..64)
                    .map(|v| c * 128 + group * 64 + v)
                    .filter(|&col| p.value(0, col) > 0.0)
                    .map(|col| i32::from(q[col]))
                    .sum();
                let mut got = 0i32;
                for t in 2 * group..2 * group + 2 {
                    let w = u32::from_le_bytes(p.codes[16 * c + 4 * t..][..4].try_into().unwrap());
                    for g in 0..8 {
                        let weight = if g == 7 { -128 } else { 1 << g };
                        got += weight * (w & planes[32 * c + 4 * g + t]).count_ones() as i32;
                    }
                }
                assert_eq!(got, want, "chunk {c}, group {group}");
            }
        }
    }

    #[test]
    fn code_three_survives_retiling() {
        // Raw random bytes include code 3 (+2·d), which a ternary-only kernel would get wrong.
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut data: Vec<u8> = (0..2 * 18 * 4).map(|_| rng.gen()).collect();
        for b in data.chunks_exact_mut(18) {
            b[..2].copy_from_slice(&half::f16::from_f32(0.5).to_bits().to_le_bytes());
        }
        assert!(quant::count_code3(Format::Q2_0, &data) > 0);
        let p = repack("m", Format::Q2_0, &data, 2, 256).unwrap();
        let mut want = vec![0f32; 512];
        quant::dequantize(Format::Q2_0, &data, &mut want).unwrap();
        for (i, w) in want.iter().enumerate() {
            assert_eq!(p.value(i / 256, i % 256), *w);
        }
    }

    #[test]
    fn unsupported_formats_and_shapes_are_named_errors() {
        let err = repack("blk.0.x", Format::Q8_0, &[0; 34], 1, 32).unwrap_err();
        assert!(err.to_string().contains("blk.0.x") && err.to_string().contains("Q8_0"));
        let err = repack("m", Format::Q2_0G128, &[0; 34], 1, 64).unwrap_err();
        assert!(matches!(err, RepackError::Shape { .. }), "{err}");
        let err = repack("m", Format::Q1_0, &[0; 17], 1, 128).unwrap_err();
        assert!(matches!(err, RepackError::Bytes { .. }), "{err}");
    }

    #[test]
    fn concatenation_refuses_mixed_layouts() {
        let a = repack(
            "a",
            Format::Q1_0,
            &random_rows(Format::Q1_0, 2, 256, 1),
            2,
            256,
        )
        .unwrap();
        let b = repack(
            "b",
            Format::Q2_0,
            &random_rows(Format::Q2_0, 2, 256, 2),
            2,
            256,
        )
        .unwrap();
        let err = concat(vec![
            ("a".into(), Format::Q1_0, a.clone()),
            ("b".into(), Format::Q2_0, b),
        ])
        .unwrap_err();
        assert!(err.to_string().contains('b'));
        let c = concat(vec![
            ("a".into(), Format::Q1_0, a.clone()),
            ("a2".into(), Format::Q1_0, a.clone()),
        ])
        .unwrap();
        assert_eq!(c.rows, 4);
        assert_eq!(c.value(3, 100), a.value(1, 100));
    }

    #[test]
    fn quantized_activations_reconstruct_within_half_a_step() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let mut x: Vec<f32> = (0..256).map(|_| rng.gen_range(-3.0..3.0)).collect();
        x[64..128].fill(0.0);
        let qx = quantize_x(&x);
        for (i, &v) in x.iter().enumerate() {
            let [d, _] = qx.groups[i / 64];
            assert!(
                (f32::from(qx.q[i]) * d - v).abs() <= 0.5 * d * 1.0001,
                "{i}"
            );
        }
        assert_eq!(qx.groups[1], [0.0, 0.0]);
        assert!(qx.q.iter().all(|&q| q != i8::MIN));
    }

    #[test]
    fn the_integer_dot_twin_is_close_to_the_exact_dot() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let cols = 1024;
        let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let qx = quantize_x(&x);
        for format in FORMATS {
            let data = random_rows(format, 2, cols, 5);
            let p = repack("m", format, &data, 2, cols).unwrap();
            for r in 0..2 {
                let row = &data[r * data.len() / 2..(r + 1) * data.len() / 2];
                let exact = quant::dot_scalar(format, row, &x);
                let mut w = vec![0f32; cols];
                quant::dequantize(format, row, &mut w).unwrap();
                let mag: f32 = w.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
                let got = dot_row(&p, r, &qx);
                assert!(
                    (got - exact).abs() <= 0.01 * mag,
                    "{format}: {got} vs {exact}"
                );
            }
        }
    }
}
