use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use model::Model;
use quant::Format;

use crate::{load, progress};

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, short = 'm')]
    pub model: PathBuf,
}

/// Reads every byte of every tensor. Exit status 0 only when nothing is wrong.
pub fn main(a: Args) -> Result<ExitCode> {
    let file = match load::open_gguf(&a.model) {
        Ok(f) => f,
        Err(e) => {
            println!("INVALID: {e:#}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let mut problems = Vec::new();
    let total: u64 = file.tensors().iter().map(|t| t.size).sum();
    let pb = progress::bytes(total, "scanning");
    for t in file.tensors() {
        let data = file.view(t).data;
        let code3 = quant::count_code3(t.format, data);
        if code3 > 0 {
            problems.push(format!(
                "{}: {code3} codes equal 3 (+2·d) in a {} tensor; a ternary quantizer never writes them, so the file is corrupt or not ternary",
                t.name, t.format
            ));
        }
        let bad_scales = quant::count_non_finite_scales(t.format, data);
        if bad_scales > 0 {
            let what = if t.format.block_len() == 1 {
                "values"
            } else {
                "block scales"
            };
            problems.push(format!(
                "{}: {bad_scales} non-finite {what} ({})",
                t.name, t.format
            ));
        }
        if t.format == Format::PTQ1_0 {
            let odd = quant::count_noncanonical(t.format, data);
            if odd > 0 {
                problems.push(format!(
                    "{}: {odd} PTQ1_0 bytes are not canonical base-3 packings",
                    t.name
                ));
            }
        }
        pb.inc(t.size);
    }
    pb.finish_and_clear();

    let md = file.metadata();
    let is_model = file.tensor("token_embd.weight").is_some();
    if is_model {
        if let Err(e) = Model::from_gguf(file.clone()) {
            problems.push(format!("model: {e}"));
        }
    } else {
        println!("note: no token_embd.weight: checked as a vocabulary-only file");
    }
    if md.get("tokenizer.ggml.tokens").is_some() {
        if let Err(e) = load::tokenizer(&file) {
            problems.push(format!("tokenizer: {e:#}"));
        }
    }
    println!(
        "{}: {} tensors, {} bytes of tensor data scanned",
        a.model.display(),
        file.tensors().len(),
        total
    );
    if problems.is_empty() {
        println!("OK");
        Ok(ExitCode::SUCCESS)
    } else {
        for p in &problems {
            println!("PROBLEM: {p}");
        }
        println!("INVALID: {} problem(s)", problems.len());
        Ok(ExitCode::FAILURE)
    }
}
