//! The 1-bit lookup tables of a token's int8 activation codes: for each 4-value run (chunk), the
//! 16 sums `S = Σ ±q` over its values, one per sign pattern `m` (bit `i` set: `+q[i]`), as the
//! two digits of `S = RADIX·H + L` (`0 ≤ L < 32`, `−16 ≤ H < 16`, bytes): one table of `L`, one of
//! `H`, what a 1-bit row's 4 bits look up with one `vpshufb` each. Digits this small add up as
//! bytes over a group's four chunks and stay signed bytes (`ΣL` ≤ 124, `|ΣH|` ≤ 64), so a kernel
//! joins them (`vpmaddubsw` by `[1, RADIX]`) and widens them once per group, not once per chunk.
//! Per 64-value half, 8 blocks of 64 bytes, block `m` for chunks `2m` and `2m + 1`:
//! `[L(2m), L(2m + 1), H(2m), H(2m + 1)]`, 16 bytes each.

/// Bytes of table per activation code.
pub(crate) const BYTES_PER_CODE: usize = 8;

/// The weight of the high digit `H`.
pub(crate) const RADIX: i16 = 32;

/// The two digits of a chunk's sum `v` (|v| ≤ 4·127), `H` as a two's-complement byte.
fn digits(v: i16) -> [u8; 2] {
    [v.rem_euclid(RADIX) as u8, v.div_euclid(RADIX) as i8 as u8]
}

/// The tables of `q` (a whole number of 64-value halves).
pub(crate) fn build(q: &[i8]) -> Vec<u8> {
    assert_eq!(
        q.len() % 64,
        0,
        "sign tables: codes come in 64-value halves"
    );
    let mut out = vec![0u8; BYTES_PER_CODE * q.len()];
    #[cfg(target_arch = "x86_64")]
    if crate::simd::allows(crate::Simd::Avx2) && is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2; the lengths were checked above.
        unsafe { build_avx2(q, &mut out) };
        return out;
    }
    build_scalar(q, &mut out);
    out
}

/// The plain build, the fallback and the twin of [`build_avx2`].
fn build_scalar(q: &[i8], out: &mut [u8]) {
    for (half, block) in q.chunks_exact(64).zip(out.chunks_exact_mut(512)) {
        for (m, tb) in block.chunks_exact_mut(64).enumerate() {
            for (slot, c) in [2 * m, 2 * m + 1].into_iter().enumerate() {
                let run = &half[4 * c..4 * c + 4];
                // All minus, then each pattern from the one without its top bit: one add per
                // entry.
                let mut v = [0i16; 16];
                v[0] = -run.iter().map(|&q| i16::from(q)).sum::<i16>();
                for m in 1..16usize {
                    let top = m.ilog2() as usize;
                    v[m] = v[m & !(1 << top)] + 2 * i16::from(run[top]);
                }
                for (m, &v) in v.iter().enumerate() {
                    let [lo, hi] = digits(v);
                    tb[16 * slot + m] = lo;
                    tb[32 + 16 * slot + m] = hi;
                }
            }
        }
    }
}

