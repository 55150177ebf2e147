#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] model::ModelError),
    #[error(transparent)]
    Tokenizer(#[from] tokenizer::TokenizerError),
    #[error(transparent)]
    Sampler(#[from] crate::sampler::SamplerError),
    #[error("device backend: {0}")]
    Backend(String),
    #[error("the prompt is empty: at least one token is needed")]
    EmptyPrompt,
    /// A [`crate::Hooks::mask`] could not continue (e.g. a grammar rejected the text so far).
    #[error("constrained decoding: {0}")]
    Constraint(String),
    /// [`crate::generate_after`] asked to skip what it cannot.
    #[error(
        "{cached} of a {prompt}-token prompt said to be in a state of {held}: the state must \
         hold them and at least one token must be left to feed"
    )]
    CachedPrompt {
        cached: usize,
        prompt: usize,
        held: usize,
    },
    #[error("the prompt has {prompt} tokens but the context holds {context}")]
    PromptTooLong { prompt: usize, context: usize },
}

pub type Result<T> = std::result::Result<T, EngineError>;
