//! Chat templates: minijinja set up to render like Hugging Face's `apply_chat_template`.

use minijinja::value::{Kwargs, Value};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State};

use crate::error::TokenizerError;
use crate::pyfmt;

const TEMPLATE_NAME: &str = "chat";
/// Marks errors that come from the template's own `raise_exception`.
const RAISE_MARKER: &str = "\u{1}raise_exception\u{1}";

/// A conversation to turn into a prompt. Messages are OpenAI-shaped JSON objects: `role`,
/// `content` (string or list of parts), and for assistants optionally `reasoning_content` and
/// `tool_calls`.
#[derive(Debug, Clone, Default)]
pub struct ChatRequest {
    pub messages: Vec<serde_json::Value>,
    /// Tool definitions (`{"type": "function", "function": {...}}`).
    pub tools: Option<Vec<serde_json::Value>>,
    /// End the prompt with the assistant header so the model writes the reply.
    pub add_generation_prompt: bool,
    /// Qwen's thinking switch; `None` leaves it undefined (the template's default: thinking on).
    pub enable_thinking: Option<bool>,
    /// Other `chat_template_kwargs`, passed to the template as top-level variables.
    pub extra: serde_json::Map<String, serde_json::Value>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
}

impl ChatTemplate {
    /// Compiles a Jinja chat template (e.g. GGUF `tokenizer.chat_template`).
    pub fn new(source: &str) -> Result<Self, TokenizerError> {
        let mut env = Environment::new();
        // Hugging Face: jinja2 with trim_blocks and lstrip_blocks, no autoescape, the single
        // trailing newline of the source dropped.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, _state, value| {
            // Printing follows Python's str(): True/False/None, repr inside containers.
            out.write_str(&pyfmt::py_str(value))
                .map_err(|_| Error::new(ErrorKind::WriteFailure, "write failed"))
        });
        env.add_filter("tojson", tojson);
        env.add_filter("string", |v: Value| pyfmt::py_str(&v));
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| TokenizerError::Template(describe(&e)))?;
        Ok(ChatTemplate { env })
    }

    /// The built-in Qwen3.5 ChatML template, for files without `tokenizer.chat_template`.
    pub fn builtin_qwen35() -> Self {
        match Self::new(BUILTIN_QWEN35) {
            Ok(t) => t,
            // The built-in source is a constant that the tests compile.
            Err(e) => panic!("built-in chat template does not compile: {e}"),
        }
    }

    /// The source of the built-in template.
    pub fn builtin_qwen35_source() -> &'static str {
        BUILTIN_QWEN35
    }

    /// The template of a tokenizer's file, or the built-in one when the file has none.
    pub fn for_tokenizer(tokenizer: &crate::Tokenizer) -> Result<Self, TokenizerError> {
        match tokenizer.chat_template() {
            Some(src) if !src.trim().is_empty() => Self::new(src),
            _ => Ok(Self::builtin_qwen35()),
        }
    }

    /// Renders the prompt text.
    pub fn render(&self, req: &ChatRequest) -> Result<String, TokenizerError> {
        let mut ctx = serde_json::Map::new();
        for (k, v) in &req.extra {
            ctx.insert(k.clone(), v.clone());
        }
        let messages: Vec<serde_json::Value> = req.messages.iter().map(normalize_message).collect();
        ctx.insert("messages".into(), messages.into());
        ctx.insert(
            "tools".into(),
            req.tools
                .clone()
                .map_or(serde_json::Value::Null, Into::into),
        );
        ctx.insert("documents".into(), serde_json::Value::Null);
        ctx.insert(
            "add_generation_prompt".into(),
            req.add_generation_prompt.into(),
        );
        if let Some(b) = req.enable_thinking {
            ctx.insert("enable_thinking".into(), b.into());
        }
        if let Some(t) = &req.bos_token {
            ctx.insert("bos_token".into(), t.clone().into());
        }
        if let Some(t) = &req.eos_token {
            ctx.insert("eos_token".into(), t.clone().into());
        }
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TokenizerError::Template(describe(&e)))?;
        tmpl.render(Value::from_serialize(&ctx))
            .map_err(|e| match raised_message(&e) {
                Some(msg) => TokenizerError::TemplateException(msg),
                None => TokenizerError::Template(describe(&e)),
            })
    }
}

/// What Hugging Face and llama.cpp do to messages before rendering:
/// * the reasoning may arrive as `reasoning` or `thinking`; templates read `reasoning_content`
///   (transformers copies it into both `thinking` and `reasoning_content`);
/// * OpenAI sends tool-call `arguments` as a JSON string; templates iterate them as a mapping.
fn normalize_message(msg: &serde_json::Value) -> serde_json::Value {
    let serde_json::Value::Object(m) = msg else {
        return msg.clone();
    };
    let reasoning = ["reasoning_content", "thinking", "reasoning"]
        .iter()
        .find_map(|k| m.get(*k).filter(|v| !v.is_null()))
        .cloned();
    let mut out = serde_json::Map::new();
    if let Some(r) = &reasoning {
        out.insert("thinking".into(), r.clone());
    }
    for (k, v) in m {
        out.insert(k.clone(), v.clone());
    }
    if let Some(r) = reasoning {
        out.insert("reasoning_content".into(), r);
    }
    if let Some(serde_json::Value::Array(calls)) = out.get_mut("tool_calls") {
        for call in calls {
            let target = match call.get_mut("function") {
                Some(f) => f,
                None => call,
            };
            if let Some(args) = target.get_mut("arguments") {
                if let serde_json::Value::String(s) = args {
                    if let Ok(parsed @ serde_json::Value::Object(_)) = serde_json::from_str(s) {
                        *args = parsed;
                    }
                }
            }
        }
    }
    serde_json::Value::Object(out)
}

