//! HTTP handlers.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use engine::logprobs::TokenLogprob;
use engine::GenerateParams;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::api::{self, ChatCompletionRequest, CompletionRequest, ResponseFormat, Sampling};
use crate::constraint::{Constraint, Forced};
use crate::error::ApiError;
use crate::output::{Delta, OutputParser};
use crate::scheduler::{Event, Finish, Job, Refused};
use crate::{AppState, DeviceKind};

type St = State<Arc<AppState>>;

pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.config.max_body_bytes;
    Router::new()
        .route("/", get(index))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model_by_id))
        .route("/v1/policy", get(policy))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(state.clone(), count))
        .with_state(state)
}

/// Counts every answer by endpoint and status.
async fn count(State(st): St, req: Request, next: Next) -> Response {
    let path = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("other", |p| p.as_str())
        .to_string();
    let resp = next.run(req).await;
    st.metrics.count_request(&path, resp.status().as_u16());
    resp
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such endpoint")
}

async fn index() -> impl IntoResponse {
    (
        [(header::CACHE_CONTROL, "no-store")],
        Html(include_str!("web/index.html")),
    )
}

async fn health(State(st): St) -> Response {
    if st.ready.load(Ordering::Acquire) {
        Json(json!({"status": "ok", "model": st.config.model_id})).into_response()
    } else {
        ApiError::unavailable("shutting down").into_response()
    }
}

async fn metrics(State(st): St) -> impl IntoResponse {
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

async fn models(State(st): St) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_card(&st)]}))
}

async fn model_by_id(
    State(st): St,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<Value>, ApiError> {
    if id != st.config.model_id {
        return Err(ApiError::model_not_found(&id));
    }
    Ok(Json(model_card(&st)))
}

async fn policy(State(st): St) -> Json<Value> {
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
        "speculation": {"value": "off", "rule": "the engine has no speculative decoding yet"},
        "prefill_chunk": {"value": engine::DEFAULT_PREFILL_CHUNK, "rule": "engine default: weights are read once per chunk of prompt tokens"},
        "sequence_state_bytes_max": {"value": d.state_bytes(c.context_length), "rule": d.state_rule},
        "request_timeout_s": {"value": st.config.request_timeout.as_secs_f64(), "rule": "--request-timeout: a generation running longer ends with finish_reason length"},
        "max_body_bytes": {"value": st.config.max_body_bytes, "rule": "larger request bodies get 413"},
        "thinking_with_json_output": {"value": "off", "rule": "response_format json_object/json_schema turns thinking off so the whole reply follows the grammar"},
        "default_sampling": {"value": {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}, "rule": "OpenAI's defaults; requests set their own"},
    })
}

fn backend_rule(kind: DeviceKind) -> &'static str {
    match kind {
        DeviceKind::Cpu => "the CPU backend, always built in; --device cuda picks the GPU in binaries built with the cuda feature",
        DeviceKind::Cuda => "the CUDA backend (weights on the GPU, kernels compiled at first use with NVRTC)",
    }
}

// ---------------------------------------------------------------------------------------------
// Bodies

