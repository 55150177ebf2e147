//! The device: context, compiled kernels, buffers and raw launches. Pointers are passed to the
//! kernels as plain 64-bit device addresses so that a whole token can be captured as one graph.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{
    result, sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr,
};

use crate::compile;
use crate::error::{Context, CudaError, Result};
use crate::plan::{Dims, GEMV_ROWS, GEMV_TOKENS};
use crate::repack::{GpuFormat, Packed, X_GROUP};

/// What `available()` reports about the first GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub compute_capability: (i32, i32),
    pub multiprocessors: i32,
    pub total_bytes: usize,
    pub free_bytes: usize,
    /// As `cuDriverGetVersion` reports it (13000 = 13.0).
    pub driver_version: i32,
}

impl DeviceInfo {
    /// The NVRTC target, e.g. `sm_90`.
    pub fn arch(&self) -> String {
        format!(
            "sm_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}, {} SMs, {:.1} GiB, driver {}.{})",
            self.name,
            self.arch(),
            self.multiprocessors,
            self.total_bytes as f64 / (1u64 << 30) as f64,
            self.driver_version / 1000,
            self.driver_version % 1000 / 10
        )
    }
}

fn open_context() -> Result<Arc<CudaContext>> {
    // SAFETY: only checks whether the shared library can be opened; nothing is called yet.
    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::NoDriver("libcuda.so not found".into()));
    }
    let n = CudaContext::device_count().map_err(|e| CudaError::NoDriver(e.to_string()))?;
    if n < 1 {
        return Err(CudaError::NoDevice);
    }
    let ctx = CudaContext::new(0).ctx(|| "creating a context on GPU 0".into())?;
    // SAFETY: the backend orders all work itself (one stream per sequence, synchronised at the
    // end of each call), so cudarc's per-buffer events are not needed; they would also get in
    // the way of graph capture.
    unsafe { ctx.disable_event_tracking() };
    Ok(ctx)
}

fn device_info(ctx: &CudaContext) -> Result<DeviceInfo> {
    let (free_bytes, total_bytes) = ctx.mem_get_info().ctx(|| "memory info".into())?;
    let mut driver_version = 0i32;
    // SAFETY: writes one int.
    unsafe { sys::cuDriverGetVersion(&mut driver_version) }
        .result()
        .ctx(|| "driver version".into())?;
    Ok(DeviceInfo {
        name: ctx.name().ctx(|| "device name".into())?,
        compute_capability: ctx
            .compute_capability()
            .ctx(|| "compute capability".into())?,
        multiprocessors: ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .ctx(|| "SM count".into())?,
        total_bytes,
        free_bytes,
        driver_version,
    })
}

/// Whether a GPU can be used, and which. Never panics: without a driver or a GPU it returns the
/// reason as an error.
pub fn available() -> Result<DeviceInfo, CudaError> {
    match std::panic::catch_unwind(|| open_context().and_then(|c| device_info(&c))) {
        Ok(r) => r,
        Err(_) => Err(CudaError::NoDriver(
            "the CUDA driver library could not be loaded".into(),
        )),
    }
}

/// A device allocation with its raw address.
pub struct DevBuf {
    _mem: CudaSlice<u8>,
    pub ptr: u64,
    pub bytes: usize,
}

impl DevBuf {
    pub fn at(&self, offset: usize) -> u64 {
        debug_assert!(offset <= self.bytes);
        self.ptr + offset as u64
    }
}

/// A re-tiled weight matrix on the device.
pub struct DevMat {
    pub format: GpuFormat,
    pub rows: usize,
    pub cols: usize,
    pub codes: DevBuf,
    pub scales: DevBuf,
}

impl DevMat {
    pub fn bytes(&self) -> usize {
        self.codes.bytes + self.scales.bytes
    }
}

/// A kernel argument.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    Ptr(u64),
    I32(i32),
    F32(f32),
    U64(u64),
}

/// The context, the main stream and the compiled kernels.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    _module: Arc<CudaModule>,
    funcs: HashMap<&'static str, CudaFunction>,
    pub info: DeviceInfo,
    /// Seconds NVRTC took (0 when the PTX came from the cache).
    pub compile_secs: f64,
    pub from_cache: bool,
}

