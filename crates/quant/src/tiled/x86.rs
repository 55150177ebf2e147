//! The AVX-512 tiled kernels (F/BW/VNNI/VBMI): one 512-bit register is one panel, 16 rows.
//!
//! Per chunk of 4 values × 16 rows: decode 64 unsigned codes (Q1_0: a broadcast and an `and`
//! that leave row `L`'s codes scaled by `2^(L/2)`, undone per block in floats, or with its bits
//! in nibbles a mask load and a masked move; 2-bit: an `and` of the chunk's quad that leaves
//! group `k`'s codes scaled by `4^k`, undone by the group's scale; PTQ1_0: a shift
//! and an `and` of trits that each 64-byte base-3 block had looked up once for its five chunks,
//! by `vpermt2b` on the low 7 bits of each byte, blended by its top bit) and one `vpdpbusd`
//! against the chunk's 4 activation codes broadcast from memory. Per activation
//! group (four chunks, 16 values apart), the accumulator starts at the group's `−Σq` (Q1_0: at
//! 0, its `−Σq` terms joining once per block in floats), and one conversion and one FMA by the
//! group scale add it to the block sum; per block, one FMA by the 16 rows' weight scales.

use std::arch::x86_64::*;
use std::ops::Range;
use std::sync::OnceLock;

use super::layout::{self, Q1Bits, PANEL};
use super::{prefetch_ahead, scatter, Act, TiledMatrix};
use crate::acts::GROUPS_PER_HALF;
use crate::{Format, QuantizedActs};

pub(super) fn available() -> bool {
    crate::simd::allows(crate::Simd::Avx512)
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("avx512vbmi")
        && is_x86_feature_detected!("f16c")
        && is_x86_feature_detected!("fma")
}

/// Whether the CPU's vendor is AMD (its vector units favour other decodes than Intel's), asked
/// once: under a hypervisor `cpuid` traps, and the kernels ask on every call.
fn amd() -> bool {
    static AMD: OnceLock<bool> = OnceLock::new();
    *AMD.get_or_init(|| {
        let id = __cpuid(0);
        let vendor: Vec<u8> = [id.ebx, id.edx, id.ecx]
            .iter()
            .flat_map(|r| r.to_le_bytes())
            .collect();
        vendor == b"AuthenticAMD"
    })
}

trait Chunks {
    const FORMAT: Format;
    /// Tokens a multi-token tile takes at once: 8 where decoding a chunk takes more than one
    /// operation (each decoded chunk then serves twice the tokens: prefill of a 27B file on 2
    /// cores, PTQ1_0 3.3–3.7 → 4.5–5.0 tok/s, Q2_0 5.9–6.5 → 6.8–7.1), else 4 (Q1_0's one masked
    /// move per chunk: 8 tokens measured 20% slower there, from register pressure).
    const TOKENS: usize = 4;
    /// Whether the accumulators start at 0 rather than the group's `−Σq` (Q1_0): its codes 0
    /// and 2 sum to `2·Σ_{bit set} q`, and the span's `Σ_g (−Σq_g)·d_g` joins the block sum
    /// once per block, a float step per block instead of an integer one per group (the group
    /// steps' fused multiply-adds and `vpdpbusd` share the same two pipes on Zen 4).
    const SPAN_NEG: bool = false;
    /// Whether decoded codes are 0 or `2^(L/2)` in lane `L` (Q1_0's one `and`) rather than the
    /// weight's code (with [`Chunks::SPAN_NEG`]): the block sum is then scaled back per lane
    /// once per block, by a power of two, so exactly where no product is subnormal.
    const LANE_SCALED: bool = false;
    /// Whether the codes of activation group `k` of a half come times `4^k` (the 2-bit quads:
    /// one `and`, no shift): the group's sum then starts at `4^k·(−Σq)` and is scaled by
    /// `4^−k·d`, which gives the same products, exactly.
    const FIELD_SCALED: bool = false;
    /// Whether a pass asks for the bytes a few panel blocks ahead (`prefetch_ahead`) on an AMD
    /// CPU: the 2-bit quads stream faster without there (a decode token of the 27B Q2_0 file
    /// 31% faster, of PQ2_0 27%, alternated step by step in one process), Q1_0 slower (5-7%),
    /// PTQ1_0 level. On Intel every format prefetches ([`prefetch`]).
    const PREFETCH: bool = true;
    /// Panels a one-token pass multiplies at once, each from its own part of the task's range
    /// (so each a weight stream of its own): 4 for Q1_0, whose chunks carry 8 bytes of weights
    /// each, so that one broadcast of a chunk's activations serves four panels (2 Zen 5 cores,
    /// 5120 × 17408: its ceiling from L2 41.0 → 45.7 GB/s a thread; the 27B file's decode,
    /// builds alternated with the memory reading 84-89 GB/s, 13.54 / 13.28 / 13.52 → 13.93 /
    /// 14.34 / 13.63 tok/s); 2 for the others (Q2_0's ceiling 97 → 92.5 GB/s, two threads from
    /// memory 76 → 65-69 GB/s with 4). On AMD; Intel takes four for every format
    /// ([`decode_streams_here`]).
    const DECODE_STREAMS: usize = 2;
    /// What one row's pass over a half keeps between its chunks: the half's address, or what
    /// several chunks share decoded once.
    type Half: Copy;
    /// The half at `h`.
    unsafe fn half(h: *const u8) -> Self::Half;
    /// Codes of chunk `c` of a half.
    unsafe fn codes(h: &Self::Half, c: usize) -> __m512i;
}

