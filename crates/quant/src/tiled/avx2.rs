//! The AVX2 tiled kernels, for CPUs without AVX-512 (FMA and F16C too): a panel's 16 rows as two
//! 256-bit halves of 8 rows, one 32-bit lane a row, read from the same panel layout as the
//! AVX-512 kernels (see [`layout`](super::layout)).
//!
//! 2-bit formats, per chunk of 4 values × 16 rows: decode the two halves' unsigned codes (a
//! load of the chunk's quad, a shift and an `and` per half), then `vpmaddubsw` against the
//! chunk's 4 activation codes broadcast from memory. Per activation group (four chunks) the
//! 16-bit pair sums are added, widened once by `vpmaddwd`, offset by the group's `−Σq`,
//! converted and scaled: the same integer sums and the same float steps in the same order as
//! the AVX-512 kernels and the scalar twin, so the same bits. Q1_0 goes by table lookups
//! instead (`q1_lookup_tile`): the same exact group sums, the same float steps.
//!
//! PTQ1_0 has no AVX2 decode of its base-3 bytes here: held packed, its panels take the scalar
//! twin, so AVX2 machines hold it widened ([`Ternary::preferred`](super::Ternary::preferred)).

use std::arch::x86_64::*;
use std::ops::Range;

use super::layout::{self, Q1Bits, PANEL};
use super::{prefetch_ahead, scatter, Act, TiledMatrix};
use crate::acts::GROUPS_PER_HALF;
use crate::{sign_tables, Format, QuantizedActs};

pub(super) fn available() -> bool {
    crate::simd::avx2()
}

/// Whether the kernels take matrices in `layout` (every panel layout but packed PTQ1_0, and
/// Q1_0 only with its bits in nibbles).
pub(super) fn takes(layout: Format, q1: Q1Bits) -> bool {
    match layout {
        Format::Q1_0 => q1 == Q1Bits::Nibbles,
        Format::Q2_0 | Format::Q2_0G128 | Format::PQ2_0 => true,
        _ => false,
    }
}

trait Chunks {
    const FORMAT: Format;
    /// Unsigned codes of chunk `c` of the half at `h`, rows `8e..8e + 8`.
    unsafe fn codes(h: *const u8, c: usize, e: usize) -> __m256i;
}

struct Q2<const G128: bool>;

impl<const G128: bool> Chunks for Q2<G128> {
    const FORMAT: Format = if G128 { Format::Q2_0G128 } else { Format::Q2_0 };
    #[inline(always)]
    unsafe fn codes(h: *const u8, c: usize, e: usize) -> __m256i {
        // Rows 8e.. are the quad's bytes 32e..; chunk c's codes are field c mod 4 of each
        // (shifted down, not scaled: `vpmaddubsw`'s pair sums would overflow 16 bits).
        let quad = h.add(layout::QUAD * (c / 4) + 32 * e);
        let x = _mm256_loadu_si256(quad as *const __m256i);
        let x = match c % 4 {
            0 => x,
            1 => _mm256_srli_epi16::<2>(x),
            2 => _mm256_srli_epi16::<4>(x),
            _ => _mm256_srli_epi16::<6>(x),
        };
        _mm256_and_si256(x, _mm256_set1_epi8(3))
    }
}

/// Two halves (rows 0..8, 8..16) of `R` panels × `T` tokens.
type Sums<const R: usize, const T: usize> = [[[__m256; 2]; T]; R];

