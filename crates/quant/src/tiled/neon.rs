//! The NEON tiled kernels (AArch64 with the dot-product extension): a panel's 16 rows as four
//! 128-bit *quarters* of 4 rows, one 32-bit lane a row, read from the same panel layout as the
//! x86 kernels (see [`layout`](super::layout)).
//!
//! A quarter's 16 bytes of a chunk are its 4 rows' codes for the chunk's 4 values, which is
//! exactly what one `sdot` by element multiplies against 4 activation codes: a 16-byte load of
//! the activations holds four chunks' codes, and the instruction picks one of them as a lane, so
//! no broadcast is needed.
//!
//! - 2-bit formats: one load of a quarter's 16 bytes of a quad gives four chunks (one of each
//!   activation group `k` of the half), each one instruction away: an `and` that leaves the
//!   codes of groups 0 to 2 times `4^k` (at most 48, within `sdot`'s signed bytes), a shift for
//!   group 3's. A group's accumulator starts at its `−Σq` (times `4^k` where its codes are), so
//!   it ends at the exact `Σ (c − 1)·q` (times `4^k`), and its scale is taken times `4^−k`:
//!   the same products, exactly, as the AVX-512 kernels take them.
//! - Q1_0 with its bits spread ([`Q1Bits::Spread`]): a chunk's 8-byte word, loaded into both
//!   halves of a register, holds in bits `2e` and `2e + 1` of its bytes the 16 register bytes of
//!   quarter `e`; one `cmtst` against those bits gives `−1` where a bit is set, so the `sdot`
//!   forms `−Σ_{bit set} q`, and `−2` times it is the `2·Σ_{bit set} q` the twin sums.
//!
//! Per activation group the exact integer sum is converted and added to the block sum by one
//! fused multiply-add with the group's scale, in group order; per block (Q1_0: after adding the
//! span's `−Σq` terms) one fused multiply-add with the rows' weight scales: the twin's steps in
//! the twin's order, so the same bits.
//!
//! - PTQ1_0 held packed: a quarter's 16 base-3 bytes of each of a half's three 64-byte blocks
//!   give five chunks' trits by four divisions by 3 (a widening multiply by 171, the high bytes,
//!   a shift) and their remainders; chunk 15's 2-bit codes are a shift and an `and`. About four
//!   instructions a chunk where the widened rows ([`Ternary::Wide`](super::Ternary)) take one,
//!   for 23% fewer bytes.
//!
//! The dot products are written as `asm!`, their intrinsics being unstable.

use std::arch::aarch64::*;
use std::arch::asm;
use std::ops::Range;

use super::layout::{self, Q1Bits, PANEL};
use super::{scatter, Act, TiledMatrix};
use crate::acts::GROUPS_PER_HALF;
use crate::{Format, QuantizedActs};

pub(super) fn available() -> bool {
    crate::simd::neon()
}

/// Whether the kernels take matrices in `layout` (every panel layout, Q1_0 only with its bits
/// spread).
pub(super) fn takes(layout: Format, q1: Q1Bits) -> bool {
    match layout {
        Format::Q1_0 => q1 == Q1Bits::Spread,
        Format::Q2_0 | Format::Q2_0G128 | Format::PQ2_0 | Format::PTQ1_0 => true,
        _ => false,
    }
}

/// Rows per quarter (one 128-bit register of 32-bit lanes).
const QUARTER: usize = 4;
/// Quarters per panel.
const QUARTERS: usize = PANEL / QUARTER;

/// `acc + Σ_i a[4l + i]·b[4·lane + i]` per 32-bit lane `l` (signed bytes): `sdot` by element.
#[inline(always)]
unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t, lane: usize) -> int32x4_t {
    let mut acc = acc;
    macro_rules! by {
        ($l:literal) => {
            asm!(
                concat!("sdot {0:v}.4s, {1:v}.16b, {2:v}.4b[", $l, "]"),
                inout(vreg) acc,
                in(vreg) a,
                in(vreg) b,
                options(pure, nomem, nostack, preserves_flags)
            )
        };
    }
    match lane {
        0 => by!(0),
        1 => by!(1),
        2 => by!(2),
        _ => by!(3),
    }
    acc
}

