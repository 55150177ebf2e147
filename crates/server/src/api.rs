//! The request bodies of the OpenAI API as this server accepts them. Every field OpenAI defines
//! is either honoured or refused with a 400 that says so; fields OpenAI does not define are
//! refused too, so a typo never silently changes nothing.

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::ApiError;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
    #[serde(default)]
    pub continuous_usage_stats: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    pub name: Option<String>,
    pub description: Option<String>,
    pub schema: Option<Value>,
    pub strict: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatCompletionRequest {
    pub model: String,
    pub messages: Vec<Value>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
    pub n: Option<u32>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub response_format: Option<ResponseFormat>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    pub logit_bias: Option<Map<String, Value>>,
    pub user: Option<String>,
    pub store: Option<bool>,
    pub metadata: Option<Value>,
    pub service_tier: Option<String>,
    pub reasoning_effort: Option<String>,
    pub modalities: Option<Vec<String>>,
    pub audio: Option<Value>,
    pub prediction: Option<Value>,
    pub web_search_options: Option<Value>,
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: Value,
    pub max_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    /// The number of alternatives to report per token (the legacy API's integer form).
    pub logprobs: Option<u32>,
    pub n: Option<u32>,
    pub best_of: Option<u32>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub logit_bias: Option<Map<String, Value>>,
    pub user: Option<String>,
}

/// What both endpoints ask of the sampler and the stop conditions.
pub struct Sampling {
    pub max_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Vec<String>,
}

/// OpenAI's limits on stop sequences.
pub const MAX_STOP_STRINGS: usize = 4;
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// Refuses `n` other than 1: one choice per request.
pub fn check_n(n: Option<u32>) -> Result<(), ApiError> {
    match n {
        None | Some(1) => Ok(()),
        Some(k) => Err(ApiError::unsupported(
            "n",
            format!("n = {k} is not supported: this server returns one choice per request (n = 1)"),
        )),
    }
}

pub fn check_logit_bias(b: &Option<Map<String, Value>>) -> Result<(), ApiError> {
    match b {
        Some(m) if !m.is_empty() => Err(ApiError::unsupported(
            "logit_bias",
            "logit_bias is not supported by this server",
        )),
        _ => Ok(()),
    }
}

pub fn check_stop(stop: &[String]) -> Result<(), ApiError> {
    if stop.len() > MAX_STOP_STRINGS {
        return Err(ApiError::bad_param(
            "stop",
            format!(
                "stop has {} sequences; at most {MAX_STOP_STRINGS} are allowed",
                stop.len()
            ),
        ));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::bad_param(
            "stop",
            "stop sequences must not be empty",
        ));
    }
    Ok(())
}

impl Sampling {
    /// The sampler settings, validated. Defaults: OpenAI's temperature 1 and top_p 1, no top-k.
    pub fn config(&self) -> Result<engine::SamplerConfig, ApiError> {
        let c = engine::SamplerConfig {
            temperature: self.temperature.unwrap_or(1.0),
            top_k: match self.top_k {
                None => 0,
                Some(k) if k <= 0 => 0,
                Some(k) => k as usize,
            },
            top_p: self.top_p.unwrap_or(1.0),
            min_p: self.min_p.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            penalty_window: 0,
            seed: match self.seed {
                Some(s) => s as u64,
                None => fresh_seed(),
            },
        };
        if self.temperature.is_some_and(|t| t > 2.0) {
            return Err(ApiError::bad_param(
                "temperature",
                "temperature must be between 0 and 2",
            ));
        }
        c.validate().map_err(|e| {
            let param = e.to_string();
            let name = param.split(' ').next().unwrap_or("").to_string();
            ApiError::bad_param(&name, param)
        })?;
        Ok(c)
    }
}

/// A seed for requests that give none: different every time, as OpenAI's sampling is.
fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ NEXT.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
}

/// Checks the messages' shape before the template sees them, so errors name the message.
pub fn check_messages(messages: &[Value]) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_param(
            "messages",
            "messages must contain at least one message",
        ));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let Some(obj) = m.as_object() else {
            return Err(ApiError::bad_param(
                &format!("messages[{i}]"),
                format!("messages[{i}] must be an object with a role and content"),
            ));
        };
        let role = obj.get("role").and_then(Value::as_str).ok_or_else(|| {
            ApiError::bad_param(
                &format!("messages[{i}].role"),
                format!("messages[{i}] has no role"),
            )
        })?;
        let mut obj = obj.clone();
        match role {
            "system" | "user" | "assistant" | "tool" => {}
            // OpenAI's newer name for system instructions.
            "developer" => {
                obj.insert("role".into(), "system".into());
            }
            other => {
                return Err(ApiError::bad_param(
                    &format!("messages[{i}].role"),
                    format!("messages[{i}].role {other:?} is not one of system, developer, user, assistant, tool"),
                ))
            }
        }
        match obj.get("content") {
            Some(Value::String(_)) => {}
            Some(Value::Null) | None if role == "assistant" => {}
            Some(Value::Array(parts)) => {
                for (j, p) in parts.iter().enumerate() {
                    let is_text = p.get("type").and_then(Value::as_str) == Some("text")
                        && p.get("text").is_some_and(Value::is_string);
                    if !is_text {
                        return Err(ApiError::unsupported(
                            &format!("messages[{i}].content[{j}]"),
                            format!("messages[{i}].content[{j}]: only text parts are supported"),
                        ));
                    }
                }
            }
            _ => {
                return Err(ApiError::bad_param(
                    &format!("messages[{i}].content"),
                    format!("messages[{i}].content must be a string or a list of text parts"),
                ))
            }
        }
        out.push(Value::Object(obj));
    }
    Ok(out)
}

/// The text of the last user message (what scripted replies match on).
pub fn last_user_text(messages: &[Value]) -> String {
    let Some(m) = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
    else {
        return String::new();
    };
    match m.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// How the request wants tools handled.
pub enum ToolChoice {
    /// No tools, or `"none"`: tool-call text stays text.
    None,
    Auto,
}

pub fn tool_choice(
    tools: &Option<Vec<Value>>,
    choice: &Option<Value>,
) -> Result<ToolChoice, ApiError> {
    let has_tools = tools.as_ref().is_some_and(|t| !t.is_empty());
    if let Some(t) = tools {
        for (i, tool) in t.iter().enumerate() {
            let ok = tool.get("type").and_then(Value::as_str) == Some("function")
                && tool
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .is_some_and(Value::is_string);
            if !ok {
                return Err(ApiError::bad_param(
                    &format!("tools[{i}]"),
                    format!("tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"),
                ));
            }
        }
    }
    match choice {
        None => Ok(if has_tools {
            ToolChoice::Auto
        } else {
            ToolChoice::None
        }),
        Some(Value::String(s)) if s == "none" => Ok(ToolChoice::None),
        Some(Value::String(s)) if s == "auto" => Ok(if has_tools {
            ToolChoice::Auto
        } else {
            ToolChoice::None
        }),
        Some(other) => Err(ApiError::unsupported(
            "tool_choice",
            format!("tool_choice {other} is not supported: use \"auto\" or \"none\""),
        )),
    }
}
