//! Splitting the model's streamed text into what OpenAI clients expect: Qwen3.5's
//! `<think>…</think>` goes to `reasoning_content`, its XML tool calls
//! (`<tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n</function>\n</tool_call>`)
//! become `tool_calls`, and the rest is `content`. Text that may be the start of a tag is held
//! back until it is known not to be one, so no tag ever leaks into `content`, not even in part.

use serde_json::{Map, Value};

const THINK_END: &str = "</think>";
const TOOL_START: &str = "<tool_call>";
const TOOL_END: &str = "</tool_call>";

#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub index: usize,
    pub id: String,
    pub name: String,
    /// The arguments as a JSON object text.
    pub arguments: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Delta {
    Reasoning(String),
    Content(String),
    ToolCall(ToolCall),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Reasoning,
    Content,
    Tool,
}

/// Incremental parser of one reply.
pub struct OutputParser {
    mode: Mode,
    buf: String,
    /// Tool definitions (`function` objects) when tool calls are parsed at all.
    tools: Option<Vec<Value>>,
    /// Content seen so far is only whitespace (dropped at the start of content).
    content_started: bool,
    calls: usize,
    id_prefix: String,
}

impl OutputParser {
    /// `thinking`: the prompt ends inside an open `<think>` block. `tools`: the request's tool
    /// definitions, or `None` to leave tool-call text alone.
    pub fn new(thinking: bool, tools: Option<Vec<Value>>, id_prefix: &str) -> Self {
        OutputParser {
            mode: if thinking {
                Mode::Reasoning
            } else {
                Mode::Content
            },
            buf: String::new(),
            tools,
            content_started: false,
            calls: 0,
            id_prefix: id_prefix.to_string(),
        }
    }

    pub fn tool_calls(&self) -> usize {
        self.calls
    }

    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.mode {
                Mode::Reasoning => match self.buf.find(THINK_END) {
                    Some(at) => {
                        let before = self.buf[..at].trim_end().to_string();
                        self.buf.drain(..at + THINK_END.len());
                        push_text(&mut out, Delta::Reasoning(before));
                        self.mode = Mode::Content;
                    }
                    None => {
                        let keep = held_back(&self.buf, &[THINK_END]);
                        let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                        push_text(&mut out, Delta::Reasoning(text));
                        return out;
                    }
                },
                Mode::Content => {
                    if !self.content_started {
                        let trimmed = self.buf.trim_start().len();
                        self.buf.drain(..self.buf.len() - trimmed);
                        if self.buf.is_empty() {
                            return out;
                        }
                        self.content_started = true;
                    }
                    let tags: &[&str] = if self.tools.is_some() {
                        &[TOOL_START]
                    } else {
                        &[]
                    };
                    match tags.first().and_then(|t| self.buf.find(t)) {
                        Some(at) => {
                            let before = self.buf[..at].trim_end().to_string();
                            self.buf.drain(..at + TOOL_START.len());
                            push_text(&mut out, Delta::Content(before));
                            self.mode = Mode::Tool;
                        }
                        None => {
                            let keep = held_back(&self.buf, tags);
                            let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                            push_text(&mut out, Delta::Content(text));
                            return out;
                        }
                    }
                }
                Mode::Tool => match self.buf.find(TOOL_END) {
                    Some(at) => {
                        let body = self.buf[..at].to_string();
                        self.buf.drain(..at + TOOL_END.len());
                        out.push(self.tool_delta(&body));
                        // Whitespace between calls is not content.
                        self.content_started = false;
                        self.mode = Mode::Content;
                    }
                    None => return out,
                },
            }
        }
    }

    /// Everything still held back, at the end of generation.
    pub fn finish(&mut self) -> Vec<Delta> {
        let rest = std::mem::take(&mut self.buf);
        let mut out = Vec::new();
        match self.mode {
            Mode::Reasoning => push_text(&mut out, Delta::Reasoning(rest)),
            Mode::Content => {
                if self.content_started {
                    push_text(&mut out, Delta::Content(rest));
                } else {
                    push_text(&mut out, Delta::Content(rest.trim_start().to_string()));
                }
            }
            // A call cut off by the token budget: keep it if it can still be read.
            Mode::Tool => out.push(self.tool_delta(&rest)),
        }
        out
    }

    fn tool_delta(&mut self, body: &str) -> Delta {
        match parse_tool_call(body, self.tools.as_deref().unwrap_or(&[])) {
            Some((name, args)) => {
                let index = self.calls;
                self.calls += 1;
                Delta::ToolCall(ToolCall {
                    index,
                    id: format!("call_{}_{index}", self.id_prefix),
                    name,
                    arguments: Value::Object(args).to_string(),
                })
            }
            // Not a call the parser can read: give the model's text back as it was.
            None => Delta::Content(format!("{TOOL_START}{body}")),
        }
    }
}

fn push_text(out: &mut Vec<Delta>, d: Delta) {
    let empty = match &d {
        Delta::Reasoning(t) | Delta::Content(t) => t.is_empty(),
        Delta::ToolCall(_) => false,
    };
    if !empty {
        out.push(d);
    }
}

