/// Everything that can go wrong building a tokenizer, tokenizing, or rendering a chat prompt.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("unsupported tokenizer model {0:?}: only \"gpt2\" (byte-level BPE) is supported")]
    UnsupportedModel(String),
    #[error("unsupported pre-tokenizer {0:?}: known ones are \"qwen35\", \"qwen2\" and \"gpt2\"")]
    UnsupportedPreTokenizer(String),
    #[error("the file has no tokenizer.ggml.pre, so the pre-tokenizer split is unknown")]
    MissingPreTokenizer,
    #[error("tokenizer metadata: {0}")]
    Metadata(String),
    #[error("invalid vocabulary: {0}")]
    InvalidVocab(String),
    #[error("invalid merge #{index} {merge:?}: {reason}")]
    InvalidMerge {
        index: usize,
        merge: String,
        reason: String,
    },
    #[error("token id {id} is out of range: the vocabulary has {vocab_size} tokens")]
    UnknownId { id: u32, vocab_size: usize },
    #[error("tokenization failed: {0}")]
    Encode(String),
    #[error("chat template error: {0}")]
    Template(String),
    /// The template called `raise_exception(message)`: the request does not fit the template.
    #[error("chat template rejected the conversation: {0}")]
    TemplateException(String),
}
