//! The attention kernels in AArch64's NEON: 16 positions or values as four registers of 4,
//! each lane's arithmetic that of the plain form (and of the x86 kernels).

use std::arch::aarch64::*;
use std::ops::Range;

use half::f16;

use super::{prefetch, Scores, Values, AHEAD};
use crate::kv::{HeadRows, KEY_TILE, VALUE_CHUNK, VALUE_TILE};

/// Registers a run of 16 takes.
const REGS: usize = 4;

/// 4 cached values from where `p` points, in f32.
trait Load: Copy {
    /// # Safety
    /// 4 values from `p` are readable.
    unsafe fn load4(p: *const Self) -> float32x4_t;

    /// 16 values from `p`, as four registers.
    ///
    /// # Safety
    /// 16 values from `p` are readable.
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> [float32x4_t; REGS] {
        // SAFETY: the caller's promise covers the four runs of 4.
        std::array::from_fn(|i| unsafe { Self::load4(p.add(4 * i)) })
    }
}

impl Load for f32 {
    #[inline(always)]
    unsafe fn load4(p: *const f32) -> float32x4_t {
        // SAFETY: readable, by the caller's promise; NEON loads need no alignment.
        unsafe { vld1q_f32(p) }
    }
}

impl Load for f16 {
    #[inline(always)]
    unsafe fn load4(p: *const f16) -> float32x4_t {
        // SAFETY: as for f32; every f16 converts exactly.
        unsafe { quant::simd::f16x4(p.cast()) }
    }
}

/// [`Kernels::scores`](super::Kernels::scores) for `G` query heads.
///
/// # Safety
/// The bounds `Kernels::scores` asserts hold.
#[target_feature(enable = "neon")]
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
#[target_feature(enable = "neon")]
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
    let (q, out) = (q.as_ptr(), out.as_mut_ptr());
    for t in tiles.clone() {
        let col = (t - tiles.start) * KEY_TILE;
        let mut acc = [[vdupq_n_f32(0.0); REGS]; G];
        // SAFETY: tile t lies within `keys`, the queries are G rows of `hd`, and the tile's
        // scores lie within `out` (the caller's bounds).
        unsafe {
            let k = keys.as_ptr().add(t * tile);
            for d in 0..hd {
                // As in the AVX-512 kernel.
                if (d * KEY_TILE * size_of::<T>()).is_multiple_of(64) {
                    prefetch(k.wrapping_add(AHEAD * tile + d * KEY_TILE), 1);
                }
                let kd = T::load16(k.add(d * KEY_TILE));
                for (g, acc) in acc.iter_mut().enumerate() {
                    let x = vdupq_n_f32(*q.add(g * hd + d));
                    for (a, &k) in acc.iter_mut().zip(&kd) {
                        *a = vfmaq_f32(*a, x, k);
                    }
                }
            }
            for (g, acc) in acc.iter().enumerate() {
                let o = out.add(g * stride + col);
                for (i, &a) in acc.iter().enumerate() {
                    vst1q_f32(o.add(4 * i), vmulq_n_f32(a, scale));
                }
            }
        }
    }
}

/// [`Kernels::values`](super::Kernels::values) for `G` heads over the values `v.d` (whole
/// chunks of [`VALUE_CHUNK`]) of a slice `w` wide (`acc`'s rows).
///
/// # Safety
/// The bounds `Kernels::values` asserts hold.
#[target_feature(enable = "neon")]
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
#[target_feature(enable = "neon")]
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
        // Each chunk in two halves of 16 values (four registers a head).
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
                let mut a: [[float32x4_t; REGS]; G] =
                    std::array::from_fn(|g| f32::load16(out.add(g * w)));
                for p in p0..p1 {
                    let x = half.add((p - tile * VALUE_TILE) * VALUE_CHUNK);
                    prefetch(x.wrapping_add(VALUE_TILE * VALUE_CHUNK), 16);
                    let x = T::load16(x);
                    for (g, a) in a.iter_mut().enumerate() {
                        let s = vdupq_n_f32(*wts.add(g * wstride + p));
                        for (a, &x) in a.iter_mut().zip(&x) {
                            *a = vfmaq_f32(*a, s, x);
                        }
                    }
                }
                for (g, a) in a.iter().enumerate() {
                    for (i, &a) in a.iter().enumerate() {
                        vst1q_f32(out.add(g * w + 4 * i), a);
                    }
                }
            }
        }
        p0 = p1;
    }
}
