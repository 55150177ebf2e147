//! The AVX2 tiled kernels, for CPUs without AVX-512 (FMA and F16C too): a panel's 16 rows as two
//! 256-bit halves of 8 rows, one 32-bit lane a row, read from the same panel layout as the
//! AVX-512 kernels (see [`layout`](super::layout)).
//!
//! Per chunk of 4 values × 16 rows: decode the two halves' unsigned codes (2-bit: a 16-byte
//! broadcast, a variable shift and an `and` per half; Q1_0: a byte spread, `and`, compare and
//! `and`), then `vpmaddubsw` against the chunk's 4 activation codes broadcast from memory. Per
//! activation group (four chunks) the 16-bit pair sums are added, widened once by `vpmaddwd`,
//! offset by the group's `−Σq`, converted and scaled: the same integer sums and the same float
//! steps in the same order as the AVX-512 kernels and the scalar twin, so the same bits. One
//! token of Q1_0 goes by table lookups instead (`q1_lookup_panel`).
//!
//! PTQ1_0 has no AVX2 decode of its base-3 bytes here: held packed, its panels take the scalar
//! twin, so AVX2 machines hold it widened ([`Ternary::preferred`](super::Ternary::preferred)).

use std::arch::x86_64::*;
use std::ops::Range;

use super::layout::{self, PANEL};
use super::{prefetch_ahead, scatter, Act, TiledMatrix};
use crate::acts::GROUPS_PER_HALF;
use crate::gemm::x86::avx2::one_bit_codes;
use crate::{Format, QuantizedActs};

pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Whether the kernels take matrices in `layout` (every panel layout but packed PTQ1_0).
pub(super) fn takes(layout: Format) -> bool {
    matches!(
        layout,
        Format::Q1_0 | Format::Q2_0 | Format::Q2_0G128 | Format::PQ2_0
    )
}

trait Chunks {
    const FORMAT: Format;
    /// Unsigned codes of chunk `c` of the half at `h`, rows `8e..8e + 8`.
    unsafe fn codes(h: *const u8, c: usize, e: usize) -> __m256i;
}

struct Q1;
struct Q2<const G128: bool>;

impl Chunks for Q1 {
    const FORMAT: Format = Format::Q1_0;
    /// Register byte j ↔ bit j: bits `32e..32e + 32` are rows `8e..8e + 8`.
    #[inline(always)]
    unsafe fn codes(h: *const u8, c: usize, e: usize) -> __m256i {
        one_bit_codes((h.add(8 * c + 4 * e) as *const i32).read_unaligned())
    }
}