/// `R` panels × `T` tokens starting at panel pointer `p` (panels `stride` bytes apart).
#[inline(always)]
#[allow(clippy::needless_range_loop)] // the r/t/e loops index several arrays at once
unsafe fn tile<C: Chunks, const R: usize, const T: usize>(
    p: *const u8,
    stride: usize,
    blocks: usize,
    acts: &[Act; T],
) -> Sums<R, T> {
    let pbb = layout::panel_block_bytes(C::FORMAT);
    let (halves, hb) = (layout::halves(C::FORMAT), layout::half_bytes(C::FORMAT));
    let ones = _mm256_set1_epi16(1);
    let mut tot = [[[_mm256_setzero_ps(); 2]; T]; R];
    for b in 0..blocks {
        let mut blk = [[[_mm256_setzero_ps(); 2]; T]; R];
        for r in 0..R {
            prefetch_ahead(p.wrapping_add(r * stride + b * pbb), pbb);
        }
        for h in 0..halves {
            let half = b * halves + h;
            let at = b * pbb + layout::SCALES + h * hb;
            for k in 0..GROUPS_PER_HALF {
                let g = GROUPS_PER_HALF * half + k;
                // Several tokens take one half of the panel at a time (their accumulators
                // then fit the 16 registers beside the block sums); one token both at once
                // (its activation operand made once per chunk).
                let (passes, per) = if T > 1 { (2, 1) } else { (1, 2) };
                for pass in 0..passes {
                    // Pair sums of the group's four chunks: at most 4·2·3·127, no overflow.
                    let mut acc = [[[_mm256_setzero_si256(); 2]; T]; R];
                    for i in 0..layout::CHUNKS / GROUPS_PER_HALF {
                        let c = k + GROUPS_PER_HALF * i;
                        let mut q = [_mm256_setzero_si256(); T];
                        for t in 0..T {
                            let at = acts[t].q.add(16 * half + c);
                            q[t] = _mm256_set1_epi32(at.read_unaligned());
                        }
                        for r in 0..R {
                            for e in pass..pass + per {
                                let codes = C::codes(p.add(r * stride + at), c, e);
                                for t in 0..T {
                                    let pairs = _mm256_maddubs_epi16(codes, q[t]);
                                    acc[r][t][e] = _mm256_add_epi16(acc[r][t][e], pairs);
                                }
                            }
                        }
                    }
                    for t in 0..T {
                        let neg = _mm256_set1_epi32(*acts[t].neg.add(g));
                        let s = _mm256_set1_ps(*acts[t].scale.add(g));
                        for r in 0..R {
                            for e in pass..pass + per {
                                let sum = _mm256_madd_epi16(acc[r][t][e], ones);
                                let sum = _mm256_cvtepi32_ps(_mm256_add_epi32(neg, sum));
                                blk[r][t][e] = _mm256_fmadd_ps(sum, s, blk[r][t][e]);
                            }
                        }
                    }
                }
            }
        }
        for r in 0..R {
            let scales = p.add(r * stride + b * pbb);
            for e in 0..2 {
                let d = _mm256_cvtph_ps(_mm_loadu_si128(scales.add(16 * e) as *const __m128i));
                for t in 0..T {
                    tot[r][t][e] = _mm256_fmadd_ps(blk[r][t][e], d, tot[r][t][e]);
                }
            }
        }
    }
    tot
}

