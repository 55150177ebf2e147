//! 512-bit kernels (AVX-512 F/BW/VL/VNNI/VBMI) for Q1_0, the 2-bit formats and PTQ1_0: 64 values
//! per `vpdpbusd`. Q8_0, Q4_1 and the float formats run the 256-bit kernels with EVEX VNNI.
//!
//! Decoding to unsigned codes (weight = code − 1) per 64 values:
//! - Q1_0: the 64 bits are a byte mask: `vmovdqu8 {k}{z}` of 2s (1 instruction).
//! - 2-bit: `vpmovzxwq` puts bytes 2i, 2i+1 at the bottom of qword i, `vpmultishiftqb` picks the
//!   byte at bit 2k for output byte k, `vpand 3` (3 instructions; code 3 decodes to 3 = +2).
//! - PTQ1_0: `vpermb` gathers each value's packed byte, two `vpmullw` multiply even and odd bytes
//!   by `3ⁿ` (mod 256), and two unsigned compares read the trit `(y ≥ 86) + (y ≥ 171)`.

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::avx2::{self, ptq_mul, ptq_source, Act, Vnni512};
use crate::{Format, QuantizedActs};

trait Dec512 {
    const LEN: usize;
    const BYTES: usize;
    const SCALE_AT: usize;
    /// Codes of values `64c..64c + 64` of the block at `p`.
    unsafe fn codes(p: *const u8, c: usize) -> __m512i;
}

struct Q1;
struct Q2<const QK: usize>;
struct Ptq;

impl Dec512 for Q1 {
    const LEN: usize = 128;
    const BYTES: usize = 18;
    const SCALE_AT: usize = 0;
    #[inline(always)]
    unsafe fn codes(p: *const u8, c: usize) -> __m512i {
        let bits = (p.add(2 + 8 * c) as *const u64).read_unaligned();
        _mm512_maskz_mov_epi8(bits, _mm512_set1_epi8(2))
    }
}

impl<const QK: usize> Dec512 for Q2<QK> {
    const LEN: usize = QK;
    const BYTES: usize = 2 + QK / 4;
    const SCALE_AT: usize = 0;
    #[inline(always)]
    unsafe fn codes(p: *const u8, c: usize) -> __m512i {
        let x = _mm512_cvtepu16_epi64(_mm_loadu_si128(p.add(2 + 16 * c) as *const __m128i));
        let shifts = _mm512_set1_epi64(0x0e0c_0a08_0604_0200);
        _mm512_and_si512(_mm512_multishift_epi64_epi8(shifts, x), _mm512_set1_epi8(3))
    }
}

/// Per 64-value chunk: the `vpermb` index of each value's packed byte and the `3ⁿ` multipliers
/// of even and odd bytes as words.
struct PtqTables {
    idx: [[u8; 64]; 2],
    even: [[u16; 32]; 2],
    odd: [[u16; 32]; 2],
}

static PTQ512: PtqTables = {
    let mut t = PtqTables {
        idx: [[0; 64]; 2],
        even: [[0; 32]; 2],
        odd: [[0; 32]; 2],
    };
    let mut e = 0;
    while e < 128 {
        let (c, i) = (e / 64, e % 64);
        t.idx[c][i] = ptq_source(e).0 as u8;
        if i % 2 == 0 {
            t.even[c][i / 2] = ptq_mul(e);
        } else {
            t.odd[c][i / 2] = ptq_mul(e);
        }
        e += 1;
    }
    t
};

impl Dec512 for Ptq {
    const LEN: usize = 128;
    const BYTES: usize = 28;
    const SCALE_AT: usize = 26;
    #[inline(always)]
    unsafe fn codes(p: *const u8, c: usize) -> __m512i {
        // The 26 packed bytes; the masked load never touches the bytes after them.
        let bytes = _mm512_maskz_loadu_epi8((1 << 26) - 1, p as *const i8);
        let ld = |t: *const u8| _mm512_loadu_si512(t as *const __m512i);
        let src = _mm512_permutexvar_epi8(ld(PTQ512.idx[c].as_ptr()), bytes);
        let even = _mm512_mullo_epi16(src, ld(PTQ512.even[c].as_ptr() as *const u8));
        let odd = _mm512_mullo_epi16(
            _mm512_and_si512(src, _mm512_set1_epi16(0xff00u16 as i16)),
            ld(PTQ512.odd[c].as_ptr() as *const u8),
        );
        let y = _mm512_mask_blend_epi8(0xaaaa_aaaa_aaaa_aaaa, even, odd);
        let one = _mm512_set1_epi8(1);
        let t1 = _mm512_maskz_mov_epi8(_mm512_cmpge_epu8_mask(y, _mm512_set1_epi8(86)), one);
        let k2 = _mm512_cmpge_epu8_mask(y, _mm512_set1_epi8(171u8 as i8));
        _mm512_mask_add_epi8(t1, k2, t1, one)
    }
}

/// Bytes ahead of the current block that each row prefetches (0: none). The kernels are close
/// to their compute ceiling, so without software prefetch too few cache misses are in flight to
/// stream from DRAM: measured on a 2-core AVX-512 machine (GB/s per thread-CPU-second, Q1_0 /
/// PQ2_0), 0 B: 5.1 / 5.1, 2 KiB: 7.2 / 7.7, 4 KiB: 8.3 / 8.4, 8 KiB: 8.3 / 9.2.
const PREFETCH: usize = 8192;

