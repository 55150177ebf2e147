//! Activations quantized to int8 for the integer dot kernels.
//!
//! # The choice
//! Groups of [`ACT_GROUP`] = 16 values, each with an **f32** scale `d = amax / 127` and codes
//! `q = round(x / d)` (half away from zero) in −127..=127. A group is not 16 consecutive values
//! but four runs of four, 16 apart: within each 64-value half `h`, group `4h + k` (k < 4) holds
//! values `64h + 4k + 16r + {0..3}` for r < 4. Every weight block (64 or 128 values) holds whole
//! groups, so a kernel sums a group's runs in one integer accumulator and spends one int→float
//! conversion and one scale multiply per 16 values and 16 rows (the tiled AVX-512 kernels, see
//! `tiled`); 256-bit kernels read per-lane copies of the scales.
//!
//! Why 16: against llama.cpp's Q8_0 (32 consecutive values, the same `amax/127` codes, fp16
//! scale) a group of 16 has a smaller maximum than a block of 32, so a finer step, and the scale
//! is not rounded to fp16 (the `act_quant_accuracy_is_at_least_q8_0s` test measures both on the
//! same data); over the 2048-position oracle sequence the model's KL to the exact answer is 0.6×
//! llama.cpp's with a higher top-1 agreement. Groups of 8 were about 35% more accurate again, but
//! their conversions cost the 1-bit kernel 12% of its throughput, which is compute-bound.
//!
//! # The tables kernels read
//! Besides the codes and per-group scales and negated code sums (group order), every four
//! consecutive values (one 32-bit lane) carry their group's scale (`lane_scale`) and the negated
//! sum of their four codes (`neg_lane_sum`), for kernels that handle 32 values at a time.
//! Kernels start an integer accumulator at `neg·k` to turn unsigned weight codes `c` into the
//! signed weight `c − k`. Codes are zero-padded to a multiple of 128 values (a whole span).

use std::sync::OnceLock;

/// Values per activation group (one f32 scale each).
pub const ACT_GROUP: usize = 16;

/// Groups in each 64-value half; a group's runs of four are this many runs apart.
pub(crate) const GROUPS_PER_HALF: usize = 64 / ACT_GROUP;

/// Codes are padded to a whole number of spans of this many values.
const SPAN: usize = 128;

/// The group (index into [`QuantizedActs::scales`]) of value `i`.
pub const fn act_group(i: usize) -> usize {
    GROUPS_PER_HALF * (i / 64) + (i / 4) % GROUPS_PER_HALF
}

/// One activation vector: the f32 values (for the float weight formats) and their int8
/// quantization in groups of [`ACT_GROUP`] (for every block format).
#[derive(Clone, Debug)]
pub struct QuantizedActs {
    x: Vec<f32>,
    q: Vec<i8>,
    scale: Vec<f32>,
    neg_sum: Vec<i32>,
    /// Per 128-value span, `Σ_g (−Σq_g)·d_g` over its groups (see [`QuantizedActs::neg_span_terms`]).
    neg_span: Vec<f32>,
    /// Group `g`'s scale times `4^−(g mod 4)` and its `−Σq` times `4^(g mod 4)` (see
    /// [`QuantizedActs::field_scales`]).
    field_scale: Vec<f32>,
    field_neg: Vec<i32>,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // read by the x86 kernels only
    lane_scale: Vec<f32>,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    neg_lane_sum: Vec<i32>,
    /// The 1-bit lookup tables (see [`QuantizedActs::sign_tables`]), made on first use.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    sign_tables: OnceLock<Vec<u8>>,
}

/// `(d, codes)` of one group with `d = amax/127` (f32) and `q = round(x/d)`. Non-finite inputs
/// give unspecified but memory-safe codes (NaN codes become 0).
#[cfg(test)]
fn quantize_group(x: &[f32; ACT_GROUP], q: &mut [i8; ACT_GROUP]) -> f32 {
    let amax = x
        .iter()
        .fold(0.0f32, |m, v| if v.abs() > m { v.abs() } else { m });
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (o, &v) in q.iter_mut().zip(x) {
        // `as` saturates and maps NaN to 0; finite values already lie in −127..=127.
        *o = ((v * id).round() as i32).clamp(-127, 127) as i8;
    }
    d
}