/// `T` tokens × `R` Q1_0 panels by table lookups: each row's 4 bits of a chunk index the
/// chunk's 16 sums `Σ ±q` ([`QuantizedActs::sign_tables`], as two small digits, one `vpshufb`
/// each). A register holds two neighbouring chunks (a 128-bit lane each), which belong to two
/// neighbouring activation groups, 16 rows each: the rows' indices are shared by the tokens, a
/// token's tables by the panels. The digits of a group's four chunks add up as bytes; once per
/// group they are joined into the exact 16-bit group sum (`vpmaddubsw`), widened, turned into
/// the other kernels' `2·Σ_{bit set} q` and scaled as they do it, in the same group order.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // the r/t/e loops index several arrays at once
unsafe fn q1_lookup_tile<const R: usize, const T: usize>(
    p: [*const u8; R],
    blocks: usize,
    acts: &[Act; T],
    tables: &[*const u8; T],
) -> Sums<R, T> {
    let pbb = layout::panel_block_bytes(Format::Q1_0);
    let halves = layout::halves(Format::Q1_0);
    let hb = layout::half_bytes(Format::Q1_0);
    let nibbles = _mm256_set1_epi16(0x0f0f);
    // Digit pairs (L, H) joined as L + RADIX·H: the digits are the signed operand.
    let join = _mm256_set1_epi16(1 | (sign_tables::RADIX << 8));
    let mut tot = [[[_mm256_setzero_ps(); 2]; T]; R];
    for b in 0..blocks {
        for r in 0..R {
            prefetch_ahead(p[r].wrapping_add(b * pbb), pbb);
        }
        let mut blk = [[[_mm256_setzero_ps(); 2]; T]; R];
        for h in 0..halves {
            let half = b * halves + h;
            let at = b * pbb + layout::SCALES + h * hb;
            // Groups 2·pair and 2·pair + 1 hold chunks 2m and 2m + 1 for m = pair + 2i.
            for pair in 0..GROUPS_PER_HALF / 2 {
                // Digit sums of the groups' four chunks: at most 4·31 and 4·16 in size, no carry.
                let mut lo = [[_mm256_setzero_si256(); T]; R];
                let mut hi = [[_mm256_setzero_si256(); T]; R];
                for i in 0..layout::CHUNKS / GROUPS_PER_HALF {
                    let m = pair + 2 * i;
                    // Byte b of a chunk holds row 2b in its low nibble, row 2b + 1 in its high
                    // one: as 16-bit words, low nibble to the low byte and high to the high byte
                    // gives each lane's 16 rows in order.
                    let idx: [__m256i; R] = std::array::from_fn(|r| {
                        let src = p[r].add(at + 16 * m) as *const __m128i;
                        let w = _mm256_cvtepu8_epi16(_mm_loadu_si128(src));
                        _mm256_and_si256(_mm256_or_si256(w, _mm256_slli_epi16::<4>(w)), nibbles)
                    });
                    for t in 0..T {
                        let tb = tables[t].add((8 * half + m) * 64);
                        let tl = _mm256_loadu_si256(tb as *const __m256i);
                        let th = _mm256_loadu_si256(tb.add(32) as *const __m256i);
                        for r in 0..R {
                            lo[r][t] = _mm256_add_epi8(lo[r][t], _mm256_shuffle_epi8(tl, idx[r]));
                            hi[r][t] = _mm256_add_epi8(hi[r][t], _mm256_shuffle_epi8(th, idx[r]));
                        }
                    }
                }
                let g = GROUPS_PER_HALF * half + 2 * pair;
                for t in 0..T {
                    let s = [
                        _mm256_set1_ps(*acts[t].scale.add(g)),
                        _mm256_set1_ps(*acts[t].scale.add(g + 1)),
                    ];
                    // The tables' `Σ ±q` less the group's `−Σq` is the `2·Σ_{bit set} q` the
                    // other Q1_0 kernels scale; the `−Σq` terms join once per block, below.
                    let neg = [
                        _mm256_set1_epi32(*acts[t].neg.add(g)),
                        _mm256_set1_epi32(*acts[t].neg.add(g + 1)),
                    ];
                    for r in 0..R {
                        // Each row's digits side by side, joined to its 16-bit group sum.
                        let sums = |pairs| _mm256_maddubs_epi16(join, pairs);
                        let acc = [
                            sums(_mm256_unpacklo_epi8(lo[r][t], hi[r][t])),
                            sums(_mm256_unpackhi_epi8(lo[r][t], hi[r][t])),
                        ];
                        for e in 0..2 {
                            let lanes = [
                                _mm256_castsi256_si128(acc[e]),
                                _mm256_extracti128_si256::<1>(acc[e]),
                            ];
                            for l in 0..2 {
                                let two = _mm256_sub_epi32(_mm256_cvtepi16_epi32(lanes[l]), neg[l]);
                                let sum = _mm256_cvtepi32_ps(two);
                                blk[r][t][e] = _mm256_fmadd_ps(sum, s[l], blk[r][t][e]);
                            }
                        }
                    }
                }
            }
        }
        for r in 0..R {
            let scales = p[r].add(b * pbb);
            for e in 0..2 {
                let d = _mm256_cvtph_ps(_mm_loadu_si128(scales.add(16 * e) as *const __m128i));
                for t in 0..T {
                    let n = _mm256_set1_ps(*acts[t].span_neg.add(b));
                    let sum = _mm256_add_ps(blk[r][t][e], n);
                    tot[r][t][e] = _mm256_fmadd_ps(sum, d, tot[r][t][e]);
                }
            }
        }
    }
    tot
}

/// Writes the two halves `v` for the rows of panel `p` that lie in `rows`, token `t` of `nt`.
#[inline(always)]
unsafe fn store(
    v: [__m256; 2],
    p: usize,
    t: usize,
    nt: usize,
    rows: &Range<usize>,
    out: &mut [f32],
) {
    let mut lanes = [0f32; PANEL];
    _mm256_storeu_ps(lanes.as_mut_ptr(), v[0]);
    _mm256_storeu_ps(lanes.as_mut_ptr().add(8), v[1]);
    scatter(&lanes, p, t, nt, rows, out);
}

/// Tokens a multi-token pass takes at once.
const MULTI: usize = 4;

