//! `/v1/chat/completions`: the chat template applied, reasoning and tool calls parsed, whole or
//! streamed.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use axum::Json;
use engine::logprobs::TokenLogprob;
use engine::{GenerateParams, LookupConfig};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::api::{self, ChatCompletionRequest, ResponseFormat, Sampling};
use crate::constraint::Constraint;
use crate::error::ApiError;
use crate::output::{Delta, OutputParser};
use crate::scheduler::Event;
use crate::AppState;

use super::request::{
    budget, check_model, fingerprint, finish_name, finite, generation_error, now_s, parse_body,
    request_id, scripted, sse_json, sse_response, submit, token_text, usage, with_bos,
    CancelOnDrop, Prepared,
};
use super::St;

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
                lookup: st.config.lookup.then(LookupConfig::default),
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

pub(super) async fn chat(
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