/// Value indices of group `g`, in order.
#[cfg(test)]
fn members(g: usize) -> impl Iterator<Item = usize> {
    let base = 64 * (g / GROUPS_PER_HALF) + 4 * (g % GROUPS_PER_HALF);
    (0..ACT_GROUP).map(move |i| base + 4 * GROUPS_PER_HALF * (i / 4) + i % 4)
}

/// `v.round() as i32` (half away from zero, NaN → 0) for `|v| < 2²³`, without the libm call
/// the baseline x86-64 target makes for `round`: truncate, then step away from zero when the
/// exact remainder is at least one half.
#[inline(always)]
fn round_half_away(v: f32) -> i32 {
    let i = v as i32;
    let frac = v - i as f32;
    if frac >= 0.5 {
        i + 1
    } else if frac <= -0.5 {
        i - 1
    } else {
        i
    }
}

/// The code of `v·(1/d)`: rounded half away from zero into −127..=127, NaN → 0. Clamped first:
/// a group whose maximum is below ~3.7e-37 has a subnormal `d`, so `1/d` is infinite, and
/// unclamped the truncation saturated and its step away from zero wrapped (`i32::MAX + 1`),
/// flipping such a group's signs (and panicking where overflow is checked).
#[inline(always)]
fn code(p: f32) -> i32 {
    round_half_away(p.clamp(-128.0, 128.0)).clamp(-127, 127)
}

/// Each 64-value half's codes, its four groups' scales and negated code sums, with its index.
#[allow(clippy::type_complexity)]
fn halves_mut<'a>(
    q: &'a mut [i8],
    scale: &'a mut [f32],
    neg_sum: &'a mut [i32],
) -> impl Iterator<Item = (usize, ((&'a mut [i8], &'a mut [f32]), &'a mut [i32]))> {
    q.chunks_exact_mut(64)
        .zip(scale.chunks_exact_mut(GROUPS_PER_HALF))
        .zip(neg_sum.chunks_exact_mut(GROUPS_PER_HALF))
        .enumerate()
}

/// The 64 values of half `h` of `x`: in place, or copied into `tail` and zero-padded where `x`
/// ends inside the half (the SIMD quantizers then read 64 values either way).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline(always)]
fn half_of<'a>(x: &'a [f32], h: usize, tail: &'a mut [f32; 64]) -> &'a [f32] {
    let n = x.len();
    if 64 * h + 64 <= n {
        &x[64 * h..64 * h + 64]
    } else {
        let part = &x[(64 * h).min(n)..];
        tail[..part.len()].copy_from_slice(part);
        tail[part.len()..].fill(0.0);
        tail
    }
}

/// [`quantize_halves`] written out in AVX-512, for the same codes, scales and sums bit for bit:
/// one 16-lane register per run of a half, whose lanes `4k..4k + 4` are group `k`'s; the group
/// maximum, scale and code sum are reduced within each 128-bit lane (the maximum as a tree,
/// which no NaN reaches, so in any order). Compiled from the portable loops, the group steps
/// stayed scalar: 2 ns a value, the largest serial step of a decode token
/// (`examples/act_quant_cost`).
///
/// # Safety
/// The CPU has AVX-512 F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_halves_avx512(x: &[f32], q: &mut [i8], scale: &mut [f32], neg_sum: &mut [i32]) {
    use std::arch::x86_64::*;
    // Within each 128-bit lane: swap neighbours, then pairs.
    const PAIRS: i32 = 0b1011_0001;
    const HALVES: i32 = 0b0100_1110;
    let mut tail = [0.0f32; 64];
    let firsts = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    let (one, half, lo, hi) = (
        _mm512_set1_ps(1.0),
        _mm512_set1_ps(0.5),
        _mm512_set1_epi32(-127),
        _mm512_set1_epi32(127),
    );
    for (h, ((qh, sh), nh)) in halves_mut(q, scale, neg_sum) {
        let src = half_of(x, h, &mut tail).as_ptr();
        // SAFETY: `src` has 64 readable values: the half lies inside `x`, or it is `tail`.
        let v: [__m512; 4] = std::array::from_fn(|r| _mm512_loadu_ps(src.add(16 * r)));
        // max(|v|, m) keeps m where |v| is NaN, as `f32::max` ignores a NaN.
        let mut m = _mm512_setzero_ps();
        for &vr in &v {
            m = _mm512_max_ps(_mm512_abs_ps(vr), m);
        }
        m = _mm512_max_ps(m, _mm512_permute_ps::<PAIRS>(m));
        m = _mm512_max_ps(m, _mm512_permute_ps::<HALVES>(m));
        let d = _mm512_div_ps(m, _mm512_set1_ps(127.0));
        let nonzero = _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(d, _mm512_setzero_ps());
        let id = _mm512_maskz_div_ps(nonzero, one, d);
        let mut sum = _mm512_setzero_si512();
        for (r, &vr) in v.iter().enumerate() {
            // `code`: clamped to ±128 (NaN kept: `max` and `min` return their second operand
            // where one is NaN), truncated, then a step away from zero on a remainder of ±½ or
            // more; NaN (which truncates to i32::MIN here) gives 0 as `as i32` does.
            let p = _mm512_mul_ps(vr, id);
            let p = _mm512_min_ps(
                _mm512_set1_ps(128.0),
                _mm512_max_ps(_mm512_set1_ps(-128.0), p),
            );
            let t = _mm512_cvttps_epi32(p);
            let frac = _mm512_sub_ps(p, _mm512_cvtepi32_ps(t));
            let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, half);
            let down =
                _mm512_cmp_ps_mask::<_CMP_LE_OQ>(frac, _mm512_sub_ps(_mm512_setzero_ps(), half));
            let t = _mm512_mask_add_epi32(t, up, t, _mm512_set1_epi32(1));
            let t = _mm512_mask_sub_epi32(t, down, t, _mm512_set1_epi32(1));
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(p, p);
            let t = _mm512_mask_mov_epi32(t, nan, _mm512_setzero_si512());
            let c = _mm512_min_epi32(_mm512_max_epi32(t, lo), hi);
            // SAFETY: `qh` is 64 codes, so the 16 from `16r` (r < 4) lie inside it.
            _mm_storeu_si128(
                qh[16 * r..].as_mut_ptr() as *mut __m128i,
                _mm512_cvtepi32_epi8(c),
            );
            sum = _mm512_sub_epi32(sum, c);
        }
        sum = _mm512_add_epi32(sum, _mm512_shuffle_epi32::<PAIRS>(sum));
        sum = _mm512_add_epi32(sum, _mm512_shuffle_epi32::<HALVES>(sum));
        let scales = _mm512_permutexvar_ps(firsts, d);
        let sums = _mm512_permutexvar_epi32(firsts, sum);
        // SAFETY: `sh` and `nh` are the half's four groups.
        _mm_storeu_ps(sh.as_mut_ptr(), _mm512_castps512_ps128(scales));
        _mm_storeu_si128(
            nh.as_mut_ptr() as *mut __m128i,
            _mm512_castsi512_si128(sums),
        );
    }
}

