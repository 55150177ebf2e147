//! A matrix times activations, by token count: the decode GEMVs for one token
//! (`decode_gemv.rs`), the tensor-core GEMMs, and the register-streaming GEMV any device runs.

use std::sync::atomic::Ordering;

use cudarc::driver::CudaStream;

use super::{Arg, DevMat, GemvIo, Gpu};
use crate::compile;
use crate::error::{CudaError, Result};
use crate::plan::{self, GEMV_ROWS, GEMV_TOKENS};
use crate::repack::X_GROUP;
use crate::tma;

impl Gpu {
    /// `out[t][r] (+)= W[r] · x[t]` for `io.ntok` tokens: the decode GEMV for one token, the
    /// tensor-core GEMM from [`Gpu::gemm_min_tokens`] tokens on (the argmax is only in the
    /// dp4a kernels), else the dp4a kernels (several launches past 8 tokens).
    pub fn gemv(&self, stream: &CudaStream, m: &DevMat, io: &GemvIo) -> Result<()> {
        if self.gemv_decode(stream, m, io, None)? {
            return Ok(());
        }
        if io.rms_in.is_some() || io.fold.is_some() {
            return Err(CudaError::Unsupported(
                "a folded norm needs the sm_90 decode GEMVs".into(),
            ));
        }
        if io.ntok >= self.gemm_min_tokens() && io.argmax.is_none() && self.mma() {
            return self.gemm(stream, m, io);
        }
        self.gemv_plain(stream, m, io)
    }

    /// The tensor-core GEMM for any number of tokens (no argmax), with the kernel set by
    /// [`Gpu::set_gemm_kernel`] or else the preferred one for the matrix (the int8 one where
    /// the f16 activations are missing, the rows are not whole f16-GEMM stages, or a format
    /// whose scales the f16 GEMM reads in stage order has no such copy: [`DevMat::hgemm_ready`]).
    pub fn gemm(&self, stream: &CudaStream, m: &DevMat, io: &GemvIo) -> Result<()> {
        let kernel = match self.gemm_kernel() {
            Some(k) => k,
            None => {
                let k = plan::GemmKernel::preferred(
                    self.info.wgmma(),
                    m.rows,
                    m.cols,
                    io.ntok,
                    self.info.multiprocessors.max(1) as usize,
                    io.split_scratch.map_or(0, |(_, cap)| cap),
                );
                if self.hgemm_narrow() {
                    k
                } else {
                    k.widest()
                }
            }
        };
        let kernel = match kernel {
            plan::GemmKernel::F16 { .. } if io.xh.is_none() || !m.hgemm_ready() => {
                plan::GemmKernel::INT8
            }
            k => k,
        };
        self.gemm_with(stream, m, io, kernel)
    }

