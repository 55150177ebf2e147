use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use gguf::{GgufWriter, Value};
use model::synth::{self, Preset};
use quant::Format;

use crate::{load, progress};

#[derive(clap::Args)]
pub struct Args {
    /// tiny (4 layers, hidden 128), small (8 layers, hidden 1024) or 27b.
    #[arg(long, default_value = "tiny")]
    pub preset: String,
    /// Q1_0, Q2_0, Q2_0_g128, PQ2_0, PTQ1_0 (or F32 for small presets).
    #[arg(long, short = 'f', default_value = "Q1_0")]
    pub format: String,
    /// The file to write.
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// A GGUF whose tokenizer.* metadata to copy (a vocabulary-only file is enough); without
    /// it, a small byte-level tokenizer is written.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Mark the matrices as Hadamard-folded the way Ternary-Bonsai-2 stores them (random signs;
    /// random weights stand for folded ones equally well): for running and timing that path.
    /// Needs widths that are multiples of 1024 (small, 27b).
    #[arg(long)]
    pub hadamard: bool,
}

/// Writes (once) a tiny random Q1_0 model with a byte-level tokenizer under the system temp
/// directory, for trying niwaki without weights. Its output is random text.
pub fn demo_model() -> Result<PathBuf> {
    let path = std::env::temp_dir().join("niwaki-demo-tiny-q1_0.gguf");
    if !path.exists() {
        eprintln!(
            "--demo: synthesizing a tiny random model at {} (its output is random text)",
            path.display()
        );
        let args = Args {
            preset: "tiny".into(),
            format: "Q1_0".into(),
            model: path.with_extension("partial"),
            tokenizer: None,
            seed: 0,
            hadamard: false,
        };
        let partial = args.model.clone();
        main(args)?;
        std::fs::rename(&partial, &path)
            .with_context(|| format!("moving the demo model to {}", path.display()))?;
    }
    Ok(path)
}

pub fn main(a: Args) -> Result<ExitCode> {
    let preset = Preset::parse(&a.preset)
        .with_context(|| format!("unknown preset {:?} (tiny, small, 27b)", a.preset))?;
    let format =
        Format::from_name(&a.format).with_context(|| format!("unknown format {:?}", a.format))?;
    if preset == Preset::B27 && format.block_len() == 1 {
        bail!("{format} is not a Bonsai format; a 27B file in it would not be useful");
    }
    let (tok_keys, n_tokens) = match &a.tokenizer {
        Some(path) => tokenizer_keys(&*load::open_gguf(path)?)?,
        None => byte_level_tokenizer(),
    };
    // The real Bonsai vocabulary is padded to 248320 rows; small presets use the tokens as is.
    let vocab = if preset == Preset::B27 {
        n_tokens.max(248_320)
    } else {
        n_tokens
    };
    let shape = preset.shape(vocab);
    let t = Instant::now();
    let mut w = synth::random_packed(
        &shape,
        format,
        a.seed,
        &format!("niwaki synthetic {} {format}", a.preset),
    )?;
    for (k, v) in tok_keys {
        w.set(&k, v);
    }
    if a.hadamard {
        let signs = synth::hadamard::signs(&shape, a.seed).with_context(|| {
            format!(
                "the {} preset has widths that are not multiples of 1024: it cannot carry a Hadamard rotation",
                a.preset
            )
        })?;
        synth::hadamard::write_metadata(&mut w, &shape, &signs);
    }
    pad_vocabulary(&mut w, vocab);
    let pb = progress::bytes(w.data_bytes(), "writing");
    w.write_file_with_progress(&a.model, |done, _| pb.set_position(done))?;
    pb.finish_and_clear();
    eprintln!(
        "wrote {} ({} preset, {format}, vocab {vocab}) in {:.1} s",
        a.model.display(),
        a.preset,
        t.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

/// Copies `tokenizer.*` keys; returns them and the token count.
fn tokenizer_keys(file: &gguf::Gguf) -> Result<(Vec<(String, Value)>, usize)> {
    let keys: Vec<(String, Value)> = file
        .metadata()
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let n = file
        .metadata()
        .get_strings("tokenizer.ggml.tokens")?
        .map(|t| t.len())
        .context("no tokenizer.ggml.tokens")?;
    Ok((keys, n))
}

/// GPT-2's byte-to-character table: printable bytes stand for themselves, the rest are moved
/// to code points from 256 up.
fn byte_chars() -> Vec<char> {
    let printable = |b: u32| {
        (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    let mut next = 256;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap_or('?')
            } else {
                let c = char::from_u32(next).unwrap_or('?');
                next += 1;
                c
            }
        })
        .collect()
}

const SPECIALS: [&str; 7] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
];

/// A byte-level BPE tokenizer with no merges: one token per byte plus the ChatML specials.
fn byte_level_tokenizer() -> (Vec<(String, Value)>, usize) {
    let mut tokens: Vec<String> = byte_chars().into_iter().map(String::from).collect();
    let mut types = vec![1i32; tokens.len()];
    for s in SPECIALS {
        tokens.push(s.to_string());
        types.push(3);
    }
    let id = |s: &str| Value::U32(tokens.iter().position(|t| t == s).unwrap_or(0) as u32);
    let keys = vec![
        (
            "tokenizer.ggml.model".to_string(),
            Value::String("gpt2".into()),
        ),
        (
            "tokenizer.ggml.pre".to_string(),
            Value::String("qwen35".into()),
        ),
        ("tokenizer.ggml.eos_token_id".to_string(), id("<|im_end|>")),
        (
            "tokenizer.ggml.padding_token_id".to_string(),
            id("<|endoftext|>"),
        ),
        (
            "tokenizer.ggml.add_bos_token".to_string(),
            Value::Bool(false),
        ),
        (
            "tokenizer.ggml.merges".to_string(),
            Value::strings(Vec::<String>::new()),
        ),
        ("tokenizer.ggml.token_type".to_string(), Value::i32s(types)),
        (
            "tokenizer.ggml.tokens".to_string(),
            Value::strings(tokens.clone()),
        ),
    ];
    (keys, tokens.len())
}

/// llama.cpp wants one token per embedding row: pad with unused `[PADn]` tokens.
fn pad_vocabulary(w: &mut GgufWriter, vocab: usize) {
    let md = w.metadata();
    let Ok(Some(tokens)) = md.get_strings("tokenizer.ggml.tokens") else {
        return;
    };
    if tokens.len() >= vocab {
        return;
    }
    let mut tokens: Vec<String> = tokens.into_iter().map(str::to_string).collect();
    let mut types: Vec<i32> = md
        .get_ints("tokenizer.ggml.token_type")
        .ok()
        .flatten()
        .map(|v| v.into_iter().map(|x| x as i32).collect())
        .unwrap_or_else(|| vec![1; tokens.len()]);
    for i in tokens.len()..vocab {
        tokens.push(format!("[PAD{i}]"));
        types.push(5);
    }
    w.set("tokenizer.ggml.tokens", Value::strings(tokens));
    w.set("tokenizer.ggml.token_type", Value::i32s(types));
}
