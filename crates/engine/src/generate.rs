//! The generation loop: prefill the prompt in chunks, then sample one token at a time, streaming
//! complete UTF-8 text and stopping at end-of-generation tokens, stop strings, the token budget or
//! the context limit.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use model::Logits;
use tokenizer::Tokenizer;

use crate::backend::{Backend, Ranked};
use crate::error::{EngineError, Result};
use crate::lookup::LookupConfig;
use crate::ranking::Drawn;
use crate::sampler::{argmax, Sampler, SamplerConfig, SamplerError};
use crate::stop::{Scan, StopMatcher};

/// Tokens per prefill chunk by default: large enough that weights are read once for many tokens,
/// small enough to keep activations in cache-friendly sizes.
pub const DEFAULT_PREFILL_CHUNK: usize = 256;

#[derive(Clone, Debug)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    pub stop_strings: Vec<String>,
    /// Extra token ids that end generation, besides the tokenizer's end-of-generation ids.
    pub stop_tokens: Vec<u32>,
    pub prefill_chunk: usize,
    /// Drafts looked up in the sequence so far and verified several tokens a pass
    /// ([`crate::lookup`]), where decoding is plain greedy, nothing reads the logits and the
    /// device verifies drafts losslessly ([`Backend::verifies_drafts`]): the same tokens as
    /// without, in fewer passes where the output repeats its context. `None`: one token a pass.
    pub lookup: Option<LookupConfig>,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_tokens: 256,
            sampler: SamplerConfig::default(),
            stop_strings: Vec::new(),
            stop_tokens: Vec::new(),
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            lookup: None,
        }
    }
}

/// What a caller of [`generate_with`] can plug into the loop. Every method but `on_text` has a
/// default that changes nothing.
pub trait Hooks {
    /// Text that is safe to show (whole characters, never part of a stop string).
    fn on_text(&mut self, piece: &str) -> Flow;

    /// Restricts the next token: set the logits of tokens that must not come next to −∞.
    /// Called before penalties and sampling.
    fn mask(&mut self, _logits: &mut [f32]) -> Result<()> {
        Ok(())
    }

    /// The token just sampled (end-of-generation tokens included) and the logits it was drawn
    /// from, after the mask and the penalties, before temperature. `Flow::Stop` ends generation
    /// as cancelled, before the token is shown.
    fn on_token(&mut self, _id: u32, _logits: &[f32]) -> Flow {
        Flow::Continue
    }

    /// Checked before every token: true ends generation as cancelled.
    fn cancelled(&self) -> bool {
        false
    }

    /// Whether `mask` or `on_token` read the logits. When neither does and sampling is plain
    /// greedy (or random without penalties), the device picks each token (or may select its
    /// candidates) itself and `on_token` gets an empty slice.
    fn wants_logits(&self) -> bool {
        true
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The context is full; what was generated is kept.
    ContextFull,
    /// The caller asked to stop.
    Cancelled,
}

#[derive(Clone, Debug)]
pub struct Generation {
    pub text: String,
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    /// Of those, the ones the state already held ([`generate_after`]): not fed, not timed.
    pub cached_tokens: usize,
    pub prefill_time: Duration,
    pub decode_time: Duration,
    /// Passes that verified a looked-up draft, and the drafted tokens they accepted
    /// ([`GenerateParams::lookup`]).
    pub drafts: DraftStats,
}

/// What drafting did in one generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DraftStats {
    /// Passes that verified a draft.
    pub passes: usize,
    /// Tokens drafted into those passes.
    pub drafted: usize,
    /// Drafted tokens that were the model's own picks, taken without a pass of their own.
    pub accepted: usize,
}

impl Generation {
    pub fn decode_tok_s(&self) -> f64 {
        let n = self.tokens.len().saturating_sub(1);
        if n == 0 || self.decode_time.is_zero() {
            return 0.0;
        }
        n as f64 / self.decode_time.as_secs_f64()
    }

    pub fn prefill_tok_s(&self) -> f64 {
        if self.prefill_time.is_zero() {
            return 0.0;
        }
        (self.prompt_tokens - self.cached_tokens) as f64 / self.prefill_time.as_secs_f64()
    }
}