/// Bytes at the end of `buf` to hold back: the longest tail that is a proper prefix of a tag,
/// plus trailing whitespace in front of it (dropped if a tag follows).
fn held_back(buf: &str, tags: &[&str]) -> usize {
    let tag_tail = tags
        .iter()
        .flat_map(|t| (1..t.len()).map(move |n| &t[..n]))
        .filter(|p| buf.ends_with(p))
        .map(str::len)
        .max()
        .unwrap_or(0);
    let head = &buf[..buf.len() - tag_tail];
    tag_tail + (head.len() - head.trim_end().len())
}

/// Reads `\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n…</function>\n`. Values are
/// JSON when they read as JSON and the tool's schema does not say the parameter is a string.
fn parse_tool_call(body: &str, tools: &[Value]) -> Option<(String, Map<String, Value>)> {
    let rest = body.trim_start();
    let rest = rest.strip_prefix("<function=")?;
    let end = rest.find('>')?;
    let name = rest[..end].trim().to_string();
    if name.is_empty() {
        return None;
    }
    let schema = tools
        .iter()
        .filter_map(|t| t.get("function").or(Some(t)))
        .find(|f| f.get("name").and_then(Value::as_str) == Some(name.as_str()))
        .and_then(|f| f.get("parameters"))
        .and_then(|p| p.get("properties"));
    let mut rest = &rest[end + 1..];
    let mut args = Map::new();
    while let Some(at) = rest.find("<parameter=") {
        let after = &rest[at + "<parameter=".len()..];
        let close = after.find('>')?;
        let key = after[..close].trim().to_string();
        let value_start = &after[close + 1..];
        let (raw, next) = match value_start.find("</parameter>") {
            Some(e) => (&value_start[..e], &value_start[e + "</parameter>".len()..]),
            None => (value_start.trim_end().trim_end_matches("</function>"), ""),
        };
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let declared = schema
            .and_then(|s| s.get(&key))
            .and_then(|p| p.get("type"))
            .and_then(Value::as_str);
        let value = if declared == Some("string") {
            Value::String(raw.to_string())
        } else {
            serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()))
        };
        args.insert(key, value);
        rest = next;
    }
    Some((name, args))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(thinking: bool, tools: bool, pieces: &[&str]) -> Vec<Delta> {
        let tools = tools.then(|| {
            vec![
                json!({"type": "function", "function": {"name": "get_weather",
                "parameters": {"type": "object", "properties": {
                    "city": {"type": "string"}, "days": {"type": "integer"}}}}}),
            ]
        });
        let mut p = OutputParser::new(thinking, tools, "x");
        let mut out: Vec<Delta> = Vec::new();
        for piece in pieces.iter().copied() {
            out.extend(p.push(piece));
        }
        out.extend(p.finish());
        // Merge neighbouring text of the same kind, as a client would.
        let mut merged: Vec<Delta> = Vec::new();
        for d in out {
            match (merged.last_mut(), &d) {
                (Some(Delta::Reasoning(a)), Delta::Reasoning(b)) => a.push_str(b),
                (Some(Delta::Content(a)), Delta::Content(b)) => a.push_str(b),
                _ => merged.push(d),
            }
        }
        merged
    }

    fn chars(s: &str) -> Vec<String> {
        s.chars().map(String::from).collect()
    }

    #[test]
    fn thinking_goes_to_reasoning_even_when_split_in_characters() {
        let pieces = chars("Let me think.\n</think>\n\nThe answer is 4.");
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        assert_eq!(
            run(true, false, &pieces),
            vec![
                Delta::Reasoning("Let me think.".into()),
                Delta::Content("The answer is 4.".into())
            ]
        );
    }

    #[test]
    fn without_thinking_everything_is_content() {
        assert_eq!(
            run(false, false, &["Hi <", "/think> there"]),
            vec![Delta::Content("Hi </think> there".into())]
        );
    }

    #[test]
    fn tool_calls_are_parsed_and_never_leak_into_content() {
        let text = "I will check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
        let pieces = chars(text);
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let out = run(false, true, &pieces);
        assert_eq!(out[0], Delta::Content("I will check.".into()));
        let Delta::ToolCall(c) = &out[1] else {
            panic!("{out:?}")
        };
        assert_eq!(c.name, "get_weather");
        let args: Value = serde_json::from_str(&c.arguments).unwrap();
        assert_eq!(args, json!({"city": "Paris", "days": 3}));
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn string_parameters_stay_strings() {
        let out = run(
            false,
            true,
            &["<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n</function>\n</tool_call>"],
        );
        let Delta::ToolCall(c) = &out[0] else {
            panic!("{out:?}")
        };
        assert_eq!(c.arguments, r#"{"city":"42"}"#);
    }

    #[test]
    fn two_calls_get_two_indices() {
        let call = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>";
        let out = run(false, true, &[call, "\n", call]);
        let idx: Vec<usize> = out
            .iter()
            .filter_map(|d| match d {
                Delta::ToolCall(c) => Some(c.index),
                _ => None,
            })
            .collect();
        assert_eq!(idx, vec![0, 1]);
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn unreadable_call_is_given_back_as_text() {
        let out = run(false, true, &["<tool_call>nonsense</tool_call>"]);
        assert_eq!(out, vec![Delta::Content("<tool_call>nonsense".into())]);
    }

    #[test]
    fn tags_are_left_alone_without_tools() {
        let out = run(false, false, &["<tool_call>x</tool_call>"]);
        assert_eq!(out, vec![Delta::Content("<tool_call>x</tool_call>".into())]);
    }
}
