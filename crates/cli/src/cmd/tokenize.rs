use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

use crate::load;

#[derive(clap::Args)]
pub struct Args {
    /// Any GGUF with tokenizer metadata (a vocabulary-only file is enough).
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// Treat special-token text such as <|im_start|> as text, not as the special token.
    #[arg(long)]
    pub no_special: bool,
    pub text: String,
}

pub fn main(a: Args) -> Result<ExitCode> {
    let file = load::open_gguf(&a.model)?;
    let tok = load::tokenizer(&file)?;
    let ids = tok.encode(&a.text, !a.no_special)?;
    println!("{}", serde_json::to_string(&ids)?);
    Ok(ExitCode::SUCCESS)
}
