//! A generation's events handed on to the client, the loop chat and text completions share:
//! collected into one answer, or streamed as server-sent events, each endpoint saying only
//! what its text and its end become.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use engine::logprobs::TokenLogprob;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::error::ApiError;
use crate::scheduler::{Event, Finish};
use crate::AppState;

use super::request::{fingerprint, generation_error, now_s, usage, CancelOnDrop};

/// How a generation ended, every piece of text before it handed on already.
pub(super) struct Ended {
    pub(super) finish: Finish,
    pub(super) prompt_tokens: usize,
    /// Of those, the ones taken from the slot's kept conversation.
    pub(super) cached_tokens: usize,
    pub(super) completion_tokens: usize,
    /// Log-probabilities not yet sent with text (e.g. of held-back stop-string tokens).
    pub(super) logprobs: Vec<TokenLogprob>,
}

/// A generation's next event as the relays take it: its end counted in the metrics once.
enum Step {
    Text(String, Vec<TokenLogprob>),
    End(Ended),
    Failed(ApiError),
}

async fn next(st: &AppState, rx: &mut mpsc::UnboundedReceiver<Event>) -> Option<Step> {
    Some(match rx.recv().await? {
        Event::Text(t, l) => Step::Text(t, l),
        Event::Done {
            finish,
            prompt_tokens,
            cached_tokens,
            completion_tokens,
            logprobs,
        } => {
            st.metrics.generated_tokens.inc_by(completion_tokens as u64);
            st.metrics.cached_prompt_tokens.inc_by(cached_tokens as u64);
            Step::End(Ended {
                finish,
                prompt_tokens,
                cached_tokens,
                completion_tokens,
                logprobs,
            })
        }
        Event::Failed(m) => Step::Failed(generation_error(m)),
    })
}

/// Waits for the whole generation, each piece of text going to `text`: its end. A failed
/// generation, or one that stops without an end, is an error.
pub(super) async fn collect(
    st: &AppState,
    mut rx: mpsc::UnboundedReceiver<Event>,
    mut text: impl FnMut(String, Vec<TokenLogprob>),
) -> Result<Ended, ApiError> {
    while let Some(step) = next(st, &mut rx).await {
        match step {
            Step::Text(t, l) => text(t, l),
            Step::End(end) => return Ok(end),
            Step::Failed(e) => return Err(e),
        }
    }
    Err(ApiError::internal("generation ended without a result"))
}

/// What every streamed chunk of one response carries besides its choices.
pub(super) struct Envelope {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    /// `stream_options.include_usage`: every chunk has a `usage` (null but in the last).
    include_usage: bool,
}

impl Envelope {
    pub(super) fn new(
        st: &AppState,
        id: String,
        object: &'static str,
        include_usage: bool,
    ) -> Self {
        Envelope {
            id,
            object,
            created: now_s(),
            model: st.config.model_id.clone(),
            include_usage,
        }
    }

    /// A chunk of one choice.
    pub(super) fn chunk(&self, choice: Value) -> Value {
        let mut c = self.with_choices(json!([choice]));
        if self.include_usage {
            c["usage"] = Value::Null;
        }
        c
    }

    /// The chunk that ends the stream where usage was asked for: no choices, the counts.
    pub(super) fn usage(&self, end: &Ended) -> Option<Value> {
        self.include_usage.then(|| {
            let mut c = self.with_choices(json!([]));
            c["usage"] = usage(end);
            c
        })
    }

    fn with_choices(&self, choices: Value) -> Value {
        json!({
            "id": self.id, "object": self.object, "created": self.created,
            "model": self.model, "system_fingerprint": fingerprint(),
            "choices": choices,
        })
    }
}

/// What an endpoint's stream makes of a generation: its first chunks, each piece of text's,
/// and the end's.
pub(super) trait Chunks: Send + 'static {
    fn first(&mut self) -> Vec<Value> {
        Vec::new()
    }
    fn text(&mut self, text: String, logprobs: Vec<TokenLogprob>) -> Vec<Value>;
    fn done(self, end: Ended) -> Vec<Value>;
}

/// Streams the generation as server-sent events: `chunks`' first, each piece of text's, the
/// end's, then `[DONE]`; a failure is sent as an error body. Stops (dropping `guard`, which
/// cancels the generation) once the client has gone.
pub(super) fn stream(
    st: Arc<AppState>,
    mut rx: mpsc::UnboundedReceiver<Event>,
    guard: CancelOnDrop,
    mut chunks: impl Chunks,
) -> Response {
    let (tx, out) = mpsc::channel::<Result<SseEvent, Infallible>>(64);
    tokio::spawn(async move {
        let _guard = guard;
        let send_all = |values: Vec<Value>| {
            let tx = tx.clone();
            async move {
                for v in values {
                    tx.send(sse_json(&v)).await.map_err(|_| ())?;
                }
                Ok::<(), ()>(())
            }
        };
        if send_all(chunks.first()).await.is_err() {
            return;
        }
        while let Some(step) = next(&st, &mut rx).await {
            match step {
                Step::Text(t, l) => {
                    if send_all(chunks.text(t, l)).await.is_err() {
                        return;
                    }
                }
                Step::End(end) => {
                    if send_all(chunks.done(end)).await.is_ok() {
                        let _ = tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
                    }
                    return;
                }
                Step::Failed(e) => {
                    let _ = tx.send(sse_json(&e.body())).await;
                    return;
                }
            }
        }
    });
    sse_response(out)
}

/// One SSE `data:` event. Unicode line separators (U+0085, U+2028, U+2029) are escaped: JSON
/// allows them raw, but some clients split lines on them.
fn sse_json(v: &Value) -> Result<SseEvent, Infallible> {
    let text = v
        .to_string()
        .replace('\u{85}', "\\u0085")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029");
    Ok(SseEvent::default().data(text))
}

fn sse_response(rx: mpsc::Receiver<Result<SseEvent, Infallible>>) -> Response {
    Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}
