//! The panel layout: how 16 rows of one weight block are interleaved, and the codecs between it
//! and the rows' own blocks.
//!
//! A *panel* is 16 consecutive rows; its bytes are its *panel blocks* in column order. A panel
//! block holds the 16 rows' blocks of the same columns: their fp16 scales (32 bytes, row order),
//! then one *half* per 64 values. Within a half, *chunk* `c` (0..16) is what one `vpdpbusd`
//! consumes: byte `j = 4L + i` of the decoded 64-byte register is the unsigned code of row `L`,
//! value `4c + i` of the half (codes: Q1_0 0 or 2, the 2-bit formats 0..=3, PTQ1_0 trits 0..=2;
//! the weight is `code − 1`). How a chunk is stored depends on the format:
//!
//! - Q1_0 (128 B per half): chunk `c` is a little-endian u64 at `8c`, one bit per register byte
//!   set for code 2, in one of two orders ([`Q1Bits`]): bit `j` (a mask register, expanded by
//!   one masked move; a row's bits a nibble, for the AVX2 lookups), or bit `j / 8` of byte
//!   `j mod 8` (a broadcast and one `and`).
//! - 2-bit (256 B per half): four 64-byte *quads*; quad `i` holds chunks `4i + k` (k < 4, the
//!   `i`-th chunk of activation group `k`), byte `j` of the quad holding register byte `j` of
//!   chunk `4i + k` at bits `2k..2k+2`. One load and one `and` with `3 << 2k` give a chunk's
//!   codes times `4^k` (the same factor for a whole activation group, undone by its scale), or
//!   a shift and an `and` the codes themselves.
//! - PTQ1_0 (208 B per half): chunks `5s + n` (s < 3, n < 5) are trit `n` of the 64 bytes at
//!   `64s`, each byte the base-3 number `Σ 3ⁿ·tₙ` (at most 242) — decoded by table lookups;
//!   chunk 15 is stored at 192 as 16 bytes, byte `m` holding at bits `2r..2r+2` the code of
//!   register byte `m + 16r` (a 16-byte broadcast, one `vpmultishiftqb`, one `and`). That is 13
//!   bytes per row and half, the 26 of a PTQ1_0 block, so a tiled matrix is exactly as large as
//!   the file's. Widened
//!   ([`Ternary::Wide`](super::Ternary)), PTQ1_0 rows take the 2-bit layout of Q2_0 g128
//!   instead (same codes, same scales).
//!
//! Rows past the matrix's last (in its last panel) have zero codes and zero scales.

use crate::Format;

/// Rows per panel: one 32-bit lane of a 512-bit register each.
pub const PANEL: usize = 16;
/// Bytes of a panel block's scales.
pub(crate) const SCALES: usize = 2 * PANEL;
/// Values per half (one `vpdpbusd` group of 16 chunks).
pub(crate) const HALF: usize = 64;
/// Chunks per half.
pub(crate) const CHUNKS: usize = 16;

/// The formats with a panel layout.
pub(crate) const fn supports(format: Format) -> bool {
    matches!(
        format,
        Format::Q1_0 | Format::Q2_0 | Format::Q2_0G128 | Format::PQ2_0 | Format::PTQ1_0
    )
}

/// Bytes of one half of a panel block.
pub(crate) const fn half_bytes(format: Format) -> usize {
    match format {
        Format::Q1_0 => 128,
        Format::PTQ1_0 => 208,
        _ => 256,
    }
}

/// Halves per block.
pub(crate) const fn halves(format: Format) -> usize {
    format.block_len() / HALF
}

/// Bytes of one panel block (16 of the format's blocks).
pub(crate) const fn panel_block_bytes(format: Format) -> usize {
    SCALES + halves(format) * half_bytes(format)
}

/// How a Q1_0 chunk word orders its 64 bits, one per register byte `j = 4L + i` (row `L`,
/// value `i`): which kernels read it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Q1Bits {
    /// Bit `j`: a row's four bits side by side (a nibble), as the AVX2 kernels' table lookups
    /// index them; AVX-512 expands the word by a mask load and a masked move.
    #[default]
    Nibbles,
    /// Bit `j / 8` of word byte `j mod 8`: a broadcast of the word and one `and` with a constant
    /// leave each register byte its own bit, at place `j / 8` (row `L` at place `L / 2`). For the
    /// AVX-512 kernels where that measured faster than the masked move ([`Q1Bits::preferred`]).
    Spread,
}

