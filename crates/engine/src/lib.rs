//! Generation on top of the model: sampling, stop conditions and streamed text.

pub mod backend;
mod bands;
mod error;
pub mod eval;
mod generate;
pub mod logprobs;
pub mod lookup;
mod ranking;
pub mod sampler;
mod stop;

pub use backend::{Backend, Ranked};
pub use error::{EngineError, Result};
pub use generate::{
    generate, generate_after, generate_with, prefill, prefill_and_save, DraftStats, FinishReason,
    Flow, GenerateParams, Generation, Hooks, OnText, DEFAULT_PREFILL_CHUNK,
};
pub use lookup::LookupConfig;
pub use ranking::{Drawn, RankedRequest, RANKED_CANDIDATES};
pub use sampler::{Sampler, SamplerConfig};
pub use stop::{Scan, StopMatcher};
