#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    #[error(
        "architecture {found:?} is not supported: niwaki runs qwen35 (Bonsai 27B) models{}",
        architecture_hint(found)
    )]
    WrongArchitecture { found: String },
    #[error("hyperparameter {key}: {reason}")]
    BadConfig { key: String, reason: String },
    #[error("tensor {0:?} is required by the qwen35 architecture but missing from the file")]
    MissingTensor(String),
    #[error("tensor {name:?} has shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        name: String,
        found: Vec<u64>,
        expected: Vec<u64>,
    },
    #[error("tensor {name:?}: {source}")]
    Decode {
        name: String,
        source: quant::QuantError,
    },
    #[error("tensor {name:?} holds a non-finite value at index {index}")]
    NonFinite { name: String, index: usize },
    #[error("Hadamard metadata: {0}")]
    BadHadamard(String),
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("empty input: at least one token is needed")]
    EmptyInput,
    #[error("context full: {have} tokens in the sequence plus {adding} new exceed the context limit of {limit}")]
    ContextFull {
        have: usize,
        adding: usize,
        limit: usize,
    },
    #[error("sequence state belongs to a different model shape")]
    StateMismatch,
    #[error("cannot rewind a sequence state of {have} tokens to {to}")]
    RewindPastEnd { to: usize, have: usize },
    #[error(
        "the checkpoint was saved from another sequence (or from this one before it was cloned)"
    )]
    CheckpointOfOtherSequence,
    #[error(
        "the checkpoint at {pos} no longer holds: the sequence went back to {low} after it was \
         saved, and its cache from there holds other tokens"
    )]
    CheckpointOverwritten { pos: usize, low: usize },
}

impl ModelError {
    /// Why a checkpoint at `pos` was refused, as an error.
    pub fn stale_checkpoint(why: crate::lineage::Stale, pos: usize) -> ModelError {
        match why {
            crate::lineage::Stale::OtherSequence => ModelError::CheckpointOfOtherSequence,
            crate::lineage::Stale::Overwritten { low } => {
                ModelError::CheckpointOverwritten { pos, low }
            }
        }
    }
}

pub type Result<T> = std::result::Result<T, ModelError>;

/// What a file of a known but unrunnable architecture is, for the error that refuses it.
fn architecture_hint(found: &str) -> &'static str {
    match found {
        "dspark" => {
            "; this is a DSpark drafter (a speculative-decoding head that reads a Bonsai \
             model's hidden states, not a model of its own), which niwaki does not draft with \
             yet: load the Bonsai model it belongs to"
        }
        _ => "",
    }
}