/// Q1_0 with its bits in nibbles ([`Q1Bits::Nibbles`]).
struct Q1;
/// Q1_0 with its bits spread ([`Q1Bits::Spread`]).
struct Q1Spread;
struct Q2<const G128: bool>;
struct Ptq;

/// Register byte `j` of a Q1_0 chunk keeps bit `j / 8` of its byte of the broadcast word
/// (`layout::q1_bit`).
const Q1_PLACES: [u8; 64] = {
    let mut t = [0u8; 64];
    let mut j = 0;
    while j < 64 {
        t[j] = 1 << (layout::q1_bit(Q1Bits::Spread, j) % 8);
        j += 1;
    }
    t
};

/// Lane `L`'s factor from a Q1_0 sum of `2^(L/2)·x` to `2·x`.
const Q1_LANE_SCALE: [f32; 16] = {
    let mut t = [0f32; 16];
    let mut l = 0;
    while l < 16 {
        t[l] = 2.0 / (1u32 << (l / 2)) as f32;
        l += 1;
    }
    t
};

impl Chunks for Q1 {
    const FORMAT: Format = Format::Q1_0;
    const DECODE_STREAMS: usize = 4;
    const SPAN_NEG: bool = true;
    type Half = *const u8;
    #[inline(always)]
    unsafe fn half(h: *const u8) -> *const u8 {
        h
    }
    #[inline(always)]
    unsafe fn codes(h: &*const u8, c: usize) -> __m512i {
        let bits = (h.add(8 * c) as *const u64).read_unaligned();
        _mm512_maskz_mov_epi8(bits, _mm512_set1_epi8(2))
    }
}

impl Chunks for Q1Spread {
    const FORMAT: Format = Format::Q1_0;
    const DECODE_STREAMS: usize = 4;
    const SPAN_NEG: bool = true;
    const LANE_SCALED: bool = true;
    type Half = *const u8;
    #[inline(always)]
    unsafe fn half(h: *const u8) -> *const u8 {
        h
    }
    #[inline(always)]
    unsafe fn codes(h: &*const u8, c: usize) -> __m512i {
        let word = (h.add(8 * c) as *const i64).read_unaligned();
        let places = _mm512_loadu_si512(Q1_PLACES.as_ptr() as *const __m512i);
        _mm512_and_si512(_mm512_set1_epi64(word), places)
    }
}

impl<const G128: bool> Chunks for Q2<G128> {
    const FORMAT: Format = if G128 { Format::Q2_0G128 } else { Format::Q2_0 };
    const TOKENS: usize = 8;
    const FIELD_SCALED: bool = true;
    const PREFETCH: bool = false;
    type Half = *const u8;
    #[inline(always)]
    unsafe fn half(h: *const u8) -> *const u8 {
        h
    }
    #[inline(always)]
    unsafe fn codes(h: &*const u8, c: usize) -> __m512i {
        // A plain load (the quad serves the four groups) and an `and`: a broadcast and
        // `vpmultishiftqb` per chunk measured 2.9 cycles a `vpdpbusd`, the shift sharing the
        // dot product's pipes.
        let quad = _mm512_loadu_si512(h.add(layout::QUAD * (c / 4)) as *const __m512i);
        _mm512_and_si512(quad, _mm512_set1_epi8((3u8 << (2 * (c % 4))) as i8))
    }
}

