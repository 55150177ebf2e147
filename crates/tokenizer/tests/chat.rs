//! Chat templates against transformers' `apply_chat_template` renders.

mod common;

use common::{json_fixture, qwen35_spec};
use serde_json::Value;
use tokenizer::{ChatRequest, ChatTemplate, Tokenizer, TokenizerError};

fn request(case: &Value) -> ChatRequest {
    ChatRequest {
        messages: case["messages"].as_array().unwrap().clone(),
        tools: case["tools"].as_array().cloned(),
        add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap_or(false),
        enable_thinking: case["enable_thinking"].as_bool(),
        ..ChatRequest::default()
    }
}

fn cases() -> Vec<Value> {
    json_fixture("chat.json")["renders"]
        .as_array()
        .unwrap()
        .clone()
}

fn reference_template() -> ChatTemplate {
    let src = qwen35_spec()
        .chat_template
        .as_deref()
        .expect("GGUF has a template");
    ChatTemplate::new(src).unwrap()
}

#[test]
fn gguf_template_renders_byte_identical_to_transformers() {
    let t = reference_template();
    for case in cases() {
        let got = t.render(&request(&case)).unwrap();
        assert_eq!(
            got,
            case["expected"].as_str().unwrap(),
            "case {}",
            case["name"]
        );
    }
}

#[test]
fn builtin_template_renders_byte_identical_to_transformers() {
    let t = ChatTemplate::builtin_qwen35();
    for case in cases().into_iter().filter(|c| c["builtin"] != false) {
        let got = t.render(&request(&case)).unwrap();
        assert_eq!(
            got,
            case["expected"].as_str().unwrap(),
            "case {}",
            case["name"]
        );
    }
}

#[test]
fn template_exceptions_surface_as_errors_with_the_reference_message() {
    let errors = json_fixture("chat.json")["errors"]
        .as_array()
        .unwrap()
        .clone();
    assert!(!errors.is_empty());
    for t in [reference_template(), ChatTemplate::builtin_qwen35()] {
        for e in &errors {
            let req = ChatRequest {
                messages: e["messages"].as_array().unwrap().clone(),
                ..ChatRequest::default()
            };
            match t.render(&req) {
                Err(TokenizerError::TemplateException(msg)) => {
                    assert_eq!(msg, e["error"].as_str().unwrap(), "case {}", e["name"])
                }
                other => panic!("case {}: expected an exception, got {other:?}", e["name"]),
            }
        }
    }
}

#[test]
fn string_tool_arguments_render_like_objects() {
    let t = reference_template();
    let case = cases()
        .into_iter()
        .find(|c| c["name"] == "tools_full")
        .unwrap();
    let mut req = request(&case);
    for m in &mut req.messages {
        if let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) {
            for c in calls {
                let args = c["function"]["arguments"].to_string();
                c["function"]["arguments"] = Value::String(args);
            }
        }
    }
    assert_eq!(t.render(&req).unwrap(), case["expected"].as_str().unwrap());
}

#[test]
fn a_file_without_template_uses_the_builtin_one() {
    let mut spec = qwen35_spec().clone();
    spec.chat_template = None;
    let tok = Tokenizer::new(&spec).unwrap();
    let t = ChatTemplate::for_tokenizer(&tok).unwrap();
    let case = cases()
        .into_iter()
        .find(|c| c["name"] == "multi_turn")
        .unwrap();
    assert_eq!(
        t.render(&request(&case)).unwrap(),
        case["expected"].as_str().unwrap()
    );
}

#[test]
fn rendered_prompt_tokenizes_with_single_chat_markers() {
    let tok = common::qwen35();
    let t = reference_template();
    let case = cases()
        .into_iter()
        .find(|c| c["name"] == "system_user_gen")
        .unwrap();
    let ids = tok
        .encode(&t.render(&request(&case)).unwrap(), true)
        .unwrap();
    assert_eq!(ids[0], 248_045);
    assert_eq!(ids.iter().filter(|&&i| i == 248_046).count(), 2);
    assert_eq!(ids[ids.len() - 2..], [248_068, 198]); // "<think>", "\n"
}

#[test]
fn builtin_template_rejects_media_parts() {
    let case = cases()
        .into_iter()
        .find(|c| c["name"] == "vision_parts")
        .unwrap();
    assert!(matches!(
        ChatTemplate::builtin_qwen35().render(&request(&case)),
        Err(TokenizerError::TemplateException(_))
    ));
}
