use crate::repack::RepackError;

/// Everything the CUDA backend can refuse or fail at. Nothing here is a silent fallback: the
/// caller decides whether to run on the CPU instead.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("no CUDA driver: {0} (install the NVIDIA driver, or run on the CPU)")]
    NoDriver(String),
    #[error("no NVRTC library: {0} (NVRTC ships with the CUDA toolkit; set LD_LIBRARY_PATH to its lib64 folder)")]
    NoNvrtc(String),
    #[error("the CUDA driver reports no GPU")]
    NoDevice,
    #[error("CUDA {what}: {source}")]
    Driver {
        what: String,
        source: cudarc::driver::DriverError,
    },
    #[error("NVRTC could not compile the kernels for {arch}:\n{log}")]
    Compile { arch: String, log: String },
    #[error("the CUDA backend does not support this model: {0}")]
    Unsupported(String),
    #[error(transparent)]
    Repack(#[from] RepackError),
    #[error(
        "not enough GPU memory for {what}: need {need_mib} MiB ({breakdown}), {free_mib} MiB free"
    )]
    OutOfMemory {
        what: String,
        need_mib: u64,
        free_mib: u64,
        breakdown: String,
    },
    #[error(transparent)]
    Model(#[from] model::ModelError),
    #[error("sequence state was made for a context of {ctx} tokens; {have} + {adding} do not fit")]
    ContextFull {
        ctx: usize,
        have: usize,
        adding: usize,
    },
    #[error("context of {ctx} tokens exceeds the model's limit of {limit}")]
    ContextTooLong { ctx: usize, limit: usize },
    #[error("an internal limit of the CUDA backend was exceeded: {0} (a bug)")]
    Invariant(String),
    #[error("{name}={value}: {why}")]
    Setting {
        name: String,
        value: String,
        why: String,
    },
}

pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// Adds what was being done to a driver error.
pub(crate) trait Context<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> Context<T> for std::result::Result<T, cudarc::driver::DriverError> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| CudaError::Driver {
            what: what(),
            source,
        })
    }
}
