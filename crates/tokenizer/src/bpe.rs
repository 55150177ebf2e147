//! The tokenizer: byte-level BPE over the `tokenizers` crate, plus a byte table for decoding.

use std::collections::HashMap;

use aho_corasick::{AhoCorasick, MatchKind};

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, Model, NormalizedString, OffsetType, PreTokenizedString, PreTokenizer,
    PreTokenizerWrapper, SplitDelimiterBehavior,
};

use unicode_normalization::{is_nfc_quick, IsNormalized, UnicodeNormalization};

use crate::error::TokenizerError;
use crate::spec::{TokenType, TokenizerSpec};
use crate::stream::StreamDecoder;

/// Qwen3.5/3.6 (`tokenizer.ggml.pre = "qwen35"`): Qwen2's split with combining marks (`\p{M}`)
/// kept inside words.
const QWEN35_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2/2.5/3 (`"qwen2"`).
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-2 (`"gpt2"`, llama.cpp's default).
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Split pattern and whether the pre-tokenizer family NFC-normalises its input.
fn pre_tokenizer_config(pre: &str) -> Result<(&'static str, bool), TokenizerError> {
    match pre {
        "qwen35" | "qwen3.5" | "qwen3_5" => Ok((QWEN35_PATTERN, true)),
        "qwen2" => Ok((QWEN2_PATTERN, true)),
        "gpt2" | "default" => Ok((GPT2_PATTERN, false)),
        other => Err(TokenizerError::UnsupportedPreTokenizer(other.to_owned())),
    }
}

/// GPT-2's reversible mapping of the 256 byte values onto printable characters.
fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if printable {
            u32::from(b)
        } else {
            let c = next;
            next += 1;
            c
        };
        // Every value here is below 0x144, a valid scalar value.
        table[usize::from(b)] = char::from_u32(c).unwrap_or('\u{FFFD}');
    }
    table
}