fn parse_body<T: serde::de::DeserializeOwned>(
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

fn check_model(st: &AppState, model: &str) -> Result<(), ApiError> {
    if model == st.config.model_id {
        Ok(())
    } else {
        Err(ApiError::model_not_found(model))
    }
}

/// Token budget: what was asked (never more than the context), else what the context leaves.
fn budget(
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

fn with_bos(st: &AppState, mut ids: Vec<u32>) -> Vec<u32> {
    if st.tok.add_bos() {
        if let Some(b) = st.tok.bos_id() {
            ids.insert(0, b);
        }
    }
    ids
}

fn scripted(st: &AppState, text: &str) -> Result<Option<Box<dyn Constraint>>, ApiError> {
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

fn request_id(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(1);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    format!(
        "{prefix}-{t:x}{:04x}",
        N.fetch_add(1, Ordering::Relaxed) & 0xffff
    )
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Sets the cancel flag when dropped: the client went away (or the request is over).
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

struct Prepared {
    prompt: Vec<u32>,
    params: GenerateParams,
    constraint: Option<Box<dyn Constraint>>,
    logprobs: Option<usize>,
}

fn submit(
    st: &AppState,
    p: Prepared,
) -> Result<(mpsc::UnboundedReceiver<Event>, CancelOnDrop), ApiError> {
    let (tx, rx) = mpsc::unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let prompt_len = p.prompt.len();
    let job = Job {
        prompt: p.prompt,
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

fn finish_name(f: Finish, tool_calls: bool) -> &'static str {
    match f {
        Finish::Stop if tool_calls => "tool_calls",
        Finish::Stop | Finish::Cancelled => "stop",
        Finish::Length => "length",
    }
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

fn token_text(st: &AppState, id: u32) -> (String, Vec<u8>) {
    let bytes = st.tok.token_bytes(id).unwrap_or(&[]).to_vec();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

fn finite(x: f32) -> f32 {
    if x.is_finite() {
        x
    } else {
        -9999.0
    }
}

/// Chat `logprobs.content` entries.
fn chat_logprobs(st: &AppState, lps: &[TokenLogprob]) -> Value {
    let entries: Vec<Value> = lps
        .iter()
        .map(|t| {
            let (text, bytes) = token_text(st, t.id);
            let top: Vec<Value> = t
                .top
                .iter()
                .map(|&(id, lp)| {
                    let (tt, tb) = token_text(st, id);
                    json!({"token": tt, "logprob": finite(lp), "bytes": tb})
                })
                .collect();
            json!({"token": text, "logprob": finite(t.logprob), "bytes": bytes, "top_logprobs": top})
        })
        .collect();
    json!({"content": entries})
}

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

struct ChatPlan {
    prepared: Prepared,
    thinking: bool,
    tools: Option<Vec<Value>>,
    stream: bool,
    include_usage: bool,
    want_logprobs: bool,
}

fn plan_chat(st: &AppState, r: ChatCompletionRequest) -> Result<ChatPlan, ApiError> {
    check_model(st, &r.model)?;
    api::check_n(r.n)?;
    api::check_logit_bias(&r.logit_bias)?;
    if r.top_logprobs.is_some_and(|n| n > api::MAX_TOP_LOGPROBS) {
        return Err(ApiError::bad_param(
            "top_logprobs",
            format!("top_logprobs must be at most {}", api::MAX_TOP_LOGPROBS),
        ));
    }
    if r.top_logprobs.is_some() && r.logprobs != Some(true) {
        return Err(ApiError::bad_param(
            "top_logprobs",
            "top_logprobs needs logprobs: true",
        ));
    }
    if let Some(a) = &r.audio {
        if !a.is_null() {
            return Err(ApiError::unsupported(
                "audio",
                "audio output is not supported",
            ));
        }
    }
    if let Some(m) = &r.modalities {
        if m.iter().any(|x| x != "text") {
            return Err(ApiError::unsupported(
                "modalities",
                "only text output is supported",
            ));
        }
    }
    if r.prediction.is_some() {
        return Err(ApiError::unsupported(
            "prediction",
            "predicted outputs are not supported",
        ));
    }
    if r.web_search_options.is_some() {
        return Err(ApiError::unsupported(
            "web_search_options",
            "web search is not supported",
        ));
    }
    let messages = api::check_messages(&r.messages)?;
    let choice = api::tool_choice(&r.tools, &r.tool_choice)?;
    let use_tools = matches!(choice, api::ToolChoice::Auto);
    let stop = r.stop.map(api::Stop::into_vec).unwrap_or_default();
    api::check_stop(&stop)?;

    let mut kwargs = r.chat_template_kwargs.unwrap_or_default();
    let mut enable_thinking = match kwargs.remove("enable_thinking") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(b),
        Some(_) => {
            return Err(ApiError::bad_param(
                "chat_template_kwargs.enable_thinking",
                "enable_thinking must be true or false",
            ))
        }
    };
    let schema = match r.response_format {
        None | Some(ResponseFormat::Text) => None,
        Some(ResponseFormat::JsonObject) => Some(json!({"type": "object"})),
        Some(ResponseFormat::JsonSchema { json_schema }) => match json_schema.schema {
            Some(s) if s.is_object() => Some(s),
            Some(_) => {
                return Err(ApiError::bad_param(
                    "response_format.json_schema.schema",
                    "the schema must be a JSON object",
                ))
            }
            None => Some(json!({})),
        },
    };
    if schema.is_some() {
        // The whole reply must follow the grammar; a think block would not.
        enable_thinking = Some(false);
    }
    let req = tokenizer::ChatRequest {
        messages: messages.clone(),
        tools: if use_tools { r.tools.clone() } else { None },
        add_generation_prompt: true,
        enable_thinking,
        extra: kwargs,
        bos_token: None,
        eos_token: None,
    };
    let text = st.template.render(&req).map_err(|e| match e {
        tokenizer::TokenizerError::TemplateException(m) => ApiError::bad_param("messages", m),
        other => ApiError::bad_request(format!("the chat template failed: {other}")),
    })?;
    let thinking = text.trim_end().ends_with("<think>");
    let prompt = with_bos(
        st,
        st.tok
            .encode(&text, true)
            .map_err(|e| ApiError::bad_request(e.to_string()))?,
    );
    let asked = r.max_completion_tokens.or(r.max_tokens);
    let param = if r.max_completion_tokens.is_some() {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    let max_tokens = budget(st, asked, prompt.len(), param)?;
    let sampling = Sampling {
        max_tokens: asked,
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
    let constraint = match scripted(st, &api::last_user_text(&messages))? {
        Some(c) => Some(c),
        None => match schema {
            Some(s) => Some(Box::new(
                st.grammars()?
                    .json(s)
                    .map_err(|e| ApiError::bad_param("response_format", e))?,
            ) as Box<dyn Constraint>),
            None => None,
        },
    };
    let want_logprobs = r.logprobs == Some(true);
    Ok(ChatPlan {
        prepared: Prepared {
            prompt,
            params: GenerateParams {
                max_tokens,
                sampler: sampling.config()?,
                stop_strings: stop,
                ..GenerateParams::default()
            },
            constraint,
            logprobs: want_logprobs.then(|| r.top_logprobs.unwrap_or(0) as usize),
        },
        thinking,
        tools: if use_tools { r.tools } else { None },
        stream: r.stream == Some(true),
        include_usage: r.stream_options.is_some_and(|o| o.include_usage),
        want_logprobs,
    })
}

async fn chat(
    State(st): St,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ChatCompletionRequest = parse_body(body)?;
    let plan = plan_chat(&st, req)?;
    let id = request_id("chatcmpl");
    let parser = OutputParser::new(plan.thinking, plan.tools.clone(), &id);
    let (rx, guard) = submit(&st, plan.prepared)?;
    if plan.stream {
        Ok(chat_stream(
            st,
            id,
            parser,
            rx,
            guard,
            plan.include_usage,
            plan.want_logprobs,
        ))
    } else {
        chat_once(&st, id, parser, rx, guard, plan.want_logprobs).await
    }
}

async fn chat_once(
    st: &Arc<AppState>,
    id: String,
    mut parser: OutputParser,
    mut rx: mpsc::UnboundedReceiver<Event>,
    _guard: CancelOnDrop,
    want_logprobs: bool,
) -> Result<Response, ApiError> {
    let mut reasoning = String::new();
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut lps: Vec<TokenLogprob> = Vec::new();
    let mut take = |ds: Vec<Delta>, reasoning: &mut String, content: &mut String| {
        for d in ds {
            match d {
                Delta::Reasoning(t) => reasoning.push_str(&t),
                Delta::Content(t) => content.push_str(&t),
                Delta::ToolCall(c) => calls.push(json!({
                    "id": c.id, "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                })),
            }
        }
    };
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text(t, l) => {
                lps.extend(l);
                take(parser.push(&t), &mut reasoning, &mut content);
            }
            Event::Done {
                finish,
                prompt_tokens,
                completion_tokens,
                logprobs,
            } => {
                lps.extend(logprobs);
                take(parser.finish(), &mut reasoning, &mut content);
                st.metrics.generated_tokens.inc_by(completion_tokens as u64);
                let mut message = json!({
                    "role": "assistant",
                    "content": if content.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(content) },
                });
                if !reasoning.is_empty() {
                    message["reasoning_content"] = Value::String(reasoning);
                }
                if !calls.is_empty() {
                    message["tool_calls"] = Value::Array(calls.clone());
                }
                let body = json!({
                    "id": id,
                    "object": "chat.completion",
                    "created": now_s(),
                    "model": st.config.model_id,
                    "system_fingerprint": fingerprint(),
                    "choices": [{
                        "index": 0,
                        "message": message,
                        "logprobs": if want_logprobs { chat_logprobs(st, &lps) } else { Value::Null },
                        "finish_reason": finish_name(finish, !calls.is_empty()),
                    }],
                    "usage": usage(prompt_tokens, completion_tokens),
                });
                return Ok(Json(body).into_response());
            }
            Event::Failed(m) => return Err(generation_error(m)),
        }
    }
    Err(ApiError::internal("generation ended without a result"))
}

fn generation_error(m: String) -> ApiError {
    if m.contains("shutting down") {
        ApiError::unavailable(m)
    } else {
        ApiError::internal(m)
    }
}

fn fingerprint() -> String {
    format!("niwaki-{}", env!("CARGO_PKG_VERSION"))
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

fn chat_stream(
    st: Arc<AppState>,
    id: String,
    mut parser: OutputParser,
    mut rx: mpsc::UnboundedReceiver<Event>,
    guard: CancelOnDrop,
    include_usage: bool,
    want_logprobs: bool,
) -> Response {
    let (tx, out) = mpsc::channel::<Result<SseEvent, Infallible>>(64);
    tokio::spawn(async move {
        let _guard = guard;
        let created = now_s();
        let chunk = |delta: Value, lp: Value, finish: Value| {
            let mut c = json!({
                "id": id, "object": "chat.completion.chunk", "created": created,
                "model": st.config.model_id, "system_fingerprint": fingerprint(),
                "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}],
            });
            if include_usage {
                c["usage"] = Value::Null;
            }
            c
        };
        let first = chunk(
            json!({"role": "assistant", "content": ""}),
            Value::Null,
            Value::Null,
        );
        if tx.send(sse_json(&first)).await.is_err() {
            return;
        }
        let mut had_calls = false;
        let deltas_to_chunks = |ds: Vec<Delta>, lps: Vec<TokenLogprob>, had_calls: &mut bool| {
            let mut lp = if want_logprobs && !lps.is_empty() {
                chat_logprobs(&st, &lps)
            } else if want_logprobs {
                json!({"content": []})
            } else {
                Value::Null
            };
            let mut out = Vec::new();
            for d in ds {
                let delta = match d {
                    Delta::Reasoning(t) => json!({"reasoning_content": t}),
                    Delta::Content(t) => json!({"content": t}),
                    Delta::ToolCall(c) => {
                        *had_calls = true;
                        json!({"tool_calls": [{"index": c.index, "id": c.id, "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments}}]})
                    }
                };
                out.push(chunk(delta, std::mem::take(&mut lp), Value::Null));
            }
            // Log-probabilities of tokens whose text is still held back ride on an empty delta.
            if want_logprobs
                && !lp.is_null()
                && lp["content"].as_array().is_some_and(|a| !a.is_empty())
            {
                out.push(chunk(json!({}), lp, Value::Null));
            }
            out
        };
        while let Some(ev) = rx.recv().await {
            match ev {
                Event::Text(t, l) => {
                    for c in deltas_to_chunks(parser.push(&t), l, &mut had_calls) {
                        if tx.send(sse_json(&c)).await.is_err() {
                            return;
                        }
                    }
                }
                Event::Done {
                    finish,
                    prompt_tokens,
                    completion_tokens,
                    logprobs,
                } => {
                    st.metrics.generated_tokens.inc_by(completion_tokens as u64);
                    let mut chunks = deltas_to_chunks(parser.finish(), logprobs, &mut had_calls);
                    chunks.push(chunk(
                        json!({}),
                        Value::Null,
                        json!(finish_name(finish, had_calls)),
                    ));
                    if include_usage {
                        chunks.push(json!({
                            "id": id, "object": "chat.completion.chunk", "created": created,
                            "model": st.config.model_id, "system_fingerprint": fingerprint(),
                            "choices": [], "usage": usage(prompt_tokens, completion_tokens),
                        }));
                    }
                    for c in chunks {
                        if tx.send(sse_json(&c)).await.is_err() {
                            return;
                        }
                    }
                    let _ = tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
                    return;
                }
                Event::Failed(m) => {
                    let _ = tx.send(sse_json(&generation_error(m).body())).await;
                    return;
                }
            }
        }
    });
    sse_response(out)
}

// ---------------------------------------------------------------------------------------------
// Text completions

async fn completions(
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
        params: GenerateParams {
            max_tokens,
            sampler: sampling.config()?,
            stop_strings: stop,
            ..GenerateParams::default()
        },
        constraint: scripted(&st, &prompt_text)?,
        logprobs: r.logprobs.map(|n| n as usize),
    };
    let want_logprobs = r.logprobs.is_some();
    let include_usage = r.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let id = request_id("cmpl");
    let (mut rx, guard) = submit(&st, prepared)?;
    if r.stream != Some(true) {
        let _guard = guard;
        let mut text = String::new();
        let mut lps = Vec::new();
        while let Some(ev) = rx.recv().await {
            match ev {
                Event::Text(t, l) => {
                    text.push_str(&t);
                    lps.extend(l);
                }
                Event::Done {
                    finish,
                    prompt_tokens,
                    completion_tokens,
                    logprobs,
                } => {
                    lps.extend(logprobs);
                    st.metrics.generated_tokens.inc_by(completion_tokens as u64);
                    let mut off = 0;
                    return Ok(Json(json!({
                        "id": id, "object": "text_completion", "created": now_s(),
                        "model": st.config.model_id, "system_fingerprint": fingerprint(),
                        "choices": [{"index": 0, "text": text,
                            "logprobs": if want_logprobs { completion_logprobs(&st, &lps, &mut off) } else { Value::Null },
                            "finish_reason": finish_name(finish, false)}],
                        "usage": usage(prompt_tokens, completion_tokens),
                    }))
                    .into_response());
                }
                Event::Failed(m) => return Err(generation_error(m)),
            }
        }
        return Err(ApiError::internal("generation ended without a result"));
    }
    let (tx, out) = mpsc::channel::<Result<SseEvent, Infallible>>(64);
    tokio::spawn(async move {
        let _guard = guard;
        let created = now_s();
        let mut off = 0;
        let chunk = |text: &str, lp: Value, finish: Value| {
            let mut c = json!({
                "id": id, "object": "text_completion", "created": created,
                "model": st.config.model_id, "system_fingerprint": fingerprint(),
                "choices": [{"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}],
            });
            if include_usage {
                c["usage"] = Value::Null;
            }
            c
        };
        while let Some(ev) = rx.recv().await {
            match ev {
                Event::Text(t, l) => {
                    let lp = if want_logprobs {
                        completion_logprobs(&st, &l, &mut off)
                    } else {
                        Value::Null
                    };
                    if tx
                        .send(sse_json(&chunk(&t, lp, Value::Null)))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Event::Done {
                    finish,
                    prompt_tokens,
                    completion_tokens,
                    logprobs,
                } => {
                    st.metrics.generated_tokens.inc_by(completion_tokens as u64);
                    let lp = if want_logprobs {
                        completion_logprobs(&st, &logprobs, &mut off)
                    } else {
                        Value::Null
                    };
                    let _ = tx
                        .send(sse_json(&chunk("", lp, json!(finish_name(finish, false)))))
                        .await;
                    if include_usage {
                        let u = json!({
                            "id": id, "object": "text_completion", "created": created,
                            "model": st.config.model_id, "system_fingerprint": fingerprint(),
                            "choices": [], "usage": usage(prompt_tokens, completion_tokens),
                        });
                        let _ = tx.send(sse_json(&u)).await;
                    }
                    let _ = tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
                    return;
                }
                Event::Failed(m) => {
                    let _ = tx.send(sse_json(&generation_error(m).body())).await;
                    return;
                }
            }
        }
    });
    Ok(sse_response(out))
}

// ---------------------------------------------------------------------------------------------
// Tokenizer endpoints

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

async fn tokenize(
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

async fn detokenize(
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
