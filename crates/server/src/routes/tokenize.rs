//! `/tokenize` and `/detokenize`.

use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use crate::api;
use crate::error::ApiError;

use super::request::{check_model, parse_body, with_bos};
use super::St;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizeRequest {
    model: Option<String>,
    content: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<Value>>,
    #[serde(default)]
    add_special: bool,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
}

pub(super) async fn tokenize(
    State(st): St,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let r: TokenizeRequest = parse_body(body)?;
    if let Some(m) = &r.model {
        check_model(&st, m)?;
    }
    let ids = match (r.content.or(r.prompt), r.messages) {
        (Some(text), None) => {
            let ids = st
                .tok
                .encode(&text, r.add_special)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            if r.add_special {
                with_bos(&st, ids)
            } else {
                ids
            }
        }
        (None, Some(messages)) => {
            let messages = api::check_messages(&messages)?;
            let req = tokenizer::ChatRequest {
                messages,
                add_generation_prompt: r.add_generation_prompt.unwrap_or(true),
                ..Default::default()
            };
            let text = st
                .template
                .render(&req)
                .map_err(|e| ApiError::bad_param("messages", e.to_string()))?;
            with_bos(
                &st,
                st.tok
                    .encode(&text, true)
                    .map_err(|e| ApiError::bad_request(e.to_string()))?,
            )
        }
        _ => {
            return Err(ApiError::bad_request(
                "give exactly one of content (or prompt) and messages",
            ))
        }
    };
    Ok(Json(json!({
        "tokens": ids,
        "count": ids.len(),
        "max_model_len": st.model_config.context_length,
    })))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DetokenizeRequest {
    model: Option<String>,
    tokens: Vec<u32>,
}

pub(super) async fn detokenize(
    State(st): St,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let r: DetokenizeRequest = parse_body(body)?;
    if let Some(m) = &r.model {
        check_model(&st, m)?;
    }
    let text = st
        .tok
        .decode(&r.tokens)
        .map_err(|e| ApiError::bad_param("tokens", e.to_string()))?;
    Ok(Json(json!({"content": text, "prompt": text})))
}
