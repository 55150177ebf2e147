//! Activations quantized for the GEMVs and GEMMs (kernels/quant.cu's `quant_plain`).

use cudarc::driver::CudaStream;

use super::{planes_twin, Arg, Gpu};
use crate::error::{CudaError, Result};
use crate::plan;

impl Gpu {
    /// `ntok` rows of activations (`cols` wide, f32 at `x`) quantized to `xq`, `xs` (and
    /// written as f16 to `xh` when set).
    #[allow(clippy::too_many_arguments)]
    pub fn quantize(
        &self,
        stream: &CudaStream,
        x: u64,
        cols: usize,
        ntok: usize,
        xq: u64,
        xs: u64,
        xh: Option<u64>,
    ) -> Result<()> {
        self.quantize_rotated(stream, x, cols, ntok, xq, xs, xh, None, None)
    }

    /// [`Gpu::quantize`], each 1024 values Hadamard-rotated first with `signs` (a device vector
    /// of `cols` ±1; `cols` a multiple of [`plan::ROT_BLOCK`]).
    #[allow(clippy::too_many_arguments)]
    pub fn quantize_rotated(
        &self,
        stream: &CudaStream,
        x: u64,
        cols: usize,
        ntok: usize,
        xq: u64,
        xs: u64,
        xh: Option<u64>,
        signs: Option<u64>,
        xp: Option<u64>,
    ) -> Result<()> {
        // The kernel rotates whole blocks of 1024 values with every thread of a block.
        if signs.is_some() && !cols.is_multiple_of(plan::ROT_BLOCK) {
            return Err(CudaError::Unsupported(format!(
                "rotating {cols}-wide activations (a multiple of {} is needed)",
                plan::ROT_BLOCK
            )));
        }
        let (name, args) = planes_twin(
            "quant_plain",
            &[
                Arg::Ptr(x),
                Arg::I32(cols as i32),
                Arg::Ptr(xq),
                Arg::Ptr(xs),
                Arg::Ptr(xh.unwrap_or(0)),
                Arg::Ptr(signs.unwrap_or(0)),
            ],
            xp,
        );
        self.launch(
            stream,
            &name,
            (cols.div_ceil(1024) as u32, ntok as u32, 1),
            (256, 1, 1),
            &args,
        )
    }
}
