//! Kernel launches: raw arguments, programmatic dependent launch (or plain stream order), the
//! occupancy and resources of a kernel, and timing with events.

use std::ffi::c_void;

use cudarc::driver::{sys, CudaFunction, CudaStream};

use super::Gpu;
use crate::error::{Context, CudaError, Result};
use crate::tma::TensorMap;

/// A quantizing kernel's name and arguments: `name` and `args`, or where its codes' plane words
/// go too (`xp`), its `_p` twin's, which takes their address after `args` (kernels/quant.cu,
/// `quant128`).
pub fn planes_twin(name: &str, args: &[Arg], xp: Option<u64>) -> (String, Vec<Arg>) {
    match xp {
        None => (name.to_string(), args.to_vec()),
        Some(xp) => (format!("{name}_p"), [args, &[Arg::Ptr(xp)]].concat()),
    }
}

/// A kernel argument.
#[derive(Clone, Debug)]
pub enum Arg {
    Ptr(u64),
    I32(i32),
    F32(f32),
    U64(u64),
    /// A tensor map, passed by value (`const __grid_constant__` in the kernel); boxed, as its
    /// 128 bytes and 128-byte alignment would make every argument that large.
    Map(Box<TensorMap>),
}

thread_local! {
    static SERIAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with this thread's launches plainly stream-ordered (no programmatic dependent
/// launch). Prefill passes use it: there, dependents resident early beside long kernels
/// (the 64-token recurrent step) measured 17% slower pp512, while one-token passes gain.
pub fn serial_launches<T>(f: impl FnOnce() -> T) -> T {
    let before = SERIAL.with(|c| c.replace(true));
    let out = f();
    SERIAL.with(|c| c.set(before));
    out
}

/// Blocks of `f` (kernel `name`, `threads` threads, `smem` bytes of dynamic shared memory) one
/// multiprocessor holds at once.
pub(super) fn occupancy(
    f: &CudaFunction,
    name: &str,
    threads: usize,
    smem: usize,
) -> Result<usize> {
    let mut n: std::ffi::c_int = 0;
    // SAFETY: a function handle of this context; n outlives the call.
    unsafe {
        sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
            &mut n,
            f.cu_function(),
            threads as i32,
            smem,
        )
    }
    .result()
    .ctx(|| format!("occupancy of {name}"))?;
    Ok(n.max(0) as usize)
}

impl Gpu {
    /// Whether launches made now carry programmatic dependent launch: [`Gpu::pdl`] on, and
    /// not inside [`serial_launches`].
    pub(super) fn launches_with_pdl(&self) -> bool {
        self.pdl() && !SERIAL.with(|c| c.get())
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
        self.launch_smem(stream, name, grid, block, 0, args)
    }

    /// Kernel `name`'s registers a thread, local (spilled) bytes a thread, and the blocks of
    /// `block` threads with `smem` bytes of dynamic shared memory a multiprocessor holds (the
    /// driver's occupancy query): for the harness's reports. `None` for a kernel not loaded.
    #[doc(hidden)]
    pub fn kernel_resources(&self, name: &str, block: u32, smem: usize) -> Option<(i32, i32, u32)> {
        let f = self.funcs.get(name)?;
        Some((
            f.num_regs().ok()?,
            f.local_size_bytes().ok()?,
            f.occupancy_max_active_blocks_per_multiprocessor(block, smem, None)
                .ok()?,
        ))
    }

    /// Launches `name` with `smem` bytes of dynamic shared memory.
    pub fn launch_smem(
        &self,
        stream: &CudaStream,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
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
                Arg::Map(_) => [0u8; 8],
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
        // A tensor map is read in place from `args`, which outlive the call (the driver copies
        // its 128 bytes).
        let mut params: Vec<*mut c_void> = args
            .iter()
            .zip(vals.iter_mut())
            .map(|(a, v)| match a {
                Arg::Map(m) => &m.0 as *const sys::CUtensorMap as *mut c_void,
                _ => v.as_mut_ptr() as *mut c_void,
            })
            .collect();
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: sys::CUlaunchAttributeValue {
                programmaticStreamSerializationAllowed: 1,
            },
        };
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block.0,
            blockDimY: block.1,
            blockDimZ: block.2,
            sharedMemBytes: smem,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(self.launches_with_pdl()),
        };
        // SAFETY: each parameter points at a value of the size and type of the kernel's
        // parameter at that position (the call sites mirror the kernel signatures in
        // kernels/*.cu); `vals`, `attr` and `config` outlive the call, which copies them. Every
        // kernel starts with `griddepcontrol.wait` before touching its predecessors' buffers,
        // which is what the programmatic-serialization attribute requires.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .ctx(|| format!("launching {name} grid {grid:?} block {block:?} smem {smem}"))
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

    /// Blocks of `kernel` (of `threads` threads and `smem` bytes of dynamic shared memory) one
    /// multiprocessor holds at once.
    pub fn blocks_per_sm(&self, kernel: &str, threads: usize, smem: usize) -> Result<usize> {
        let f = self
            .funcs
            .get(kernel)
            .ok_or_else(|| CudaError::Unsupported(format!("no kernel named {kernel}")))?;
        occupancy(f, kernel, threads, smem)
    }
}
