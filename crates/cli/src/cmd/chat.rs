use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use engine::Flow;
use serde_json::json;
use tokenizer::ChatRequest;

use super::Sampling;
use crate::load;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// A system message for the whole conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// Turn the model's thinking off.
    #[arg(long)]
    pub no_think: bool,
    #[command(flatten)]
    pub sampling: Sampling,
}

/// A multi-turn conversation. The model state is reused across turns while the rendered prompt
/// extends what the state has seen; otherwise (the template rewrote history, e.g. dropping old
/// reasoning) the prompt is prefilled again from the start.
pub fn main(a: Args) -> Result<ExitCode> {
    let kv = a.sampling.place.kv()?;
    load::init_threads(a.sampling.threads)?;
    if let Some(why) = a.sampling.lookup_unused(&a.sampling.place.device) {
        eprintln!("warning: --lookup is ignored: {why}");
    }
    let model = a.sampling.place.open(&a.model, a.sampling.ctx, kv)?;
    let tok = load::tokenizer(model.file())?;
    let context = model.config.context_length;
    match a.sampling.place.device {
        load::DeviceArg::Cpu => converse(&model, || Ok(model.new_state()), &tok, &a, context),
        #[cfg(feature = "cuda")]
        load::DeviceArg::Cuda => {
            let gpu = load::cuda_model(&model, kv)?;
            converse(&gpu, || Ok(gpu.new_state(context)?), &tok, &a, context)
        }
        #[cfg(not(feature = "cuda"))]
        load::DeviceArg::Cuda => Err(load::no_cuda()),
    }
}

/// The conversation loop, on any backend.
fn converse<B: engine::Backend>(
    model: &B,
    new_state: impl Fn() -> Result<B::State>,
    tok: &tokenizer::Tokenizer,
    a: &Args,
    context: usize,
) -> Result<ExitCode> {
    let template = load::chat_template(tok)?;
    let mut messages = Vec::new();
    if let Some(s) = &a.system {
        messages.push(json!({"role": "system", "content": s}));
    }
    let mut state = new_state()?;
    // Where the backend rewinds, a new conversation takes the state back to empty rather than
    // making another (on the GPU: allocating and zeroing a whole context's cache).
    let empty = if model.can_rewind() {
        let mut at = B::Checkpoint::default();
        model.save(&state, &mut at)?;
        Some(at)
    } else {
        None
    };
    let restart = |state: &mut B::State| -> Result<()> {
        match &empty {
            Some(at) => model.rewind(state, at)?,
            None => *state = new_state()?,
        }
        Ok(())
    };
    let mut seen: Vec<u32> = Vec::new();
    eprintln!("chat: type a message; /reset clears the conversation, /exit or Ctrl-D quits");
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        std::io::stderr().flush()?;
        let Some(line) = lines.next().transpose()? else {
            break;
        };
        let line = line.trim();
        match line {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages.retain(|m| m["role"] == "system");
                restart(&mut state)?;
                seen.clear();
                continue;
            }
            _ => {}
        }
        messages.push(json!({"role": "user", "content": line}));
        let req = ChatRequest {
            messages: messages.clone(),
            add_generation_prompt: true,
            enable_thinking: a.no_think.then_some(false),
            ..ChatRequest::default()
        };
        let ids = tok.encode(&template.render(&req)?, true)?;
        let new = if ids.len() > seen.len() && ids.starts_with(&seen) {
            &ids[seen.len()..]
        } else {
            restart(&mut state)?;
            seen.clear();
            &ids[..]
        };
        let new = new.to_vec();
        let mut out = std::io::stdout().lock();
        let g = engine::generate(model, tok, &mut state, &new, &a.sampling.params(), |p| {
            let _ = out.write_all(p.as_bytes()).and_then(|_| out.flush());
            Flow::Continue
        });
        writeln!(out)?;
        match g {
            Ok(g) => {
                super::run::report(&g, context);
                // Exactly what the state consumed: the last sampled token may not have been fed.
                seen.extend_from_slice(&new);
                seen.extend_from_slice(&g.tokens);
                seen.truncate(model.state_len(&state));
                messages.push(json!({"role": "assistant", "content": g.text}));
            }
            Err(e) => {
                eprintln!("error: {e}");
                messages.pop();
                restart(&mut state)?;
                seen.clear();
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
