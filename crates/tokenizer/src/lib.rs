//! Text ↔ token ids for the Qwen3.5 vocabulary, and the chat template that turns a conversation
//! into a prompt.
//!
//! * [`Tokenizer`] is byte-level BPE built from GGUF `tokenizer.ggml.*` metadata
//!   ([`TokenizerSpec`], read by [`spec_from_metadata`]) on top of the `tokenizers` crate: Unicode NFC, the `qwen35` split regex,
//!   GPT-2 byte-to-unicode mapping, rank-ordered merges. It matches Qwen's tiktoken reference.
//! * [`StreamDecoder`] turns ids into text one at a time and only ever yields whole characters.
//! * [`ChatTemplate`] renders a [`ChatRequest`] with minijinja configured to behave like
//!   Hugging Face's `apply_chat_template` (jinja2 with `trim_blocks`/`lstrip_blocks`, Python
//!   string methods, `tojson` as `json.dumps`, `raise_exception`, `strftime_now`).

mod bpe;
mod chat;
mod error;
mod gguf_meta;
mod pyfmt;
mod spec;
mod stream;

pub use bpe::Tokenizer;
pub use chat::{ChatRequest, ChatTemplate};
pub use error::TokenizerError;
pub use gguf_meta::spec_from_metadata;
pub use spec::{TokenType, TokenizerSpec};
pub use stream::StreamDecoder;

#[cfg(test)]
mod tests {
    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn tokenizer_and_template_can_be_shared_across_threads() {
        assert_send_sync::<crate::Tokenizer>();
        assert_send_sync::<crate::ChatTemplate>();
    }
}