impl Gpu {
    /// Opens GPU 0 and compiles the kernels for `dims`.
    pub fn new(dims: &Dims) -> Result<Gpu> {
        let ctx = open_context()?;
        let info = device_info(&ctx)?;
        let t = std::time::Instant::now();
        let (ptx, from_cache) = compile::nvrtc_compile(&info.arch(), &dims.defines())?;
        let compile_secs = t.elapsed().as_secs_f64();
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
            .ctx(|| "loading the kernels' PTX".into())?;
        let mut funcs = HashMap::new();
        for k in compile::KERNELS {
            funcs.insert(
                k,
                module
                    .load_function(k)
                    .ctx(|| format!("finding kernel {k}"))?,
            );
        }
        let stream = ctx.new_stream().ctx(|| "creating a stream".into())?;
        Ok(Gpu {
            ctx,
            stream,
            _module: module,
            funcs,
            info,
            compile_secs,
            from_cache,
        })
    }

    pub fn free_bytes(&self) -> Result<usize> {
        Ok(self.ctx.mem_get_info().ctx(|| "memory info".into())?.0)
    }

    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.ctx.new_stream().ctx(|| "creating a stream".into())
    }

    /// A zeroed allocation of `bytes` (at least 1).
    pub fn alloc(&self, bytes: usize, what: &str) -> Result<DevBuf> {
        let mem =
            self.stream
                .alloc_zeros::<u8>(bytes.max(1))
                .map_err(|e| match self.free_bytes() {
                    Ok(free) => CudaError::OutOfMemory {
                        what: what.into(),
                        need_mib: (bytes as u64).div_ceil(1 << 20),
                        free_mib: free as u64 >> 20,
                        breakdown: e.to_string(),
                    },
                    Err(_) => CudaError::Driver {
                        what: format!("allocating {bytes} bytes for {what}"),
                        source: e,
                    },
                })?;
        let ptr = mem.device_ptr(&self.stream).0;
        Ok(DevBuf {
            _mem: mem,
            ptr,
            bytes,
        })
    }

    pub fn upload<T: Copy>(&self, data: &[T], what: &str) -> Result<DevBuf> {
        let bytes = std::mem::size_of_val(data);
        let buf = self.alloc(bytes, what)?;
        self.write(&self.stream, buf.ptr, data)?;
        Ok(buf)
    }

    /// Host → device copy on `stream` (the host data is staged before this returns).
    pub fn write<T: Copy>(&self, stream: &CudaStream, dst: u64, data: &[T]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: `dst` is an allocation of this context at least `size_of_val(data)` long
        // (callers pass offsets inside their own buffers); pageable source memory is copied
        // before the call returns.
        unsafe { result::memcpy_htod_async(dst, data, stream.cu_stream()) }
            .ctx(|| "host to device copy".into())
    }

    /// Device → host copy on `stream`, synchronising it.
    pub fn read<T: Copy>(&self, stream: &CudaStream, src: u64, out: &mut [T]) -> Result<()> {
        // SAFETY: `src` holds at least `size_of_val(out)` bytes; the stream is synchronised
        // before `out` is used.
        unsafe { result::memcpy_dtoh_async(out, src, stream.cu_stream()) }
            .ctx(|| "device to host copy".into())?;
        stream.synchronize().ctx(|| "synchronising".into())
    }

    pub fn upload_packed(&self, p: &Packed, name: &str) -> Result<DevMat> {
        Ok(DevMat {
            format: p.format,
            rows: p.rows,
            cols: p.cols,
            codes: self.upload(&p.codes, name)?,
            scales: self.upload(&p.scales, name)?,
        })
    }

    /// Launches `name` with raw arguments.
    pub fn launch(
        &self,
        stream: &CudaStream,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        args: &[Arg],
    ) -> Result<()> {
        let f = self
            .funcs
            .get(name)
            .unwrap_or_else(|| panic!("kernel {name} is not in compile::KERNELS"));
        let mut vals: Vec<[u8; 8]> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) | Arg::U64(p) => p.to_ne_bytes(),
                Arg::I32(v) => {
                    let mut b = [0u8; 8];
                    b[..4].copy_from_slice(&v.to_ne_bytes());
                    b
                }
                Arg::F32(v) => {
                    let mut b = [0u8; 8];
                    b[..4].copy_from_slice(&v.to_ne_bytes());
                    b
                }
            })
            .collect();
        let mut params: Vec<*mut c_void> = vals
            .iter_mut()
            .map(|v| v.as_mut_ptr() as *mut c_void)
            .collect();
        // SAFETY: each parameter points at a value of the size and type of the kernel's
        // parameter at that position (the call sites mirror the kernel signatures in
        // kernels/*.cu); `vals` outlives the call, which copies the parameters.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                grid,
                block,
                0,
                stream.cu_stream(),
                &mut params,
            )
        }
        .ctx(|| format!("launching {name} grid {grid:?} block {block:?}"))
    }

    /// `ntok` rows of activations (`cols` wide, f32 at `x`) quantized to `xq`, `xs`.
    pub fn quantize(
        &self,
        stream: &CudaStream,
        x: u64,
        cols: usize,
        ntok: usize,
        xq: u64,
        xs: u64,
    ) -> Result<()> {
        self.launch(
            stream,
            "quant_plain",
            (cols.div_ceil(1024) as u32, ntok as u32, 1),
            (256, 1, 1),
            &[
                Arg::Ptr(x),
                Arg::I32(cols as i32),
                Arg::Ptr(xq),
                Arg::Ptr(xs),
            ],
        )
    }

    /// `out[t][r] (+)= W[r] · x[t]` for `ntok` tokens (several launches past 8 tokens).
    #[allow(clippy::too_many_arguments)]
    pub fn gemv(
        &self,
        stream: &CudaStream,
        m: &DevMat,
        xq: u64,
        xs: u64,
        ntok: usize,
        out: u64,
        out_stride: usize,
        accumulate: bool,
        argmax: Option<u64>,
    ) -> Result<()> {
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
                    Arg::Ptr(m.codes.ptr),
                    Arg::Ptr(m.scales.ptr),
                    Arg::I32(m.rows as i32),
                    Arg::I32(m.cols as i32),
                    Arg::Ptr(xq + (t0 * m.cols) as u64),
                    Arg::Ptr(xs + (8 * t0 * m.cols / X_GROUP) as u64),
                    Arg::I32(n as i32),
                    Arg::Ptr(out + (4 * t0 * out_stride) as u64),
                    Arg::I32(out_stride as i32),
                    Arg::I32(i32::from(accumulate)),
                    Arg::Ptr(argmax.map_or(0, |a| a + 8 * t0 as u64)),
                ],
            )?;
            t0 += n;
        }
        Ok(())
    }

    /// Median seconds per call of `f` over `iters` calls timed with events on `stream`.
    pub fn time(
        &self,
        stream: &CudaStream,
        iters: usize,
        mut f: impl FnMut() -> Result<()>,
    ) -> Result<f64> {
        let mut times = Vec::with_capacity(iters);
        for _ in 0..iters {
            let a = self
                .ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .ctx(|| "event".into())?;
            let b = self
                .ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .ctx(|| "event".into())?;
            a.record(stream).ctx(|| "event record".into())?;
            f()?;
            b.record(stream).ctx(|| "event record".into())?;
            b.synchronize().ctx(|| "event sync".into())?;
            times.push(a.elapsed_ms(&b).ctx(|| "elapsed".into())? as f64 / 1e3);
        }
        times.sort_by(|x, y| x.total_cmp(y));
        Ok(times[times.len() / 2])
    }

    /// Device-to-device copy bandwidth (bytes read + written per second) over `bytes`.
    pub fn copy_bandwidth(&self, bytes: usize) -> Result<f64> {
        let a = self.alloc(bytes, "bandwidth test")?;
        let b = self.alloc(bytes, "bandwidth test")?;
        let s = &self.stream;
        let secs = self.time(s, 10, || {
            // SAFETY: both buffers are `bytes` long.
            unsafe { result::memcpy_dtod_async(b.ptr, a.ptr, bytes, s.cu_stream()) }
                .ctx(|| "copy".into())
        })?;
        Ok(2.0 * bytes as f64 / secs)
    }
}
