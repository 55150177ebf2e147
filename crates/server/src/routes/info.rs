//! What the server says about itself: the chat page, health, metrics, the model and the policy.

use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::{AppState, DeviceKind};

use super::St;

pub(super) async fn index() -> impl IntoResponse {
    (
        [(header::CACHE_CONTROL, "no-store")],
        Html(include_str!("../web/index.html")),
    )
}

pub(super) async fn health(State(st): St) -> Response {
    if st.ready.load(Ordering::Acquire) {
        Json(json!({"status": "ok", "model": st.config.model_id})).into_response()
    } else {
        ApiError::unavailable("shutting down").into_response()
    }
}

pub(super) async fn metrics(State(st): St) -> impl IntoResponse {
    st.metrics.in_flight.set(st.scheduler.in_flight() as i64);
    st.metrics
        .state_bytes
        .set(st.scheduler.state_bytes() as i64);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        st.metrics.render(),
    )
}

fn model_card(st: &AppState) -> Value {
    json!({
        "id": st.config.model_id,
        "object": "model",
        "created": st.created,
        "owned_by": "niwaki",
        "max_model_len": st.model_config.context_length,
    })
}

pub(super) async fn models(State(st): St) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_card(&st)]}))
}

pub(super) async fn model_by_id(
    State(st): St,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<Value>, ApiError> {
    if id != st.config.model_id {
        return Err(ApiError::model_not_found(&id));
    }
    Ok(Json(model_card(&st)))
}

pub(super) async fn policy(State(st): St) -> Json<Value> {
    Json(policy_json(&st))
}

/// Every runtime decision and the rule behind it.
fn policy_json(st: &AppState) -> Value {
    let c = &st.model_config;
    let d = &st.device;
    let slots_rule = match d.kind {
        DeviceKind::Cpu => "requests generating at once (--parallel); each has its own sequence state",
        DeviceKind::Cuda => "one request generates on the GPU at a time, with a fresh device state; the others wait in the queue in arrival order",
    };
    json!({
        "device": {"value": d.kind.as_str(), "name": d.name, "rule": d.rule},
        "backend": {"value": d.kind.as_str(), "rule": backend_rule(d.kind)},
        "threads": {"value": st.config.threads, "rule": st.config.threads_rule},
        "context": {"value": c.context_length, "rule": st.config.context_rule},
        "slots": {"value": st.scheduler.slots(), "rule": slots_rule,
                  "measured_decode_step_s": st.decode_step_s, "measured_new_state_s": st.new_state_s},
        "queue": {"value": st.scheduler.capacity() - st.scheduler.slots(), "rule": "requests that may wait for a slot (--queue); past it, 503 with Retry-After"},
        "speculation": speculation(st),
        "conversation_cache": conversation_cache(st),
        "prefill_chunk": {"value": engine::DEFAULT_PREFILL_CHUNK, "rule": "engine default: prompts run in passes of this many tokens, then the rest; weights are read once a pass"},
        "sequence_state_bytes_max": {"value": d.state_bytes(c.context_length), "rule": d.state_rule},
        "sequence_checkpoint_bytes": {"value": d.checkpoint_bytes, "rule": "a saved point of a sequence (its recurrent state): a slot keeping its sequence holds one at its empty start and one after its kept conversation"},
        "request_timeout_s": {"value": st.config.request_timeout.as_secs_f64(), "rule": "--request-timeout: a generation running longer ends with finish_reason length"},
        "max_body_bytes": {"value": st.config.max_body_bytes, "rule": "larger request bodies get 413"},
        "thinking_with_json_output": {"value": "off", "rule": "response_format json_object/json_schema turns thinking off so the whole reply follows the grammar"},
        "default_sampling": {"value": {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}, "rule": "OpenAI's defaults; requests set their own"},
    })
}

fn speculation(st: &AppState) -> Value {
    if st.config.lookup {
        json!({"value": "prompt lookup", "rule": "--lookup: greedy requests without logprobs or a grammar draft up to 8 tokens from the conversation and verify them a pass at a time; the same replies"})
    } else {
        json!({"value": "off", "rule": "a token a pass (serve --lookup drafts by prompt lookup for greedy requests on the CPU)"})
    }
}

fn conversation_cache(st: &AppState) -> Value {
    if st.keeps_conversations {
        json!({"value": "on", "rule": "each slot keeps its sequence saved after the last chat request's messages (without the reply's opening), and a conversation's next request goes to the idle slot keeping it: a prompt that starts with those tokens goes on from there (usage.prompt_tokens_details.cached_tokens counts them), the same reply as from empty on the CPU, whose passes give the same bits however a prompt is cut; on the GPU a pass's kernels depend on its length, so the logits may differ in their last bits as for any prompt cut otherwise; an idle slot holds that conversation's cache and two sequence checkpoints (serve --no-conversation-cache: none)"})
    } else {
        json!({"value": "off", "rule": "every request prefills its whole prompt (serve --no-conversation-cache, or a device whose slots do not keep their sequences)"})
    }
}

fn backend_rule(kind: DeviceKind) -> &'static str {
    match kind {
        DeviceKind::Cpu => "the CPU backend, always built in; --device cuda picks the GPU in binaries built with the cuda feature",
        DeviceKind::Cuda => "the CUDA backend (weights on the GPU, kernels compiled at first use with NVRTC)",
    }
}

// ---------------------------------------------------------------------------------------------
// Bodies