/// Byte-level BPE tokenizer for one vocabulary.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// NFC-normalise input (Qwen); done on the whole text before added tokens are matched, as
    /// the reference does.
    nfc: bool,
    tokens: Vec<String>,
    types: Vec<TokenType>,
    /// Decoded bytes of token `i` are `bytes[offsets[i]..offsets[i + 1]]`.
    bytes: Vec<u8>,
    offsets: Vec<u32>,
    /// User-defined tokens (recognised in text even when not parsing special tokens): a
    /// leftmost-longest matcher over their strings and the id of each pattern.
    always_split: Option<AhoCorasick>,
    always_split_ids: Vec<u32>,
    end_of_generation: Vec<u32>,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    pad_id: Option<u32>,
    add_bos: bool,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.tokens.len())
            .field("bos_id", &self.bos_id)
            .field("eos_id", &self.eos_id)
            .field("end_of_generation", &self.end_of_generation)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from GGUF-style metadata.
    pub fn new(spec: &TokenizerSpec) -> Result<Self, TokenizerError> {
        if spec.model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(spec.model.clone()));
        }
        let pre = spec
            .pre
            .as_deref()
            .ok_or(TokenizerError::MissingPreTokenizer)?;
        let (pattern, nfc) = pre_tokenizer_config(pre)?;
        let n = spec.tokens.len();
        if n == 0 {
            return Err(TokenizerError::InvalidVocab(
                "the token list is empty".into(),
            ));
        }
        if u32::try_from(n).is_err() {
            return Err(TokenizerError::InvalidVocab(format!(
                "{n} tokens do not fit u32 ids"
            )));
        }
        if !spec.token_types.is_empty() && spec.token_types.len() != n {
            return Err(TokenizerError::InvalidVocab(format!(
                "{} token types for {n} tokens",
                spec.token_types.len()
            )));
        }
        let types: Vec<TokenType> = if spec.token_types.is_empty() {
            vec![TokenType::Normal; n]
        } else {
            spec.token_types
                .iter()
                .map(|&t| TokenType::from_gguf(t))
                .collect()
        };
        for (name, id) in [
            ("bos", spec.bos_id),
            ("eos", spec.eos_id),
            ("eot", spec.eot_id),
            ("padding", spec.pad_id),
        ] {
            if let Some(id) = id.filter(|&id| id as usize >= n) {
                return Err(TokenizerError::InvalidVocab(format!(
                    "{name} token id {id} is out of range ({n} tokens)"
                )));
            }
        }

        // The model vocabulary holds every token (first occurrence wins for duplicate strings), so
        // that added tokens find their GGUF ids in it.
        let mut vocab = Vocab::default();
        for (id, tok) in spec.tokens.iter().enumerate() {
            vocab.entry(tok.clone()).or_insert(id as u32);
        }
        let mut merges = Vec::with_capacity(spec.merges.len());
        for (index, m) in spec.merges.iter().enumerate() {
            let bad = |reason: &str| TokenizerError::InvalidMerge {
                index,
                merge: m.clone(),
                reason: reason.to_owned(),
            };
            let (a, b) = m.split_once(' ').ok_or_else(|| bad("no space separator"))?;
            if !vocab.contains_key(a) || !vocab.contains_key(b) {
                return Err(bad("a part is not in the vocabulary"));
            }
            if !vocab.contains_key(&format!("{a}{b}")) {
                return Err(bad("the merged token is not in the vocabulary"));
            }
            merges.push((a.to_owned(), b.to_owned()));
        }
        let model = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(false)
            .build()
            .map_err(|e| TokenizerError::InvalidVocab(e.to_string()))?;

        let split = Split::new(
            SplitPattern::Regex(pattern.to_owned()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| TokenizerError::InvalidVocab(format!("pre-tokenizer pattern: {e}")))?;
        let pre_tokenizer = Sequence::new(vec![
            PreTokenizerWrapper::Split(split),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)),
        ]);
        let mut inner = tokenizers::Tokenizer::new(model);
        inner.with_pre_tokenizer(Some(pre_tokenizer));

        let mut added = Vec::new();
        let mut always_split_strs = Vec::new();
        let mut always_split_ids = Vec::new();
        for (id, (tok, ty)) in spec.tokens.iter().zip(&types).enumerate() {
            let special = match ty {
                TokenType::Control => true,
                TokenType::UserDefined => false,
                _ => continue,
            };
            if tok.is_empty() {
                return Err(TokenizerError::InvalidVocab(format!("token {id} is empty")));
            }
            if vocab_id(&inner, tok) != Some(id as u32) {
                return Err(TokenizerError::InvalidVocab(format!(
                    "added token {tok:?} (id {id}) also appears with another id"
                )));
            }
            added.push(AddedToken::from(tok.clone(), special).normalized(false));
            if !special {
                always_split_strs.push(tok.clone());
                always_split_ids.push(id as u32);
            }
        }
        // Control tokens are added as special, user-defined ones as plain added tokens; both are
        // matched before pre-tokenization when parsing special tokens.
        inner.add_tokens(&added);
        let always_split = if always_split_strs.is_empty() {
            None
        } else {
            let ac = AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(&always_split_strs)
                .map_err(|e| TokenizerError::InvalidVocab(format!("added tokens: {e}")))?;
            Some(ac)
        };

        let (bytes, offsets) = decode_table(&spec.tokens, &types)?;

        let mut end_of_generation = Vec::new();
        let named = ["<|im_end|>", "<|endoftext|>"]
            .iter()
            .filter_map(|s| vocab_id(&inner, s));
        for id in [spec.eos_id, spec.eot_id]
            .into_iter()
            .flatten()
            .chain(named)
        {
            if !end_of_generation.contains(&id) {
                end_of_generation.push(id);
            }
        }

        Ok(Tokenizer {
            inner,
            nfc,
            tokens: spec.tokens.clone(),
            types,
            bytes,
            offsets,
            always_split,
            always_split_ids,
            end_of_generation,
            bos_id: spec.bos_id,
            eos_id: spec.eos_id,
            pad_id: spec.pad_id,
            add_bos: spec.add_bos,
            chat_template: spec.chat_template.clone(),
        })
    }

    /// Token ids for `text`. With `parse_special`, control tokens written in the text (such as
    /// `<|im_start|>`) become their ids; without it they are tokenized as ordinary text.
    /// User-defined added tokens (`<think>`, `<tool_call>`, ...) are always recognised. Qwen
    /// vocabularies NFC-normalise the whole text first, as Qwen's reference tokenizers do (llama.cpp
    /// does not normalise). No BOS is added here; see [`Tokenizer::add_bos`].
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let normalized: String;
        let text = if self.nfc && is_nfc_quick(text.chars()) != IsNormalized::Yes {
            normalized = text.nfc().collect();
            normalized.as_str()
        } else {
            text
        };
        if parse_special {
            let enc = self
                .inner
                .encode_fast(text, false)
                .map_err(|e| TokenizerError::Encode(e.to_string()))?;
            return Ok(enc.get_ids().to_vec());
        }
        let mut ids = Vec::new();
        let mut pos = 0;
        if let Some(ac) = &self.always_split {
            for m in ac.find_iter(text) {
                self.encode_plain(&text[pos..m.start()], &mut ids)?;
                ids.push(self.always_split_ids[m.pattern().as_usize()]);
                pos = m.end();
            }
        }
        self.encode_plain(&text[pos..], &mut ids)?;
        Ok(ids)
    }

    /// How many of `ids` — `text` encoded with special tokens parsed, after any BOS — encode
    /// its first part `head`, without encoding `head`: where the rest of `text` opens with a
    /// special or added token, the text is split there before the BPE, so `ids` are `head`'s
    /// tokens followed by the rest's. None where `text` does not start with `head`, the rest
    /// opens otherwise (its tokens could merge across the cut), or `ids` do not end with the
    /// rest's tokens.
    pub fn head_len(&self, text: &str, head: &str, ids: &[u32]) -> Option<usize> {
        let rest = text.strip_prefix(head)?;
        let rest_ids = self.encode(rest, true).ok()?;
        let first = *rest_ids.first()?;
        let opens = matches!(
            self.token_type(first),
            Some(TokenType::Control | TokenType::UserDefined)
        ) && rest.starts_with(self.id_to_token(first)?);
        (opens && ids.len() > rest_ids.len() && ids.ends_with(&rest_ids))
            .then(|| ids.len() - rest_ids.len())
    }

    /// Pre-tokenizer and BPE model on (normalised) text with no added tokens recognised.
    fn encode_plain(&self, text: &str, ids: &mut Vec<u32>) -> Result<(), TokenizerError> {
        if text.is_empty() {
            return Ok(());
        }
        let err = |e: tokenizers::Error| TokenizerError::Encode(e.to_string());
        let mut pre = PreTokenizedString::from(NormalizedString::from(text));
        if let Some(pt) = self.inner.get_pre_tokenizer() {
            pt.pre_tokenize(&mut pre).map_err(err)?;
        }
        let model = self.inner.get_model();
        pre.tokenize(|s| model.tokenize(s.get())).map_err(err)?;
        let enc = pre.into_encoding(None, 0, OffsetType::None).map_err(err)?;
        ids.extend_from_slice(enc.get_ids());
        Ok(())
    }

    /// Text for `ids` (invalid UTF-8 from partial characters becomes U+FFFD). Control and
    /// user-defined tokens decode to their text, unused padding tokens to nothing.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(self.token_bytes(id)?);
        }
        Ok(match String::from_utf8(out) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// The raw bytes token `id` stands for.
    pub fn token_bytes(&self, id: u32) -> Result<&[u8], TokenizerError> {
        let i = id as usize;
        if i >= self.tokens.len() {
            return Err(TokenizerError::UnknownId {
                id,
                vocab_size: self.tokens.len(),
            });
        }
        Ok(&self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize])
    }

    /// Number of tokens (rows of the embedding matrix the file describes).
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    pub fn token_to_id(&self, s: &str) -> Option<u32> {
        vocab_id(&self.inner, s)
    }

    /// The token's string as stored in the file (byte-level unicode for normal tokens).
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// Ids that end a generation: eos, eot, and `<|im_end|>`/`<|endoftext|>` when present.
    pub fn end_of_generation_ids(&self) -> &[u32] {
        &self.end_of_generation
    }

    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.end_of_generation.contains(&id)
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.pad_id
    }

    /// Whether prompts should start with the BOS token (`tokenizer.ggml.add_bos_token`).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// The file's chat template, if it has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// An incremental decoder that yields only complete characters.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }
}