/// The bit of a Q1_0 chunk word that holds register byte `j`.
pub(crate) const fn q1_bit(q1: Q1Bits, j: usize) -> usize {
    match q1 {
        Q1Bits::Nibbles => j,
        Q1Bits::Spread => 8 * (j % 8) + j / 8,
    }
}

/// A nibble's four bits spread to bit 0 of bytes 0..4.
const NIBBLE_BYTES: [u64; 16] = {
    let mut t = [0u64; 16];
    let mut n = 0;
    while n < 16 {
        let mut i = 0;
        while i < 4 {
            if n >> i & 1 != 0 {
                t[n] |= 1 << (8 * i);
            }
            i += 1;
        }
        n += 1;
    }
    t
};

/// Register byte `j` of PTQ1_0's 2-bit chunk: its source byte and bit shift.
const fn two_bit_place(j: usize) -> (usize, u32) {
    (j % 16, 2 * (j / 16) as u32)
}

/// Bytes of a 2-bit quad (four chunks, one of each activation group of a half).
pub(crate) const QUAD: usize = 64;

/// The codes of one half: `codes[L][v]` for row `L`, value `v` of the half.
pub(crate) type HalfCodes = [[u8; HALF]; PANEL];

fn encode_two_bit_chunk(codes: &HalfCodes, c: usize, out: &mut [u8]) {
    // Byte m holds register bytes m + 16r: row m/4 + 4r, value 4c + m%4 (see `two_bit_place`).
    for (m, o) in out[..16].iter_mut().enumerate() {
        let v = 4 * c + m % 4;
        *o = (0..4).fold(0, |acc, r| acc | codes[m / 4 + 4 * r][v] << (2 * r));
    }
}

fn decode_two_bit_chunk(src: &[u8], c: usize, codes: &mut HalfCodes) {
    for j in 0..64 {
        let (byte, shift) = two_bit_place(j);
        codes[j / 4][4 * c + j % 4] = (src[byte] >> shift) & 3;
    }
}

/// Writes one half of a panel block.
pub(crate) fn encode_half(format: Format, q1: Q1Bits, codes: &HalfCodes, out: &mut [u8]) {
    match format {
        Format::Q1_0 => {
            for c in 0..CHUNKS {
                let mut word = 0u64;
                for j in 0..64 {
                    if codes[j / 4][4 * c + j % 4] == 2 {
                        word |= 1 << q1_bit(q1, j);
                    }
                }
                out[8 * c..8 * c + 8].copy_from_slice(&word.to_le_bytes());
            }
        }
        Format::PTQ1_0 => {
            for s in 0..3 {
                for j in 0..64 {
                    let v = (0..5)
                        .rev()
                        .fold(0u8, |v, n| 3 * v + codes[j / 4][4 * (5 * s + n) + j % 4]);
                    out[64 * s + j] = v;
                }
            }
            encode_two_bit_chunk(codes, 15, &mut out[192..208]);
        }
        _ => {
            out[..4 * QUAD].fill(0);
            for c in 0..CHUNKS {
                let (i, k) = (c / 4, c % 4);
                for j in 0..QUAD {
                    out[QUAD * i + j] |= codes[j / 4][4 * c + j % 4] << (2 * k);
                }
            }
        }
    }
}

/// Reads one half of a panel block back into codes.
pub(crate) fn decode_half(format: Format, q1: Q1Bits, src: &[u8], codes: &mut HalfCodes) {
    match format {
        Format::Q1_0 => {
            for c in 0..CHUNKS {
                let mut word = [0u8; 8];
                word.copy_from_slice(&src[8 * c..8 * c + 8]);
                let word = u64::from_le_bytes(word);
                for j in 0..64 {
                    codes[j / 4][4 * c + j % 4] =
                        if word >> q1_bit(q1, j) & 1 != 0 { 2 } else { 0 };
                }
            }
        }
        Format::PTQ1_0 => {
            for s in 0..3 {
                for j in 0..64 {
                    let mut v = src[64 * s + j];
                    for n in 0..5 {
                        codes[j / 4][4 * (5 * s + n) + j % 4] = v % 3;
                        v /= 3;
                    }
                }
            }
            decode_two_bit_chunk(&src[192..208], 15, codes);
        }
        _ => {
            for c in 0..CHUNKS {
                let (i, k) = (c / 4, c % 4);
                for j in 0..QUAD {
                    codes[j / 4][4 * c + j % 4] = (src[QUAD * i + j] >> (2 * k)) & 3;
                }
            }
        }
    }
}

