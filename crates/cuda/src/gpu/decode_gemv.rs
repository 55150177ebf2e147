//! The one-token GEMVs of the sm_90 paths: which kernel takes a matrix (the binary tensor-core
//! kernel, the dp4a kernel with its activations piece-major or swizzled), its plan and its
//! arguments.

use std::sync::atomic::Ordering;

use cudarc::driver::CudaStream;

use super::{Arg, DevMat, FoldKind, GemvIo, Gpu, NormIn};
use crate::error::Result;
use crate::plan::{self, Gemv1Tuning};
use crate::repack::GpuFormat;
use crate::tma::{self, TensorMap};

/// Settings of [`Gpu`]'s `x_copy`.
pub(super) const X_COPY_OFF: usize = 0;
pub(super) const X_COPY_PLAN: usize = 1;
pub(super) const X_COPY_ALL: usize = 2;

/// The arguments the decode GEMVs (`gemv1_*`, `gemv_b1_*`, `gemv_b2*`) take after the matrix: the
/// activations (`x`: their codes, or their plane words for the `_p` kernels), output and
/// argmax, the ring's stages, the fused norm's input (or nulls), the
/// next matrix to prefetch (or nulls), how many of the ring's first tiles are requested
/// before the wait for the previous kernel, a folded norm's input scale, and the fold's
/// output (or nulls; a folded norm's weights take the fused norm's place, and a folded
/// SwiGLU's width ends the list).
fn decode_args(x: u64, io: &GemvIo, stages: usize, pre: Option<NormIn>, early: usize) -> [Arg; 22] {
    // The kernels take byte counts as i32: a larger prefetch is cut to what that holds.
    let bytes = |n: usize| Arg::I32(n.min(i32::MAX as usize) as i32);
    let (fold_weight, piece_ss, ffn) = match io.fold.map(|f| f.kind) {
        Some(FoldKind::Norm { weight, piece_ss }) => (weight, piece_ss, 0),
        Some(FoldKind::Swiglu { ffn }) => (0, 0, ffn),
        None => (0, 0, 0),
    };
    [
        Arg::Ptr(x),
        Arg::Ptr(io.xs),
        Arg::Ptr(io.out),
        Arg::I32(i32::from(io.accumulate)),
        Arg::Ptr(io.argmax.unwrap_or(0)),
        Arg::I32(stages as i32),
        Arg::Ptr(pre.map_or(0, |p| p.x)),
        Arg::I32(pre.map_or(0, |p| p.tok0 as i32)),
        Arg::Ptr(pre.map_or(fold_weight, |p| p.weight)),
        Arg::F32(pre.map_or(0.0, |p| p.eps)),
        Arg::Ptr(io.prefetch.map_or(0, |p| p.codes)),
        bytes(io.prefetch.map_or(0, |p| p.code_bytes)),
        Arg::Ptr(io.prefetch.map_or(0, |p| p.scales)),
        bytes(io.prefetch.map_or(0, |p| p.scale_bytes)),
        Arg::I32(early.min(i32::MAX as usize) as i32),
        Arg::Ptr(io.rms_in.map_or(0, |r| r.piece_ss)),
        Arg::F32(io.rms_in.map_or(0.0, |r| r.eps)),
        Arg::Ptr(io.fold.map_or(0, |f| f.counters)),
        Arg::Ptr(io.fold.map_or(0, |f| f.xq)),
        Arg::Ptr(io.fold.map_or(0, |f| f.xs)),
        Arg::Ptr(piece_ss),
        Arg::I32(ffn as i32),
    ]
}

/// Where a 1-bit decode GEMV's fold leaves its plane words (or null), the argument its kernels
/// take after [`decode_args`]; the 2-bit kernels take none (kernels/gemv.cu, FOLD_XP_PARAM).
fn fold_planes_arg(io: &GemvIo, format: GpuFormat) -> Option<Arg> {
    (format == GpuFormat::Q1).then(|| Arg::Ptr(io.fold.and_then(|f| f.xp).unwrap_or(0)))
}

impl Gpu {
    /// The one-token GEMV of the sm_90 paths, where they are on and take the matrix: the binary
    /// tensor cores where `Gpu::takes_b1` (1-bit rows, 2-bit rows up to 6144 columns), else
    /// the bulk-copy dp4a kernel with its default tuning. `false`: nothing launched. With `pre`,
    /// the kernel norms and quantizes its input itself where [`Gpu::norm_fusion`] folds the norm
    /// into that kernel and it takes it; else nothing is launched and the caller runs the norm
    /// apart. A matrix the binary kernel takes only with the norm apart stays on it (the norm
    /// then runs apart): folding a norm never moves a matrix to another kernel, whose sums
    /// would run in another order.
    pub fn gemv_decode(
        &self,
        stream: &CudaStream,
        m: &DevMat,
        io: &GemvIo,
        pre: Option<NormIn>,
    ) -> Result<bool> {
        if io.ntok != 1 || !self.gemv1() {
            return Ok(false);
        }
        let binary = self.takes_b1(m, false);
        if pre.is_some() && !self.norm_fusion().folds(binary) {
            return Ok(false);
        }
        if binary {
            // Launched unless a folded norm is asked for and its plan declines it: the norm then
            // runs apart, and the matrix comes back here without it.
            return self.gemv_b1(stream, m, io, pre);
        }
        let t = self.gemv1_tuning(m.format, m.cols);
        self.gemv1_tuned(stream, m, io, t, pre)
    }

