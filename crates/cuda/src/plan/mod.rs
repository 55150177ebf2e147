//! The CPU side of the backend: shape checks, memory sizing and the list of kernel launches for
//! a forward call. Nothing here touches the GPU, so all of it is tested without one.

mod attention;
mod attention_prefill;
mod dims;
mod embed;
mod gemm;
mod gemv;
mod memory;
mod ops;
mod rotation;
#[cfg(test)]
pub(crate) mod tests;
mod topk;

pub use attention::*;
pub use attention_prefill::*;
pub use dims::*;
pub use embed::*;
pub use gemm::*;
pub use gemv::*;
pub use memory::*;
pub use ops::*;
pub use rotation::*;
pub use topk::*;

use model::{Config, LayerKind};

use crate::error::{CudaError, Result};
use crate::repack::{GpuFormat, X_GROUP};

/// Tokens one GPU pass of a prefill handles (scratch buffers are sized for it): four of the
/// GEMM's token tiles, so that a 5120-row matrix still gives 80 blocks.
pub const MAX_CHUNK: usize = 256;