fn vocab_id(inner: &tokenizers::Tokenizer, s: &str) -> Option<u32> {
    inner.token_to_id(s)
}

/// Concatenated decoded bytes of every token and their offsets.
fn decode_table(
    tokens: &[String],
    types: &[TokenType],
) -> Result<(Vec<u8>, Vec<u32>), TokenizerError> {
    let mut char_to_byte = HashMap::with_capacity(256);
    for (b, c) in byte_to_char().into_iter().enumerate() {
        char_to_byte.insert(c, b as u8);
    }
    let mut bytes = Vec::with_capacity(tokens.iter().map(String::len).sum());
    let mut offsets = Vec::with_capacity(tokens.len() + 1);
    offsets.push(0u32);
    for (tok, ty) in tokens.iter().zip(types) {
        match ty {
            TokenType::Control | TokenType::UserDefined | TokenType::Unknown => {
                bytes.extend_from_slice(tok.as_bytes())
            }
            TokenType::Unused => {}
            TokenType::Byte => match parse_byte_token(tok) {
                Some(b) => bytes.push(b),
                None => bytes.extend_from_slice(tok.as_bytes()),
            },
            TokenType::Normal => {
                for c in tok.chars() {
                    match char_to_byte.get(&c) {
                        Some(&b) => bytes.push(b),
                        None => {
                            let mut buf = [0u8; 4];
                            bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                        }
                    }
                }
            }
        }
        let end = u32::try_from(bytes.len()).map_err(|_| {
            TokenizerError::InvalidVocab("token strings exceed 4 GiB in total".into())
        })?;
        offsets.push(end);
    }
    Ok((bytes, offsets))
}