/// Lookup tables by base-3 byte `v` (entries past 242 are never stored), one pair per
/// base-3 block `s` of a half (chunks `5s..5s+5`). Chunk `c` belongs to activation group
/// `c mod 4` of the half, so the tables put each trit where [`Chunks::FIELD_SCALED`] wants it:
/// `[s][v]` packs trits 0..=3 of `v` as 2-bit fields, trit `n` in field `(s + n) mod 4` (chunk
/// `5s + n`'s group), and `[3 + s][v]` is trit 4 times `4^s` (chunk `5s + 4`'s group is `s`).
/// A chunk's codes are then one `and` of its field, with no shift.
#[repr(align(64))]
struct Trits([[u8; 256]; 6]);

static TRITS: Trits = {
    let mut t = [[0u8; 256]; 6];
    let mut s = 0;
    while s < 3 {
        let mut v = 0;
        while v < 256 {
            let (mut x, mut n, mut packed) = (v, 0, 0u8);
            while n < 4 {
                packed |= ((x % 3) as u8) << (2 * ((s + n) % 4));
                x /= 3;
                n += 1;
            }
            t[s][v] = packed;
            t[3 + s][v] = ((x % 3) as u8) << (2 * s);
            v += 1;
        }
        s += 1;
    }
    Trits(t)
};

/// `vpmultishiftqb` control for PTQ1_0's 2-bit chunk (15): register byte `j`, where the 16-byte
/// broadcast put source byte `j mod 16`, takes the code at bit `8·(j mod 8) + 2·(j / 16)` of its
/// quadword into its top two bits (the 8 bits from six earlier, wrapping in the quadword): times
/// `4^3`, the field of chunk 15's group.
const TWO_BIT_SHIFTS_TOP: [u8; 64] = {
    let mut t = [0u8; 64];
    let mut j = 0;
    while j < 64 {
        t[j] = ((8 * (j % 8) + 2 * (j / 16) + 58) % 64) as u8;
        j += 1;
    }
    t
};

/// Byte `v` of every lane looked up in a 256-entry table (two 128-entry `vpermt2b` lookups by
/// the low 7 bits, chosen by the top bit `high`).
#[inline(always)]
unsafe fn lookup256(table: &[u8; 256], v: __m512i, high: __mmask64) -> __m512i {
    let tab = |i: usize| _mm512_load_si512(table.as_ptr().add(64 * i) as *const __m512i);
    let low = _mm512_permutex2var_epi8(tab(0), v, tab(1));
    let top = _mm512_permutex2var_epi8(tab(2), v, tab(3));
    _mm512_mask_blend_epi8(high, low, top)
}

/// A PTQ1_0 half with its three base-3 blocks `s` decoded once (chunk `5s + n` is trit `n`):
/// trits 0..=3 packed 2 bits each, trit 4 apart, and the 2-bit chunk 15's address.
#[derive(Clone, Copy)]
struct PtqHalf {
    packed: [__m512i; 3],
    fifth: [__m512i; 3],
    tail: *const u8,
}

impl Chunks for Ptq {
    const FORMAT: Format = Format::PTQ1_0;
    const TOKENS: usize = 8;
    const FIELD_SCALED: bool = true;
    type Half = PtqHalf;
    #[inline(always)]
    unsafe fn half(h: *const u8) -> PtqHalf {
        // Two 256-entry lookups per 64 bytes, shared by their five chunks: with a lookup per
        // chunk the kernel computed 8.8 GB/s of weights per thread, 13.2 like this (L2-resident,
        // `examples/gemv_bandwidth`).
        let mut out = PtqHalf {
            packed: [_mm512_setzero_si512(); 3],
            fifth: [_mm512_setzero_si512(); 3],
            tail: h.add(192),
        };
        for s in 0..3 {
            let v = _mm512_loadu_si512(h.add(64 * s) as *const __m512i);
            let high = _mm512_movepi8_mask(v);
            out.packed[s] = lookup256(&TRITS.0[s], v, high);
            out.fifth[s] = lookup256(&TRITS.0[3 + s], v, high);
        }
        out
    }
    #[inline(always)]
    unsafe fn codes(h: &PtqHalf, c: usize) -> __m512i {
        if c == 15 {
            let x = _mm512_broadcast_i32x4(_mm_loadu_si128(h.tail as *const __m128i));
            let ctl = _mm512_loadu_si512(TWO_BIT_SHIFTS_TOP.as_ptr() as *const __m512i);
            return _mm512_and_si512(
                _mm512_multishift_epi64_epi8(ctl, x),
                _mm512_set1_epi8(0xC0u8 as i8),
            );
        }
        let (s, n) = (c / 5, c % 5);
        if n == 4 {
            return h.fifth[s];
        }
        let field = 3u8 << (2 * ((s + n) % 4));
        _mm512_and_si512(h.packed[s], _mm512_set1_epi8(field as i8))
    }
}

