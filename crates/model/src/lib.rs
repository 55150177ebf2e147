//! The qwen35 model that Bonsai 27B uses: configuration from GGUF metadata, weights borrowed
//! from the file mapping, the CPU forward pass, and per-sequence state.

mod attention;
mod config;
mod disjoint;
mod error;
mod gdn;
pub mod hadamard;
mod input;
mod kv;
pub mod lineage;
mod model;
pub mod ops;
pub mod pool;
pub mod rank;
pub mod requant;
mod state;
pub mod synth;
pub mod weights;

pub use config::{Config, LayerKind, ARCH};
pub use error::{ModelError, Result};
pub use input::Kernels;
pub use kv::{KvCache, KvFormat};
pub use model::{Logits, Model};
pub use state::{Checkpoint, State};