    /// The GEMM kernel set by [`Gpu::set_gemm_kernel`], if any.
    pub fn gemm_kernel(&self) -> Option<plan::GemmKernel> {
        *self.gemm_kernel.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether multi-token passes of `ntok` tokens want f16 activations beside the int8 ones.
    pub fn wants_f16_acts(&self, ntok: usize) -> bool {
        ntok >= self.gemm_min_tokens()
            && self.mma()
            && match self.gemm_kernel() {
                Some(k) => matches!(k, plan::GemmKernel::F16 { .. }),
                None => self.info.wgmma(),
            }
    }

    /// The GEMM kernels this device runs.
    pub fn gemm_kernels(&self) -> Vec<plan::GemmKernel> {
        plan::GemmKernel::all(self.info.wgmma())
    }

    /// Fixes the GEMM kernel (one of [`Gpu::gemm_kernels`]) for every matrix, for measuring
    /// them; `None` goes back to each matrix's preferred one.
    pub fn set_gemm_kernel(&self, kernel: Option<plan::GemmKernel>) {
        if let Some(k) = kernel {
            assert!(
                self.gemm_kernels().contains(&k),
                "no GEMM kernel {k:?} on this device"
            );
        }
        *self.gemm_kernel.lock().unwrap_or_else(|e| e.into_inner()) = kernel;
    }

    /// The K splits every multi-token GEMM takes where they fit (0: the plan's).
    pub fn gemm_splits(&self) -> usize {
        self.gemm_splits.load(Ordering::Relaxed)
    }

    /// Sets [`Gpu::gemm_splits`]; returns the previous setting. For the harness's checks.
    #[doc(hidden)]
    pub fn set_gemm_splits(&self, n: usize) -> usize {
        self.gemm_splits.swap(n, Ordering::Relaxed)
    }

    /// A tensor-core GEMM kernel (the f16 one reads `io.xh`, which must be set).
    pub fn gemm_with(
        &self,
        stream: &CudaStream,
        m: &DevMat,
        io: &GemvIo,
        kernel: plan::GemmKernel,
    ) -> Result<()> {
        if io.argmax.is_some() || io.ntok == 0 {
            return Err(CudaError::Unsupported(
                "the tensor-core GEMM takes at least one token and keeps no argmax".into(),
            ));
        }
        if matches!(kernel, plan::GemmKernel::F16 { .. }) && !m.hgemm_ready() {
            return Err(CudaError::Unsupported(if plan::hgemm_takes(m.cols) {
                format!(
                    "the f16 GEMM reads {:?} scales in stage order, made at upload on \
                         devices with warpgroup MMA: this matrix has none",
                    m.format
                )
            } else {
                format!(
                    "the f16 GEMM takes rows of whole {}-value stages, not {} values",
                    plan::HGEMM_STAGE_VALUES,
                    m.cols
                )
            }));
        }
        let (leading, acts) = match (kernel, io.xh) {
            (plan::GemmKernel::Int8 { .. }, _) => {
                (m.args().to_vec(), vec![Arg::Ptr(io.xq), Arg::Ptr(io.xs)])
            }
            (plan::GemmKernel::F16 { wg, tokens }, Some(xh)) => {
                let w = plan::hgemm_weight_tile(m.format, m.rows, m.cols, wg);
                let x = plan::hgemm_act_tile(io.ntok, m.cols, tokens);
                // Formats whose threads load their own scales pass no stage-ordered copy.
                let staged = m.stage_scales.as_ref().map_or(0, |b| b.ptr);
                (
                    vec![
                        Arg::Map(Box::new(tma::encode(m.codes.ptr, &w)?)),
                        Arg::Ptr(m.scales.ptr),
                        Arg::Ptr(staged),
                        Arg::I32(plan::hgemm_stage_scale_rows(m.rows) as i32),
                        Arg::I32(m.rows as i32),
                        Arg::I32(m.cols as i32),
                    ],
                    vec![Arg::Map(Box::new(tma::encode(xh, &x)?))],
                )
            }
            (plan::GemmKernel::F16 { .. }, None) => {
                return Err(CudaError::Unsupported(
                    "the f16 GEMM needs the f16 activations".into(),
                ))
            }
        };
        let (gx, gy) = plan::gemm_grid(m.rows, io.ntok, kernel);
        let sms = self.info.multiprocessors.max(1) as usize;
        let splits = io.split_scratch.map_or(1, |(_, cap)| {
            let set = self.gemm_splits();
            if set > 0 && plan::gemm_split_fits(m.rows, m.cols, io.ntok, kernel, set, cap) {
                set
            } else {
                let pdl_pass = self.short_pass_splits && self.launches_with_pdl();
                plan::gemm_splits(m.rows, m.cols, io.ntok, kernel, sms, cap, pdl_pass)
            }
        });
        // Split: partial sums [split][token][row] into the scratch, then added up in order.
        let zstride = (io.ntok * m.rows) as u64;
        let (out, out_stride, accumulate) = match io.split_scratch {
            Some((part, _)) if splits > 1 => (part, m.rows, false),
            _ => (io.out, io.out_stride, io.accumulate),
        };
        self.launch_smem(
            stream,
            &kernel.name(m.format),
            (gx as u32, gy as u32, splits as u32),
            (kernel.threads() as u32, 1, 1),
            kernel.smem_bytes() as u32,
            &[
                &leading[..],
                &acts,
                &[
                    Arg::I32(io.ntok as i32),
                    Arg::Ptr(out),
                    Arg::I32(out_stride as i32),
                    Arg::I32(i32::from(accumulate)),
                    Arg::U64(zstride),
                ],
            ]
            .concat(),
        )?;
        if splits == 1 {
            return Ok(());
        }
        self.launch(
            stream,
            "gemm_reduce",
            (m.rows.div_ceil(256) as u32, io.ntok as u32, 1),
            (256, 1, 1),
            &[
                Arg::Ptr(out),
                Arg::I32(splits as i32),
                Arg::U64(zstride),
                Arg::I32(m.rows as i32),
                Arg::Ptr(io.out),
                Arg::I32(io.out_stride as i32),
                Arg::I32(i32::from(io.accumulate)),
            ],
        )
    }

    /// The register-streaming GEMV (`gemv_<format>_t1` / `_t8`), for any device.
    pub fn gemv_plain(&self, stream: &CudaStream, m: &DevMat, io: &GemvIo) -> Result<()> {
        let GemvIo {
            xq,
            xs,
            ntok,
            out,
            out_stride,
            accumulate,
            argmax,
            ..
        } = *io;
        let width = if ntok == 1 { 1 } else { GEMV_TOKENS };
        let name = format!("gemv_{}_t{width}", m.format.kernel_name());
        let name = compile::KERNELS
            .iter()
            .find(|k| **k == name)
            .expect("gemv kernel");
        // 8 warps a block, each owning groups of GEMV_ROWS rows; a grid of a few blocks per SM
        // strides over the row groups.
        let groups = m.rows.div_ceil(GEMV_ROWS);
        let sms = self.info.multiprocessors.max(1) as usize;
        let grid = (groups.div_ceil(8).min(4 * sms) as u32, 1, 1);
        let mut t0 = 0;
        while t0 < ntok {
            let n = width.min(ntok - t0);
            self.launch(
                stream,
                name,
                grid,
                (256, 1, 1),
                &[
                    &m.args()[..],
                    &[
                        Arg::Ptr(xq + (t0 * m.cols) as u64),
                        Arg::Ptr(xs + (8 * t0 * m.cols / X_GROUP) as u64),
                        Arg::I32(n as i32),
                        Arg::Ptr(out + (4 * t0 * out_stride) as u64),
                        Arg::I32(out_stride as i32),
                        Arg::I32(i32::from(accumulate)),
                        Arg::Ptr(argmax.map_or(0, |a| a + 8 * t0 as u64)),
                    ],
                ]
                .concat(),
            )?;
            t0 += n;
        }
        Ok(())
    }
}
