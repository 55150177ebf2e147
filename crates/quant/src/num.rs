//! Scalar conversions shared by the block formats, written to reproduce ggml's reference C
//! bit-for-bit on x86-64 (the platform the fixtures are generated on).

/// fp32 → IEEE fp16 bits, round to nearest even, as `GGML_FP32_TO_FP16` does: overflow goes to
/// infinity, subnormals are kept, and every NaN becomes the quiet NaN `0x7e00` with its sign.
pub(crate) fn f32_to_f16_bits(v: f32) -> u16 {
    if v.is_nan() {
        let sign = ((v.to_bits() >> 16) & 0x8000) as u16;
        sign | 0x7e00
    } else {
        half::f16::from_f32(v).to_bits()
    }
}

/// IEEE fp16 bits → fp32 (exact).
#[inline(always)]
pub(crate) fn f16_bits_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// Reads the little-endian fp16 at `bytes[at..at + 2]` as f32.
#[inline(always)]
pub(crate) fn read_f16(bytes: &[u8], at: usize) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([bytes[at], bytes[at + 1]]))
}

/// Whether the little-endian fp16 at `bytes[at..at + 2]` is NaN or infinite.
#[inline(always)]
pub(crate) fn f16_is_non_finite(bytes: &[u8], at: usize) -> bool {
    u16::from_le_bytes([bytes[at], bytes[at + 1]]) & 0x7c00 == 0x7c00
}

/// fp32 → bf16 bits as ggml's `ggml_compute_fp32_to_bf16`: NaN keeps its top 16 bits with the quiet
/// bit forced on; everything else rounds to nearest even (overflow rounds to infinity, subnormals
/// are kept).
pub(crate) fn f32_to_bf16_bits(v: f32) -> u16 {
    let u = v.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// bf16 bits → fp32 (exact).
#[inline(always)]
pub(crate) fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// C's `(int)v` as compiled for x86-64 (`cvttss2si`): truncation toward zero, and NaN or a value
/// outside the `int` range gives `INT_MIN`. Rust's `as` saturates instead, which would differ from
/// the reference on exactly those inputs.
#[inline(always)]
pub(crate) fn c_trunc_i32(v: f32) -> i32 {
    if v.is_nan() || !(-2_147_483_648.0..2_147_483_648.0).contains(&v) {
        i32::MIN
    } else {
        v as i32
    }
}

/// ggml's `MAX(a, b)` macro: `a > b ? a : b` (so a NaN `b` replaces `a`).
#[inline(always)]
pub(crate) fn c_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// Sums lane accumulators pairwise: `(a0 + a4) + ...` folds halves until one value is left, the
/// order a tree reduction of SIMD lanes uses. `N` must be a power of two.
#[inline(always)]
pub(crate) fn reduce_lanes<const N: usize>(mut acc: [f32; N]) -> f32 {
    let mut n = N;
    while n > 1 {
        n /= 2;
        for i in 0..n {
            acc[i] += acc[i + n];
        }
    }
    acc[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_nan_is_the_ggml_quiet_nan() {
        assert_eq!(f32_to_f16_bits(f32::NAN), 0x7e00);
        assert_eq!(f32_to_f16_bits(-f32::NAN), 0xfe00);
        assert_eq!(f32_to_f16_bits(f32::from_bits(0x7f80_0001)), 0x7e00);
    }

    #[test]
    fn f16_rounds_to_nearest_even() {
        // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties go to the even mantissa (1.0).
        assert_eq!(f32_to_f16_bits(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f32_to_f16_bits(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        assert_eq!(f32_to_f16_bits(65520.0), 0x7c00);
        assert_eq!(f32_to_f16_bits(65519.0), 0x7bff);
        assert_eq!(f32_to_f16_bits(2f32.powi(-24)), 0x0001);
        assert_eq!(f32_to_f16_bits(2f32.powi(-25)), 0x0000);
        assert_eq!(f32_to_f16_bits(-0.0), 0x8000);
    }

    #[test]
    fn bf16_rounds_to_nearest_even_and_quiets_nan() {
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0xff81_0000)), 0xffc1);
        assert_eq!(f32_to_bf16_bits(f32::MAX), 0x7f80);
        assert_eq!(f32_to_bf16_bits(f32::INFINITY), 0x7f80);
    }

    #[test]
    fn c_trunc_matches_cvttss2si() {
        assert_eq!(c_trunc_i32(-1.9), -1);
        assert_eq!(c_trunc_i32(2.9), 2);
        assert_eq!(c_trunc_i32(f32::NAN), i32::MIN);
        assert_eq!(c_trunc_i32(3e9), i32::MIN);
        assert_eq!(c_trunc_i32(-3e9), i32::MIN);
        assert_eq!(c_trunc_i32(-2_147_483_648.0), i32::MIN);
    }
}
