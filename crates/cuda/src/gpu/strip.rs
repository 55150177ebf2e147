//! A recurrent layer's out-projection laid out head by head, for the kernel that runs the
//! recurrence and the out-projection together (`kernels/gdn_out.cu`): value head h's 128
//! columns of a row are one 1-bit chunk or two 2-bit ones, and the strip puts those code bytes
//! and their scales of all rows one after another, so that head h's block copies its strip
//! into shared memory with two bulk copies. A second copy of the matrix (as the 2-bit tile images are),
//! made at upload where `NIWAKI_CUDA_GDN_OUT=1`; the other kernels keep reading the row-major
//! upload.

use super::{Arg, DevBuf, DevMat, Gpu};
use crate::error::{CudaError, Result};

/// A matrix's columns head by head: codes `[heads][rows]` of 16 or 32 bytes, scales
/// `[heads][rows]` of 1 or 2 (`plan::gdn_out_strip_row`).
pub(crate) struct Strip {
    pub(crate) codes: DevBuf,
    pub(crate) scales: DevBuf,
}

impl Strip {
    pub(crate) fn bytes(&self) -> usize {
        self.codes.bytes + self.scales.bytes
    }
}

impl Gpu {
    /// The strip of `m`, a matrix of `heads` · 128 columns.
    pub(crate) fn make_strip(&self, m: &DevMat, heads: usize) -> Result<Strip> {
        if m.cols != heads * 128 {
            return Err(CudaError::Unsupported(format!(
                "a head-by-head strip of a matrix of {} columns for {heads} heads",
                m.cols
            )));
        }
        // 16-byte chunks and scales a row takes for a head's 128 columns.
        let (cpr, spr) = (128 / m.format.chunk_values(), 128 / m.format.scale_values());
        let codes = self.alloc(16 * cpr * heads * m.rows, "the out-projection's strip")?;
        let scales = self.alloc(
            2 * spr * heads * m.rows,
            "the out-projection's strip scales",
        )?;
        self.launch(
            &self.stream,
            "strip_image",
            (m.rows.div_ceil(256) as u32, heads as u32, 1),
            (256, 1, 1),
            &[
                Arg::Ptr(m.codes.ptr),
                Arg::Ptr(m.scales.ptr),
                Arg::I32(m.rows as i32),
                Arg::I32(cpr as i32),
                Arg::I32(spr as i32),
                Arg::Ptr(codes.ptr),
                Arg::Ptr(scales.ptr),
            ],
        )?;
        Ok(Strip { codes, scales })
    }
}
