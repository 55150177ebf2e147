//! Generation on top of the model: sampling, stop conditions and streamed text.

mod error;
pub mod eval;
mod generate;
pub mod sampler;
mod stop;

pub use error::{EngineError, Result};
pub use generate::{
    generate, prefill, FinishReason, Flow, GenerateParams, Generation, DEFAULT_PREFILL_CHUNK,
};
pub use sampler::{Sampler, SamplerConfig};
pub use stop::{Scan, StopMatcher};