impl<const G128: bool> Chunks for Q2<G128> {
    const FORMAT: Format = if G128 { Format::Q2_0G128 } else { Format::Q2_0 };
    #[inline(always)]
    unsafe fn codes(h: *const u8, c: usize, e: usize) -> __m256i {
        // Register byte j is field j / 16 of source byte j % 16: each 128-bit lane of a half
        // shifts the broadcast by its field.
        let x = _mm256_broadcastsi128_si256(_mm_loadu_si128(h.add(16 * c) as *const __m128i));
        let f = 4 * e as i64;
        let shift = _mm256_setr_epi64x(f, f, f + 2, f + 2);
        _mm256_and_si256(_mm256_srlv_epi64(x, shift), _mm256_set1_epi8(3))
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

/// One token × one Q1_0 panel by table lookups: each row's 4 bits of a chunk index the chunk's
/// 16 sums `Σ ±q` ([`QuantizedActs::sign_tables`], low and high bytes by one `vpshufb` each),
/// two chunks a register (a 128-bit lane each), 16 rows a lookup (the low nibbles of a chunk's
/// 8 bytes are the even rows, the high nibbles the odd ones). Per group, the two lanes' 16-bit
/// sums are added and widened once: the group's exact sum per row, as the other kernels form
/// it. Returns the even rows' and the odd rows' totals.
#[inline(always)]
unsafe fn q1_lookup_panel(
    p: *const u8,
    blocks: usize,
    act: &Act,
    tables: *const u8,
) -> [__m256; 2] {
    let pbb = layout::panel_block_bytes(Format::Q1_0);
    let halves = layout::halves(Format::Q1_0);
    let hb = layout::half_bytes(Format::Q1_0);
    let low4 = _mm256_set1_epi8(0x0f);
    // Scales of rows 0..16 → even rows in the low 128 bits, odd rows in the high.
    let split = _mm256_setr_epi8(
        0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7,
        10, 11, 14, 15,
    );
    let mut tot = [_mm256_setzero_ps(); 2];
    for b in 0..blocks {
        prefetch_ahead(p.wrapping_add(b * pbb), pbb);
        let mut blk = [_mm256_setzero_ps(); 2];
        for h in 0..halves {
            let half = b * halves + h;
            let at = p.add(b * pbb + layout::SCALES + h * hb);
            for k in 0..GROUPS_PER_HALF {
                let g = GROUPS_PER_HALF * half + k;
                let mut acc = [_mm256_setzero_si256(); 2];
                for j in 0..2 {
                    let c = k + 8 * j;
                    let x = _mm256_set_m128i(
                        _mm_loadl_epi64(at.add(8 * (c + 4)) as *const __m128i),
                        _mm_loadl_epi64(at.add(8 * c) as *const __m128i),
                    );
                    let idx =
                        _mm256_and_si256(_mm256_unpacklo_epi64(x, _mm256_srli_epi16::<4>(x)), low4);
                    let tb = tables.add((8 * half + 2 * k + j) * 64);
                    let lo = _mm256_shuffle_epi8(_mm256_loadu_si256(tb as *const __m256i), idx);
                    let hi =
                        _mm256_shuffle_epi8(_mm256_loadu_si256(tb.add(32) as *const __m256i), idx);
                    acc[0] = _mm256_add_epi16(acc[0], _mm256_unpacklo_epi8(lo, hi));
                    acc[1] = _mm256_add_epi16(acc[1], _mm256_unpackhi_epi8(lo, hi));
                }
                let s = _mm256_set1_ps(*act.scale.add(g));
                for e in 0..2 {
                    let sum = _mm_add_epi16(
                        _mm256_castsi256_si128(acc[e]),
                        _mm256_extracti128_si256::<1>(acc[e]),
                    );
                    let sum = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(sum));
                    blk[e] = _mm256_fmadd_ps(sum, s, blk[e]);
                }
            }
        }
        let scales = _mm256_loadu_si256(p.add(b * pbb) as *const __m256i);
        let d = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(scales, split));
        for e in 0..2 {
            let half16 = if e == 0 {
                _mm256_castsi256_si128(d)
            } else {
                _mm256_extracti128_si256::<1>(d)
            };
            tot[e] = _mm256_fmadd_ps(blk[e], _mm256_cvtph_ps(half16), tot[e]);
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

/// One token of Q1_0 over `panels` by table lookups (`q1_lookup_panel`).
#[inline(always)]
unsafe fn run_q1_lookup(
    m: &TiledMatrix,
    panels: Range<usize>,
    act: &QuantizedActs,
    out: &mut [f32],
) {
    let rows = m.row_range(&panels);
    let blocks = m.blocks();
    let stride = blocks * layout::panel_block_bytes(Format::Q1_0);
    let base = m.data.as_ptr();
    let tables = act.sign_tables().as_ptr();
    let a = Act::all(std::slice::from_ref(act))[0];
    for p in panels {
        let [even, odd] = q1_lookup_panel(base.add(p * stride), blocks, &a, tables);
        let (mut e, mut o) = ([0f32; 8], [0f32; 8]);
        _mm256_storeu_ps(e.as_mut_ptr(), even);
        _mm256_storeu_ps(o.as_mut_ptr(), odd);
        let lanes: [f32; PANEL] =
            std::array::from_fn(|l| if l % 2 == 0 { e[l / 2] } else { o[l / 2] });
        scatter(&lanes, p, 0, 1, &rows, out);
    }
}

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
    // One token of Q1_0 looks its rows up in the token's sign tables (made once per token).
    if let (Format::Q1_0, [one]) = (m.layout, acts) {
        return run_q1_lookup(m, panels, one, out);
    }
    let acts = Act::all(acts);
    match m.layout {
        Format::Q1_0 => run::<Q1>(m, panels, &acts, out),
        Format::Q2_0 => run::<Q2<false>>(m, panels, &acts, out),
        Format::Q2_0G128 | Format::PQ2_0 => run::<Q2<true>>(m, panels, &acts, out),
        other => unreachable!("{other} is not a layout the AVX2 kernels take"),
    }
}