/// The activation codes of one half for `T` tokens: register `i` holds chunks `4i..4i + 4`.
type HalfActs<const T: usize> = [[int8x16_t; 4]; T];

trait Chunks {
    const FORMAT: Format;
    /// Whether the group sums are Q1_0's `2·Σ_{bit set} q`, its `−Σq` terms joining once per
    /// block in floats (else the sums are the exact `Σ (c − 1)·q`).
    const SPAN_NEG: bool;
    /// How many of a half's groups (the first) come with codes times `4^k`: their sums start
    /// at the field-scaled `−Σq` and are scaled by the field scales (`4^−k·d`).
    const FIELD_SCALED: usize = 0;
    /// Per token and activation group `k` of the half at `h` (group `g0 + k` of the tokens'),
    /// the exact integer sums of quarter `e`'s rows (times `4^k` for the field-scaled groups).
    unsafe fn sums<const T: usize>(
        h: *const u8,
        e: usize,
        q: &HalfActs<T>,
        acts: &[Act; T],
        g0: usize,
    ) -> [[int32x4_t; GROUPS_PER_HALF]; T];
}

struct Q1Spread;
struct Q2<const G128: bool>;
/// PTQ1_0 held packed.
struct Ptq;

/// Each token's group accumulators for the groups `g0..g0 + 4` of a half, started at their
/// `−Σq` (times `4^k` for `C`'s field-scaled groups).
#[inline(always)]
unsafe fn starts<C: Chunks, const T: usize>(
    acts: &[Act; T],
    g0: usize,
) -> [[int32x4_t; GROUPS_PER_HALF]; T] {
    let mut acc = [[vdupq_n_s32(0); GROUPS_PER_HALF]; T];
    for (groups, a) in acc.iter_mut().zip(acts) {
        for (k, s) in groups.iter_mut().enumerate() {
            let neg = if k < C::FIELD_SCALED {
                a.field_neg
            } else {
                a.neg
            };
            *s = vdupq_n_s32(*neg.add(g0 + k));
        }
    }
    acc
}

impl Chunks for Q1Spread {
    const FORMAT: Format = Format::Q1_0;
    const SPAN_NEG: bool = true;
    #[inline(always)]
    unsafe fn sums<const T: usize>(
        h: *const u8,
        e: usize,
        q: &HalfActs<T>,
        _: &[Act; T],
        _: usize,
    ) -> [[int32x4_t; GROUPS_PER_HALF]; T] {
        // Register byte j of quarter e is bit 2e + j/8 of word byte j mod 8 (`layout::q1_bit`).
        let lo = vdup_n_u8(1 << (2 * e));
        let places = vcombine_u8(lo, vshl_n_u8::<1>(lo));
        let mut acc = [[vdupq_n_s32(0); GROUPS_PER_HALF]; T];
        for c in 0..layout::CHUNKS {
            let word = vreinterpretq_u8_u64(vld1q_dup_u64(h.add(8 * c) as *const u64));
            let minus = vreinterpretq_s8_u8(vtstq_u8(word, places));
            let k = c % GROUPS_PER_HALF;
            for t in 0..T {
                acc[t][k] = sdot(acc[t][k], minus, q[t][c / 4], k);
            }
        }
        // Loops rather than `map`: the closures and `array::map` were left as calls here.
        for groups in acc.iter_mut() {
            for s in groups.iter_mut() {
                *s = vmulq_n_s32(*s, -2);
            }
        }
        acc
    }
}

impl<const G128: bool> Chunks for Q2<G128> {
    const FORMAT: Format = if G128 { Format::Q2_0G128 } else { Format::Q2_0 };
    const SPAN_NEG: bool = false;
    /// Groups 0 to 2 by an `and` alone (their codes at most 48); group 3's would pass 127
    /// (`sdot` multiplies signed bytes), so it is shifted down.
    const FIELD_SCALED: usize = 3;
    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // i picks both a quad and an activation register
    unsafe fn sums<const T: usize>(
        h: *const u8,
        e: usize,
        q: &HalfActs<T>,
        acts: &[Act; T],
        g0: usize,
    ) -> [[int32x4_t; GROUPS_PER_HALF]; T] {
        let mut acc = starts::<Self, T>(acts, g0);
        for i in 0..layout::CHUNKS / GROUPS_PER_HALF {
            // Quad i holds chunk 4i + k in field k of each byte; quarter e is its bytes 16e...
            let x = vld1q_u8(h.add(layout::QUAD * i + 16 * e));
            let fields = [
                vandq_u8(x, vdupq_n_u8(3)),
                vandq_u8(x, vdupq_n_u8(3 << 2)),
                vandq_u8(x, vdupq_n_u8(3 << 4)),
                vshrq_n_u8::<6>(x),
            ];
            for (k, &codes) in fields.iter().enumerate() {
                let codes = vreinterpretq_s8_u8(codes);
                for t in 0..T {
                    acc[t][k] = sdot(acc[t][k], codes, q[t][i], k);
                }
            }
        }
        acc
    }
}

