//! 256-bit kernels: the AVX2 path (with or without AVX-VNNI), and the native-layout kernels of
//! the AVX-512 path (through [`Vnni512`]).
//!
//! Block formats decode 32 values at a time into unsigned byte codes and dot them with the int8
//! activations four per 32-bit lane (`Dot256`); lane sums are scaled by the activation scale of
//! their lane, summed per weight block and scaled by the weight scale.

use std::arch::x86_64::*;

use crate::{Format, QuantizedActs};

/// `acc + Σ₄ u·s` per 32-bit lane, `u` unsigned bytes ≤ 128, `s` signed bytes in −127..=127
/// (so the `vpmaddubsw` pair sums, ≤ 2·128·127, never saturate).
pub(super) trait Dot256 {
    unsafe fn dot(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
}

/// `vpmaddubsw` + `vpmaddwd`: plain AVX2.
struct Maddubs;
/// AVX-VNNI `vpdpbusd ymm`.
struct AvxVnni;
/// AVX-512 VNNI `vpdpbusd ymm` (EVEX, needs AVX512VL).
pub(super) struct Vnni512;

impl Dot256 for Maddubs {
    #[inline(always)]
    unsafe fn dot(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        let pairs = _mm256_maddubs_epi16(u, s);
        _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
    }
}

impl Dot256 for AvxVnni {
    #[inline(always)]
    unsafe fn dot(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(acc, u, s)
    }
}

impl Dot256 for Vnni512 {
    #[inline(always)]
    unsafe fn dot(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, s)
    }
}

/// 32 bits as 32 byte codes: byte j is 2 where bit j is set, else 0.
#[inline(always)]
unsafe fn one_bit_codes(bits: i32) -> __m256i {
    // Byte j takes source byte j / 8, then tests its bit j % 8.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits),
        _mm256_setr_epi64x(
            0,
            0x0101_0101_0101_0101,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
        ),
    );
    let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
    _mm256_and_si256(set, _mm256_set1_epi8(2))
}

/// A block format whose weights are `code − 1` for unsigned codes 0..=3, decoded 32 at a time.
trait Dec256 {
    const LEN: usize;
    const BYTES: usize;
    /// Byte offset of the fp16 scale.
    const SCALE_AT: usize;
    /// The codes of values `32c..32c + 32` of the block at `p`.
    unsafe fn codes(p: *const u8, c: usize) -> __m256i;
}

struct Q1;
struct Q2<const QK: usize>;
struct Ptq;

impl Dec256 for Q1 {
    const LEN: usize = 128;
    const BYTES: usize = 18;
    const SCALE_AT: usize = 0;
    /// Bit j set → code 2 (+1), clear → code 0 (−1).
    #[inline(always)]
    unsafe fn codes(p: *const u8, c: usize) -> __m256i {
        one_bit_codes((p.add(2 + 4 * c) as *const i32).read_unaligned())
    }
}

impl<const QK: usize> Dec256 for Q2<QK> {
    const LEN: usize = QK;
    const BYTES: usize = 2 + QK / 4;
    const SCALE_AT: usize = 0;
    #[inline(always)]
    unsafe fn codes(p: *const u8, c: usize) -> __m256i {
        let x = _mm_loadl_epi64(p.add(2 + 8 * c) as *const __m128i);
        let three = _mm_set1_epi8(3);
        let v0 = _mm_and_si128(x, three);
        let v1 = _mm_and_si128(_mm_srli_epi16(x, 2), three);
        let v2 = _mm_and_si128(_mm_srli_epi16(x, 4), three);
        let v3 = _mm_and_si128(_mm_srli_epi16(x, 6), three);
        // Byte i of v_s is code 4i + s; interleave back to positional order.
        let a = _mm_unpacklo_epi8(v0, v1);
        let b = _mm_unpacklo_epi8(v2, v3);
        _mm256_set_m128i(_mm_unpackhi_epi16(a, b), _mm_unpacklo_epi16(a, b))
    }
}

/// For value `e` of a PTQ1_0 block: the packed byte holding it and its trit position.
const fn ptq_source(e: usize) -> (usize, usize) {
    if e < 80 {
        (e % 16, e / 16)
    } else if e < 120 {
        (16 + (e - 80) % 8, (e - 80) / 8)
    } else {
        (24 + (e - 120) % 2, (e - 120) / 2)
    }
}

