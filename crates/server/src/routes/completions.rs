//! `/v1/completions`: plain text in, text out, whole or streamed.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use engine::logprobs::TokenLogprob;
use engine::{GenerateParams, LookupConfig};
use serde_json::{json, Value};

use crate::api::{self, CompletionRequest, Sampling};
use crate::error::ApiError;
use crate::AppState;

use super::relay::{self, Chunks, Ended, Envelope};
use super::request::{
    budget, check_model, fingerprint, finish_name, finite, now_s, parse_body, request_id, scripted,
    submit, token_text, usage, with_bos, Prepared,
};
use super::St;

/// Legacy completions `logprobs` object.
fn completion_logprobs(st: &AppState, lps: &[TokenLogprob], offset: &mut usize) -> Value {
    let mut tokens = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut top = Vec::new();
    let mut offsets = Vec::new();
    for t in lps {
        let (text, _) = token_text(st, t.id);
        offsets.push(*offset);
        *offset += text.len();
        tokens.push(text);
        token_logprobs.push(finite(t.logprob));
        let m: serde_json::Map<String, Value> = t
            .top
            .iter()
            .map(|&(id, lp)| (token_text(st, id).0, json!(finite(lp))))
            .collect();
        top.push(Value::Object(m));
    }
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
}

// ---------------------------------------------------------------------------------------------
// Chat completions

pub(super) async fn completions(
    State(st): St,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let r: CompletionRequest = parse_body(body)?;
    check_model(&st, &r.model)?;
    api::check_n(r.n)?;
    api::check_logit_bias(&r.logit_bias)?;
    if r.best_of.is_some_and(|b| b != 1) {
        return Err(ApiError::unsupported(
            "best_of",
            "best_of other than 1 is not supported",
        ));
    }
    if r.echo == Some(true) {
        return Err(ApiError::unsupported("echo", "echo is not supported"));
    }
    if r.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::unsupported(
            "suffix",
            "suffix (fill-in-the-middle) is not supported",
        ));
    }
    if r.logprobs.is_some_and(|n| n > 5) {
        return Err(ApiError::bad_param(
            "logprobs",
            "logprobs must be at most 5",
        ));
    }
    let (prompt_text, ids) = match &r.prompt {
        Value::String(s) => (s.clone(), None),
        Value::Array(a) if a.len() == 1 && a[0].is_string() => {
            (a[0].as_str().unwrap_or_default().to_string(), None)
        }
        Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_u64) => {
            let ids: Vec<u32> = a
                .iter()
                .filter_map(Value::as_u64)
                .map(|x| x as u32)
                .collect();
            if let Some(&bad) = ids.iter().find(|&&i| i as usize >= st.tok.vocab_size()) {
                return Err(ApiError::bad_param(
                    "prompt",
                    format!(
                        "token id {bad} is outside the vocabulary of {}",
                        st.tok.vocab_size()
                    ),
                ));
            }
            (String::new(), Some(ids))
        }
        Value::Array(a) if a.len() > 1 => {
            return Err(ApiError::unsupported(
                "prompt",
                "one prompt per request is supported",
            ))
        }
        _ => {
            return Err(ApiError::bad_param(
                "prompt",
                "prompt must be a string, a list of one string, or a list of token ids",
            ))
        }
    };
    let prompt = match ids {
        Some(ids) => ids,
        None => with_bos(
            &st,
            st.tok
                .encode(&prompt_text, false)
                .map_err(|e| ApiError::bad_request(e.to_string()))?,
        ),
    };
    let stop = r.stop.map(api::Stop::into_vec).unwrap_or_default();
    api::check_stop(&stop)?;
    let max_tokens = budget(
        &st,
        Some(r.max_tokens.unwrap_or(16)),
        prompt.len(),
        "max_tokens",
    )?;
    let sampling = Sampling {
        max_tokens: r.max_tokens,
        temperature: r.temperature,
        top_p: r.top_p,
        top_k: r.top_k,
        min_p: r.min_p,
        repetition_penalty: r.repetition_penalty,
        presence_penalty: r.presence_penalty,
        frequency_penalty: r.frequency_penalty,
        seed: r.seed,
        stop: stop.clone(),
    };
    let prepared = Prepared {
        prompt,
        // A raw prompt marks no conversation.
        history: None,
        params: GenerateParams {
            max_tokens,
            sampler: sampling.config()?,
            stop_strings: stop,
            lookup: st.config.lookup.then(LookupConfig::default),
            ..GenerateParams::default()
        },
        constraint: scripted(&st, &prompt_text)?,
        logprobs: r.logprobs.map(|n| n as usize),
    };
    let want_logprobs = r.logprobs.is_some();
    let include_usage = r.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let id = request_id("cmpl");
    let (rx, guard) = submit(&st, prepared)?;
    if r.stream != Some(true) {
        let _guard = guard;
        let mut text = String::new();
        let mut lps = Vec::new();
        let mut end = relay::collect(&st, rx, |t, l| {
            text.push_str(&t);
            lps.extend(l);
        })
        .await?;
        lps.extend(std::mem::take(&mut end.logprobs));
        let mut off = 0;
        let body = json!({
            "id": id, "object": "text_completion", "created": now_s(),
            "model": st.config.model_id, "system_fingerprint": fingerprint(),
            "choices": [{"index": 0, "text": text,
                "logprobs": if want_logprobs { completion_logprobs(&st, &lps, &mut off) } else { Value::Null },
                "finish_reason": finish_name(end.finish, false)}],
            "usage": usage(&end),
        });
        return Ok(Json(body).into_response());
    }
    let chunks = TextChunks {
        env: Envelope::new(&st, id, "text_completion", include_usage),
        st: st.clone(),
        want_logprobs,
        offset: 0,
    };
    Ok(relay::stream(st, rx, guard, chunks))
}

/// A streamed completion's chunks: its text as it comes, with the log-probabilities of the
/// tokens behind it (their text offsets counted over the whole stream).
struct TextChunks {
    env: Envelope,
    st: Arc<AppState>,
    want_logprobs: bool,
    offset: usize,
}

impl TextChunks {
    fn chunk(&mut self, text: &str, lps: &[TokenLogprob], finish: Value) -> Value {
        let lp = if self.want_logprobs {
            completion_logprobs(&self.st, lps, &mut self.offset)
        } else {
            Value::Null
        };
        self.env
            .chunk(json!({"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}))
    }
}

impl Chunks for TextChunks {
    fn text(&mut self, text: String, logprobs: Vec<TokenLogprob>) -> Vec<Value> {
        vec![self.chunk(&text, &logprobs, Value::Null)]
    }

    fn done(mut self, end: Ended) -> Vec<Value> {
        let finish = json!(finish_name(end.finish, false));
        let mut out = vec![self.chunk("", &end.logprobs, finish)];
        out.extend(self.env.usage(&end));
        out
    }
}

// ---------------------------------------------------------------------------------------------
// Tokenizer endpoints
