//! The AVX-512 path for native-layout rows: the 256-bit kernels with EVEX `vpdpbusd`. The
//! 512-bit kernels work on re-tiled weights (see `tiled`), where a register holds 16 rows.

use super::avx2::{self, Vnni512};
use crate::{Format, QuantizedActs};

/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; shapes were checked by the caller.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn gemm(
    format: Format,
    w: &[u8],
    row_bytes: usize,
    acts: &[QuantizedActs],
    out: &mut [f32],
) {
    avx2::body::<Vnni512>(format, w, row_bytes, acts, out)
}