/// `3ⁿ mod 256` of value `e`'s trit position: multiplying the packed byte by it moves the trit to
/// the top, where `(y·3) >> 8` reads it.
const fn ptq_mul(e: usize) -> u16 {
    [1, 3, 9, 27, 81][ptq_source(e).1]
}

/// Per 32-value chunk: `pshufb` indices into block bytes 0..16 (`A`) and 12..28 (`B`), and the
/// multipliers of even and odd bytes as 16-bit words.
struct PtqTables {
    a: [[u8; 32]; 4],
    b: [[u8; 32]; 4],
    even: [[u16; 16]; 4],
    odd: [[u16; 16]; 4],
}

static PTQ256: PtqTables = {
    let mut t = PtqTables {
        a: [[0x80; 32]; 4],
        b: [[0x80; 32]; 4],
        even: [[0; 16]; 4],
        odd: [[0; 16]; 4],
    };
    let mut e = 0;
    while e < 128 {
        let (c, i) = (e / 32, e % 32);
        let byte = ptq_source(e).0;
        if byte < 16 {
            t.a[c][i] = byte as u8;
        } else {
            t.b[c][i] = (byte - 12) as u8;
        }
        if i % 2 == 0 {
            t.even[c][i / 2] = ptq_mul(e);
        } else {
            t.odd[c][i / 2] = ptq_mul(e);
        }
        e += 1;
    }
    t
};

impl Dec256 for Ptq {
    const LEN: usize = 128;
    const BYTES: usize = 28;
    const SCALE_AT: usize = 26;
    /// Trit `t` of byte `b` is `((b·3ⁿ mod 256)·3) >> 8 = (y ≥ 86) + (y ≥ 171)`.
    #[inline(always)]
    unsafe fn codes(p: *const u8, c: usize) -> __m256i {
        let lo = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
        let hi = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(12) as *const __m128i));
        let ld = |t: &[u8; 32]| _mm256_loadu_si256(t.as_ptr() as *const __m256i);
        let src = _mm256_or_si256(
            _mm256_shuffle_epi8(lo, ld(&PTQ256.a[c])),
            _mm256_shuffle_epi8(hi, ld(&PTQ256.b[c])),
        );
        let ldw = |t: &[u16; 16]| _mm256_loadu_si256(t.as_ptr() as *const __m256i);
        let even = _mm256_mullo_epi16(src, ldw(&PTQ256.even[c]));
        let odd = _mm256_mullo_epi16(
            _mm256_and_si256(src, _mm256_set1_epi16(0xff00u16 as i16)),
            ldw(&PTQ256.odd[c]),
        );
        let y = _mm256_or_si256(_mm256_and_si256(even, _mm256_set1_epi16(0xff)), odd);
        let ge = |k: i8| {
            let k = _mm256_set1_epi8(k);
            _mm256_cmpeq_epi8(_mm256_max_epu8(y, k), y)
        };
        let (m1, m2) = (ge(86), ge(171u8 as i8));
        _mm256_sub_epi8(_mm256_sub_epi8(_mm256_setzero_si256(), m1), m2)
    }
}

/// Raw pointers into one token's activation tables.
#[derive(Clone, Copy)]
struct Act {
    q: *const i8,
    ls: *const f32,
    nls: *const i32,
    x: *const f32,
    len: usize,
}

impl Act {
    fn new(a: &QuantizedActs) -> Act {
        Act {
            q: a.codes().as_ptr(),
            ls: a.lane_scales().as_ptr(),
            nls: a.neg_lane_sums().as_ptr(),
            x: a.values().as_ptr(),
            len: a.len(),
        }
    }
}

