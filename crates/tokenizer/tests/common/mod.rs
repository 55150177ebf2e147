//! Test support: the committed fixtures, and a minimal reader for the GGUF metadata the
//! tokenizer needs (so these tests do not depend on the container crate).

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use tokenizer::{Tokenizer, TokenizerSpec};

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/tokenizer")
        .join(name)
}

pub fn json_fixture(name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(fixture(name)).expect("read fixture");
    serde_json::from_str(&text).expect("parse fixture")
}

#[derive(Debug, Clone)]
pub enum Meta {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Meta>),
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        s
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn string(&mut self) -> String {
        let n = self.u64() as usize;
        String::from_utf8(self.take(n).to_vec()).expect("utf-8 string")
    }
    fn value(&mut self, ty: u32) -> Meta {
        match ty {
            0 => Meta::Int(i64::from(self.take(1)[0])),
            1 => Meta::Int(i64::from(self.take(1)[0] as i8)),
            2 => Meta::Int(i64::from(u16::from_le_bytes(
                self.take(2).try_into().unwrap(),
            ))),
            3 => Meta::Int(i64::from(i16::from_le_bytes(
                self.take(2).try_into().unwrap(),
            ))),
            4 => Meta::Int(i64::from(self.u32())),
            5 => Meta::Int(i64::from(self.u32() as i32)),
            6 => Meta::Float(f64::from(f32::from_le_bytes(
                self.take(4).try_into().unwrap(),
            ))),
            7 => Meta::Bool(self.take(1)[0] != 0),
            8 => Meta::Str(self.string()),
            9 => {
                let et = self.u32();
                let n = self.u64() as usize;
                Meta::Array((0..n).map(|_| self.value(et)).collect())
            }
            10 => Meta::Int(self.u64() as i64),
            11 => Meta::Int(self.u64() as i64),
            12 => Meta::Float(f64::from_le_bytes(self.take(8).try_into().unwrap())),
            t => panic!("unknown GGUF value type {t}"),
        }
    }
}

/// The metadata key/values of a GGUF file.
pub fn read_gguf_metadata(bytes: &[u8]) -> HashMap<String, Meta> {
    let mut c = Cursor { b: bytes, pos: 0 };
    assert_eq!(c.take(4), b"GGUF");
    let version = c.u32();
    assert!(version >= 2, "GGUF version {version}");
    let _n_tensors = c.u64();
    let n_kv = c.u64();
    let mut out = HashMap::new();
    for _ in 0..n_kv {
        let key = c.string();
        let ty = c.u32();
        let v = c.value(ty);
        out.insert(key, v);
    }
    out
}

pub fn spec_from_gguf(path: &std::path::Path) -> TokenizerSpec {
    let bytes = std::fs::read(path).expect("read gguf");
    let md = read_gguf_metadata(&bytes);
    let s = |k: &str| match md.get(k) {
        Some(Meta::Str(s)) => Some(s.clone()),
        _ => None,
    };
    let id = |k: &str| match md.get(k) {
        Some(Meta::Int(i)) => Some(*i as u32),
        _ => None,
    };
    let strings = |k: &str| match md.get(k) {
        Some(Meta::Array(a)) => a
            .iter()
            .map(|m| match m {
                Meta::Str(s) => s.clone(),
                other => panic!("{k}: {other:?}"),
            })
            .collect(),
        _ => Vec::new(),
    };
    let types = match md.get("tokenizer.ggml.token_type") {
        Some(Meta::Array(a)) => a
            .iter()
            .map(|m| match m {
                Meta::Int(i) => *i as i32,
                other => panic!("token_type: {other:?}"),
            })
            .collect(),
        _ => Vec::new(),
    };
    TokenizerSpec {
        model: s("tokenizer.ggml.model").unwrap_or_default(),
        pre: s("tokenizer.ggml.pre"),
        tokens: strings("tokenizer.ggml.tokens"),
        token_types: types,
        merges: strings("tokenizer.ggml.merges"),
        bos_id: id("tokenizer.ggml.bos_token_id"),
        eos_id: id("tokenizer.ggml.eos_token_id"),
        eot_id: id("tokenizer.ggml.eot_token_id"),
        pad_id: id("tokenizer.ggml.padding_token_id"),
        add_bos: matches!(
            md.get("tokenizer.ggml.add_bos_token"),
            Some(Meta::Bool(true))
        ),
        chat_template: s("tokenizer.chat_template"),
    }
}

/// The spec of the committed vocab-only GGUF, read once per test binary.
pub fn qwen35_spec() -> &'static TokenizerSpec {
    static SPEC: OnceLock<TokenizerSpec> = OnceLock::new();
    SPEC.get_or_init(|| spec_from_gguf(&fixture("qwen35-vocab.gguf")))
}

/// The tokenizer built from it, shared by the tests of one binary.
pub fn qwen35() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Tokenizer::new(qwen35_spec()).expect("build tokenizer"))
}