/// `(v mod 3, v / 3)` of 16 bytes: `v / 3` is `(171·v) >> 9` for every byte.
#[inline(always)]
unsafe fn divmod3(v: uint8x16_t) -> (uint8x16_t, uint8x16_t) {
    let k = vdup_n_u8(171);
    let lo = vmull_u8(vget_low_u8(v), k);
    let hi = vmull_high_u8(v, vdupq_n_u8(171));
    let q = vshrq_n_u8::<1>(vuzp2q_u8(
        vreinterpretq_u8_u16(lo),
        vreinterpretq_u8_u16(hi),
    ));
    (vmlsq_u8(v, q, vdupq_n_u8(3)), q)
}

impl Chunks for Ptq {
    const FORMAT: Format = Format::PTQ1_0;
    const SPAN_NEG: bool = false;
    #[inline(always)]
    unsafe fn sums<const T: usize>(
        h: *const u8,
        e: usize,
        q: &HalfActs<T>,
        acts: &[Act; T],
        g0: usize,
    ) -> [[int32x4_t; GROUPS_PER_HALF]; T] {
        let mut acc = starts::<Self, T>(acts, g0);
        let mut dot = |c: usize, codes: uint8x16_t| {
            let codes = vreinterpretq_s8_u8(codes);
            let k = c % GROUPS_PER_HALF;
            for (groups, q) in acc.iter_mut().zip(q) {
                groups[k] = sdot(groups[k], codes, q[c / 4], k);
            }
        };
        // Block s's bytes hold chunks 5s..5s + 5, trit n of each its chunk 5s + n.
        for s in 0..3 {
            let mut v = vld1q_u8(h.add(64 * s + 16 * e));
            for n in 0..4 {
                let (trit, rest) = divmod3(v);
                dot(5 * s + n, trit);
                v = rest;
            }
            dot(5 * s + 4, v);
        }
        // Chunk 15: quarter e's codes in bits 2e..2e + 2 of the 16 bytes at 192.
        let x = vld1q_u8(h.add(192));
        let three = vdupq_n_u8(3);
        dot(
            15,
            match e {
                0 => vandq_u8(x, three),
                1 => vandq_u8(vshrq_n_u8::<2>(x), three),
                2 => vandq_u8(vshrq_n_u8::<4>(x), three),
                _ => vshrq_n_u8::<6>(x),
            },
        );
        acc
    }
}

/// The four quarters of a panel, for `T` tokens.
type Sums<const T: usize> = [[float32x4_t; QUARTERS]; T];

