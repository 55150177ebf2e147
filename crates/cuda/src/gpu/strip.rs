//! A recurrent layer's 1-bit out-projection laid out head by head, for the kernel that runs
//! the recurrence and the out-projection together (`kernels/gdn_out.cu`): the columns of value
//! head h are chunk h of every row, and the strip puts those 16 code bytes and the chunk's
//! scale of all rows one after another, so that head h's block copies its strip into shared
//! memory with two bulk copies. A second copy of the matrix (as the 2-bit tile images are),
//! made at upload where `NIWAKI_CUDA_GDN_OUT=1`; the other kernels keep reading the row-major
//! upload.

use super::{Arg, DevBuf, DevMat, Gpu};
use crate::error::{CudaError, Result};
use crate::repack::GpuFormat;

/// A matrix's chunks head by head: codes `[heads][rows]` of 16 bytes, scales `[heads][rows]`.
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
    /// The strip of `m`, a 1-bit matrix of `heads` · 128 columns (one chunk a head).
    pub(crate) fn make_strip(&self, m: &DevMat, heads: usize) -> Result<Strip> {
        if m.format != GpuFormat::Q1 || m.cols != heads * 128 {
            return Err(CudaError::Unsupported(format!(
                "a head-by-head strip of a {:?} matrix of {} columns for {heads} heads",
                m.format, m.cols
            )));
        }
        let codes = self.alloc(16 * heads * m.rows, "the out-projection's strip")?;
        let scales = self.alloc(2 * heads * m.rows, "the out-projection's strip scales")?;
        self.launch(
            &self.stream,
            "strip_image_q1",
            (m.rows.div_ceil(256) as u32, heads as u32, 1),
            (256, 1, 1),
            &[
                Arg::Ptr(m.codes.ptr),
                Arg::Ptr(m.scales.ptr),
                Arg::I32(m.rows as i32),
                Arg::Ptr(codes.ptr),
                Arg::Ptr(scales.ptr),
            ],
        )?;
        Ok(Strip { codes, scales })
    }
}