/// Hugging Face's `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, with no HTML escaping (unlike jinja2's and minijinja's own filter).
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let bad = |what: &str| Error::new(ErrorKind::InvalidOperation, format!("tojson: {what}"));
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(n.max(0) as usize)),
            (None, Some(s)) => Some(s.to_owned()),
            _ => return Err(bad("indent must be an integer or a string")),
        },
    };
    let separators = match separators {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] => match (a.as_str(), b.as_str()) {
                    (Some(a), Some(b)) => Some((a.to_owned(), b.to_owned())),
                    _ => return Err(bad("separators must be two strings")),
                },
                _ => return Err(bad("separators must be two strings")),
            }
        }
    };
    let opts = pyfmt::JsonOptions {
        indent,
        separators,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    pyfmt::json_dumps(value, &opts).map(Value::from_safe_string)
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISE_MARKER}{msg}"),
    ))
}

fn strftime_now(_state: &State, fmt: String) -> String {
    pyfmt::strftime(&pyfmt::DateTime::now_utc(), &fmt)
}

/// The message given to `raise_exception`, if that is where the error came from.
fn raised_message(e: &Error) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(me) = err.downcast_ref::<Error>() {
            if let Some(msg) = me.detail().and_then(|d| d.strip_prefix(RAISE_MARKER)) {
                return Some(msg.to_owned());
            }
        }
        cur = err.source();
    }
    None
}

/// The error with its chain and template location.
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut cur = std::error::Error::source(e);
    while let Some(err) = cur {
        s.push_str(": ");
        s.push_str(&err.to_string());
        cur = err.source();
    }
    s
}

/// Qwen3.5's ChatML prompt format, written for this crate. For text conversations, reasoning
/// and tool calls it renders what the model's own template does.
const BUILTIN_QWEN35: &str = include_str!("qwen35_chat.jinja");

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(src: &str, ctx: serde_json::Value) -> Result<String, TokenizerError> {
        let t = ChatTemplate::new(src)?;
        let serde_json::Value::Object(extra) = ctx else {
            unreachable!()
        };
        t.render(&ChatRequest {
            extra,
            ..ChatRequest::default()
        })
    }

    #[test]
    fn tojson_does_not_html_escape_and_uses_python_separators() {
        let out = render(
            "{{ x | tojson }}",
            json!({"x": {"a": "<b>&'c'", "n": [1, 2]}}),
        )
        .unwrap();
        assert_eq!(out, r#"{"a": "<b>&'c'", "n": [1, 2]}"#);
    }

    #[test]
    fn tojson_accepts_json_dumps_keyword_arguments() {
        let out = render(
            "{{ x | tojson(indent=2, sort_keys=true) }}|{{ x | tojson(separators=(',', ':')) }}",
            json!({"x": {"b": 1, "a": [true]}}),
        )
        .unwrap();
        assert_eq!(
            out,
            "{\n  \"a\": [\n    true\n  ],\n  \"b\": 1\n}|{\"b\":1,\"a\":[true]}"
        );
    }

    #[test]
    fn python_string_methods_work() {
        let out = render(
            "{{ s.strip().split(',')[1] }}|{{ s.startswith('  a') }}|{{ s.rstrip() ~ '!' }}",
            json!({"s": "  a,b,c  "}),
        )
        .unwrap();
        assert_eq!(out, "b|True|  a,b,c!");
    }

    #[test]
    fn raise_exception_is_a_template_exception_error() {
        let err = render("{{ raise_exception('bad ' ~ x) }}", json!({"x": 1})).unwrap_err();
        match err {
            TokenizerError::TemplateException(m) => assert_eq!(m, "bad 1"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn raise_exception_inside_a_macro_is_still_recognised() {
        let src = "{% macro m() %}{{ raise_exception('deep') }}{% endmacro %}{{ m() }}";
        assert!(matches!(
            render(src, json!({})),
            Err(TokenizerError::TemplateException(m)) if m == "deep"
        ));
    }

    #[test]
    fn syntax_errors_are_reported_at_compile_time() {
        assert!(matches!(
            ChatTemplate::new("{% if %}"),
            Err(TokenizerError::Template(_))
        ));
    }

    #[test]
    fn trim_and_lstrip_blocks_like_hugging_face() {
        let out = render("a\n  {% if true %}\nb\n  {% endif %}\nc\n", json!({})).unwrap();
        assert_eq!(out, "a\nb\nc");
    }

    #[test]
    fn namespace_previtem_and_reverse_slicing() {
        let src = "{% set ns = namespace(n=0) %}{% for x in xs[::-1] %}{% if loop.previtem %}{% set ns.n = ns.n + loop.previtem %}{% endif %}{% endfor %}{{ ns.n }}";
        assert_eq!(render(src, json!({"xs": [1, 2, 3]})).unwrap(), "5");
    }

    #[test]
    fn strftime_now_formats_the_current_date() {
        let out = render("{{ strftime_now('%Y-%m-%d') }}", json!({})).unwrap();
        assert_eq!(out.len(), 10);
        assert_eq!(&out[4..5], "-");
    }

    #[test]
    fn string_tool_arguments_are_parsed_into_mappings() {
        let m = normalize_message(&json!({
            "role": "assistant",
            "tool_calls": [{"function": {"name": "f", "arguments": "{\"a\": 1}"}}]
        }));
        assert_eq!(m["tool_calls"][0]["function"]["arguments"], json!({"a": 1}));
    }

    #[test]
    fn reasoning_aliases_fill_reasoning_content() {
        let m = normalize_message(&json!({"role": "assistant", "reasoning": "r", "content": "c"}));
        assert_eq!(m["reasoning_content"], "r");
        assert_eq!(m["thinking"], "r");
    }
}
