//! What every generating request shares: its body parsed and checked, its token budget, its job
//! submitted to the scheduler, and the pieces of its answer (usage, finish reasons, errors).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use engine::GenerateParams;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::relay::Ended;
use crate::constraint::{Constraint, Forced};
use crate::error::ApiError;
use crate::scheduler::{Event, Finish, Job, Refused};
use crate::AppState;

pub(super) fn parse_body<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|e| {
        let mut err = ApiError::bad_request(format!("could not read the request body: {e}"));
        err.status = e.status();
        err
    })?;
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            ApiError::bad_request(format!("invalid request: {}", e.inner()))
        } else {
            ApiError::bad_param(&path, format!("invalid request: {path}: {}", e.inner()))
        }
    })
}

pub(super) fn check_model(st: &AppState, model: &str) -> Result<(), ApiError> {
    if model == st.config.model_id {
        Ok(())
    } else {
        Err(ApiError::model_not_found(model))
    }
}

/// Token budget: what was asked (never more than the context), else what the context leaves.
pub(super) fn budget(
    st: &AppState,
    asked: Option<u64>,
    prompt: usize,
    param: &str,
) -> Result<usize, ApiError> {
    let ctx = st.model_config.context_length;
    if prompt == 0 {
        return Err(ApiError::bad_param("prompt", "the prompt is empty"));
    }
    if prompt >= ctx {
        return Err(ApiError::bad_param(
            "messages",
            format!("the prompt has {prompt} tokens but the context holds {ctx}: shorten the input (at least one token must be left for the reply)"),
        ));
    }
    match asked {
        Some(0) => Err(ApiError::bad_param(
            param,
            format!("{param} must be at least 1"),
        )),
        Some(n) if n > ctx as u64 => Err(ApiError::bad_param(
            param,
            format!("{param} = {n} is more than the context of {ctx} tokens"),
        )),
        Some(n) => Ok(n as usize),
        None => Ok(ctx - prompt),
    }
}

pub(super) fn with_bos(st: &AppState, mut ids: Vec<u32>) -> Vec<u32> {
    if st.tok.add_bos() {
        if let Some(b) = st.tok.bos_id() {
            ids.insert(0, b);
        }
    }
    ids
}

pub(super) fn scripted(st: &AppState, text: &str) -> Result<Option<Box<dyn Constraint>>, ApiError> {
    let Some(s) = st.config.script.iter().find(|s| text.contains(&s.matches)) else {
        return Ok(None);
    };
    let ids = st
        .tok
        .encode(&s.text, true)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(Some(Box::new(Forced::new(
        ids,
        st.end_of_turn(),
        std::time::Duration::from_millis(s.delay_ms),
    ))))
}

pub(super) fn request_id(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(1);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    format!(
        "{prefix}-{t:x}{:04x}",
        N.fetch_add(1, Ordering::Relaxed) & 0xffff
    )
}

pub(super) fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Sets the cancel flag when dropped: the client went away (or the request is over).
pub(super) struct CancelOnDrop(pub(super) Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

pub(super) struct Prepared {
    pub(super) prompt: Vec<u32>,
    /// The prompt's first tokens a later request of the conversation will start with
    /// ([`Job::history`]).
    pub(super) history: Option<usize>,
    pub(super) params: GenerateParams,
    pub(super) constraint: Option<Box<dyn Constraint>>,
    pub(super) logprobs: Option<usize>,
}

pub(super) fn submit(
    st: &AppState,
    p: Prepared,
) -> Result<(mpsc::UnboundedReceiver<Event>, CancelOnDrop), ApiError> {
    let (tx, rx) = mpsc::unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let prompt_len = p.prompt.len();
    let job = Job {
        prompt: p.prompt,
        history: p.history,
        params: p.params,
        constraint: p.constraint,
        logprobs: p.logprobs,
        cancel: cancel.clone(),
        timeout: st.config.request_timeout,
        events: tx,
    };
    match st.scheduler.submit(job) {
        Ok(()) => {
            st.metrics.prompt_tokens.inc_by(prompt_len as u64);
            Ok((rx, CancelOnDrop(cancel)))
        }
        Err(Refused::Full) => Err(ApiError::overloaded(1)),
        Err(Refused::Closing) => Err(ApiError::unavailable("the server is shutting down")),
    }
}

pub(super) fn finish_name(f: Finish, tool_calls: bool) -> &'static str {
    match f {
        Finish::Stop if tool_calls => "tool_calls",
        Finish::Stop | Finish::Cancelled => "stop",
        Finish::Length => "length",
    }
}

/// A response's `usage`, with the prompt tokens taken from the slot's kept conversation as
/// OpenAI reports its cached ones.
pub(super) fn usage(end: &Ended) -> Value {
    let (prompt, completion) = (end.prompt_tokens, end.completion_tokens);
    json!({
        "prompt_tokens": prompt, "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": end.cached_tokens},
    })
}

pub(super) fn token_text(st: &AppState, id: u32) -> (String, Vec<u8>) {
    let bytes = st.tok.token_bytes(id).unwrap_or(&[]).to_vec();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

pub(super) fn finite(x: f32) -> f32 {
    if x.is_finite() {
        x
    } else {
        -9999.0
    }
}

pub(super) fn generation_error(m: String) -> ApiError {
    if m.contains("shutting down") {
        ApiError::unavailable(m)
    } else {
        ApiError::internal(m)
    }
}

pub(super) fn fingerprint() -> String {
    format!("niwaki-{}", env!("CARGO_PKG_VERSION"))
}