/// What the streaming callback wants next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// Feeds `tokens` (in chunks of `chunk`) and saves the state after them: the point a
/// conversation's next turn goes on from. `reuse`: a checkpoint whose room to save into.
pub fn prefill_and_save<B: Backend>(
    model: &B,
    state: &mut B::State,
    tokens: &[u32],
    chunk: usize,
    reuse: Option<B::Checkpoint>,
) -> Result<B::Checkpoint> {
    prefill(model, state, tokens, chunk)?;
    let mut at = reuse.unwrap_or_default();
    model.save(state, &mut at)?;
    Ok(at)
}

/// Feeds `tokens` to the model in chunks and returns the logits after the last one.
pub fn prefill<B: Backend>(
    model: &B,
    state: &mut B::State,
    tokens: &[u32],
    chunk: usize,
) -> Result<Vec<f32>> {
    if tokens.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    let limit = model.context_length(state);
    let have = model.state_len(state);
    if have + tokens.len() > limit {
        return Err(EngineError::PromptTooLong {
            prompt: have + tokens.len(),
            context: limit,
        });
    }
    let chunk = chunk.max(1);
    let mut logits = Vec::new();
    let n_chunks = tokens.len().div_ceil(chunk);
    for (i, part) in tokens.chunks(chunk).enumerate() {
        let want = if i + 1 == n_chunks {
            Logits::Last
        } else {
            Logits::None
        };
        logits = model.forward(state, part, want)?;
    }
    Ok(logits)
}

/// Generates a continuation of `prompt` after what `state` already holds. `on_text` receives each
/// piece of text as soon as it is safe to show.
pub fn generate<B: Backend>(
    model: &B,
    tok: &Tokenizer,
    state: &mut B::State,
    prompt: &[u32],
    params: &GenerateParams,
    on_text: impl FnMut(&str) -> Flow,
) -> Result<Generation> {
    generate_with(model, tok, state, prompt, params, &mut OnText(on_text))
}

/// Adapts a text callback to [`Hooks`] (nothing else read: the device may pick tokens).
pub struct OnText<F>(pub F);

impl<F: FnMut(&str) -> Flow> Hooks for OnText<F> {
    fn on_text(&mut self, piece: &str) -> Flow {
        (self.0)(piece)
    }

    fn wants_logits(&self) -> bool {
        false
    }
}

/// What the next token is drawn from: the logits, the best candidates the device selected, or
/// the token the device already picked.
enum Next {
    Logits(Vec<f32>),
    Ranked {
        top: Vec<(u32, f32)>,
        sums: Option<(f32, f32)>,
    },
    Picked(u32),
    /// Drafted tokens a verifying pass accepted, which the state has already consumed, then
    /// the model's pick after them, which it has not.
    Drafted {
        fed: VecDeque<u32>,
        then: u32,
    },
}

/// Drafting for one generation: the lookup, and the checkpoint each verifying pass saves.
struct Drafting<C> {
    config: LookupConfig,
    /// Saved by every verifying pass (`stats.passes` of them) before it runs.
    checkpoint: C,
    stats: DraftStats,
}

impl<C: Default> Drafting<C> {
    fn new(config: LookupConfig) -> Self {
        Drafting {
            config,
            checkpoint: C::default(),
            stats: DraftStats::default(),
        }
    }

    /// Consumes `next` (the token just taken, last of `history`) and picks the one after it
    /// as a one-token pass would: with a draft, by one pass over `next` and the draft, each
    /// drafted token the pick at the position before it accepted and the state taken back to
    /// the last one accepted. `most` bounds the draft (the room left in the context and in the
    /// token budget); `ends` cut it before an end-of-generation token, which is never consumed.
    fn step<B: Backend<Checkpoint = C>>(
        &mut self,
        model: &B,
        state: &mut B::State,
        history: &[u32],
        most: usize,
        ends: &[u32],
    ) -> Result<Next> {
        let next = *history.last().ok_or(EngineError::EmptyPrompt)?;
        let mut draft = self.config.draft(history);
        draft.truncate(most);
        if let Some(end) = draft.iter().position(|t| ends.contains(t)) {
            draft.truncate(end);
        }
        if draft.is_empty() {
            return Ok(Next::Picked(model.forward_argmax(state, &[next])?));
        }
        model.save(state, &mut self.checkpoint)?;
        let feed: Vec<u32> = std::iter::once(next).chain(draft.iter().copied()).collect();
        let logits = model.forward(state, &feed, Logits::All)?;
        let vocab = logits.len() / feed.len();
        let mut picks = logits.chunks_exact(vocab.max(1)).map(|row| {
            argmax(row)
                .map(|i| i as u32)
                .ok_or(SamplerError::NoFiniteLogit)
        });
        let mut accepted = 0;
        let then = loop {
            let pick = picks.next().ok_or_else(|| {
                EngineError::Backend("a pass gave fewer rows of logits than tokens".into())
            })??;
            if draft.get(accepted) != Some(&pick) {
                break pick;
            }
            accepted += 1;
        };
        if accepted < draft.len() {
            // The state holds the rejected tokens too: back, and the accepted ones again.
            model.rewind(state, &self.checkpoint)?;
            model.forward(state, &feed[..=accepted], Logits::None)?;
        }
        self.stats.passes += 1;
        self.stats.drafted += draft.len();
        self.stats.accepted += accepted;
        draft.truncate(accepted);
        Ok(Next::Drafted {
            fed: draft.into(),
            then,
        })
    }

