//! x86-64 kernels, compiled with `#[target_feature]` and chosen at run time.

mod avx2;
mod avx512;

use super::Isa;
use crate::{Format, QuantizedActs};

pub(crate) fn has_avx2() -> bool {
    crate::simd::avx2()
}

pub(crate) fn has_avx2_vnni() -> bool {
    has_avx2() && is_x86_feature_detected!("avxvnni")
}

pub(crate) fn has_avx512() -> bool {
    crate::simd::allows(crate::Simd::Avx512)
        && has_avx2()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("avx512vbmi")
}

pub(crate) fn available(isa: Isa) -> bool {
    match isa {
        Isa::Scalar => true,
        Isa::Avx2 => has_avx2(),
        Isa::Avx2Vnni => has_avx2_vnni(),
        Isa::Avx512 => has_avx512(),
    }
}

/// Runs `format` on `isa`; the caller checked shapes and that the CPU has `isa`.
pub(crate) fn gemm(
    isa: Isa,
    format: Format,
    weights: &[u8],
    row_bytes: usize,
    acts: &[QuantizedActs],
    out: &mut [f32],
) {
    assert!(available(isa), "gemm_rows: this CPU cannot run {isa:?}");
    // SAFETY: `available` confirmed every feature the kernels of `isa` are compiled with; the
    // kernels read only `weights` (whole rows of `row_bytes`, checked by the caller), the
    // activation buffers (padded to 64 values) and write `out` (rows × tokens, checked).
    unsafe {
        match isa {
            Isa::Scalar => super::scalar::gemm(format, weights, row_bytes, acts, out),
            Isa::Avx2 => avx2::gemm(format, weights, row_bytes, acts, out),
            Isa::Avx2Vnni => avx2::gemm_vnni(format, weights, row_bytes, acts, out),
            Isa::Avx512 => avx512::gemm(format, weights, row_bytes, acts, out),
        }
    }
}
