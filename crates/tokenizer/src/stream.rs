//! Incremental decoding for streaming output.

use crate::bpe::Tokenizer;
use crate::error::TokenizerError;

/// Decodes ids one at a time. A character split across tokens (CJK, emoji) is held back until
/// its last byte arrives, so every piece returned is whole text and the pieces concatenate to
/// `decode` of all ids.
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    pub(crate) fn new(tokenizer: &'a Tokenizer) -> Self {
        StreamDecoder {
            tokenizer,
            pending: Vec::new(),
        }
    }

    /// Adds one token and returns the text it completes (possibly empty). Bytes that can never
    /// become valid UTF-8 are returned as U+FFFD, as `decode` does.
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        self.pending
            .extend_from_slice(self.tokenizer.token_bytes(id)?);
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = start + e.valid_up_to();
                    // The prefix up to `valid` was just checked.
                    out.push_str(&String::from_utf8_lossy(&self.pending[start..valid]));
                    match e.error_len() {
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            start = valid;
                            break;
                        }
                        Some(n) => {
                            out.push('\u{FFFD}');
                            start = valid + n;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        Ok(out)
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending_bytes(&self) -> usize {
        self.pending.len()
    }

    /// Returns whatever is held back (an unfinished character becomes U+FFFD) and resets.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}