/// `R` panels × `T` tokens starting at panel pointer `p` (panels `stride` bytes apart).
#[inline(always)]
#[allow(clippy::needless_range_loop)] // the r/t loops index several arrays at once
unsafe fn tile<C: Chunks, const R: usize, const T: usize>(
    p: *const u8,
    stride: usize,
    blocks: usize,
    acts: &[Act; T],
    prefetch: bool,
) -> [[__m512; T]; R] {
    let pbb = layout::panel_block_bytes(C::FORMAT);
    let (halves, hb) = (layout::halves(C::FORMAT), layout::half_bytes(C::FORMAT));
    let mut tot = [[_mm512_setzero_ps(); T]; R];
    for b in 0..blocks {
        let mut blk = [[_mm512_setzero_ps(); T]; R];
        for r in 0..R {
            if prefetch {
                prefetch_ahead(p.wrapping_add(r * stride + b * pbb), pbb);
            }
        }
        for h in 0..halves {
            let half = b * halves + h;
            // A loop, not `array::from_fn`: a closure would not inherit the target features.
            let at = b * pbb + layout::SCALES + h * hb;
            let mut rows = [C::half(p.add(at)); R];
            for r in 1..R {
                rows[r] = C::half(p.add(r * stride + at));
            }
            for k in 0..GROUPS_PER_HALF {
                let g = GROUPS_PER_HALF * half + k;
                let mut acc = [[_mm512_setzero_si512(); T]; R];
                if !C::SPAN_NEG {
                    for t in 0..T {
                        let neg = if C::FIELD_SCALED {
                            acts[t].field_neg
                        } else {
                            acts[t].neg
                        };
                        let neg = _mm512_set1_epi32(*neg.add(g));
                        for r in 0..R {
                            acc[r][t] = neg;
                        }
                    }
                }
                for i in 0..layout::CHUNKS / GROUPS_PER_HALF {
                    let c = k + GROUPS_PER_HALF * i;
                    for r in 0..R {
                        let codes = C::codes(&rows[r], c);
                        for t in 0..T {
                            let q =
                                _mm512_set1_epi32(acts[t].q.add(16 * half + c).read_unaligned());
                            acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], codes, q);
                        }
                    }
                }
                for t in 0..T {
                    let s = if C::FIELD_SCALED {
                        acts[t].field_scale
                    } else {
                        acts[t].scale
                    };
                    let s = _mm512_set1_ps(*s.add(g));
                    for r in 0..R {
                        let sum = _mm512_cvtepi32_ps(acc[r][t]);
                        blk[r][t] = _mm512_fmadd_ps(sum, s, blk[r][t]);
                    }
                }
            }
        }
        for r in 0..R {
            let bits = _mm256_loadu_si256(p.add(r * stride + b * pbb) as *const __m256i);
            let d = _mm512_cvtph_ps(bits);
            for t in 0..T {
                if C::SPAN_NEG {
                    let n = _mm512_set1_ps(*acts[t].span_neg.add(b));
                    blk[r][t] = if C::LANE_SCALED {
                        let back = _mm512_loadu_ps(Q1_LANE_SCALE.as_ptr());
                        _mm512_fmadd_ps(blk[r][t], back, n)
                    } else {
                        _mm512_add_ps(blk[r][t], n)
                    };
                }
                tot[r][t] = _mm512_fmadd_ps(blk[r][t], d, tot[r][t]);
            }
        }
    }
    tot
}

/// Writes lane `l` of `v` for the rows of panel `p` that lie in `rows`, token `t` of `nt`.
#[inline(always)]
unsafe fn store(v: __m512, p: usize, t: usize, nt: usize, rows: &Range<usize>, out: &mut [f32]) {
    let mut lanes = [0f32; PANEL];
    _mm512_storeu_ps(lanes.as_mut_ptr(), v);
    scatter(&lanes, p, t, nt, rows, out);
}

