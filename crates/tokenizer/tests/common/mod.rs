//! Test support: the committed fixtures, read through the GGUF container crate.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use tokenizer::{spec_from_metadata, Tokenizer, TokenizerSpec};

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/tokenizer")
        .join(name)
}

pub fn json_fixture(name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(fixture(name)).expect("read fixture");
    serde_json::from_str(&text).expect("parse fixture")
}

/// The spec of the committed vocab-only GGUF, read once per test binary.
pub fn qwen35_spec() -> &'static TokenizerSpec {
    static SPEC: OnceLock<TokenizerSpec> = OnceLock::new();
    SPEC.get_or_init(|| {
        let file = gguf::Gguf::open(fixture("qwen35-vocab.gguf")).expect("open vocab GGUF");
        spec_from_metadata(file.metadata()).expect("tokenizer metadata")
    })
}

/// The tokenizer built from it, shared by the tests of one binary.
pub fn qwen35() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Tokenizer::new(qwen35_spec()).expect("build tokenizer"))
}
