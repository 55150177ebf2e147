use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use model::{Logits, Model};
use npyz::WriterBuilder;

use crate::{load, progress};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The whole sequence as one chunked prefill.
    Prefill,
    /// One token at a time.
    Step,
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// Comma-separated token ids.
    #[arg(long, conflicts_with = "tokens_file")]
    pub tokens: Option<String>,
    /// A JSON array of token ids.
    #[arg(long)]
    pub tokens_file: Option<PathBuf>,
    /// Output .npy file: f32 logits of shape [tokens, vocab].
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, value_enum, default_value_t = Mode::Prefill)]
    pub mode: Mode,
    /// Tokens per prefill chunk.
    #[arg(long, default_value_t = engine::DEFAULT_PREFILL_CHUNK)]
    pub chunk: usize,
    #[arg(long)]
    pub threads: Option<usize>,
    /// Dot kernels.
    #[arg(long, value_enum, default_value_t)]
    pub kernels: load::KernelsArg,
}

pub fn read_tokens(tokens: &Option<String>, file: &Option<PathBuf>) -> Result<Vec<u32>> {
    match (tokens, file) {
        (Some(t), _) => load::parse_ids(t),
        (None, Some(f)) => {
            let text =
                std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            serde_json::from_str(&text)
                .with_context(|| format!("{} is not a JSON array of token ids", f.display()))
        }
        (None, None) => bail!("give the tokens with --tokens 1,2,3 or --tokens-file ids.json"),
    }
}

/// Logits of every position, `[tokens][vocab]`.
pub fn all_logits(model: &Model, ids: &[u32], mode: Mode, chunk: usize) -> Result<Vec<f32>> {
    let mut state = model.new_state();
    let mut out = Vec::with_capacity(ids.len() * model.config.vocab);
    let step = if mode == Mode::Step { 1 } else { chunk.max(1) };
    let pb = progress::count(ids.len() as u64, "evaluating");
    for part in ids.chunks(step) {
        out.extend(model.forward(&mut state, part, Logits::All)?);
        pb.inc(part.len() as u64);
    }
    pb.finish_and_clear();
    Ok(out)
}

pub fn write_npy(path: &Path, rows: usize, cols: usize, data: &[f32]) -> Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = npyz::WriteOptions::<f32>::new()
        .default_dtype()
        .shape(&[rows as u64, cols as u64])
        .writer(std::io::BufWriter::new(file))
        .begin_nd()?;
    w.extend(data.iter().copied())?;
    w.finish()?;
    Ok(())
}

/// Reads a 2-D f32 (or f64) .npy file.
pub fn read_npy(path: &Path) -> Result<(usize, usize, Vec<f32>)> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let npy = npyz::NpyFile::new(&bytes[..])
        .with_context(|| format!("{} is not a .npy file", path.display()))?;
    let shape = npy.shape().to_vec();
    let [rows, cols] = shape[..] else {
        bail!(
            "{}: expected a 2-D array, found shape {shape:?}",
            path.display()
        )
    };
    let data: Vec<f32> = match npy.dtype() {
        npyz::DType::Plain(t) if t.type_char() == npyz::TypeChar::Float && t.size_field() == 8 => {
            npy.into_vec::<f64>()?
                .into_iter()
                .map(|v| v as f32)
                .collect()
        }
        _ => npy
            .into_vec::<f32>()
            .with_context(|| format!("{}: expected f32 values", path.display()))?,
    };
    Ok((rows as usize, cols as usize, data))
}

pub fn main(a: Args) -> Result<ExitCode> {
    load::init_threads(a.threads)?;
    let ids = read_tokens(&a.tokens, &a.tokens_file)?;
    let model = load::open_model(&a.model, None, a.kernels)?;
    let logits = all_logits(&model, &ids, a.mode, a.chunk)?;
    write_npy(&a.out, ids.len(), model.config.vocab, &logits)?;
    eprintln!(
        "wrote {} x {} logits to {}",
        ids.len(),
        model.config.vocab,
        a.out.display()
    );
    Ok(ExitCode::SUCCESS)
}