    /// Whether `m`'s one-token GEMV (its norm fused or not) goes to the binary tensor cores:
    /// [`Gpu::prefers_b1`], and the kernel's plan takes its shape ([`Gpu::b1_plan`]).
    pub(super) fn takes_b1(&self, m: &DevMat, fused: bool) -> bool {
        self.prefers_b1(m) && self.b1_plan(m, fused).is_some()
    }

    /// Whether the binary kernels are on for `m`'s format and `m` has the rows
    /// [`plan::prefers_b1`] asks for.
    fn prefers_b1(&self, m: &DevMat) -> bool {
        self.prefers_b1_shape(m.format, m.rows)
    }

    /// [`Gpu::prefers_b1`] for a matrix of that format and rows.
    pub(super) fn prefers_b1_shape(&self, format: GpuFormat, rows: usize) -> bool {
        let on = match format {
            GpuFormat::Q1 => &self.b1,
            GpuFormat::Q2G64 | GpuFormat::Q2G128 => &self.b2,
        };
        on.load(Ordering::Relaxed)
            && !self.gemv1_nodot.load(Ordering::Relaxed)
            && plan::prefers_b1(
                rows,
                self.info.multiprocessors.max(1) as usize,
                self.b1_min_tiles,
            )
    }

    /// The binary kernel's launch for `m`: sm_90 only (its plan sizes blocks for that
    /// multiprocessor's shared memory), rows of a width the plan takes.
    fn b1_plan(&self, m: &DevMat, fused: bool) -> Option<plan::GemvB1Launch> {
        self.b1_plan_shape(m.format, m.rows, m.cols, fused)
    }

    /// [`Gpu::b1_plan`] for a matrix of that format and shape.
    pub(super) fn b1_plan_shape(
        &self,
        format: GpuFormat,
        rows: usize,
        cols: usize,
        fused: bool,
    ) -> Option<plan::GemvB1Launch> {
        if self.info.compute_capability.0 != 9 {
            return None;
        }
        let l = plan::gemv_b1_launch(
            format,
            rows,
            cols,
            self.info.multiprocessors.max(1) as usize,
            self.smem_limit,
            fused,
            self.b1_knobs,
            self.b1_tile_rows.load(Ordering::Relaxed),
        )?;
        // A program with lane pairs has its 2-bit kernels read them: those launch so or not
        // at all.
        if self.lane_pairs && format != GpuFormat::Q1 {
            plan::lane_paired(l, rows, cols)
        } else {
            Some(l)
        }
    }

    /// `l` with its activations staged in shared memory where that is on and its kernel has
    /// such a form ([`plan::x_staged`]: the widest 1-bit rows, the norm apart).
    fn staged(&self, l: plan::GemvB1Launch, cols: usize) -> plan::GemvB1Launch {
        if self.x_stage() {
            plan::x_staged(l, cols).unwrap_or(l)
        } else {
            l
        }
    }

    /// The binary kernel's launch for a one-token GEMV of that shape, its norm apart: what
    /// [`Gpu::gemv_b1`] launches without a folded norm's cluster (its 2-bit kernel's image twin
    /// where the matrix has an image). For the harness's reports.
    #[doc(hidden)]
    pub fn b1_launch_shape(
        &self,
        format: GpuFormat,
        rows: usize,
        cols: usize,
    ) -> Option<plan::GemvB1Launch> {
        self.b1_plan_shape(format, rows, cols, false)
            .map(|l| self.staged(l, cols))
    }