#[inline(always)]
unsafe fn f16_to_f32(p: *const u8) -> f32 {
    let bits = (p as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// `R` rows × `T` tokens of a `code − 1` format; returns the row × token dots.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // the r/t loops index several arrays at once
unsafe fn tile<D: Dec256, K: Dot256, const R: usize, const T: usize>(
    w: *const u8,
    row_bytes: usize,
    blocks: usize,
    acts: &[Act; T],
) -> [[f32; T]; R] {
    let mut tot = [[_mm256_setzero_ps(); T]; R];
    for b in 0..blocks {
        let mut blk = [[_mm256_setzero_ps(); T]; R];
        for c in 0..D::LEN / 32 {
            let v = b * D::LEN + c * 32;
            let mut q = [_mm256_setzero_si256(); T];
            let mut ls = [_mm256_setzero_ps(); T];
            let mut nls = [_mm256_setzero_si256(); T];
            for t in 0..T {
                q[t] = _mm256_loadu_si256(acts[t].q.add(v) as *const __m256i);
                ls[t] = _mm256_loadu_ps(acts[t].ls.add(v / 4));
                nls[t] = _mm256_loadu_si256(acts[t].nls.add(v / 4) as *const __m256i);
            }
            for r in 0..R {
                let codes = D::codes(w.add(r * row_bytes + b * D::BYTES), c);
                for t in 0..T {
                    let s = K::dot(nls[t], codes, q[t]);
                    blk[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), ls[t], blk[r][t]);
                }
            }
        }
        for r in 0..R {
            let d = _mm256_set1_ps(f16_to_f32(
                w.add(r * row_bytes + b * D::BYTES + D::SCALE_AT),
            ));
            for t in 0..T {
                tot[r][t] = _mm256_fmadd_ps(blk[r][t], d, tot[r][t]);
            }
        }
    }
    let mut out = [[0.0f32; T]; R];
    for r in 0..R {
        for t in 0..T {
            out[r][t] = hsum(tot[r][t]);
        }
    }
    out
}

/// Q8_0 row · token: `Σ d_w·d_a·Σ|w|·sign(q, w)` per block.
#[inline(always)]
unsafe fn q8_0<K: Dot256>(row: *const u8, blocks: usize, a: &Act) -> f32 {
    let mut tot = _mm256_setzero_ps();
    for b in 0..blocks {
        let p = row.add(b * 34);
        let w = _mm256_loadu_si256(p.add(2) as *const __m256i);
        let q = _mm256_loadu_si256(a.q.add(32 * b) as *const __m256i);
        let s = K::dot(
            _mm256_setzero_si256(),
            _mm256_abs_epi8(w),
            _mm256_sign_epi8(q, w),
        );
        let f = _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_loadu_ps(a.ls.add(8 * b)));
        tot = _mm256_fmadd_ps(f, _mm256_set1_ps(f16_to_f32(p)), tot);
    }
    hsum(tot)
}

/// Q4_1 row · token: `Σ d_a·(d·Σ nibble·q + m·Σq)` per block.
#[inline(always)]
unsafe fn q4_1<K: Dot256>(row: *const u8, blocks: usize, a: &Act) -> f32 {
    let mut tot = _mm256_setzero_ps();
    let low = _mm_set1_epi8(15);
    for b in 0..blocks {
        let p = row.add(b * 20);
        let x = _mm_loadu_si128(p.add(4) as *const __m128i);
        let codes = _mm256_set_m128i(
            _mm_and_si128(_mm_srli_epi16(x, 4), low),
            _mm_and_si128(x, low),
        );
        let q = _mm256_loadu_si256(a.q.add(32 * b) as *const __m256i);
        let ls = _mm256_loadu_ps(a.ls.add(8 * b));
        let s = K::dot(_mm256_setzero_si256(), codes, q);
        let nls = _mm256_loadu_si256(a.nls.add(8 * b) as *const __m256i);
        let f = _mm256_mul_ps(_mm256_cvtepi32_ps(s), ls);
        let g = _mm256_mul_ps(_mm256_cvtepi32_ps(nls), ls);
        tot = _mm256_fmadd_ps(f, _mm256_set1_ps(f16_to_f32(p)), tot);
        tot = _mm256_fnmadd_ps(g, _mm256_set1_ps(f16_to_f32(p.add(2))), tot);
    }
    hsum(tot)
}

/// Float row · f32 activations: 8 lanes × 4 accumulators, scalar tail.
#[inline(always)]
unsafe fn float_row(format: Format, row: *const u8, a: &Act) -> f32 {
    #[inline(always)]
    unsafe fn load(format: Format, row: *const u8, i: usize) -> __m256 {
        match format {
            Format::F32 => _mm256_loadu_ps((row as *const f32).add(i)),
            Format::F16 => _mm256_cvtph_ps(_mm_loadu_si128(row.add(2 * i) as *const __m128i)),
            _ => _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_cvtepu16_epi32(_mm_loadu_si128(row.add(2 * i) as *const __m128i)),
                16,
            )),
        }
    }
    let n = a.len;
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, acc) in acc.iter_mut().enumerate() {
            let j = i + 8 * k;
            *acc = _mm256_fmadd_ps(load(format, row, j), _mm256_loadu_ps(a.x.add(j)), *acc);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(load(format, row, i), _mm256_loadu_ps(a.x.add(i)), acc[0]);
        i += 8;
    }
    let mut sum = hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    let bytes = format.block_bytes();
    while i < n {
        let b = std::slice::from_raw_parts(row.add(i * bytes), bytes);
        let mut w = [0.0f32];
        crate::dequantize(format, b, &mut w).expect("one value");
        sum += w[0] * *a.x.add(i);
        i += 1;
    }
    sum
}

