//! The CUDA backend of niwaki: the qwen35 (Bonsai 27B) forward pass on an NVIDIA GPU.
//!
//! - [`available`] says whether a GPU can be used (never panics without one).
//! - [`CudaModel::load`] re-tiles and uploads a [`::model::Model`]'s weights and compiles the
//!   kernels for the device with NVRTC (cached on disk, see [`compile::cache_dir`]).
//! - [`CudaModel::new_state`] sizes a sequence's recurrent state and f16 KV cache for a context.
//! - [`CudaModel::forward`] has the contract of `model::Model::forward`;
//!   [`CudaModel::forward_greedy`] returns the argmax token computed on the GPU, and
//!   [`CudaModel::forward_top_k`] the best k candidates for sampling, selected there.
//!
//! The driver and NVRTC are loaded at run time, so the crate builds and its CPU-side logic
//! (re-tiling, memory sizing, launch plans, the kernel cache) is tested on machines without CUDA.
//! Activations are quantized to int8 per 64 values before each low-bit matrix product (dp4a);
//! the harness (`examples/harness.rs`) measures the resulting error against the CPU engine.

pub mod compile;
mod error;
pub mod gpu;
pub mod knobs;
mod model;
pub mod plan;
pub mod repack;
pub mod stage_scales;
pub mod timeline;
pub mod tma;
mod topk;
pub mod twin;

pub use error::{CudaError, Result};
pub use gpu::{available, DeviceInfo};
pub use model::{ChainMode, ChainTimes, ChainWaits, CudaCheckpoint, CudaModel, CudaState};
pub use plan::KvCache;
pub use topk::{Selected, TopkJob, TopkScratch};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn availability_is_an_answer_not_a_panic() {
        match available() {
            Ok(info) => assert!(!info.name.is_empty()),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
}