/// One token over `S` panels at a time: the range is cut in `S` equal parts and pass `i` takes
/// panel `i` of each, so that each of the `S` weight streams runs on into the next panel it
/// reads, where the previous pass's prefetches already went, instead of starting cold; the
/// independent chains also hide the latency of the block sums. Returns the first panel left
/// (fewer than `S` at the end).
#[inline(always)]
unsafe fn decode_streams<C: Chunks, const S: usize>(
    base: *const u8,
    stride: usize,
    blocks: usize,
    panels: Range<usize>,
    act: Act,
    rows: &Range<usize>,
    out: &mut [f32],
) -> usize {
    let part = panels.len() / S;
    let prefetch = prefetch::<C>();
    for i in 0..part {
        let a = panels.start + i;
        let v = tile::<C, S, 1>(
            base.add(a * stride),
            part * stride,
            blocks,
            &[act],
            prefetch,
        );
        for (k, v) in v.iter().enumerate() {
            store(v[0], a + k * part, 0, 1, rows, out);
        }
    }
    panels.start + S * part
}

/// Whether passes over `C` prefetch: on Intel always (a 2-core Xeon streaming 5120 × 17408
/// matrices from memory with two threads: Q2_0 83% → 106% of a plain read's GB/s, PQ2_0 →
/// 106%, Q1_0 81% without → 102%, PTQ1_0 60% → 93%, `examples/gemv_bandwidth --tiled 1`), on
/// AMD where [`Chunks::PREFETCH`] says.
fn prefetch<C: Chunks>() -> bool {
    C::PREFETCH || !amd()
}

/// Panels a one-token pass over `C` takes at once: on AMD what [`Chunks::DECODE_STREAMS`] says,
/// on Intel four for every format (2-core Xeon, the 27B files' decode alternated two runs
/// against two with two panels: Q2_0 3.92 / 4.02 / 4.01 / 3.90 against 3.75 / 3.86 / 3.86 /
/// 3.70 tok/s, PQ2_0 4.07 / 3.96 against 3.77 / 3.77, PTQ1_0 4.42 / 4.38 against 4.22 / 4.17).
fn decode_streams_here<C: Chunks>() -> usize {
    if amd() {
        C::DECODE_STREAMS
    } else {
        4
    }
}

#[inline(always)]
unsafe fn run<C: Chunks>(m: &TiledMatrix, panels: Range<usize>, acts: &[Act], out: &mut [f32]) {
    let rows = m.row_range(&panels);
    let blocks = m.blocks();
    let stride = blocks * layout::panel_block_bytes(C::FORMAT);
    let base = m.data.as_ptr();
    let nt = acts.len();
    let prefetch = prefetch::<C>();
    let mut p = panels.start;
    if nt == 1 {
        p = match decode_streams_here::<C>() {
            4 => decode_streams::<C, 4>(base, stride, blocks, panels.clone(), acts[0], &rows, out),
            _ => decode_streams::<C, 2>(base, stride, blocks, panels.clone(), acts[0], &rows, out),
        };
    }
    while p < panels.end {
        let pp = base.add(p * stride);
        let mut t = 0;
        while t < nt {
            if C::TOKENS >= 8 && nt - t >= 8 {
                let a: [Act; 8] = std::array::from_fn(|k| acts[t + k]);
                let v = tile::<C, 1, 8>(pp, stride, blocks, &a, prefetch);
                for (k, &v) in v[0].iter().enumerate() {
                    store(v, p, t + k, nt, &rows, out);
                }
                t += 8;
            } else if nt - t >= 4 {
                let a = [acts[t], acts[t + 1], acts[t + 2], acts[t + 3]];
                let v = tile::<C, 1, 4>(pp, stride, blocks, &a, prefetch);
                for (k, &v) in v[0].iter().enumerate() {
                    store(v, p, t + k, nt, &rows, out);
                }
                t += 4;
            } else {
                let v = tile::<C, 1, 1>(pp, stride, blocks, &[acts[t]], prefetch);
                store(v[0][0], p, t, nt, &rows, out);
                t += 1;
            }
        }
        p += 1;
    }
}

/// # Safety
/// The CPU has the features [`available`] checks; shapes were checked by the caller.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,f16c,fma")]
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
        Format::Q1_0 if m.q1 == Q1Bits::Spread => run::<Q1Spread>(m, panels, &acts, out),
        Format::Q1_0 => run::<Q1>(m, panels, &acts, out),
        Format::Q2_0 => run::<Q2<false>>(m, panels, &acts, out),
        Format::Q2_0G128 | Format::PQ2_0 => run::<Q2<true>>(m, panels, &acts, out),
        Format::PTQ1_0 => run::<Ptq>(m, panels, &acts, out),
        other => unreachable!("{other} has no tiled layout"),
    }
}
