//! A score row's softmax, `exp(s − max) / Σ`, with its own `exp` (a range reduction by
//! `ln 2` and a degree-7 polynomial, within a few ulp of the exact value) so that the SIMD
//! forms compute every lane exactly as the plain one does; the sum runs in 16 lanes (position
//! `p` into lane `p mod 16`, in order), added pairwise at the end, then the positions past the
//! last 16.

/// Below this `exp` is taken at it (about 1.2e-38, the smallest normal f32): weights that
/// small are nothing beside the row's largest, which is 1.
const EXP_MIN: f32 = -87.336_54;
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` in two parts, the first exact in few bits, so that `x − n·ln 2` loses nothing.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// `1/k!` for k = 7 down to 2 (the terms of degree 1 and 0 are 1).
const POLY: [f32; 6] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
];

/// `exp(x)` for `x ≤ 0` as the kernels compute it.
pub(super) fn exp_plain(x: f32) -> f32 {
    let x = x.max(EXP_MIN);
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let p = POLY.iter().fold(0f32, |p, &c| p.mul_add(r, c));
    let p = p.mul_add(r, 1.0).mul_add(r, 1.0);
    f32::from_bits(((n as i32 + 127) << 23) as u32) * p
}

/// The 16 lanes' sums added pairwise (lane l with l + 8, then with l + 4, …).
fn fold16(mut s: [f32; 16]) -> f32 {
    let mut w = 8;
    while w > 0 {
        for l in 0..w {
            s[l] += s[l + w];
        }
        w /= 2;
    }
    s[0]
}

/// The softmax of `row` in place, one value at a time: the definition.
pub(super) fn softmax_plain(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let body = row.len() / 16 * 16;
    let mut lanes = [0f32; 16];
    for (p, s) in row.iter_mut().enumerate() {
        *s = exp_plain(*s - max);
        if p < body {
            lanes[p % 16] += *s;
        }
    }
    let sum = row[body..].iter().fold(fold16(lanes), |a, &e| a + e);
    row.iter_mut().for_each(|s| *s /= sum);
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    use std::arch::x86_64::*;

    use super::*;

    /// [`exp_plain`] of 16 values.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn exp16(x: __m512) -> __m512 {
        let x = _mm512_max_ps(x, _mm512_set1_ps(EXP_MIN));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
        let mut p = _mm512_setzero_ps();
        for c in POLY {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let one = _mm512_set1_ps(1.0);
        let p = _mm512_fmadd_ps(_mm512_fmadd_ps(p, r, one), r, one);
        let e = _mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_cvtps_epi32(n),
            _mm512_set1_epi32(127),
        ));
        _mm512_mul_ps(_mm512_castsi512_ps(e), p)
    }

    /// [`softmax_plain`], 16 positions a register.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(in super::super) unsafe fn softmax(row: &mut [f32]) {
        let body = row.len() / 16 * 16;
        let (head, tail) = row.split_at_mut(body);
        let ptr = head.as_mut_ptr();
        let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
        for i in (0..body).step_by(16) {
            // SAFETY: i + 16 <= body (here and below).
            m = _mm512_max_ps(unsafe { _mm512_loadu_ps(ptr.add(i)) }, m);
        }
        let max = tail.iter().copied().fold(_mm512_reduce_max_ps(m), f32::max);
        let mut acc = _mm512_setzero_ps();
        for i in (0..body).step_by(16) {
            // SAFETY: as above.
            unsafe {
                let x = _mm512_sub_ps(_mm512_loadu_ps(ptr.add(i)), _mm512_set1_ps(max));
                let e = exp16(x);
                _mm512_storeu_ps(ptr.add(i), e);
                acc = _mm512_add_ps(acc, e);
            }
        }
        let mut lanes = [0f32; 16];
        // SAFETY: 16 values.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc) };
        tail.iter_mut().for_each(|s| *s = exp_plain(*s - max));
        let sum = tail.iter().fold(fold16(lanes), |a, &e| a + e);
        let inv = _mm512_set1_ps(sum);
        for i in (0..body).step_by(16) {
            // SAFETY: as above.
            unsafe {
                _mm512_storeu_ps(ptr.add(i), _mm512_div_ps(_mm512_loadu_ps(ptr.add(i)), inv))
            };
        }
        tail.iter_mut().for_each(|s| *s /= sum);
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use std::arch::x86_64::*;

    use super::*;

    /// [`exp_plain`] of 8 values.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn exp8(x: __m256) -> __m256 {
        let x = _mm256_max_ps(x, _mm256_set1_ps(EXP_MIN));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
        let mut p = _mm256_setzero_ps();
        for c in POLY {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let one = _mm256_set1_ps(1.0);
        let p = _mm256_fmadd_ps(_mm256_fmadd_ps(p, r, one), r, one);
        let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        _mm256_mul_ps(_mm256_castsi256_ps(e), p)
    }

    /// [`softmax_plain`], 16 positions as two registers.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(in super::super) unsafe fn softmax(row: &mut [f32]) {
        let body = row.len() / 16 * 16;
        let (head, tail) = row.split_at_mut(body);
        let ptr = head.as_mut_ptr();
        let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
        for i in (0..body).step_by(8) {
            // SAFETY: i + 8 <= body (here and below).
            m = _mm256_max_ps(unsafe { _mm256_loadu_ps(ptr.add(i)) }, m);
        }
        let mut lanes = [0f32; 16];
        // SAFETY: 8 values.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
        let max = lanes[..8]
            .iter()
            .chain(tail.iter())
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        let mut acc = [_mm256_setzero_ps(); 2];
        for i in (0..body).step_by(16) {
            for (j, acc) in acc.iter_mut().enumerate() {
                // SAFETY: as above.
                unsafe {
                    let at = ptr.add(i + 8 * j);
                    let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(at), _mm256_set1_ps(max)));
                    _mm256_storeu_ps(at, e);
                    *acc = _mm256_add_ps(*acc, e);
                }
            }
        }
        // SAFETY: 16 values.
        unsafe {
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[1]);
        }
        tail.iter_mut().for_each(|s| *s = exp_plain(*s - max));
        let sum = tail.iter().fold(fold16(lanes), |a, &e| a + e);
        let inv = _mm256_set1_ps(sum);
        for i in (0..body).step_by(8) {
            // SAFETY: as above.
            unsafe {
                _mm256_storeu_ps(ptr.add(i), _mm256_div_ps(_mm256_loadu_ps(ptr.add(i)), inv))
            };
        }
        tail.iter_mut().for_each(|s| *s /= sum);
    }
}

#[cfg(target_arch = "aarch64")]
pub(super) mod neon {
    use std::arch::aarch64::*;

    use super::*;

    /// [`exp_plain`] of 4 values (`fmax`-style clamp, so a NaN goes as `f32::max` takes it).
    #[inline(always)]
    unsafe fn exp4(x: float32x4_t) -> float32x4_t {
        let x = vmaxnmq_f32(x, vdupq_n_f32(EXP_MIN));
        let n = vrndnq_f32(vmulq_n_f32(x, LOG2E));
        let r = vfmsq_f32(x, n, vdupq_n_f32(LN2_HI));
        let r = vfmsq_f32(r, n, vdupq_n_f32(LN2_LO));
        let mut p = vdupq_n_f32(0.0);
        for c in POLY {
            p = vfmaq_f32(vdupq_n_f32(c), p, r);
        }
        let one = vdupq_n_f32(1.0);
        let p = vfmaq_f32(one, vfmaq_f32(one, p, r), r);
        let e = vshlq_n_s32::<23>(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)));
        vmulq_f32(vreinterpretq_f32_s32(e), p)
    }

    /// [`softmax_plain`], 16 positions as four registers.
    ///
    /// # Safety
    /// None beyond an AArch64 CPU (NEON is part of the architecture).
    #[target_feature(enable = "neon")]
    pub(in super::super) unsafe fn softmax(row: &mut [f32]) {
        let body = row.len() / 16 * 16;
        let (head, tail) = row.split_at_mut(body);
        let ptr = head.as_mut_ptr();
        let mut m = vdupq_n_f32(f32::NEG_INFINITY);
        for i in (0..body).step_by(4) {
            // SAFETY: i + 4 <= body (here and below).
            m = vmaxnmq_f32(unsafe { vld1q_f32(ptr.add(i)) }, m);
        }
        let max = tail.iter().copied().fold(vmaxnmvq_f32(m), f32::max);
        let mut acc = [vdupq_n_f32(0.0); 4];
        for i in (0..body).step_by(16) {
            for (j, acc) in acc.iter_mut().enumerate() {
                // SAFETY: as above.
                unsafe {
                    let at = ptr.add(i + 4 * j);
                    let e = exp4(vsubq_f32(vld1q_f32(at), vdupq_n_f32(max)));
                    vst1q_f32(at, e);
                    *acc = vaddq_f32(*acc, e);
                }
            }
        }
        let mut lanes = [0f32; 16];
        for (j, &a) in acc.iter().enumerate() {
            // SAFETY: 4 values at 4j < 16.
            unsafe { vst1q_f32(lanes.as_mut_ptr().add(4 * j), a) };
        }
        tail.iter_mut().for_each(|s| *s = exp_plain(*s - max));
        let sum = tail.iter().fold(fold16(lanes), |a, &e| a + e);
        let inv = vdupq_n_f32(sum);
        for i in (0..body).step_by(4) {
            // SAFETY: as above.
            unsafe { vst1q_f32(ptr.add(i), vdivq_f32(vld1q_f32(ptr.add(i)), inv)) };
        }
        tail.iter_mut().for_each(|s| *s /= sum);
    }
}
