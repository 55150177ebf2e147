//! Opening models and tokenizers, and the options every generating command shares.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use gguf::Gguf;
use model::Model;
use tokenizer::{ChatTemplate, Tokenizer, TokenizerSpec};

/// Sets the worker-thread count (default: every core).
pub fn init_threads(threads: Option<usize>) -> Result<()> {
    let n = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    rayon::ThreadPoolBuilder::new()
        .num_threads(n.max(1))
        .build_global()
        .context("starting worker threads")?;
    Ok(())
}

pub fn open_gguf(path: &Path) -> Result<Arc<Gguf>> {
    Ok(Arc::new(
        Gguf::open(path).with_context(|| format!("opening {}", path.display()))?,
    ))
}

pub fn open_model(path: &Path) -> Result<Model> {
    let t = Instant::now();
    let file = open_gguf(path)?;
    let m = Model::from_gguf(file).with_context(|| format!("loading {}", path.display()))?;
    eprintln!(
        "loaded {} in {:.2} s",
        path.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(m)
}

/// The tokenizer described by a file's `tokenizer.*` metadata.
pub fn tokenizer_spec(file: &Gguf) -> Result<TokenizerSpec> {
    let md = file.metadata();
    let id = |k: &str| md.get_u32(k).with_context(|| format!("reading {k}"));
    Ok(TokenizerSpec {
        model: md.require_str("tokenizer.ggml.model")?.to_string(),
        pre: md.get_str("tokenizer.ggml.pre")?.map(str::to_string),
        tokens: md
            .get_strings("tokenizer.ggml.tokens")?
            .context("the file has no tokenizer (tokenizer.ggml.tokens is missing)")?
            .into_iter()
            .map(str::to_string)
            .collect(),
        token_types: md
            .get_ints("tokenizer.ggml.token_type")?
            .unwrap_or_default()
            .into_iter()
            .map(|v| i32::try_from(v).unwrap_or(0))
            .collect(),
        merges: md
            .get_strings("tokenizer.ggml.merges")?
            .unwrap_or_default()
            .into_iter()
            .map(str::to_string)
            .collect(),
        bos_id: id("tokenizer.ggml.bos_token_id")?,
        eos_id: id("tokenizer.ggml.eos_token_id")?,
        eot_id: id("tokenizer.ggml.eot_token_id")?,
        pad_id: id("tokenizer.ggml.padding_token_id")?,
        add_bos: md
            .get_bool("tokenizer.ggml.add_bos_token")?
            .unwrap_or(false),
        chat_template: md.get_str("tokenizer.chat_template")?.map(str::to_string),
    })
}

pub fn tokenizer(file: &Gguf) -> Result<Tokenizer> {
    Tokenizer::new(&tokenizer_spec(file)?)
        .context("building the tokenizer from the file's metadata")
}

/// The file's chat template, or the built-in Qwen3.5 one when it has none.
pub fn chat_template(tok: &Tokenizer) -> Result<ChatTemplate> {
    match tok.chat_template() {
        Some(src) => ChatTemplate::new(src).context("compiling the file's chat template"),
        None => Ok(ChatTemplate::builtin_qwen35()),
    }
}

/// Parses "1,2,3" into token ids.
pub fn parse_ids(s: &str) -> Result<Vec<u32>> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<u32>()
                .with_context(|| format!("{p:?} is not a token id"))
        })
        .collect()
}