/// [`quantize_halves`] written out in NEON, for the same codes, scales and sums bit for bit:
/// register `k` of each run of 16 values is group `k`'s four lanes. The group maximum by
/// `fmaxnm` (which passes over a NaN as `f32::max` does), the clamp by `fmin`/`fmax` (which
/// keep it, for the truncation to make 0 of it as `as i32` does).
///
/// # Safety
/// None beyond an AArch64 CPU (NEON is part of the architecture).
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
unsafe fn quantize_halves_neon(x: &[f32], q: &mut [i8], scale: &mut [f32], neg_sum: &mut [i32]) {
    use std::arch::aarch64::*;
    let mut tail = [0.0f32; 64];
    for (h, ((qh, sh), nh)) in halves_mut(q, scale, neg_sum) {
        let src = half_of(x, h, &mut tail).as_ptr();
        // SAFETY: `src` has 64 readable values: the half lies inside `x`, or it is `tail`.
        let mut v = [[vdupq_n_f32(0.0); GROUPS_PER_HALF]; 4];
        for (r, run) in v.iter_mut().enumerate() {
            for (k, reg) in run.iter_mut().enumerate() {
                *reg = unsafe { vld1q_f32(src.add(16 * r + 4 * k)) };
            }
        }
        let mut amax = [0.0f32; GROUPS_PER_HALF];
        for (k, a) in amax.iter_mut().enumerate() {
            let mut m = vdupq_n_f32(0.0);
            for run in &v {
                m = vmaxnmq_f32(m, vabsq_f32(run[k]));
            }
            *a = vmaxnmvq_f32(m);
        }
        // SAFETY: four values each.
        let d = vdivq_f32(unsafe { vld1q_f32(amax.as_ptr()) }, vdupq_n_f32(127.0));
        let nonzero = vmvnq_u32(vceqzq_f32(d));
        let id = vreinterpretq_f32_u32(vandq_u32(
            nonzero,
            vreinterpretq_u32_f32(vdivq_f32(vdupq_n_f32(1.0), d)),
        ));
        let ids = [
            vdupq_laneq_f32::<0>(id),
            vdupq_laneq_f32::<1>(id),
            vdupq_laneq_f32::<2>(id),
            vdupq_laneq_f32::<3>(id),
        ];
        let mut sums = [vdupq_n_s32(0); GROUPS_PER_HALF];
        for (r, run) in v.iter().enumerate() {
            let mut c = [vdupq_n_s32(0); GROUPS_PER_HALF];
            for k in 0..GROUPS_PER_HALF {
                let p = vmulq_f32(run[k], ids[k]);
                let p = vmaxq_f32(vminq_f32(p, vdupq_n_f32(128.0)), vdupq_n_f32(-128.0));
                let t = vcvtq_s32_f32(p);
                let frac = vsubq_f32(p, vcvtq_f32_s32(t));
                // Masks are −1 where true: a step up subtracts one, a step down adds one.
                let up = vreinterpretq_s32_u32(vcgeq_f32(frac, vdupq_n_f32(0.5)));
                let down = vreinterpretq_s32_u32(vcleq_f32(frac, vdupq_n_f32(-0.5)));
                let t = vaddq_s32(vsubq_s32(t, up), down);
                c[k] = vminq_s32(vmaxq_s32(t, vdupq_n_s32(-127)), vdupq_n_s32(127));
                sums[k] = vsubq_s32(sums[k], c[k]);
            }
            let lo = vcombine_s16(vmovn_s32(c[0]), vmovn_s32(c[1]));
            let hi = vcombine_s16(vmovn_s32(c[2]), vmovn_s32(c[3]));
            let bytes = vcombine_s8(vmovn_s16(lo), vmovn_s16(hi));
            // SAFETY: `qh` is 64 codes, so the 16 from `16r` (r < 4) lie inside it.
            unsafe { vst1q_s8(qh[16 * r..].as_mut_ptr(), bytes) };
        }
        // SAFETY: `sh` is the half's four scales.
        unsafe { vst1q_f32(sh.as_mut_ptr(), d) };
        for (o, s) in nh.iter_mut().zip(sums) {
            *o = vaddvq_s32(s);
        }
    }
}