/// `<0xNN>` → the byte NN.
fn parse_byte_token(tok: &str) -> Option<u8> {
    let hex = tok.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> TokenizerSpec {
        // Byte-level strings: 'Ġ' is the space byte.
        let tokens = [
            "a",
            "b",
            "Ġ",
            "ab",
            "Ġab",
            "<|im_end|>",
            "<think>",
            "[PAD7]",
        ];
        TokenizerSpec {
            model: "gpt2".into(),
            pre: Some("qwen35".into()),
            tokens: tokens.iter().map(|s| s.to_string()).collect(),
            token_types: vec![1, 1, 1, 1, 1, 3, 4, 5],
            merges: vec!["a b".into(), "Ġ ab".into()],
            eos_id: Some(5),
            ..TokenizerSpec::default()
        }
    }

    #[test]
    fn byte_to_char_is_gpt2_mapping() {
        let t = byte_to_char();
        assert_eq!(t[usize::from(b' ')], 'Ġ');
        assert_eq!(t[usize::from(b'\n')], 'Ċ');
        assert_eq!(t[usize::from(b'A')], 'A');
        assert_eq!(t[0xAD], 'Ń');
    }

    #[test]
    fn merges_apply_in_rank_order() {
        let tok = Tokenizer::new(&tiny()).unwrap();
        assert_eq!(tok.encode("ab ab", false).unwrap(), vec![3, 4]);
    }

    #[test]
    fn control_tokens_need_parse_special_but_user_defined_do_not() {
        let tok = Tokenizer::new(&tiny()).unwrap();
        assert_eq!(tok.encode("ab<think>", false).unwrap(), vec![3, 6]);
        assert_eq!(tok.encode("ab<|im_end|>", true).unwrap(), vec![3, 5]);
        assert_ne!(tok.encode("ab<|im_end|>", false).unwrap(), vec![3, 5]);
    }

    #[test]
    fn unused_tokens_decode_to_nothing_and_unknown_ids_are_errors() {
        let tok = Tokenizer::new(&tiny()).unwrap();
        assert_eq!(tok.decode(&[3, 7, 5]).unwrap(), "ab<|im_end|>");
        assert!(matches!(
            tok.decode(&[8]),
            Err(TokenizerError::UnknownId {
                id: 8,
                vocab_size: 8
            })
        ));
    }

    #[test]
    fn end_of_generation_includes_eos_and_im_end_once() {
        let tok = Tokenizer::new(&tiny()).unwrap();
        assert_eq!(tok.end_of_generation_ids(), &[5]);
    }

    #[test]
    fn bad_specs_are_errors() {
        let mut s = tiny();
        s.model = "llama".into();
        assert!(matches!(
            Tokenizer::new(&s),
            Err(TokenizerError::UnsupportedModel(_))
        ));
        let mut s = tiny();
        s.pre = None;
        assert!(matches!(
            Tokenizer::new(&s),
            Err(TokenizerError::MissingPreTokenizer)
        ));
        let mut s = tiny();
        s.merges.push("a zz".into());
        assert!(matches!(
            Tokenizer::new(&s),
            Err(TokenizerError::InvalidMerge { index: 2, .. })
        ));
        let mut s = tiny();
        s.token_types.pop();
        assert!(matches!(
            Tokenizer::new(&s),
            Err(TokenizerError::InvalidVocab(_))
        ));
    }
}
