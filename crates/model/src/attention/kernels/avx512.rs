//! The attention kernels in AVX-512: 16 positions (scores) or 16 values (outputs) a register.

use std::arch::x86_64::*;
use std::ops::Range;

use half::f16;

use super::{prefetch, Scores, Values, AHEAD};
use crate::kv::{HeadRows, KEY_TILE, VALUE_CHUNK, VALUE_TILE};

/// 16 cached values from where `p` points, in f32.
trait Load: Copy {
    /// # Safety
    /// 16 values from `p` are readable; the CPU has AVX-512F.
    unsafe fn load16(p: *const Self) -> __m512;
}

impl Load for f32 {
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const f32) -> __m512 {
        // SAFETY: readable, by the caller's promise; unaligned loads are allowed.
        unsafe { _mm512_loadu_ps(p) }
    }
}

impl Load for f16 {
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const f16) -> __m512 {
        // SAFETY: as for f32; every f16 converts exactly.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
}

/// [`Kernels::scores`](super::Kernels::scores) for `G` query heads.
///
/// # Safety
/// The CPU has AVX-512F; the bounds `Kernels::scores` asserts hold.
#[target_feature(enable = "avx512f")]
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
#[target_feature(enable = "avx512f")]
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
    let scale = _mm512_set1_ps(scale);
    let (q, out) = (q.as_ptr(), out.as_mut_ptr());
    let mut t = tiles.start;
    // Two tiles at a time: each query value broadcast once for 32 positions.
    while t < tiles.end {
        let col = (t - tiles.start) * KEY_TILE;
        // SAFETY: tile t (and t + 1 where taken) lies within `keys`, and its scores within
        // `out`, by the bounds the caller asserted.
        unsafe {
            let k = keys.as_ptr().add(t * tile);
            if t + 1 < tiles.end {
                score_tiles::<G, 2, T>(q, hd, k, scale, out.add(col), stride);
                t += 2;
            } else {
                score_tiles::<G, 1, T>(q, hd, k, scale, out.add(col), stride);
                t += 1;
            }
        }
    }
}

/// `N` consecutive tiles from `k`, scored for `G` heads into `out` (rows `stride` apart).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn score_tiles<const G: usize, const N: usize, T: Load>(
    q: *const f32,
    hd: usize,
    k: *const T,
    scale: __m512,
    out: *mut f32,
    stride: usize,
) {
    let tile = KEY_TILE * hd;
    let mut acc = [[_mm512_setzero_ps(); N]; G];
    for d in 0..hd {
        // The same line of the tiles AHEAD further on, as each line of these is first read.
        if (d * KEY_TILE * size_of::<T>()).is_multiple_of(64) {
            for j in 0..N {
                prefetch(k.wrapping_add((AHEAD + j) * tile + d * KEY_TILE), 1);
            }
        }
        // SAFETY: the tiles hold `hd` rows of 16; the queries G rows of `hd` (the caller's
        // bounds).
        unsafe {
            let kd: [__m512; N] =
                std::array::from_fn(|j| T::load16(k.add(j * tile + d * KEY_TILE)));
            for (g, acc) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*q.add(g * hd + d));
                for (a, &kd) in acc.iter_mut().zip(&kd) {
                    *a = _mm512_fmadd_ps(x, kd, *a);
                }
            }
        }
    }
    for (g, acc) in acc.iter().enumerate() {
        for (j, &a) in acc.iter().enumerate() {
            // SAFETY: the scores of these tiles lie within `out` (the caller's bounds).
            unsafe {
                _mm512_storeu_ps(out.add(g * stride + j * KEY_TILE), _mm512_mul_ps(a, scale))
            };
        }
    }
}

/// [`Kernels::values`](super::Kernels::values) for `G` heads over the values `v.d` (whole
/// chunks of [`VALUE_CHUNK`]) of a slice `w` wide (`acc`'s rows).
///
/// # Safety
/// The CPU has AVX-512F; the bounds `Kernels::values` asserts hold.
#[target_feature(enable = "avx512f")]
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
#[target_feature(enable = "avx512f")]
unsafe fn values_of<const G: usize, T: Load>(
    v: &Values<'_>,
    rows: &[T],
    acc: &mut [f32],
    w: usize,
) {
    let (wstride, hd, d, pos) = (v.wstride, v.hd, v.d.clone(), v.pos.clone());
    let (wts, acc) = (v.wts.as_ptr(), acc.as_mut_ptr());
    // Tile after tile and chunk after chunk: the order they lie in memory.
    let mut p0 = pos.start;
    while p0 < pos.end {
        let tile = p0 / VALUE_TILE;
        let p1 = ((tile + 1) * VALUE_TILE).min(pos.end);
        for c0 in d.clone().step_by(VALUE_CHUNK) {
            // SAFETY: chunk c0 of the tile holds VALUE_TILE positions of VALUE_CHUNK values
            // (d is whole chunks, and the rows hold the tiles of `pos`), and columns
            // c0 - d.start.. of G rows of `acc` lie within it (the caller's bounds).
            unsafe {
                let chunk = rows.as_ptr().add(tile * VALUE_TILE * hd + VALUE_TILE * c0);
                let first = tile * VALUE_TILE;
                value_chunk::<G, T>(wts, wstride, chunk, first, p0..p1, acc.add(c0 - d.start), w);
            }
        }
        p0 = p1;
    }
}

/// A chunk's 32 values of positions `pos` (position `p` at `chunk + (p − first) ·
/// VALUE_CHUNK`, all in the tile from `first`) into `G` rows of `acc` (`w` apart).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn value_chunk<const G: usize, T: Load>(
    wts: *const f32,
    wstride: usize,
    chunk: *const T,
    first: usize,
    pos: Range<usize>,
    acc: *mut f32,
    w: usize,
) {
    // SAFETY (this function's blocks): the caller's bounds cover G rows of 32 values of `acc`,
    // the chunk's positions `pos`, and G rows of weights up to `pos.end`.
    let mut a: [[__m512; 2]; G] = std::array::from_fn(|g| {
        std::array::from_fn(|j| unsafe { _mm512_loadu_ps(acc.add(g * w + j * 16)) })
    });
    for p in pos {
        unsafe {
            let x = chunk.add((p - first) * VALUE_CHUNK);
            // The next chunk's line for this lane: chunks lie one after another.
            prefetch(x.wrapping_add(VALUE_TILE * VALUE_CHUNK), VALUE_CHUNK);
            let x = [T::load16(x), T::load16(x.add(16))];
            for (g, a) in a.iter_mut().enumerate() {
                let s = _mm512_set1_ps(*wts.add(g * wstride + p));
                a[0] = _mm512_fmadd_ps(s, x[0], a[0]);
                a[1] = _mm512_fmadd_ps(s, x[1], a[1]);
            }
        }
    }
    for (g, a) in a.iter().enumerate() {
        for (j, &a) in a.iter().enumerate() {
            unsafe { _mm512_storeu_ps(acc.add(g * w + j * 16), a) };
        }
    }
}
