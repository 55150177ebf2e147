//! Which GPU is there: the driver's context on GPU 0 and what it reports about the device.

use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};

use crate::error::{Context, CudaError, Result};

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
    /// The NVRTC target, e.g. `sm_90a`: an sm_90 device gets its architecture-specific
    /// features (warpgroup MMA), which the PTX then needs.
    pub fn arch(&self) -> String {
        let (major, minor) = self.compute_capability;
        format!("sm_{major}{minor}{}", if self.wgmma() { "a" } else { "" })
    }

    /// Whether the device runs warpgroup MMA (sm_90: the f16 GEMM).
    pub fn wgmma(&self) -> bool {
        self.compute_capability == (9, 0)
    }

    /// Whether the device is sm_90 or later, where the decode paths built on the copy engine,
    /// programmatic launches and clusters run (and every switch of those paths may be on).
    pub fn sm90(&self) -> bool {
        self.compute_capability.0 >= 9
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

pub(super) fn open_context() -> Result<Arc<CudaContext>> {
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

pub(super) fn device_info(ctx: &CudaContext) -> Result<DeviceInfo> {
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

#[cfg(test)]
mod tests {
    use super::DeviceInfo;

    fn device(compute_capability: (i32, i32)) -> DeviceInfo {
        DeviceInfo {
            name: "test".into(),
            compute_capability,
            multiprocessors: 1,
            total_bytes: 0,
            free_bytes: 0,
            driver_version: 13000,
        }
    }

    #[test]
    fn the_architecture_names_its_target_and_its_paths() {
        let cases = [
            ((8, 0), "sm_80", false),
            ((8, 9), "sm_89", false),
            ((9, 0), "sm_90a", true),
            ((10, 0), "sm_100", true),
            ((12, 0), "sm_120", true),
        ];
        for (cc, arch, sm90) in cases {
            let d = device(cc);
            assert_eq!((d.arch().as_str(), d.sm90()), (arch, sm90), "{cc:?}");
        }
    }
}