#[inline(always)]
unsafe fn run<C: Chunks>(m: &TiledMatrix, panels: Range<usize>, acts: &[Act], out: &mut [f32]) {
    let rows = m.row_range(&panels);
    let blocks = m.blocks();
    let stride = blocks * layout::panel_block_bytes(C::FORMAT);
    let base = m.data.as_ptr();
    let nt = acts.len();
    let mut panels = panels;
    if nt == 1 {
        // Two panels per pass, as the AVX-512 kernels pair them (see there).
        let half = panels.len() / 2;
        for i in 0..half {
            let (a, b) = (panels.start + i, panels.start + half + i);
            let v = tile::<C, 2, 1>(base.add(a * stride), (b - a) * stride, blocks, &[acts[0]]);
            store(v[0][0], a, 0, 1, &rows, out);
            store(v[1][0], b, 0, 1, &rows, out);
        }
        panels.start += 2 * half;
    }
    for p in panels {
        let pp = base.add(p * stride);
        let mut t = 0;
        while t < nt {
            if nt - t >= MULTI {
                let a: [Act; MULTI] = std::array::from_fn(|k| acts[t + k]);
                let v = tile::<C, 1, MULTI>(pp, stride, blocks, &a);
                for (k, &v) in v[0].iter().enumerate() {
                    store(v, p, t + k, nt, &rows, out);
                }
                t += MULTI;
            } else if nt - t >= 2 {
                let v = tile::<C, 1, 2>(pp, stride, blocks, &[acts[t], acts[t + 1]]);
                store(v[0][0], p, t, nt, &rows, out);
                store(v[0][1], p, t + 1, nt, &rows, out);
                t += 2;
            } else {
                let v = tile::<C, 1, 1>(pp, stride, blocks, &[acts[t]]);
                store(v[0][0], p, t, nt, &rows, out);
                t += 1;
            }
        }
    }
}

/// Tokens of Q1_0 over `panels` by table lookups (`q1_lookup_tile`): one token two panels at a
/// time, several tokens [`LOOKUP_TOKENS`] at a time.
#[inline(always)]
unsafe fn run_q1_lookup(
    m: &TiledMatrix,
    panels: Range<usize>,
    acts: &[QuantizedActs],
    out: &mut [f32],
) {
    let rows = m.row_range(&panels);
    let blocks = m.blocks();
    let stride = blocks * layout::panel_block_bytes(Format::Q1_0);
    let base = m.data.as_ptr();
    let tables: Vec<*const u8> = acts.iter().map(|a| a.sign_tables().as_ptr()).collect();
    let a = Act::all(acts);
    let nt = acts.len();
    let mut panels = panels;
    if nt == 1 {
        // Two panels per pass, as the other kernels pair them: each table load serves both.
        let half = panels.len() / 2;
        for i in 0..half {
            let (pa, pb) = (panels.start + i, panels.start + half + i);
            let v = q1_lookup_tile::<2, 1>(
                [base.add(pa * stride), base.add(pb * stride)],
                blocks,
                &[a[0]],
                &[tables[0]],
            );
            store(v[0][0], pa, 0, 1, &rows, out);
            store(v[1][0], pb, 0, 1, &rows, out);
        }
        panels.start += 2 * half;
    }
    // Tokens outer, panels inner: a pass's tables (8 bytes a value a token, far more than the
    // panels' weights) are then read once per task rather than once per panel.
    let mut t = 0;
    while t < nt {
        let take = if nt - t >= LOOKUP_TOKENS {
            LOOKUP_TOKENS
        } else {
            1
        };
        for p in panels.clone() {
            let pp = [base.add(p * stride)];
            if take == LOOKUP_TOKENS {
                let v = q1_lookup_tile::<1, LOOKUP_TOKENS>(
                    pp,
                    blocks,
                    &std::array::from_fn(|k| a[t + k]),
                    &std::array::from_fn(|k| tables[t + k]),
                );
                for (k, &v) in v[0].iter().enumerate() {
                    store(v, p, t + k, nt, &rows, out);
                }
            } else {
                let v = q1_lookup_tile::<1, 1>(pp, blocks, &[a[t]], &[tables[t]]);
                store(v[0][0], p, t, nt, &rows, out);
            }
        }
        t += take;
    }
}

/// Tokens a Q1_0 lookup pass takes at once.
const LOOKUP_TOKENS: usize = 4;

/// # Safety
/// The CPU has the features [`available`] checks, [`takes`] holds for the matrix's layout, and
/// shapes were checked by the caller.
#[target_feature(enable = "avx2,fma,f16c")]
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
    // Q1_0 looks its rows up in each token's sign tables (made once per token).
    if m.layout == Format::Q1_0 {
        return run_q1_lookup(m, panels, acts, out);
    }
    let acts = Act::all(acts);
    match m.layout {
        Format::Q2_0 => run::<Q2<false>>(m, panels, &acts, out),
        Format::Q2_0G128 | Format::PQ2_0 => run::<Q2<true>>(m, panels, &acts, out),
        other => unreachable!("{other} is not a layout the AVX2 kernels take"),
    }
}
