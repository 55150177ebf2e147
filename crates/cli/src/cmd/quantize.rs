use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use quant::Format;

use crate::{load, progress};

#[derive(clap::Args)]
pub struct Args {
    /// The model to read.
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// Where to write the re-packed model.
    #[arg(long, short = 'o')]
    pub out: PathBuf,
    /// Target format: Q1_0, Q2_0, Q2_0_g128, PQ2_0, PTQ1_0, Q8_0, Q4_1, F16, BF16, F32.
    #[arg(long, short = 'f')]
    pub format: String,
}

pub fn main(a: Args) -> Result<ExitCode> {
    let format =
        Format::from_name(&a.format).with_context(|| format!("unknown format {:?}", a.format))?;
    let file = load::open_gguf(&a.model)?;
    let w = model::requant::requantize(file, format)?;
    let pb = progress::bytes(w.data_bytes(), "quantizing");
    w.write_file_with_progress(&a.out, |done, _| pb.set_position(done))?;
    pb.finish_and_clear();
    eprintln!("wrote {} ({format})", a.out.display());
    Ok(ExitCode::SUCCESS)
}