    /// Where a generation ends holding drafted tokens the one-token loop would not have
    /// consumed (past the last shown, or an ending one), the state is taken back to the last
    /// checkpoint and given `tokens`: it then holds what it would without drafting.
    fn settle<B: Backend<Checkpoint = C>>(
        &self,
        model: &B,
        state: &mut B::State,
        want: usize,
        consumed_since_start: &[u32],
        start: usize,
    ) -> Result<()> {
        // Without a verifying pass the checkpoint is not this generation's, nor is it needed.
        if self.stats.passes == 0 || model.state_len(state) <= want {
            return Ok(());
        }
        model.rewind(state, &self.checkpoint)?;
        let from = model.state_len(state);
        // The checkpoint lies inside this generation's tokens, at or before `want`.
        let tokens = from
            .checked_sub(start)
            .zip(want.checked_sub(start))
            .and_then(|(a, b)| consumed_since_start.get(a..b))
            .ok_or_else(|| {
                EngineError::Backend(format!(
                    "a draft's checkpoint at {from} lies outside the generation's positions \
                     {start}..{want}"
                ))
            })?;
        if !tokens.is_empty() {
            model.forward(state, tokens, Logits::None)?;
        }
        Ok(())
    }
}

/// [`generate`] with [`Hooks`]: a mask on the logits before each token is sampled (constrained
/// decoding), every sampled token with the logits it was drawn from (log-probabilities, timing),
/// and cancellation checked before every model step.
pub fn generate_with<B: Backend>(
    model: &B,
    tok: &Tokenizer,
    state: &mut B::State,
    prompt: &[u32],
    params: &GenerateParams,
    hooks: &mut dyn Hooks,
) -> Result<Generation> {
    generate_after(model, tok, state, prompt, 0, params, hooks)
}