/// Byte `b` of a PTQ1_0 block: its trits as unsigned codes (trit `n` first), from the decoder.
fn ptq_trits() -> &'static [[u8; 5]; 256] {
    static T: std::sync::OnceLock<[[u8; 5]; 256]> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let mut t = [[0u8; 5]; 256];
        for (b, t) in t.iter_mut().enumerate() {
            for (n, t) in t.iter_mut().enumerate() {
                *t = crate::ptq1_0::trit(b as u8, n);
            }
        }
        t
    })
}

/// The scale bits of a native block.
fn scale_bits(format: Format, block: &[u8]) -> u16 {
    let at = if format == Format::PTQ1_0 { 26 } else { 0 };
    u16::from_le_bytes([block[at], block[at + 1]])
}

/// The unsigned codes (`w_int + 1`) of one native block of a 2-bit format or PTQ1_0.
fn native_codes(format: Format, block: &[u8], codes: &mut [u8; 128]) {
    if format == Format::PTQ1_0 {
        let trits = ptq_trits();
        for (byte, &b) in block[..26].iter().enumerate() {
            for (n, &t) in trits[usize::from(b)][..if byte < 24 { 5 } else { 4 }]
                .iter()
                .enumerate()
            {
                codes[crate::ptq1_0::element(byte, n)] = t;
            }
        }
    } else {
        for (c, b) in codes
            .chunks_exact_mut(4)
            .zip(&block[2..2 + format.block_len() / 4])
        {
            for (k, c) in c.iter_mut().enumerate() {
                *c = (b >> (2 * k)) & 3;
            }
        }
    }
}

/// Writes one panel block in `layout`'s panel layout (`format`'s own, or one that holds the same
/// codes and scales) from the native `format` blocks of its 16 rows (`None`: a padding row).
pub(crate) fn tile_block(
    format: Format,
    layout: Format,
    q1: Q1Bits,
    rows: &[Option<&[u8]>; PANEL],
    out: &mut [u8],
) {
    out.fill(0);
    for (l, row) in rows.iter().enumerate() {
        let bits = row.map_or(0, |b| scale_bits(format, b));
        out[2 * l..2 * l + 2].copy_from_slice(&bits.to_le_bytes());
    }
    if format == Format::Q1_0 {
        debug_assert_eq!(layout, format);
        // Chunk word `16h + c` takes nibble `16h + c` of each row's 128 bits: at nibble `L`, or
        // spread one bit a byte, at place `L / 2` of bytes `4 (L mod 2)..` (see `q1_bit`).
        let mut words = [0u64; 32];
        for (l, row) in rows.iter().enumerate() {
            let Some(b) = row else { continue };
            let mut x = [0u8; 16];
            x.copy_from_slice(&b[2..18]);
            let x = u128::from_le_bytes(x);
            for (k, w) in words.iter_mut().enumerate() {
                let nibble = ((x >> (4 * k)) & 0xf) as usize;
                *w |= match q1 {
                    Q1Bits::Nibbles => (nibble as u64) << (4 * l),
                    Q1Bits::Spread => NIBBLE_BYTES[nibble] << (32 * (l % 2) + l / 2),
                };
            }
        }
        for (k, w) in words.iter().enumerate() {
            out[SCALES + 8 * k..SCALES + 8 * k + 8].copy_from_slice(&w.to_le_bytes());
        }
        return;
    }
    if format == layout && format != Format::PTQ1_0 {
        tile_two_bit(format, rows, out);
        return;
    }
    tile_codes(format, layout, q1, rows, out);
}

