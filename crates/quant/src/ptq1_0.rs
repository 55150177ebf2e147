//! PTQ1_0: `{u8 qs[24]; u8 qh[2]; f16 d}` (scale last), 128 ternary values in base 3.
//!
//! Element order (not positional): element `16n + m` is trit n of `qs[m]` (m < 16, n < 5),
//! element `80 + 8n + m` is trit n of `qs[16 + m]` (m < 8, n < 5), element `120 + 2n + h` is
//! trit n of `qh[h]` (h < 2, n < 4). A byte stores the base-3 number v of its trits (first trit
//! most significant) as `ceil(256·v/243)`; a `qh` byte holds four trits and an extra factor 3, so
//! its four trits sit in the same top positions. Trit n of byte b is `((u8)(b·3ⁿ)·3) >> 8`, and
//! w = (trit − 1)·d.
//!
//! Every byte decodes to trits in 0..=2 (`255·3 < 3·256`), so no byte is invalid. Only 243 of the
//! 256 five-trit bytes and 81 of the 256 `qh` bytes are what an encoder writes; the rest are
//! *non-canonical*: they still decode deterministically (every decoder uses the same arithmetic)
//! and [`count_noncanonical`] reports them as a diagnostic.

use crate::codec::Codec;
use crate::num::{f16_is_non_finite, f32_to_f16_bits, read_f16};
use crate::Format;

pub(crate) struct PTQ1_0;

const QK: usize = 128;
const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Trit `n` (0 = most significant) of a packed byte.
#[inline(always)]
pub(crate) fn trit(b: u8, n: usize) -> u8 {
    ((u16::from(b.wrapping_mul(POW3[n])) * 3) >> 8) as u8
}

/// Packs five trits (each 0..=2, first most significant) into one byte.
pub(crate) fn encode5(t: [u8; 5]) -> u8 {
    let v = t.iter().fold(0u16, |v, &t| v * 3 + u16::from(t));
    (v * 256).div_ceil(243) as u8
}

/// Packs four trits into a `qh` byte (the base-3 number times 3, so they decode as trits 0..4).
pub(crate) fn encode4(t: [u8; 4]) -> u8 {
    let v = t.iter().fold(0u16, |v, &t| v * 3 + u16::from(t)) * 3;
    (v * 256).div_ceil(243) as u8
}

fn is_canonical5(b: u8) -> bool {
    encode5([trit(b, 0), trit(b, 1), trit(b, 2), trit(b, 3), trit(b, 4)]) == b
}

fn is_canonical4(b: u8) -> bool {
    encode4([trit(b, 0), trit(b, 1), trit(b, 2), trit(b, 3)]) == b
}

/// Index of the value that trit `n` of packed byte `byte` (0..26, `qh` from 24) holds.
pub(crate) const fn element(byte: usize, n: usize) -> usize {
    if byte < 16 {
        16 * n + byte
    } else if byte < 24 {
        80 + 8 * n + (byte - 16)
    } else {
        120 + 2 * n + (byte - 24)
    }
}

/// Non-canonical packed bytes in one block (see the module docs).
pub(crate) fn count_noncanonical_block(block: &[u8]) -> u64 {
    let five = block[..24].iter().filter(|&&b| !is_canonical5(b)).count();
    let four = block[24..26].iter().filter(|&&b| !is_canonical4(b)).count();
    (five + four) as u64
}

/// The ternary code (0..=2) of `x·id`: `lroundf` + 1, clamped; NaN gives 1 (zero), as
/// `(int)lroundf(NaN) + 1` does on x86-64.
#[inline(always)]
fn code(v: f32, id: f32) -> u8 {
    let q = v * id;
    if q.is_nan() {
        1
    } else {
        (q.round() + 1.0).clamp(0.0, 2.0) as u8
    }
}

