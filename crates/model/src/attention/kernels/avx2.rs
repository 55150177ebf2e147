//! The attention kernels in AVX2 with FMA and F16C: 16 positions or values as two registers of
//! 8, each lane's arithmetic that of the plain form (and of the AVX-512 kernels).

use std::arch::x86_64::*;
use std::ops::Range;

use half::f16;

use super::{prefetch, Scores, Values, AHEAD};
use crate::kv::{HeadRows, KEY_TILE, VALUE_CHUNK, VALUE_TILE};

/// 8 cached values from where `p` points, in f32.
trait Load: Copy {
    /// # Safety
    /// 8 values from `p` are readable; the CPU has AVX2 and F16C.
    unsafe fn load8(p: *const Self) -> __m256;
}

impl Load for f32 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const f32) -> __m256 {
        // SAFETY: readable, by the caller's promise; unaligned loads are allowed.
        unsafe { _mm256_loadu_ps(p) }
    }
}

impl Load for f16 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const f16) -> __m256 {
        // SAFETY: as for f32; every f16 converts exactly.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
}

/// [`Kernels::scores`](super::Kernels::scores) for `G` query heads.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; the bounds `Kernels::scores` asserts hold.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scores<const G: usize>(s: &Scores<'_>, out: &mut [f32], stride: usize) {
    let (q, hd, tiles, scale) = (s.q, s.hd, s.tiles.clone(), s.scale);
    // SAFETY: passed on from the caller.
    unsafe {
        match s.keys {
            HeadRows::F32(k) => scores_of::<G, f32>(q, hd, k, tiles, scale, out, stride),
            HeadRows::F16(k) => scores_of::<G, f16>(q, hd, k, tiles, scale, out, stride),
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_of<const G: usize, T: Load>(
    q: &[f32],
    hd: usize,
    keys: &[T],
    tiles: Range<usize>,
    scale: f32,
    out: &mut [f32],
    stride: usize,
) {
    let tile = KEY_TILE * hd;
    let scale = _mm256_set1_ps(scale);
    let (q, out) = (q.as_ptr(), out.as_mut_ptr());
    for t in tiles.clone() {
        let col = (t - tiles.start) * KEY_TILE;
        let mut acc = [[_mm256_setzero_ps(); 2]; G];
        // SAFETY: tile t lies within `keys`, the queries are G rows of `hd`, and the tile's
        // scores lie within `out` (the caller's bounds).
        unsafe {
            let k = keys.as_ptr().add(t * tile);
            for d in 0..hd {
                // As in the AVX-512 kernel.
                if (d * KEY_TILE * size_of::<T>()).is_multiple_of(64) {
                    prefetch(k.wrapping_add(AHEAD * tile + d * KEY_TILE), 1);
                }
                let kd = [
                    T::load8(k.add(d * KEY_TILE)),
                    T::load8(k.add(d * KEY_TILE + 8)),
                ];
                for (g, acc) in acc.iter_mut().enumerate() {
                    let x = _mm256_set1_ps(*q.add(g * hd + d));
                    acc[0] = _mm256_fmadd_ps(x, kd[0], acc[0]);
                    acc[1] = _mm256_fmadd_ps(x, kd[1], acc[1]);
                }
            }
            for (g, acc) in acc.iter().enumerate() {
                let o = out.add(g * stride + col);
                _mm256_storeu_ps(o, _mm256_mul_ps(acc[0], scale));
                _mm256_storeu_ps(o.add(8), _mm256_mul_ps(acc[1], scale));
            }
        }
    }
}

/// [`Kernels::values`](super::Kernels::values) for `G` heads over the values `v.d` (whole
/// chunks of [`VALUE_CHUNK`]) of a slice `w` wide (`acc`'s rows).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; the bounds `Kernels::values` asserts hold.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn values<const G: usize>(v: &Values<'_>, acc: &mut [f32], w: usize) {
    // SAFETY: passed on from the caller.
    unsafe {
        match v.rows {
            HeadRows::F32(rows) => values_of::<G, f32>(v, rows, acc, w),
            HeadRows::F16(rows) => values_of::<G, f16>(v, rows, acc, w),
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn values_of<const G: usize, T: Load>(
    v: &Values<'_>,
    rows: &[T],
    acc: &mut [f32],
    w: usize,
) {
    let (wstride, hd, d, pos) = (v.wstride, v.hd, v.d.clone(), v.pos.clone());
    let (wts, acc) = (v.wts.as_ptr(), acc.as_mut_ptr());
    let mut p0 = pos.start;
    while p0 < pos.end {
        let tile = p0 / VALUE_TILE;
        let p1 = ((tile + 1) * VALUE_TILE).min(pos.end);
        // Each chunk in two halves of 16 values (two registers a head, as many as fit).
        for c in (d.start..d.end).step_by(16) {
            let c0 = c / VALUE_CHUNK * VALUE_CHUNK;
            // SAFETY: chunk c0 of the tile holds VALUE_TILE positions of VALUE_CHUNK values
            // (d is whole chunks, and the rows hold the tiles of `pos`); G rows of weights up
            // to p1 and columns c - d.start .. + 16 of G rows of `acc` lie within them (the
            // caller's bounds).
            unsafe {
                let chunk = rows.as_ptr().add(tile * VALUE_TILE * hd + VALUE_TILE * c0);
                let half = chunk.add(c - c0);
                let out = acc.add(c - d.start);
                let mut a = [[_mm256_setzero_ps(); 2]; G];
                for (g, a) in a.iter_mut().enumerate() {
                    a[0] = _mm256_loadu_ps(out.add(g * w));
                    a[1] = _mm256_loadu_ps(out.add(g * w + 8));
                }
                for p in p0..p1 {
                    let x = half.add((p - tile * VALUE_TILE) * VALUE_CHUNK);
                    prefetch(x.wrapping_add(VALUE_TILE * VALUE_CHUNK), 16);
                    let x = [T::load8(x), T::load8(x.add(8))];
                    for (g, a) in a.iter_mut().enumerate() {
                        let s = _mm256_set1_ps(*wts.add(g * wstride + p));
                        a[0] = _mm256_fmadd_ps(s, x[0], a[0]);
                        a[1] = _mm256_fmadd_ps(s, x[1], a[1]);
                    }
                }
                for (g, a) in a.iter().enumerate() {
                    _mm256_storeu_ps(out.add(g * w), a[0]);
                    _mm256_storeu_ps(out.add(g * w + 8), a[1]);
                }
            }
        }
        p0 = p1;
    }
}