/// [`generate_with`] where the state already holds the prompt's first `cached` tokens, last
/// (a kept conversation's start, rewound to): only the rest is fed, and the whole prompt is
/// the history that penalties and drafts read, so the reply is the one a fresh state would
/// give. At least one prompt token must be left to feed.
pub fn generate_after<B: Backend>(
    model: &B,
    tok: &Tokenizer,
    state: &mut B::State,
    prompt: &[u32],
    cached: usize,
    params: &GenerateParams,
    hooks: &mut dyn Hooks,
) -> Result<Generation> {
    let held = model.state_len(state);
    if cached > 0 && (cached >= prompt.len() || cached > held) {
        return Err(EngineError::CachedPrompt {
            cached,
            prompt: prompt.len(),
            held,
        });
    }
    let mut sampler = Sampler::new(params.sampler.clone())?;
    // Greedy decoding whose hooks need no logits lets the device pick each token: on a GPU
    // only the token comes back instead of the vocabulary's row of logits.
    let device_picks = sampler.is_plain_greedy() && !hooks.wants_logits();
    // Likewise a random draw without penalties: the device may select the best candidates.
    let device_ranks = sampler.ranked_draw().filter(|_| !hooks.wants_logits());
    // Drafts verified a pass at a time: only where the device picks greedy tokens and its
    // several-token passes give one-token passes' logits, so the output cannot change.
    let mut drafting = params
        .lookup
        .filter(|_| device_picks && model.verifies_drafts())
        .map(Drafting::<B::Checkpoint>::new);
    // State positions from here on hold `history`'s tokens in order.
    let start = held - cached;
    let t0 = Instant::now();
    let fed = &prompt[cached..];
    let mut next_from = Next::Logits(prefill(model, state, fed, params.prefill_chunk)?);
    let prefill_time = t0.elapsed();

    let mut end_ids: Vec<u32> = tok.end_of_generation_ids().to_vec();
    end_ids.extend(&params.stop_tokens);
    let mut history: Vec<u32> = prompt.to_vec();
    let mut out_tokens = Vec::new();
    let mut text = String::new();
    let mut stops = StopMatcher::new(&params.stop_strings);
    let mut decoder = tok.stream_decoder();
    let limit = model.context_length(state);
    let t1 = Instant::now();
    let emit = |hooks: &mut dyn Hooks, piece: &str, text: &mut String| {
        text.push_str(piece);
        if piece.is_empty() {
            Flow::Continue
        } else {
            hooks.on_text(piece)
        }
    };
    let mut stopped_by_string = false;
    // Whether the token taken last is one the one-token loop would not have consumed yet (it
    // consumes each at the end of its turn).
    let mut unconsumed = false;
    let finish = loop {
        if out_tokens.len() >= params.max_tokens {
            break FinishReason::Length;
        }
        if hooks.cancelled() {
            break FinishReason::Cancelled;
        }
        // `in_state`: a drafted token the state has already consumed.
        let (next, seen, in_state): (u32, &[f32], bool) = match &mut next_from {
            Next::Logits(logits) => {
                hooks.mask(logits)?;
                (sampler.sample(logits, &history)?, logits, false)
            }
            Next::Ranked { top, sums } => match sampler.sample_ranked(top, *sums)? {
                Drawn::Token(id) => (id, &[], false),
                Drawn::NeedsRow => (
                    sampler.sample_from_row(&model.last_row(state)?)?,
                    &[],
                    false,
                ),
            },
            Next::Picked(next) => (*next, &[], false),
            Next::Drafted { fed, then } => match fed.pop_front() {
                Some(t) => (t, &[], true),
                None => (*then, &[], false),
            },
        };
        if hooks.on_token(next, seen) == Flow::Stop {
            break FinishReason::Cancelled;
        }
        if end_ids.contains(&next) {
            break FinishReason::Stop;
        }
        out_tokens.push(next);
        history.push(next);
        unconsumed = true;
        let piece = decoder.push(next)?;
        match stops.push(&piece) {
            Scan::Stopped(before) => {
                emit(hooks, &before, &mut text);
                stopped_by_string = true;
                break FinishReason::Stop;
            }
            Scan::Emit(t) => {
                if emit(hooks, &t, &mut text) == Flow::Stop {
                    break FinishReason::Cancelled;
                }
            }
        }
        if out_tokens.len() >= params.max_tokens {
            break FinishReason::Length;
        }
        // What the one-token loop's state holds here: every token taken but this one.
        let consumed = start + history.len() - 1;
        if consumed >= limit {
            break FinishReason::ContextFull;
        }
        unconsumed = false;
        // The context check above counts on it, for every device.
        debug_assert!(in_state || consumed == model.state_len(state));
        if in_state {
            // The rest of the accepted draft, then the pick after it, come next.
            continue;
        }
        next_from = if device_picks {
            match drafting.as_mut() {
                Some(d) => {
                    // Room for `next` and the draft in the context, and for the pick after
                    // the draft in the token budget.
                    let room = limit - consumed - 1;
                    let budget = params.max_tokens - out_tokens.len() - 1;
                    d.step(model, state, &history, room.min(budget), &end_ids)?
                }
                None => Next::Picked(model.forward_argmax(state, &[next])?),
            }
        } else if let Some(request) = device_ranks {
            match model.forward_top_k(state, &[next], request)? {
                Ranked::Top { top, sums } => Next::Ranked { top, sums },
                Ranked::Row(logits) => Next::Logits(logits),
            }
        } else {
            Next::Logits(model.forward(state, &[next], Logits::Last)?)
        };
    };
    if let Some(d) = &drafting {
        let want = start + history.len() - usize::from(unconsumed);
        d.settle(model, state, want, &history, start)?;
    }
    if !stopped_by_string {
        // Flush what was held back: incomplete UTF-8 at the very end, and text that looked like
        // the start of a stop string but never became one.
        let tail = decoder.finish();
        let tail = match stops.push(&tail) {
            Scan::Emit(t) => t + &stops.finish(),
            Scan::Stopped(t) => t,
        };
        emit(hooks, &tail, &mut text);
    }
    Ok(Generation {
        text,
        tokens: out_tokens,
        finish,
        prompt_tokens: prompt.len(),
        cached_tokens: cached,
        prefill_time,
        decode_time: t1.elapsed(),
        drafts: drafting.map(|d| d.stats).unwrap_or_default(),
    })
}