    /// One-token GEMV on the binary tensor cores (`kernels/gemv_b1.cu`); `false` (nothing
    /// launched) where the plan does not take the shape or the device lacks the kernel.
    pub fn gemv_b1(
        &self,
        stream: &CudaStream,
        m: &DevMat,
        io: &GemvIo,
        pre: Option<NormIn>,
    ) -> Result<bool> {
        let Some(plain) = self.b1_plan(m, pre.is_some()).filter(|_| io.ntok == 1) else {
            return Ok(false);
        };
        let norm_fold = matches!(io.fold.map(|f| f.kind), Some(FoldKind::Norm { .. }));
        let cluster = (norm_fold && self.fold_cluster().takes(m.format))
            .then(|| plan::cluster_fold(plain, m.rows))
            .flatten();
        let l = cluster.unwrap_or(plain);
        let l = if pre.is_none() {
            self.staged(l, m.cols)
        } else {
            l
        };
        let map = m.codes_map(l.tile_rows)?;
        // The 2-bit kernels take their tiles from the matrix's image where it has one of these
        // tiles (the clustered kernels have no such twin).
        let image = m
            .image
            .as_ref()
            .filter(|im| im.shape.tile_rows == l.tile_rows)
            .zip(l.image_kernel);
        let kernel = image.map_or(l.kernel, |(_, k)| k);
        // The activations' plane words where the quantization wrote them and the kernel has a
        // twin that reads them (1-bit rows, the norm apart).
        let planes = io
            .xp
            .filter(|_| pre.is_none() && m.format == GpuFormat::Q1)
            .zip(plan::planes_kernel(kernel));
        let (kernel, x) = planes.map_or((kernel, io.xq), |(xp, k)| (k, xp));
        self.launch_smem(
            stream,
            kernel,
            (l.grid as u32, 1, 1),
            (32 * (plan::GEMV1_WARPS as u32 + 1), 1, 1),
            l.smem_bytes as u32,
            &[
                Arg::Map(Box::new(map)),
                Arg::Ptr(m.scales.ptr),
                Arg::I32(m.rows as i32),
                Arg::I32(m.cols as i32),
            ]
            .into_iter()
            .chain(decode_args(x, io, l.stages, pre, self.early_tiles()))
            .chain(fold_planes_arg(io, m.format))
            .chain(image.map(|(im, _)| Arg::Ptr(im.buf.ptr)))
            .collect::<Vec<_>>(),
        )?;
        self.count_fold(io.fold);
        if image.is_some() {
            self.image_launches.fetch_add(1, Ordering::Relaxed);
        }
        if cluster.is_some() {
            self.count_cluster_fold();
        }
        if planes.is_some() {
            self.planes_launches.fetch_add(1, Ordering::Relaxed);
        }
        Ok(true)
    }

    /// One-token GEMV through the bulk-copy kernel with explicit tuning; `false` (nothing
    /// launched) when the plan does not fit or the device lacks the kernel. With `pre`, the
    /// kernel norms and quantizes its input row itself and `xq`, `xs` are not read.
    pub fn gemv1_tuned(
        &self,
        stream: &CudaStream,
        m: &DevMat,
        io: &GemvIo,
        t: Gemv1Tuning,
        pre: Option<NormIn>,
    ) -> Result<bool> {
        if !self.info.sm90() || io.ntok != 1 {
            return Ok(false);
        }
        let sms = self.info.multiprocessors.max(1) as usize;
        let fused = pre.is_some();
        let nodot = self.gemv1_nodot.load(Ordering::Relaxed) && m.format != GpuFormat::Q2G128;
        let mode = self.x_copy.load(Ordering::Relaxed);
        let x_rows = plan::x_copy_rows(m.cols).filter(|_| {
            !nodot
                && mode != X_COPY_OFF
                && plan::prefers_x_copy(m.rows, m.cols, sms, mode == X_COPY_ALL)
        });
        let Some(l) = plan::gemv1_launch(m.format, m.rows, m.cols, t, sms, self.smem_limit, fused)
        else {
            return Ok(false);
        };
        let variant = match (nodot, x_rows) {
            (true, _) => "_nodot",
            (false, Some(_)) => "_x",
            (false, None) => "",
        };
        // The probe's consumers multiply nothing: the split kernel's tiles are the same.
        let shared = if l.shared_lanes && !nodot { "s" } else { "" };
        let name = format!(
            "gemv1_{}_r{}{shared}{variant}",
            m.format.kernel_name(),
            l.rows_per_warp
        );
        let xmap = match x_rows {
            // A fused norm makes the activations in the block: the map goes unread.
            Some(rows) if !fused => tma::encode(io.xq, &plan::x_copy_tile(rows))?,
            _ => TensorMap::unused(),
        };
        let args = [
            &m.args()[..],
            &decode_args(io.xq, io, l.stages, pre, self.early_tiles()),
            &fold_planes_arg(io, m.format)
                .into_iter()
                .collect::<Vec<_>>(),
            &[Arg::Map(Box::new(xmap))],
        ]
        .concat();
        self.launch_smem(
            stream,
            &name,
            (l.grid as u32, 1, 1),
            (32 * (plan::GEMV1_WARPS as u32 + 1), 1, 1),
            l.smem_bytes as u32,
            &args,
        )?;
        if x_rows.is_some() {
            self.x_copy_launches.fetch_add(1, Ordering::Relaxed);
        }
        self.count_fold(io.fold);
        Ok(true)
    }
}
