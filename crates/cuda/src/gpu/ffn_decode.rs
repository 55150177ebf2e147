//! The decode step's feed-forward block in one launch (`kernels/ffn.cu`, [`plan::ffn_decode_launch`]).

use std::sync::atomic::Ordering;

use cudarc::driver::CudaStream;

use super::{occupancy, Arg, DevMat, Gpu, Prefetch};
use crate::error::Result;
use crate::plan;

/// What the one-kernel feed-forward block reads and writes: the normed, quantized row (`xq`,
/// `xs`, overwritten with SwiGLU's quantized row), the gate | up outputs (`proj`), the residual
/// row it adds down's product into, and the two words of its grid-wide barrier (zeroed once;
/// the kernel leaves them as it found them); with `norm`, the residual row is then normed and
/// quantized into `xq`, `xs` for the GEMV after it.
#[derive(Clone, Copy, Debug)]
pub struct FfnIo {
    pub xq: u64,
    pub xs: u64,
    pub proj: u64,
    pub residual: u64,
    pub sync: u64,
    pub norm: Option<NormWeights>,
    /// The next GEMV's first bytes, for the L2 cache.
    pub prefetch: Option<Prefetch>,
}

/// A norm's weights and epsilon.
#[derive(Clone, Copy, Debug)]
pub struct NormWeights {
    pub weight: u64,
    pub eps: f32,
}

impl Gpu {
    /// One token's gate | up (`gu`, 2·ffn rows of `hidden` values), SwiGLU and down (`down`,
    /// `hidden` rows of ffn values) in one kernel; `false` (nothing launched) where the device
    /// is not sm_90, the matrices differ in format, the plan does not take the widths or the
    /// grid would not be resident at once.
    pub fn ffn_decode(
        &self,
        stream: &CudaStream,
        gu: &DevMat,
        down: &DevMat,
        io: &FfnIo,
    ) -> Result<bool> {
        let (hidden, ffn) = (down.rows, down.cols);
        if self.info.compute_capability.0 != 9
            || gu.format != down.format
            || gu.rows != 2 * ffn
            || gu.cols != hidden
        {
            return Ok(false);
        }
        let sms = self.info.multiprocessors.max(1) as usize;
        let Some(l) = plan::ffn_decode_launch(gu.format, hidden, ffn, sms, self.smem_limit) else {
            return Ok(false);
        };
        // The barriers wait for every block: a grid larger than what the device holds at once
        // would hang.
        if occupancy(&self.funcs[l.kernel], l.kernel, l.threads, l.smem_bytes)? == 0 {
            return Ok(false);
        }
        let pf = io.prefetch;
        let bytes = |n: usize| Arg::I32(n.min(i32::MAX as usize) as i32);
        self.launch_smem(
            stream,
            l.kernel,
            (l.grid as u32, 1, 1),
            (l.threads as u32, 1, 1),
            l.smem_bytes as u32,
            &[
                Arg::Ptr(gu.codes.ptr),
                Arg::Ptr(gu.scales.ptr),
                Arg::Ptr(down.codes.ptr),
                Arg::Ptr(down.scales.ptr),
                Arg::I32(hidden as i32),
                Arg::I32(ffn as i32),
                Arg::Ptr(io.xq),
                Arg::Ptr(io.xs),
                Arg::Ptr(io.proj),
                Arg::Ptr(io.residual),
                Arg::Ptr(io.sync),
                Arg::I32(l.ring_bytes as i32),
                Arg::I32(self.early_tiles().min(i32::MAX as usize) as i32),
                Arg::Ptr(io.norm.map_or(0, |n| n.weight)),
                Arg::F32(io.norm.map_or(0.0, |n| n.eps)),
                Arg::Ptr(pf.map_or(0, |p| p.codes)),
                bytes(pf.map_or(0, |p| p.code_bytes)),
                Arg::Ptr(pf.map_or(0, |p| p.scales)),
                bytes(pf.map_or(0, |p| p.scale_bytes)),
            ],
        )?;
        self.ffn_launches.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }
}