/// All rows × tokens of a `code − 1` format: four rows per pass for one token, otherwise one
/// row per pass with up to four tokens.
#[inline(always)]
unsafe fn run<D: Dec256, K: Dot256>(w: &[u8], row_bytes: usize, acts: &[Act], out: &mut [f32]) {
    let blocks = row_bytes / D::BYTES;
    let rows = w.len() / row_bytes;
    let nt = acts.len();
    let base = w.as_ptr();
    let mut r = 0;
    if nt == 1 {
        let a = [acts[0]];
        while r + 4 <= rows {
            let v = tile::<D, K, 4, 1>(base.add(r * row_bytes), row_bytes, blocks, &a);
            for k in 0..4 {
                out[r + k] = v[k][0];
            }
            r += 4;
        }
    }
    while r < rows {
        let p = base.add(r * row_bytes);
        let o = &mut out[r * nt..(r + 1) * nt];
        let mut t = 0;
        while t < nt {
            let left = nt - t;
            if left >= 4 {
                let v = tile::<D, K, 1, 4>(
                    p,
                    row_bytes,
                    blocks,
                    &[acts[t], acts[t + 1], acts[t + 2], acts[t + 3]],
                );
                o[t..t + 4].copy_from_slice(&v[0]);
                t += 4;
            } else if left >= 2 {
                let v = tile::<D, K, 1, 2>(p, row_bytes, blocks, &[acts[t], acts[t + 1]]);
                o[t..t + 2].copy_from_slice(&v[0]);
                t += 2;
            } else {
                o[t] = tile::<D, K, 1, 1>(p, row_bytes, blocks, &[acts[t]])[0][0];
                t += 1;
            }
        }
        r += 1;
    }
}

/// Q8_0, Q4_1 and the float formats: one row at a time, each token in turn (the row stays in
/// L1 after the first token).
#[inline(always)]
unsafe fn run_simple<K: Dot256>(
    format: Format,
    w: &[u8],
    row_bytes: usize,
    acts: &[Act],
    out: &mut [f32],
) {
    let nt = acts.len();
    let blocks = row_bytes / format.block_bytes();
    for (row, o) in w.chunks_exact(row_bytes).zip(out.chunks_exact_mut(nt)) {
        for (a, o) in acts.iter().zip(o) {
            *o = match format {
                Format::Q8_0 => q8_0::<K>(row.as_ptr(), blocks, a),
                Format::Q4_1 => q4_1::<K>(row.as_ptr(), blocks, a),
                _ => float_row(format, row.as_ptr(), a),
            };
        }
    }
}

#[inline(always)]
pub(super) unsafe fn body<K: Dot256>(
    format: Format,
    w: &[u8],
    row_bytes: usize,
    acts: &[QuantizedActs],
    out: &mut [f32],
) {
    if row_bytes == 0 {
        out.fill(0.0);
        return;
    }
    let acts: Vec<Act> = acts.iter().map(Act::new).collect();
    match format {
        Format::Q1_0 => run::<Q1, K>(w, row_bytes, &acts, out),
        Format::Q2_0 => run::<Q2<64>, K>(w, row_bytes, &acts, out),
        Format::Q2_0G128 | Format::PQ2_0 => run::<Q2<128>, K>(w, row_bytes, &acts, out),
        Format::PTQ1_0 => run::<Ptq, K>(w, row_bytes, &acts, out),
        _ => run_simple::<K>(format, w, row_bytes, &acts, out),
    }
}

/// # Safety
/// The CPU has AVX2, FMA and F16C; shapes were checked by the caller.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn gemm(
    format: Format,
    w: &[u8],
    row_bytes: usize,
    acts: &[QuantizedActs],
    out: &mut [f32],
) {
    body::<Maddubs>(format, w, row_bytes, acts, out)
}

/// # Safety
/// As [`gemm`], and the CPU has AVX-VNNI.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn gemm_vnni(
    format: Format,
    w: &[u8],
    row_bytes: usize,
    acts: &[QuantizedActs],
    out: &mut [f32],
) {
    body::<AvxVnni>(format, w, row_bytes, acts, out)
}
