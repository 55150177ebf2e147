use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use engine::{FinishReason, Flow, Generation};
use tokenizer::ChatRequest;

use super::Sampling;
use crate::load;

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF model to run.
    #[arg(long, short = 'm', required_unless_present = "demo")]
    pub model: Option<PathBuf>,
    /// No weights at hand: synthesize a tiny random Bonsai-shaped model first and run that.
    #[arg(long, conflicts_with = "model")]
    pub demo: bool,
    #[arg(long, short = 'p')]
    pub prompt: String,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// With --chat: turn the model's thinking off.
    #[arg(long)]
    pub no_think: bool,
    #[command(flatten)]
    pub sampling: Sampling,
}

pub fn main(a: Args) -> Result<ExitCode> {
    let kv = a.sampling.place.kv()?;
    load::init_threads(a.sampling.threads)?;
    let path = match (&a.model, a.demo) {
        (Some(p), _) => p.clone(),
        (None, _) => super::synth::demo_model()?,
    };
    let model = a.sampling.place.open(&path, a.sampling.ctx, kv)?;
    let tok = load::tokenizer(model.file())?;
    let prompt_text = if a.chat {
        let req = ChatRequest {
            messages: vec![serde_json::json!({"role": "user", "content": a.prompt})],
            add_generation_prompt: true,
            enable_thinking: a.no_think.then_some(false),
            ..ChatRequest::default()
        };
        load::chat_template(&tok)?.render(&req)?
    } else {
        a.prompt.clone()
    };
    let mut ids = tok.encode(&prompt_text, a.chat)?;
    if tok.add_bos() {
        if let Some(b) = tok.bos_id() {
            ids.insert(0, b);
        }
    }
    let params = a.sampling.params();
    if let Some(why) = a.sampling.lookup_unused(&a.sampling.place.device) {
        eprintln!("warning: --lookup is ignored: {why}");
    }
    let g = match a.sampling.place.device {
        load::DeviceArg::Cpu => stream(&model, &tok, &mut model.new_state(), &ids, &params)?,
        #[cfg(feature = "cuda")]
        load::DeviceArg::Cuda => {
            let gpu = load::cuda_model(&model, kv)?;
            let mut state = gpu.new_state(model.config.context_length)?;
            stream(&gpu, &tok, &mut state, &ids, &params)?
        }
        #[cfg(not(feature = "cuda"))]
        load::DeviceArg::Cuda => return Err(load::no_cuda()),
    };
    report(&g, model.config.context_length);
    Ok(ExitCode::SUCCESS)
}

/// Generates on any backend, streaming text to stdout.
fn stream<B: engine::Backend>(
    model: &B,
    tok: &tokenizer::Tokenizer,
    state: &mut B::State,
    ids: &[u32],
    params: &engine::GenerateParams,
) -> Result<Generation> {
    let mut out = std::io::stdout().lock();
    let g = engine::generate(model, tok, state, ids, params, |piece| {
        let ok = out.write_all(piece.as_bytes()).and_then(|_| out.flush());
        if ok.is_ok() {
            Flow::Continue
        } else {
            Flow::Stop
        }
    })
    .context("generating")?;
    writeln!(out)?;
    Ok(g)
}

/// Timing and the reason generation ended, on stderr.
pub fn report(g: &Generation, context: usize) {
    if g.finish == FinishReason::ContextFull {
        eprintln!("[context limit of {context} tokens reached: generation stopped, the text above is kept]");
    }
    let cached = if g.cached_tokens > 0 {
        format!(" ({} already held)", g.cached_tokens)
    } else {
        String::new()
    };
    eprintln!(
        "prompt: {} tokens{cached}, {:.2} tok/s | generated: {} tokens, {:.2} tok/s | finish: {:?}",
        g.prompt_tokens,
        g.prefill_tok_s(),
        g.tokens.len(),
        g.decode_tok_s(),
        g.finish
    );
    let d = g.drafts;
    if d.passes > 0 {
        eprintln!(
            "lookup: {} passes verified drafts; {} of {} drafted tokens accepted",
            d.passes, d.accepted, d.drafted
        );
    }
}