/// Per chunk: its 4 codes in every 32-bit lane, signed by two registers of sign patterns, the 4
/// products of each lane summed (`vpmaddubsw` by ones, `vpmaddwd` by ones) and packed to 16
/// bits and split into their digits (the low bits; an arithmetic shift); per chunk pair, the
/// low and the high digits packed into one register each.
///
/// # Safety
/// The CPU has AVX2; `q.len()` is a multiple of 64 and `out.len() == 8 · q.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn build_avx2(q: &[i8], out: &mut [u8]) {
    use std::arch::x86_64::*;
    // `vpackssdw` interleaves its operands' 128-bit lanes: the first register's lanes take
    // patterns 0..4 and 8..12, the second's 4..8 and 12..16, so the packed words are patterns
    // 0..16 in order. Byte i of a lane is +1 where the pattern has bit i.
    let signs = |pattern: [i32; 8]| {
        let lane = |p: i32| {
            i32::from_le_bytes(std::array::from_fn(|i| {
                if p >> i & 1 == 1 {
                    1
                } else {
                    -1i8 as u8
                }
            }))
        };
        _mm256_setr_epi32(
            lane(pattern[0]),
            lane(pattern[1]),
            lane(pattern[2]),
            lane(pattern[3]),
            lane(pattern[4]),
            lane(pattern[5]),
            lane(pattern[6]),
            lane(pattern[7]),
        )
    };
    let first = signs([0, 1, 2, 3, 8, 9, 10, 11]);
    let second = signs([4, 5, 6, 7, 12, 13, 14, 15]);
    let ones8 = _mm256_set1_epi8(1);
    let ones16 = _mm256_set1_epi16(1);
    let low = _mm256_set1_epi16(RADIX - 1);
    const RADIX_BITS: i32 = RADIX.trailing_zeros() as i32;
    let sums = |c: *const i8| {
        let run = _mm256_set1_epi32((c as *const i32).read_unaligned());
        let lanes = |s| {
            _mm256_madd_epi16(
                _mm256_maddubs_epi16(ones8, _mm256_sign_epi8(run, s)),
                ones16,
            )
        };
        _mm256_packs_epi32(lanes(first), lanes(second))
    };
    for (c, tb) in (0..q.len()).step_by(8).zip(out.chunks_exact_mut(64)) {
        let (x, y) = (sums(q.as_ptr().add(c)), sums(q.as_ptr().add(c + 4)));
        // Per 128-bit lane the pack gives [x, y] of 8 patterns each: lanes reordered, x's 16
        // then y's 16.
        let bytes = |a, b| _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi16(a, b));
        let lo = bytes(_mm256_and_si256(x, low), _mm256_and_si256(y, low));
        let hi = bytes(
            _mm256_srai_epi16::<RADIX_BITS>(x),
            _mm256_srai_epi16::<RADIX_BITS>(y),
        );
        _mm256_storeu_si256(tb.as_mut_ptr() as *mut __m256i, lo);
        _mm256_storeu_si256(tb.as_mut_ptr().add(32) as *mut __m256i, hi);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(n: usize, seed: u32) -> Vec<i8> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                (((s >> 16) % 255) as i32 - 127) as i8
            })
            .collect()
    }

    #[test]
    fn the_scalar_tables_hold_every_signed_sum_of_each_run() {
        let mut q = codes(128, 7);
        q[..4].copy_from_slice(&[127, 127, 127, 127]);
        q[4..8].copy_from_slice(&[-127, -127, -127, -127]);
        let mut t = vec![0u8; BYTES_PER_CODE * q.len()];
        build_scalar(&q, &mut t);
        for (h, half) in q.chunks_exact(64).enumerate() {
            for c in 0..16 {
                // Block m holds chunks 2m (slot 0) and 2m + 1 (slot 1).
                let slot = c % 2;
                let tb = &t[512 * h + 64 * (c / 2)..][..64];
                for m in 0..16 {
                    let want: i16 = (0..4)
                        .map(|i| i16::from(half[4 * c + i]) * if m >> i & 1 == 1 { 1 } else { -1 })
                        .sum();
                    let (l, hd) = (tb[16 * slot + m], tb[32 + 16 * slot + m] as i8);
                    assert!(
                        l < 32 && (-16..16).contains(&hd),
                        "half {h} chunk {c} pattern {m}: {l}, {hd}"
                    );
                    let got = RADIX * i16::from(hd) + i16::from(l);
                    assert_eq!(got, want, "half {h} chunk {c} pattern {m}");
                }
            }
        }
    }

    #[test]
    fn the_fast_build_equals_the_scalar_one() {
        for (n, seed) in [(64, 1), (128, 2), (5120, 3), (17408, 4)] {
            let mut q = codes(n, seed);
            q[n - 4..].copy_from_slice(&[-127, 127, -127, 127]);
            let mut want = vec![0u8; BYTES_PER_CODE * n];
            build_scalar(&q, &mut want);
            assert_eq!(build(&q), want, "{n} codes");
        }
    }
}
