/// Everything the tokenizer needs, as found in GGUF `tokenizer.ggml.*` metadata.
#[derive(Debug, Clone, Default)]
pub struct TokenizerSpec {
    /// `tokenizer.ggml.model`: "gpt2" for byte-level BPE.
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer split, e.g. "qwen35".
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, indexed by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type` (see [`TokenType`]); may be empty (then every token is normal).
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`, "left right" in priority order.
    pub merges: Vec<String>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub eot_id: Option<u32>,
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: bool,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    /// Ordinary BPE token: byte-level unicode text.
    Normal,
    Unknown,
    /// Special token such as `<|im_start|>`: recognised in text only when parsing special tokens.
    Control,
    /// Added token such as `<think>`: always recognised in text.
    UserDefined,
    /// Padding row of the embedding matrix: never produced, decodes to nothing.
    Unused,
    /// `<0xNN>` byte token.
    Byte,
}

impl TokenType {
    /// The type for a GGUF `token_type` value; unknown values count as normal tokens.
    pub fn from_gguf(v: i32) -> TokenType {
        match v {
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Normal,
        }
    }
}
