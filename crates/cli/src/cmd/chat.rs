use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use engine::{Backend, Flow, Generation};
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
    /// Prefill every turn's whole conversation from the start rather than reusing the state
    /// (slower; the replies are the same, which this checks).
    #[arg(long)]
    pub fresh_turns: bool,
    #[command(flatten)]
    pub sampling: Sampling,
}

/// A multi-turn conversation. The model state is reused across turns while the rendered prompt
/// extends what the state has seen. Where the template rewrote history (e.g. dropping a reply's
/// reasoning) and the backend rewinds, the state goes back to where the last turn's history
/// ended (its render without the reply's opening), if the new prompt still starts with it;
/// otherwise it is prefilled from the start.
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
    // Where the backend rewinds (and not --fresh-turns): the state at the end of the last
    // turn's history, and how many tokens of `seen` it holds.
    let mut turn_start: TurnStart<B> = None;
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
                turn_start = None;
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
        // The conversation up to the user's message, without the reply's opening: what the
        // next turn's render starts with, however it renders this turn's reply.
        let history = tok.encode(
            &template.render(&ChatRequest {
                add_generation_prompt: false,
                ..req.clone()
            })?,
            true,
        )?;
        let extends = !a.fresh_turns && ids.len() > seen.len() && ids.starts_with(&seen);
        // Else back to the end of the last turn's history where the new prompt starts with it (a
        // rewind the backend refuses falls through to the start).
        let kept = turn_start
            .as_ref()
            .filter(|(_, n)| {
                !extends && ids.len() > *n && seen.len() >= *n && ids[..*n] == seen[..*n]
            })
            .filter(|(at, _)| model.rewind(&mut state, at).is_ok())
            .map(|(_, n)| *n);
        let new = if extends {
            ids[seen.len()..].to_vec()
        } else if let Some(n) = kept {
            seen.truncate(n);
            ids[n..].to_vec()
        } else {
            restart(&mut state)?;
            seen.clear();
            turn_start = None;
            ids.clone()
        };
        let params = a.sampling.params();
        let mut out = std::io::stdout().lock();
        // Saved after the history where the backend rewinds and the prompt extends it.
        let head =
            (history.len() > seen.len() && history.len() < ids.len() && ids.starts_with(&history))
                .then(|| history.len() - seen.len());
        let save = head
            .filter(|_| empty.is_some() && !a.fresh_turns)
            .map(|h| (h, &mut turn_start));
        // The state holds the prompt but `new`: penalties and drafts read the whole prompt.
        let held = ids.len() - new.len();
        let g = turn(
            model,
            &mut state,
            (&ids, held),
            params.prefill_chunk,
            save,
            |st, cached| {
                let mut show = engine::OnText(|p: &str| {
                    let _ = out.write_all(p.as_bytes()).and_then(|_| out.flush());
                    Flow::Continue
                });
                engine::generate_after(model, tok, st, &ids, cached, &params, &mut show)
            },
        );
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
                turn_start = None;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The state saved at the end of a turn's history, and how many tokens it then held.
type TurnStart<B> = Option<(<B as Backend>::Checkpoint, usize)>;

/// One turn over `prompt` of which the state holds the first `held` tokens: where `save` is
/// given as (h, slot), the next h tokens first (in passes of at most `chunk`; 0 < h and some
/// token left after them), the state saved there into the slot for the next turn (with the
/// tokens it then holds), then `generate` from the rest, given how many the state then holds;
/// its figures count those h as fed this turn.
fn turn<B: Backend>(
    model: &B,
    state: &mut B::State,
    (prompt, held): (&[u32], usize),
    chunk: usize,
    save: Option<(usize, &mut TurnStart<B>)>,
    generate: impl FnOnce(&mut B::State, usize) -> engine::Result<Generation>,
) -> engine::Result<Generation> {
    let Some((h, save)) = save.filter(|(h, _)| *h > 0 && held + *h < prompt.len()) else {
        return generate(state, held);
    };
    let t = std::time::Instant::now();
    let reuse = save.take().map(|(c, _)| c);
    let at = engine::prefill_and_save(model, state, &prompt[held..held + h], chunk, reuse)?;
    let spent = t.elapsed();
    *save = Some((at, model.state_len(state)));
    let mut g = generate(state, held + h)?;
    g.cached_tokens = held;
    g.prefill_time += spent;
    Ok(g)
}