/// [`quantize_halves`] compiled for AVX2: the same arithmetic on 8-lane vectors.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_halves_avx2(x: &[f32], q: &mut [i8], scale: &mut [f32], neg_sum: &mut [i32]) {
    quantize_halves(x, q, scale, neg_sum)
}

/// Codes, scales and negated group sums, 64 values at a time. Written so each step is a loop
/// over 16 independent lanes (value `16r + l` of a half is in group `l / 4`), which the compiler
/// turns into vector code; `max` ignores NaN like the group-by-group definition's comparison.
#[inline(always)]
fn quantize_halves(x: &[f32], q: &mut [i8], scale: &mut [f32], neg_sum: &mut [i32]) {
    const _: () = assert!(
        ACT_GROUP == 16,
        "the lane layout below is that of 16-value groups"
    );
    const RUNS: usize = 64 / 16;
    let n = x.len();
    let mut xs = [0.0f32; 64];
    for (h, ((qh, sh), nh)) in halves_mut(q, scale, neg_sum) {
        let src = &x[(64 * h).min(n)..(64 * h + 64).min(n)];
        xs[..src.len()].copy_from_slice(src);
        xs[src.len()..].fill(0.0);
        let mut lane_max = [0.0f32; 16];
        for r in 0..RUNS {
            for (m, v) in lane_max.iter_mut().zip(&xs[16 * r..16 * r + 16]) {
                *m = m.max(v.abs());
            }
        }
        let mut inv = [0.0f32; 16];
        for (k, d) in sh.iter_mut().enumerate() {
            let amax = lane_max[4 * k..4 * k + 4]
                .iter()
                .fold(0.0f32, |a, &b| a.max(b));
            *d = amax / 127.0;
            let id = if *d != 0.0 { 1.0 / *d } else { 0.0 };
            inv[4 * k..4 * k + 4].fill(id);
        }
        let mut lane_sum = [0i32; 16];
        for r in 0..RUNS {
            let codes = &mut qh[16 * r..16 * r + 16];
            for (((o, &v), &id), sum) in codes
                .iter_mut()
                .zip(&xs[16 * r..16 * r + 16])
                .zip(&inv)
                .zip(&mut lane_sum)
            {
                let c = code(v * id);
                *o = c as i8;
                *sum -= c;
            }
        }
        for (k, ns) in nh.iter_mut().enumerate() {
            *ns = lane_sum[4 * k..4 * k + 4].iter().sum();
        }
    }
}