/// One panel (at `p`) × `T` tokens.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // the t/e/k loops index several arrays at once
unsafe fn tile<C: Chunks, const T: usize>(p: *const u8, blocks: usize, acts: &[Act; T]) -> Sums<T> {
    let pbb = layout::panel_block_bytes(C::FORMAT);
    let (halves, hb) = (layout::halves(C::FORMAT), layout::half_bytes(C::FORMAT));
    let mut tot = [[vdupq_n_f32(0.0); QUARTERS]; T];
    for b in 0..blocks {
        let mut blk = [[vdupq_n_f32(0.0); QUARTERS]; T];
        for h in 0..halves {
            let half = b * halves + h;
            let at = p.add(b * pbb + layout::SCALES + h * hb);
            let mut q: HalfActs<T> = [[vdupq_n_s8(0); 4]; T];
            for (regs, a) in q.iter_mut().zip(acts) {
                for (i, r) in regs.iter_mut().enumerate() {
                    *r = vld1q_s8(a.q.add(16 * half + 4 * i) as *const i8);
                }
            }
            let g0 = GROUPS_PER_HALF * half;
            for e in 0..QUARTERS {
                let sums = C::sums::<T>(at, e, &q, acts, g0);
                for t in 0..T {
                    for k in 0..GROUPS_PER_HALF {
                        let a = &acts[t];
                        let scale = if k < C::FIELD_SCALED {
                            a.field_scale
                        } else {
                            a.scale
                        };
                        let s = vdupq_n_f32(*scale.add(g0 + k));
                        blk[t][e] = vfmaq_f32(blk[t][e], vcvtq_f32_s32(sums[t][k]), s);
                    }
                }
            }
        }
        for t in 0..T {
            let n = vdupq_n_f32(if C::SPAN_NEG {
                *acts[t].span_neg.add(b)
            } else {
                0.0
            });
            for e in 0..QUARTERS {
                if C::SPAN_NEG {
                    blk[t][e] = vaddq_f32(blk[t][e], n);
                }
                let d = crate::simd::f16x4(p.add(b * pbb + 2 * QUARTER * e).cast());
                tot[t][e] = vfmaq_f32(tot[t][e], blk[t][e], d);
            }
        }
    }
    tot
}

/// Writes the quarters `v` for the rows of panel `p` that lie in `rows`, token `t` of `nt`.
#[inline(always)]
unsafe fn store(
    v: [float32x4_t; QUARTERS],
    p: usize,
    t: usize,
    nt: usize,
    rows: &Range<usize>,
    out: &mut [f32],
) {
    let mut lanes = [0f32; PANEL];
    for (e, v) in v.into_iter().enumerate() {
        vst1q_f32(lanes.as_mut_ptr().add(QUARTER * e), v);
    }
    scatter(&lanes, p, t, nt, rows, out);
}

/// Tokens a multi-token pass takes at once: 2, since 4 tokens' activations and group sums (32
/// registers) leave no room for the decoded codes: compiled with 4, the kernels spilled about
/// 180 registers to the stack, with 2 about 30 (outside the chunk loops). Chosen from the code
/// the compiler emits, not timed (no ARM hardware to time it on).
const MULTI: usize = 2;

/// Panel `p` (at `pp`) × tokens `t..t + T`, stored.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pass<C: Chunks, const T: usize>(
    pp: *const u8,
    blocks: usize,
    acts: &[Act],
    p: usize,
    t: usize,
    rows: &Range<usize>,
    out: &mut [f32],
) {
    let v = tile::<C, T>(pp, blocks, &std::array::from_fn(|k| acts[t + k]));
    for (k, v) in v.into_iter().enumerate() {
        store(v, p, t + k, acts.len(), rows, out);
    }
}

#[inline(always)]
unsafe fn run<C: Chunks>(m: &TiledMatrix, panels: Range<usize>, acts: &[Act], out: &mut [f32]) {
    let rows = m.row_range(&panels);
    let blocks = m.blocks();
    let stride = blocks * layout::panel_block_bytes(C::FORMAT);
    let nt = acts.len();
    for p in panels {
        let pp = m.data.as_ptr().add(p * stride);
        let mut t = 0;
        while t < nt {
            if nt - t >= MULTI {
                pass::<C, MULTI>(pp, blocks, acts, p, t, &rows, out);
                t += MULTI;
            } else {
                pass::<C, 1>(pp, blocks, acts, p, t, &rows, out);
                t += 1;
            }
        }
    }
}

/// # Safety
/// The CPU has the features [`available`] checks, [`takes`] holds for the matrix's layout, and
/// shapes were checked by the caller.
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn gemm(
    m: &TiledMatrix,
    panels: Range<usize>,
    acts: &[QuantizedActs],
    out: &mut [f32],
) {
    if m.cols == 0 {
        out.fill(0.0);
        return;
    }
    let acts = Act::all(acts);
    match m.layout {
        Format::Q1_0 => run::<Q1Spread>(m, panels, &acts, out),
        Format::Q2_0 => run::<Q2<false>>(m, panels, &acts, out),
        Format::Q2_0G128 | Format::PQ2_0 => run::<Q2<true>>(m, panels, &acts, out),
        Format::PTQ1_0 => run::<Ptq>(m, panels, &acts, out),
        other => unreachable!("{other} is not a layout the NEON kernels take"),
    }
}