/// Every fp16 bit pattern as f32: a weight scale becomes a `vbroadcastss` from memory (load
/// ports only) instead of a broadcast and a conversion on the vector ports.
fn f16_table() -> &'static [f32] {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|b| half::f16::from_bits(b).to_f32())
            .collect()
    })
}

#[inline(always)]
unsafe fn scale_splat(table: *const f32, p: *const u8) -> __m512 {
    let bits = (p as *const u16).read_unaligned();
    _mm512_set1_ps(*table.add(usize::from(bits)))
}

/// `R` rows × `T` tokens of a `code − 1` format.
///
/// Each 32-bit lane `L` of the integer accumulator of a block gathers the same activation group
/// in both 64-value halves of a 128-value block (see `acts`), so a block costs one conversion,
/// one multiply by the group scales and one FMA by the weight scale per row and token. A 64-value
/// block (Q2_0) reads its lanes' scales and sums from the per-lane tables instead.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // the r/t loops index several arrays at once
unsafe fn tile<D: Dec512, const R: usize, const T: usize>(
    w: *const u8,
    row_bytes: usize,
    blocks: usize,
    acts: &[Act; T],
    table: *const f32,
) -> [[f32; T]; R] {
    let chunks = D::LEN / 64;
    let mut tot = [[_mm512_setzero_ps(); T]; R];
    for b in 0..blocks {
        let mut gs = [_mm512_setzero_ps(); T];
        let mut neg = [_mm512_setzero_si512(); T];
        let mut q = [[_mm512_setzero_si512(); T]; 2];
        for t in 0..T {
            // 16 entries per block either way: groups of a 128-value block, lanes of a 64-value one.
            let (s, n) = if chunks == 2 {
                (acts[t].gs, acts[t].gneg)
            } else {
                (acts[t].ls, acts[t].nls)
            };
            gs[t] = _mm512_loadu_ps(s.add(16 * b));
            neg[t] = _mm512_loadu_si512(n.add(16 * b) as *const __m512i);
            for c in 0..chunks {
                q[c][t] = _mm512_loadu_si512(acts[t].q.add(b * D::LEN + 64 * c) as *const __m512i);
            }
        }
        for r in 0..R {
            let p = w.add(r * row_bytes + b * D::BYTES);
            if PREFETCH > 0 {
                // A prefetch never faults; `wrapping_add` keeps the address arithmetic defined past
                // the end of the weights.
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH) as *const i8);
            }
            let mut acc = neg;
            for c in 0..chunks {
                let codes = D::codes(p, c);
                for t in 0..T {
                    acc[t] = _mm512_dpbusd_epi32(acc[t], codes, q[c][t]);
                }
            }
            let d = scale_splat(table, p.add(D::SCALE_AT));
            for t in 0..T {
                let f = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[t]), gs[t]);
                tot[r][t] = _mm512_fmadd_ps(f, d, tot[r][t]);
            }
        }
    }
    let mut out = [[0.0f32; T]; R];
    for r in 0..R {
        for t in 0..T {
            out[r][t] = _mm512_reduce_add_ps(tot[r][t]);
        }
    }
    out
}

#[inline(always)]
unsafe fn run<D: Dec512>(w: &[u8], row_bytes: usize, acts: &[Act], out: &mut [f32]) {
    let table = f16_table().as_ptr();
    let blocks = row_bytes / D::BYTES;
    let rows = w.len() / row_bytes;
    let nt = acts.len();
    let base = w.as_ptr();
    let mut r = 0;
    if nt == 1 {
        let a = [acts[0]];
        while r + 4 <= rows {
            let v = tile::<D, 4, 1>(base.add(r * row_bytes), row_bytes, blocks, &a, table);
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
                let a = [acts[t], acts[t + 1], acts[t + 2], acts[t + 3]];
                o[t..t + 4].copy_from_slice(&tile::<D, 1, 4>(p, row_bytes, blocks, &a, table)[0]);
                t += 4;
            } else if left >= 2 {
                let a = [acts[t], acts[t + 1]];
                o[t..t + 2].copy_from_slice(&tile::<D, 1, 2>(p, row_bytes, blocks, &a, table)[0]);
                t += 2;
            } else {
                o[t] = tile::<D, 1, 1>(p, row_bytes, blocks, &[acts[t]], table)[0][0];
                t += 1;
            }
        }
        r += 1;
    }
}

/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI/VBMI, AVX2, FMA and F16C; shapes were checked by the caller.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
pub(super) unsafe fn gemm(
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
        Format::Q1_0 => run::<Q1>(w, row_bytes, &acts, out),
        Format::Q2_0 => run::<Q2<64>>(w, row_bytes, &acts, out),
        Format::Q2_0G128 | Format::PQ2_0 => run::<Q2<128>>(w, row_bytes, &acts, out),
        Format::PTQ1_0 => run::<Ptq>(w, row_bytes, &acts, out),
        _ => avx2::run_simple::<Vnni512>(format, w, row_bytes, &acts, out),
    }
}
