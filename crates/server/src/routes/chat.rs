//! `/v1/chat/completions`: the chat template applied, reasoning and tool calls parsed, whole or
//! streamed.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
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

use super::relay::{self, Chunks, Ended, Envelope};
use super::request::{
    budget, check_model, fingerprint, finish_name, finite, now_s, parse_body, request_id, scripted,
    submit, token_text, usage, with_bos, CancelOnDrop, Prepared,
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
    let history = st
        .keeps_conversations
        .then(|| history_len(st, &req, &text, &prompt))
        .flatten();
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
            history,
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
        let chunks = ChatChunks {
            env: Envelope::new(&st, id, "chat.completion.chunk", plan.include_usage),
            st: st.clone(),
            parser,
            want_logprobs: plan.want_logprobs,
            had_calls: false,
        };
        Ok(relay::stream(st, rx, guard, chunks))
    } else {
        chat_once(&st, id, parser, rx, guard, plan.want_logprobs).await
    }
}

/// How many of `prompt`'s first tokens (`text` encoded) are the conversation up to its last
/// message, without the reply's opening: what the conversation's next request starts with,
/// however it renders this reply. None where that render fails or does not lead the prompt.
/// Where the opening starts with a special token (as the Qwen template's does), the count
/// comes from the prompt's tokens without encoding the conversation a second time (~13 ms for
/// 11k tokens).
fn history_len(
    st: &AppState,
    req: &tokenizer::ChatRequest,
    text: &str,
    prompt: &[u32],
) -> Option<usize> {
    let head = st
        .template
        .render(&tokenizer::ChatRequest {
            add_generation_prompt: false,
            ..req.clone()
        })
        .ok()?;
    if let Some(n) = st.tok.head_len(text, &head, prompt) {
        return Some(n);
    }
    let ids = with_bos(st, st.tok.encode(&head, true).ok()?);
    (ids.len() < prompt.len() && prompt.starts_with(&ids)).then_some(ids.len())
}

async fn chat_once(
    st: &Arc<AppState>,
    id: String,
    mut parser: OutputParser,
    rx: mpsc::UnboundedReceiver<Event>,
    _guard: CancelOnDrop,
    want_logprobs: bool,
) -> Result<Response, ApiError> {
    let mut reasoning = String::new();
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut lps: Vec<TokenLogprob> = Vec::new();
    let mut take = |ds: Vec<Delta>| {
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
    let mut end = relay::collect(st, rx, |t, l| {
        lps.extend(l);
        take(parser.push(&t));
    })
    .await?;
    lps.extend(std::mem::take(&mut end.logprobs));
    take(parser.finish());
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
            "finish_reason": finish_name(end.finish, !calls.is_empty()),
        }],
        "usage": usage(&end),
    });
    Ok(Json(body).into_response())
}

/// A streamed chat completion's chunks: the assistant's role first, then the parser's deltas
/// (reasoning, content, tool calls) as the text comes, each with the log-probabilities of the
/// tokens behind it.
struct ChatChunks {
    env: Envelope,
    st: Arc<AppState>,
    parser: OutputParser,
    want_logprobs: bool,
    had_calls: bool,
}

impl ChatChunks {
    fn chunk(&self, delta: Value, lp: Value, finish: Value) -> Value {
        self.env
            .chunk(json!({"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}))
    }

    fn deltas(&mut self, ds: Vec<Delta>, lps: &[TokenLogprob]) -> Vec<Value> {
        let mut lp = if self.want_logprobs && !lps.is_empty() {
            chat_logprobs(&self.st, lps)
        } else if self.want_logprobs {
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
                    self.had_calls = true;
                    json!({"tool_calls": [{"index": c.index, "id": c.id, "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments}}]})
                }
            };
            out.push(self.chunk(delta, std::mem::take(&mut lp), Value::Null));
        }
        // Log-probabilities of tokens whose text is still held back ride on an empty delta.
        if self.want_logprobs
            && !lp.is_null()
            && lp["content"].as_array().is_some_and(|a| !a.is_empty())
        {
            out.push(self.chunk(json!({}), lp, Value::Null));
        }
        out
    }
}

impl Chunks for ChatChunks {
    fn first(&mut self) -> Vec<Value> {
        vec![self.chunk(
            json!({"role": "assistant", "content": ""}),
            Value::Null,
            Value::Null,
        )]
    }

    fn text(&mut self, text: String, logprobs: Vec<TokenLogprob>) -> Vec<Value> {
        let ds = self.parser.push(&text);
        self.deltas(ds, &logprobs)
    }

    fn done(mut self, end: Ended) -> Vec<Value> {
        let ds = self.parser.finish();
        let mut out = self.deltas(ds, &end.logprobs);
        let finish = json!(finish_name(end.finish, self.had_calls));
        out.push(self.chunk(json!({}), Value::Null, finish));
        out.extend(self.env.usage(&end));
        out
    }
}
