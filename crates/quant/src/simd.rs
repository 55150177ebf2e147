//! The widest vector instructions this process's kernels may use: what the CPU has, capped by
//! the `NIWAKI_SIMD` environment variable (`scalar`, `neon`, `avx2` or `avx512`), so that a whole
//! run can be repeated on the plain twins of the SIMD kernels and compared with the fast one.

use std::sync::OnceLock;

/// The environment variable that caps the kernels' instruction set.
pub const SIMD_ENV: &str = "NIWAKI_SIMD";

/// A level of vector instructions, narrowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Simd {
    /// The portable kernels, the twins of the others.
    Scalar,
    /// AArch64's 128-bit NEON: the tiled GEMMs where the CPU has the dot-product extension
    /// (`sdot`), the activation quantizer and attention on every AArch64 CPU. Ordered below the
    /// x86 levels only so that one cap names a width: a `neon` cap leaves an x86 CPU on the
    /// twins.
    Neon,
    /// 256-bit AVX2 (with FMA and F16C), and AVX-VNNI where the CPU has it.
    Avx2,
    /// AVX-512 (F, BW, VL, VNNI, VBMI where a kernel needs them).
    Avx512,
}

impl Simd {
    /// The widest level the kernels run at in this process: what the CPU has, within the cap.
    pub fn in_use() -> Simd {
        if neon() {
            return Simd::Neon;
        }
        match crate::Isa::best() {
            crate::Isa::Avx512 => Simd::Avx512,
            crate::Isa::Avx2 | crate::Isa::Avx2Vnni => Simd::Avx2,
            crate::Isa::Scalar => Simd::Scalar,
        }
    }

    /// The name `NIWAKI_SIMD` takes for it.
    pub const fn name(self) -> &'static str {
        match self {
            Simd::Scalar => "scalar",
            Simd::Neon => "neon",
            Simd::Avx2 => "avx2",
            Simd::Avx512 => "avx512",
        }
    }

    /// Every level, narrowest first.
    const ALL: [Simd; 4] = [Simd::Scalar, Simd::Neon, Simd::Avx2, Simd::Avx512];

    /// The level a `NIWAKI_SIMD` value names, or why it names none.
    pub fn parse(value: &str) -> Result<Simd, String> {
        let value = value.trim().to_ascii_lowercase();
        Simd::ALL
            .into_iter()
            .find(|level| level.name() == value)
            .ok_or_else(|| format!("{SIMD_ENV}={value:?}: expected scalar, neon, avx2 or avx512"))
    }
}

/// The cap `NIWAKI_SIMD` sets (none where unset), or why its value is not one. Programs check
/// this once at start and refuse a bad value; the kernels then read [`allows`].
pub fn cap_from_env() -> Result<Option<Simd>, String> {
    match std::env::var(SIMD_ENV) {
        Ok(v) => Simd::parse(&v).map(Some),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{SIMD_ENV} is not UTF-8")),
    }
}

/// Whether the kernels may use `level` (the CPU must still have it): read once per process; an
/// unreadable value caps nothing (programs refuse it first, through [`cap_from_env`]).
pub fn allows(level: Simd) -> bool {
    static CAP: OnceLock<Option<Simd>> = OnceLock::new();
    CAP.get_or_init(|| cap_from_env().ok().flatten())
        .is_none_or(|cap| level <= cap)
}

/// Whether the AVX2 kernels may run: the CPU has AVX2 with FMA and F16C (every AVX2 kernel of
/// the project's GEMMs, tiled GEMMs and attention needs the three) and the cap allows AVX2.
pub fn avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    return allows(Simd::Avx2)
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the NEON kernels may run: an AArch64 CPU with the dot-product extension (every
/// ARMv8.4 core, and most ARMv8.2 ones: Neoverse N1, Cortex-A76, Apple M1 on), within the cap.
pub fn neon() -> bool {
    #[cfg(target_arch = "aarch64")]
    return allows(Simd::Neon) && std::arch::is_aarch64_feature_detected!("dotprod");
    #[cfg(not(target_arch = "aarch64"))]
    false
}

/// The four fp16 numbers at `p` as f32 (`fcvtl`: exact, as every f16 is an f32), for the NEON
/// kernels here and in the attention's (the conversion's intrinsic is not stable).
///
/// # Safety
/// 8 bytes at `p` are readable.
#[cfg(target_arch = "aarch64")]
#[doc(hidden)]
#[inline(always)]
pub unsafe fn f16x4(p: *const u16) -> std::arch::aarch64::float32x4_t {
    use std::arch::aarch64::vld1_u16;
    // SAFETY: readable, by the caller's promise; NEON loads need no alignment.
    let h = unsafe { vld1_u16(p) };
    let out;
    // SAFETY: a register-to-register conversion.
    unsafe {
        std::arch::asm!(
            "fcvtl {0:v}.4s, {1:v}.4h",
            out(vreg) out,
            in(vreg) h,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_and_order() {
        assert_eq!(Simd::parse("scalar"), Ok(Simd::Scalar));
        assert_eq!(Simd::parse(" AVX2 "), Ok(Simd::Avx2));
        assert_eq!(Simd::parse("avx512"), Ok(Simd::Avx512));
        let err = Simd::parse("sse4").unwrap_err();
        assert!(err.contains("NIWAKI_SIMD") && err.contains("sse4"), "{err}");
        assert_eq!(Simd::parse("Neon"), Ok(Simd::Neon));
        assert!(Simd::Scalar < Simd::Neon && Simd::Avx2 < Simd::Avx512);
        for level in Simd::ALL {
            assert_eq!(Simd::parse(level.name()), Ok(level));
        }
    }
}