impl QuantizedActs {
    /// Quantizes `x` (any length; values past the end count as zero). Runs once per token per
    /// matrix input, so it works a 64-value half at a time instead of gathering each group;
    /// the result equals the group-by-group definition (`new_by_groups`, a test twin).
    pub fn new(x: &[f32]) -> QuantizedActs {
        let n = x.len();
        let padded = n.div_ceil(SPAN) * SPAN;
        let mut q = vec![0i8; padded];
        let mut scale = vec![0.0f32; padded / ACT_GROUP];
        let mut neg_sum = vec![0i32; padded / ACT_GROUP];
        #[cfg(target_arch = "x86_64")]
        if crate::simd::allows(crate::Simd::Avx512)
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has the features the function is compiled with.
            return unsafe { Self::new_avx512(x, q, scale, neg_sum) };
        }
        #[cfg(target_arch = "x86_64")]
        if crate::simd::allows(crate::Simd::Avx2)
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has the features the function is compiled with.
            unsafe { quantize_halves_avx2(x, &mut q, &mut scale, &mut neg_sum) };
            return Self::with_group_sums(x.to_vec(), q, scale, neg_sum);
        }
        #[cfg(target_arch = "aarch64")]
        if crate::simd::allows(crate::Simd::Neon) {
            // SAFETY: NEON is part of AArch64.
            unsafe { quantize_halves_neon(x, &mut q, &mut scale, &mut neg_sum) };
            return Self::with_group_sums(x.to_vec(), q, scale, neg_sum);
        }
        quantize_halves(x, &mut q, &mut scale, &mut neg_sum);
        Self::with_group_sums(x.to_vec(), q, scale, neg_sum)
    }

    /// [`QuantizedActs::new`]'s AVX-512 path: the codes, then the side tables compiled for the
    /// same features (with FMA the span terms' `mul_add` is one instruction, not a call).
    ///
    /// # Safety
    /// The CPU has AVX-512 F and BW, and FMA.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,fma")]
    unsafe fn new_avx512(
        x: &[f32],
        mut q: Vec<i8>,
        mut scale: Vec<f32>,
        mut neg_sum: Vec<i32>,
    ) -> QuantizedActs {
        quantize_halves_avx512(x, &mut q, &mut scale, &mut neg_sum);
        Self::with_group_sums(x.to_vec(), q, scale, neg_sum)
    }

    /// The definition [`QuantizedActs::new`] is tested against: each group gathered and
    /// quantized on its own.
    #[cfg(test)]
    fn new_by_groups(x: &[f32]) -> QuantizedActs {
        let n = x.len();
        let padded = n.div_ceil(SPAN) * SPAN;
        let groups = padded / ACT_GROUP;
        let mut q = vec![0i8; padded];
        let mut scale = vec![0.0f32; groups];
        for (g, d) in scale.iter_mut().enumerate() {
            let mut xs = [0.0f32; ACT_GROUP];
            for (o, i) in xs.iter_mut().zip(members(g)) {
                *o = x.get(i).copied().unwrap_or(0.0);
            }
            let mut qs = [0i8; ACT_GROUP];
            *d = quantize_group(&xs, &mut qs);
            for (v, i) in qs.into_iter().zip(members(g)) {
                q[i] = v;
            }
        }
        Self::with_codes(x.to_vec(), q, scale)
    }

    /// Builds activations from codes and per-group scales directly: `codes.len()` values and
    /// `codes.len().div_ceil(128)·128 / ACT_GROUP` scales in group order (see [`act_group`]). The f32 values
    /// are set to the dequantized codes. Meant for tests that need exact scales (e.g. powers of
    /// two) and for callers that quantize elsewhere.
    ///
    /// # Panics
    /// When the scale count does not match.
    pub fn from_codes(codes: &[i8], scales: &[f32]) -> QuantizedActs {
        let n = codes.len();
        let padded = n.div_ceil(SPAN) * SPAN;
        assert_eq!(
            scales.len(),
            padded / ACT_GROUP,
            "one scale per group of {ACT_GROUP} codes"
        );
        let mut q = vec![0i8; padded];
        q[..n].copy_from_slice(codes);
        let x = (0..n)
            .map(|i| f32::from(q[i]) * scales[act_group(i)])
            .collect();
        Self::with_codes(x, q, scales.to_vec())
    }

    fn with_codes(x: Vec<f32>, q: Vec<i8>, scale: Vec<f32>) -> QuantizedActs {
        let mut neg_sum = vec![0i32; scale.len()];
        for (i, &v) in q.iter().enumerate() {
            neg_sum[act_group(i)] -= i32::from(v);
        }
        Self::with_group_sums(x, q, scale, neg_sum)
    }

    /// The activations with the side tables the kernels read, made from the codes, scales and
    /// negated group sums. Plain loops, not iterator closures: inlined into
    /// [`QuantizedActs::new_avx512`], they compile with its features (a closure would not
    /// inherit them, and `mul_add` stayed a call).
    #[inline(always)]
    fn with_group_sums(
        x: Vec<f32>,
        q: Vec<i8>,
        scale: Vec<f32>,
        neg_sum: Vec<i32>,
    ) -> QuantizedActs {
        // A half's 16 lanes are its groups' in turn (lane l: group l mod 4).
        let lanes = q.len() / 4;
        let mut lane_scale = vec![0.0f32; lanes];
        let mut neg_lane_sum = vec![0i32; lanes];
        for (((ls, ns), qh), sh) in lane_scale
            .chunks_exact_mut(16)
            .zip(neg_lane_sum.chunks_exact_mut(16))
            .zip(q.chunks_exact(64))
            .zip(scale.chunks_exact(GROUPS_PER_HALF))
        {
            for l in 0..16 {
                ls[l] = sh[l % GROUPS_PER_HALF];
                let c = &qh[4 * l..4 * l + 4];
                ns[l] = -(i32::from(c[0]) + i32::from(c[1]) + i32::from(c[2]) + i32::from(c[3]));
            }
        }
        let span_groups = 2 * GROUPS_PER_HALF;
        let mut neg_span = vec![0.0f32; scale.len().div_ceil(span_groups)];
        for (s, out) in neg_span.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for g in span_groups * s..(span_groups * (s + 1)).min(scale.len()) {
                acc = (neg_sum[g] as f32).mul_add(scale[g], acc);
            }
            *out = acc;
        }
        // Group g's place k = g mod 4 in its half: scales times 4^−k, starts times 4^k.
        const QUARTERS: [f32; GROUPS_PER_HALF] = [1.0, 0.25, 0.0625, 0.015625];
        let mut field_scale = vec![0.0f32; scale.len()];
        let mut field_neg = vec![0i32; scale.len()];
        for g in 0..scale.len() {
            field_scale[g] = scale[g] * QUARTERS[g % GROUPS_PER_HALF];
            field_neg[g] = neg_sum[g] << (2 * (g % GROUPS_PER_HALF));
        }
        QuantizedActs {
            x,
            q,
            scale,
            neg_sum,
            neg_span,
            field_scale,
            field_neg,
            lane_scale,
            neg_lane_sum,
            sign_tables: OnceLock::new(),
        }
    }

    /// Number of activation values.
    pub fn len(&self) -> usize {
        self.x.len()
    }

    pub fn is_empty(&self) -> bool {
        self.x.is_empty()
    }

    /// The f32 values this was built from.
    pub fn values(&self) -> &[f32] {
        &self.x
    }

    /// The int8 codes (zero-padded to a multiple of 128).
    pub fn codes(&self) -> &[i8] {
        &self.q
    }

    /// One f32 scale per group, in group order (see [`act_group`]; padding groups have scale 0).
    pub fn scales(&self) -> &[f32] {
        &self.scale
    }

    /// `−Σ q` of each group, in group order.
    pub(crate) fn neg_group_sums(&self) -> &[i32] {
        &self.neg_sum
    }

    /// Per 128-value span, the float term the 1-bit kernels add once per span:
    /// `Σ_g (−Σq_g)·d_g` over the span's groups in order, each step one fused multiply-add from
    /// 0 (the codes' sums are exact in f32).
    pub(crate) fn neg_span_terms(&self) -> &[f32] {
        &self.neg_span
    }

    /// Group `g`'s scale times `4^−k` (`k = g mod 4`, its place in its half): for kernels
    /// whose codes of group `g` come times `4^k` (the 2-bit quads of the tiled layout). Exact
    /// (a power of two) unless the product is subnormal, that is, for groups whose largest
    /// value is under about 1e−34.
    pub(crate) fn field_scales(&self) -> &[f32] {
        &self.field_scale
    }

    /// Group `g`'s `−Σq` times `4^k` (`k = g mod 4`), the start of such a kernel's sum.
    pub(crate) fn field_neg_sums(&self) -> &[i32] {
        &self.field_neg
    }

    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // read by the x86 kernels only
    pub(crate) fn lane_scales(&self) -> &[f32] {
        &self.lane_scale
    }

    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn neg_lane_sums(&self) -> &[i32] {
        &self.neg_lane_sum
    }

    /// The 1-bit lookup tables of the codes ([`crate::sign_tables`]), made once, on first use.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn sign_tables(&self) -> &[u8] {
        self.sign_tables
            .get_or_init(|| crate::sign_tables::build(&self.q))
    }

    /// The values the codes stand for, `q·d`, into `out` (`out.len() == self.len()`).
    pub fn dequantize(&self, out: &mut [f32]) {
        assert_eq!(out.len(), self.len(), "dequantize: output length");
        for (i, o) in out.iter_mut().enumerate() {
            *o = f32::from(self.q[i]) * self.scale[act_group(i)];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_partition_each_span() {
        let mut seen = [false; SPAN];
        for g in 0..2 * GROUPS_PER_HALF {
            for i in members(g) {
                assert!(!seen[i]);
                seen[i] = true;
                assert_eq!(act_group(i), g);
            }
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(act_group(128 + 64 + 5), 3 * GROUPS_PER_HALF + 1);
        assert_eq!(act_group(4 * GROUPS_PER_HALF + 4), 1);
    }

    #[test]
    fn lane_tables_agree_with_the_groups() {
        let x: Vec<f32> = (0..200).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let a = QuantizedActs::new(&x);
        assert_eq!(a.codes().len(), 256);
        assert_eq!(a.scales().len(), 256 / ACT_GROUP);
        for l in 0..64 {
            assert_eq!(a.lane_scales()[l], a.scales()[act_group(4 * l)]);
            let s: i32 = a.codes()[4 * l..4 * l + 4]
                .iter()
                .map(|&v| i32::from(v))
                .sum();
            assert_eq!(a.neg_lane_sums()[l], -s);
        }
        for g in 0..256 / ACT_GROUP {
            let s: i32 = members(g).map(|i| i32::from(a.codes()[i])).sum();
            assert_eq!(a.neg_group_sums()[g], -s);
        }
        assert!(a.codes()[200..].iter().all(|&v| v == 0));
    }

    /// A xorshift64 stream from `seed` (nonzero): the tests' reproducible inputs.
    fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        }
    }

    #[test]
    fn the_fast_quantizer_equals_the_group_by_group_definition() {
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        for n in [1, 63, 64, 127, 128, 129, 300, 5120] {
            let mut x: Vec<f32> = (0..n)
                .map(|_| (next() % 20001) as f32 / 1000.0 - 10.0)
                .collect();
            // Exact halves (ties), zeros, a huge value and a NaN.
            for (i, v) in x.iter_mut().enumerate().step_by(7) {
                *v = (i % 5) as f32 * 0.5 - 1.0;
            }
            x[n / 2] = f32::NAN;
            if n > 3 {
                x[3] = 1e30;
            }
            let (a, b) = (QuantizedActs::new(&x), QuantizedActs::new_by_groups(&x));
            assert_eq!(a.codes(), b.codes(), "n = {n}");
            let bits = |v: &[f32]| v.iter().map(|s| s.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(a.scales()), bits(b.scales()), "n = {n}");
            assert_eq!(a.neg_group_sums(), b.neg_group_sums(), "n = {n}");
        }
        for v in [
            0.5f32,
            -0.5,
            1.5,
            -2.5,
            126.5,
            -126.49999,
            0.49999997,
            f32::NAN,
        ] {
            assert_eq!(round_half_away(v), v.round() as i32, "{v}");
        }
    }

    /// Every quantizer this CPU runs, called directly on `x`, against the group-by-group
    /// definition.
    fn every_quantizer_equals_the_definition(x: &[f32], what: &str) {
        let want = QuantizedActs::new_by_groups(x);
        let padded = x.len().div_ceil(SPAN) * SPAN;
        /// A quantizer's name and its codes, scales and negated group sums.
        type Run = (&'static str, Vec<i8>, Vec<f32>, Vec<i32>);
        let mut runs: Vec<Run> = Vec::new();
        let fresh = || {
            (
                vec![0i8; padded],
                vec![0f32; padded / ACT_GROUP],
                vec![0i32; padded / ACT_GROUP],
            )
        };
        let (mut q, mut s, mut ns) = fresh();
        quantize_halves(x, &mut q, &mut s, &mut ns);
        runs.push(("portable", q, s, ns));
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                let (mut q, mut s, mut ns) = fresh();
                // SAFETY: the CPU has the features (checked above).
                unsafe { quantize_halves_avx2(x, &mut q, &mut s, &mut ns) };
                runs.push(("avx2", q, s, ns));
            }
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
                let (mut q, mut s, mut ns) = fresh();
                // SAFETY: the CPU has the features (checked above).
                unsafe { quantize_halves_avx512(x, &mut q, &mut s, &mut ns) };
                runs.push(("avx512", q, s, ns));
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            let (mut q, mut s, mut ns) = fresh();
            // SAFETY: NEON is part of AArch64.
            unsafe { quantize_halves_neon(x, &mut q, &mut s, &mut ns) };
            runs.push(("neon", q, s, ns));
        }
        let bits = |v: &[f32]| v.iter().map(|s| s.to_bits()).collect::<Vec<_>>();
        for (name, q, s, ns) in runs {
            assert_eq!(q, want.codes(), "{name}: codes, {what}");
            assert_eq!(bits(&s), bits(want.scales()), "{name}: scales, {what}");
            assert_eq!(ns, want.neg_group_sums(), "{name}: sums, {what}");
        }
    }

    /// Groups whose maximum is 127 have a scale of 1 and codes equal to their values, so
    /// values halfway between integers are ties, which every quantizer rounds away from zero.
    #[test]
    fn every_quantizer_rounds_ties_away_from_zero() {
        let mut x: Vec<f32> = (0..200).map(|i| (i % 11) as f32 - 5.5).collect();
        for h in 0..x.len() / 64 {
            for k in 0..GROUPS_PER_HALF {
                x[64 * h + 4 * k] = if k % 2 == 0 { 127.0 } else { -127.0 };
            }
        }
        let a = QuantizedActs::new_by_groups(&x);
        assert_eq!(a.scales()[0], 1.0);
        assert_eq!(&a.codes()[1..4], &[-5, -4, -3]); // -4.5, -3.5, -2.5
        assert_eq!(&a.codes()[5..8], &[-1, 1, 2]); // -0.5, 0.5, 1.5
        every_quantizer_equals_the_definition(&x, "ties");
    }

    /// Every quantizer this CPU runs, called directly, against the group-by-group definition on
    /// the inputs that break a careless one: infinities, −0, subnormals, groups so small that
    /// `1/d` is infinite, NaN, ties, and a partial last half.
    #[test]
    fn every_quantizer_equals_the_definition_at_the_edges() {
        let specials = [
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.0,
            1e-45,
            -3e-39,
            1e-37,
            -1e-37,
            5e-38,
            f32::MAX,
            f32::NAN,
            2.5,
            -0.5,
        ];
        let mut next = xorshift(0x853c_49e6_748f_ea9b);
        for n in [3usize, 64, 100, 256, 1000] {
            for scale in [1.0f32, 1e-37, 1e-40] {
                let x: Vec<f32> = (0..n)
                    .map(|_| {
                        let r = next();
                        if r.is_multiple_of(7) {
                            specials[(r / 7) as usize % specials.len()]
                        } else {
                            ((r % 2001) as f32 / 100.0 - 10.0) * scale
                        }
                    })
                    .collect();
                every_quantizer_equals_the_definition(&x, &format!("n = {n}, scale {scale}"));
            }
        }
    }

    #[test]
    fn a_zero_group_has_zero_scale_and_codes() {
        let a = QuantizedActs::new(&[0.0; 64]);
        assert!(a.scales().iter().all(|&d| d == 0.0));
        assert!(a.codes().iter().all(|&q| q == 0));
    }

    #[test]
    fn the_group_maximum_maps_to_127() {
        let mut x = vec![0.5f32; 128];
        x[34] = -4.0; // group 0 holds values 0..4 and 32..36
        let a = QuantizedActs::new(&x);
        assert_eq!(a.codes()[34], -127);
        assert_eq!(a.scales()[0], 4.0 / 127.0);
        assert_eq!(a.codes()[0], 16); // 0.5·127/4 = 15.875
        assert_eq!(a.codes()[4], 127); // group 1 is all 0.5
    }
}