impl Codec for PTQ1_0 {
    const FORMAT: Format = Format::PTQ1_0;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = read_f16(block, 26);
        let out = &mut out[..QK];
        for (byte, &b) in block[..26].iter().enumerate() {
            let trits = if byte < 24 { 5 } else { 4 };
            for n in 0..trits {
                out[element(byte, n)] = (i32::from(trit(b, n)) - 1) as f32 * d;
            }
        }
    }

    /// The fork's reference: d = max|x| (by `>`), id = 1/d or 0, trit = round(x·id) + 1.
    fn quantize_block(x: &[f32], out: &mut [u8]) {
        let x = &x[..QK];
        let mut amax = 0.0f32;
        for v in x {
            let a = v.abs();
            if a > amax {
                amax = a;
            }
        }
        let id = if amax != 0.0 { 1.0 / amax } else { 0.0 };
        for (byte, o) in out[..24].iter_mut().enumerate() {
            let t = |n: usize| code(x[element(byte, n)], id);
            *o = encode5([t(0), t(1), t(2), t(3), t(4)]);
        }
        for (byte, o) in out[24..26].iter_mut().enumerate() {
            let t = |n: usize| code(x[element(24 + byte, n)], id);
            *o = encode4([t(0), t(1), t(2), t(3)]);
        }
        out[26..28].copy_from_slice(&f32_to_f16_bits(amax).to_le_bytes());
    }

    /// `d · Σ (trit − 1)·x`. The block is first decoded to its 128 trit values (trit n of 16 or
    /// 8 bytes at a time, which vectorizes), then dotted with eight lane accumulators (lane k takes
    /// values 8i + k), reduced pairwise.
    fn dot_block(block: &[u8], x: &[f32]) -> f32 {
        let d = read_f16(block, 26);
        let x = &x[..QK];
        let (qa, rest) = block[..26].split_at(16);
        let (qb, qh) = rest.split_at(8);
        let mut w = [0.0f32; QK];
        for (n, &p) in POW3.iter().enumerate() {
            for (o, &b) in w[16 * n..16 * n + 16].iter_mut().zip(qa) {
                *o = f32::from(((u16::from(b.wrapping_mul(p)) * 3) >> 8) as u8) - 1.0;
            }
            for (o, &b) in w[80 + 8 * n..88 + 8 * n].iter_mut().zip(qb) {
                *o = f32::from(((u16::from(b.wrapping_mul(p)) * 3) >> 8) as u8) - 1.0;
            }
        }
        for n in 0..4 {
            for h in 0..2 {
                w[120 + 2 * n + h] = f32::from(trit(qh[h], n)) - 1.0;
            }
        }
        let mut acc = [0.0f32; 8];
        for (ws, xs) in w.chunks_exact(8).zip(x.chunks_exact(8)) {
            for k in 0..8 {
                acc[k] += ws[k] * xs[k];
            }
        }
        d * crate::num::reduce_lanes(acc)
    }

    fn non_finite(block: &[u8]) -> u64 {
        u64::from(f16_is_non_finite(block, 26))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_trits<const N: usize>() -> impl Iterator<Item = [u8; N]> {
        (0..3usize.pow(N as u32)).map(|mut v| {
            let mut t = [0u8; N];
            for i in (0..N).rev() {
                t[i] = (v % 3) as u8;
                v /= 3;
            }
            t
        })
    }

    #[test]
    fn every_five_trit_value_round_trips() {
        let mut seen = std::collections::HashSet::new();
        for t in all_trits::<5>() {
            let b = encode5(t);
            let back: Vec<u8> = (0..5).map(|n| trit(b, n)).collect();
            assert_eq!(back, t, "byte {b}");
            assert!(seen.insert(b), "two values share byte {b}");
        }
        assert_eq!(seen.len(), 243);
    }

    #[test]
    fn every_four_trit_value_round_trips() {
        let mut seen = std::collections::HashSet::new();
        for t in all_trits::<4>() {
            let b = encode4(t);
            let back: Vec<u8> = (0..4).map(|n| trit(b, n)).collect();
            assert_eq!(back, t, "byte {b}");
            assert_eq!(trit(b, 4), 0, "the fifth trit of a qh byte is zero");
            assert!(seen.insert(b));
        }
        assert_eq!(seen.len(), 81);
    }

    #[test]
    fn every_byte_decodes_to_valid_trits() {
        for b in 0..=255u8 {
            for n in 0..5 {
                assert!(trit(b, n) <= 2);
            }
        }
        let canonical5 = (0..=255u8).filter(|&b| is_canonical5(b)).count();
        let canonical4 = (0..=255u8).filter(|&b| is_canonical4(b)).count();
        assert_eq!((canonical5, canonical4), (243, 81));
    }

    #[test]
    fn the_element_map_is_a_permutation() {
        let mut hit = [false; QK];
        for byte in 0..26 {
            for n in 0..if byte < 24 { 5 } else { 4 } {
                let e = element(byte, n);
                assert!(!hit[e], "element {e} twice");
                hit[e] = true;
            }
        }
        assert!(hit.iter().all(|&h| h));
    }

    #[test]
    fn a_hand_packed_byte_lands_on_the_spec_positions() {
        // Trits (2, 0, 1, 1, 1): v = 162 + 9 + 3 + 1 = 175, byte = ceil(175·256/243) = 185.
        assert_eq!(encode5([2, 0, 1, 1, 1]), 185);
        let mut block = [0u8; 28];
        // All other bytes hold the all-zero-weight pattern (trits 1,1,1,1,1 / 1,1,1,1).
        for b in block[..24].iter_mut() {
            *b = encode5([1; 5]);
        }
        for b in block[24..26].iter_mut() {
            *b = encode4([1; 4]);
        }
        block[0] = 185;
        block[26..28].copy_from_slice(&half::f16::from_f32(1.0).to_bits().to_le_bytes());
        let mut out = [0.0f32; QK];
        PTQ1_0::dequantize_block(&block, &mut out);
        assert_eq!(
            (out[0], out[16], out[32], out[48], out[64]),
            (1.0, -1.0, 0.0, 0.0, 0.0)
        );
        assert_eq!(out.iter().filter(|&&v| v != 0.0).count(), 2);
    }
}