/// The codes of a 2-bit block straight into its own layout. A row's native bytes `4i..4i + 4` of
/// a half (byte `4i + k` holding value `16i + 4k + m` at bits `2m`) become its four bytes of quad
/// `i` (byte `m` holding that value at bits `2k`): a transpose of 4 × 4 two-bit fields in one
/// 32-bit word, by two exchanges of bit groups.
fn tile_two_bit(format: Format, rows: &[Option<&[u8]>; PANEL], out: &mut [u8]) {
    let hb = half_bytes(format);
    for h in 0..halves(format) {
        for (l, row) in rows.iter().enumerate() {
            for i in 0..CHUNKS / 4 {
                let src = 2 + 16 * h + 4 * i;
                // A padding row holds code 1 (weight 0) in every field.
                let mut x = row.map_or(0x5555_5555, |b| {
                    u32::from_le_bytes([b[src], b[src + 1], b[src + 2], b[src + 3]])
                });
                // Field (k, m) at bit 8k + 2m; moved to 8m + 2k.
                let t = ((x >> 6) ^ x) & 0x00cc_00cc;
                x ^= t ^ (t << 6);
                let t = ((x >> 12) ^ x) & 0x0000_f0f0;
                x ^= t ^ (t << 12);
                let at = SCALES + h * hb + QUAD * i + 4 * l;
                out[at..at + 4].copy_from_slice(&x.to_le_bytes());
            }
        }
    }
}

/// [`tile_block`] by way of every value's code: any format into any layout that holds it.
fn tile_codes(
    format: Format,
    layout: Format,
    q1: Q1Bits,
    rows: &[Option<&[u8]>; PANEL],
    out: &mut [u8],
) {
    let hb = half_bytes(layout);
    let mut codes = [[1u8; 128]; PANEL];
    for (c, row) in codes.iter_mut().zip(rows) {
        if let Some(b) = row {
            native_codes(format, b, c);
        }
    }
    let mut half = [[0u8; HALF]; PANEL];
    for h in 0..halves(layout) {
        for (dst, src) in half.iter_mut().zip(&codes) {
            dst.copy_from_slice(&src[HALF * h..HALF * (h + 1)]);
        }
        let at = SCALES + h * hb;
        encode_half(layout, q1, &half, &mut out[at..at + hb]);
    }
}

/// Packs unsigned codes and scale bits into one native block.
pub(crate) fn native_block(format: Format, codes: &[u8], scale: u16, out: &mut [u8]) {
    out.fill(0);
    let s = scale.to_le_bytes();
    match format {
        Format::Q1_0 => {
            out[..2].copy_from_slice(&s);
            for (j, &c) in codes.iter().enumerate() {
                out[2 + j / 8] |= u8::from(c == 2) << (j % 8);
            }
        }
        Format::PTQ1_0 => {
            out[26..28].copy_from_slice(&s);
            for (byte, o) in out[..26].iter_mut().enumerate() {
                let trits = |k: usize| codes[crate::ptq1_0::element(byte, k)];
                *o = if byte < 24 {
                    crate::ptq1_0::encode5([trits(0), trits(1), trits(2), trits(3), trits(4)])
                } else {
                    crate::ptq1_0::encode4([trits(0), trits(1), trits(2), trits(3)])
                };
            }
        }
        _ => {
            out[..2].copy_from_slice(&s);
            for (j, &c) in codes.iter().enumerate() {
                out[2 + j / 4] |= c << (2 * (j % 4));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_bit_blocks_tile_as_their_codes_do() {
        let mut s = 0x9e37_79b9_u32;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        };
        for format in [Format::Q2_0, Format::Q2_0G128, Format::PQ2_0] {
            let bb = format.block_bytes();
            let native: Vec<u8> = (0..PANEL * bb).map(|_| next() as u8).collect();
            for present in [PANEL, 11, 1] {
                let mut rows = [None; PANEL];
                for (l, r) in rows.iter_mut().enumerate().take(present) {
                    *r = Some(&native[l * bb..(l + 1) * bb]);
                }
                let n = panel_block_bytes(format);
                // The fast path must write every byte: it starts from a pattern, not zeros.
                let (mut fast, mut slow) = (vec![0xa5u8; n], vec![0u8; n]);
                tile_block(format, format, Q1Bits::Nibbles, &rows, &mut fast);
                for (l, row) in rows.iter().enumerate() {
                    let bits = row.map_or(0, |b| scale_bits(format, b));
                    slow[2 * l..2 * l + 2].copy_from_slice(&bits.to_le_bytes());
                }
                tile_codes(format, format, Q1Bits::Nibbles, &rows, &mut slow);
                assert_eq!(fast, slow, "{format}, {present} rows");
            }
        }
    }
}
