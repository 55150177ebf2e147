use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use engine::eval;

use super::logits::{all_logits, read_npy, read_tokens, Mode};
use crate::load;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// A text file to score.
    #[arg(long, conflicts_with_all = ["tokens", "tokens_file"])]
    pub text: Option<PathBuf>,
    /// Comma-separated token ids instead of a text.
    #[arg(long)]
    pub tokens: Option<String>,
    /// A JSON array of token ids instead of a text.
    #[arg(long)]
    pub tokens_file: Option<PathBuf>,
    /// Reference logits ([tokens, vocab] .npy) to compare against: KL divergence and top-1.
    #[arg(long)]
    pub kl_base: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Mode::Prefill)]
    pub mode: Mode,
    #[arg(long, default_value_t = engine::DEFAULT_PREFILL_CHUNK)]
    pub chunk: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    #[arg(long)]
    pub threads: Option<usize>,
    /// Dot kernels.
    #[arg(long, value_enum, default_value_t)]
    pub kernels: load::KernelsArg,
}

pub fn main(a: Args) -> Result<ExitCode> {
    load::init_threads(a.threads)?;
    let model = load::open_model(&a.model, None, a.kernels)?;
    let ids = match &a.text {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            load::tokenizer(model.file())?.encode(&text, false)?
        }
        None => read_tokens(&a.tokens, &a.tokens_file)?,
    };
    if ids.len() < 2 {
        bail!("perplexity needs at least two tokens, got {}", ids.len());
    }
    let vocab = model.config.vocab;
    let logits = all_logits(&model, &ids, a.mode, a.chunk)?;
    let ppl = eval::perplexity(&logits, &ids, vocab);
    let cmp = match &a.kl_base {
        None => None,
        Some(path) => {
            let (rows, cols, base) = read_npy(path)?;
            if cols != vocab || rows != ids.len() {
                bail!(
                    "{}: shape [{rows}, {cols}] does not match [{} tokens, {vocab} vocab]",
                    path.display(),
                    ids.len()
                );
            }
            Some(eval::compare(&base, &logits, vocab))
        }
    };
    if a.json {
        let mut o = serde_json::json!({"tokens": ids.len(), "perplexity": ppl});
        if let Some(c) = &cmp {
            o["mean_kl"] = c.mean_kl.into();
            o["max_kl"] = c.max_kl.into();
            o["top1"] = c.top1.into();
            o["max_abs_diff"] = f64::from(c.max_abs_diff).into();
        }
        println!("{o}");
    } else {
        println!("tokens: {}  perplexity: {ppl:.4}", ids.len());
        if let Some(c) = &cmp {
            println!(
                "vs base: mean KL {:.6}  max KL {:.6}  top-1 agreement {:.2}%  max |Δlogit| {:.5}",
                c.mean_kl,
                c.max_kl,
                100.0 * c.top1,
                c.max_abs_diff
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
