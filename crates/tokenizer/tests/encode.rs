//! The tokenizer built from the vocab-only GGUF against Qwen's tiktoken reference ids.

mod common;

use common::{json_fixture, qwen35, qwen35_spec};
use serde_json::Value;
use tokenizer::TokenType;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn fixture() -> &'static Value {
    static F: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    F.get_or_init(|| json_fixture("encode.json"))
}

#[test]
fn gguf_spec_is_qwen35_byte_level_bpe() {
    let spec = qwen35_spec();
    assert_eq!(spec.model, "gpt2");
    assert_eq!(spec.pre.as_deref(), Some("qwen35"));
    assert_eq!(spec.tokens.len(), 248_320);
    assert_eq!(spec.merges.len(), 247_556);
    assert_eq!(spec.eos_id, Some(248_046));
    assert!(!spec.add_bos);
}

#[test]
fn special_tokens_have_their_reference_ids_and_types() {
    let tok = qwen35();
    for s in fixture()["special_tokens"].as_array().unwrap() {
        let id = s["id"].as_u64().unwrap() as u32;
        let content = s["content"].as_str().unwrap();
        assert_eq!(tok.token_to_id(content), Some(id), "{content}");
        assert_eq!(tok.id_to_token(id), Some(content));
        let ty = if s["type"] == 3 {
            TokenType::Control
        } else {
            TokenType::UserDefined
        };
        assert_eq!(tok.token_type(id), Some(ty), "{content}");
    }
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(248_045));
    assert_eq!(tok.token_to_id("<think>"), Some(248_068));
    assert_eq!(tok.vocab_size(), 248_320);
}

#[test]
fn end_of_generation_ids_are_im_end_and_endoftext() {
    let eog = qwen35().end_of_generation_ids();
    assert_eq!(eog, &[248_046, 248_044]);
}

#[test]
fn every_corpus_paragraph_encodes_like_tiktoken() {
    let tok = qwen35();
    let mut mismatches = Vec::new();
    for seg in fixture()["segments"].as_array().unwrap() {
        let text = seg["text"].as_str().unwrap();
        let got = tok.encode(text, true).unwrap();
        if got != ids(&seg["ids"]) {
            mismatches.push(text.to_owned());
        }
    }
    assert!(
        mismatches.is_empty(),
        "paragraphs that differ: {mismatches:#?}"
    );
}

#[test]
fn whole_corpus_encodes_like_tiktoken() {
    let corpus = std::fs::read_to_string(common::fixture("corpus.txt")).unwrap();
    assert!(corpus.chars().count() >= 10_000);
    let got = qwen35().encode(&corpus, true).unwrap();
    assert_eq!(got, ids(&fixture()["whole"]["ids"]));
}

#[test]
fn without_parse_special_control_tokens_are_plain_text() {
    let tok = qwen35();
    for seg in fixture()["segments"].as_array().unwrap() {
        let text = seg["text"].as_str().unwrap();
        assert_eq!(
            tok.encode(text, false).unwrap(),
            ids(&seg["ids_plain"]),
            "{text:?}"
        );
    }
    let corpus = std::fs::read_to_string(common::fixture("corpus.txt")).unwrap();
    let got = tok.encode(&corpus, false).unwrap();
    assert_eq!(got, ids(&fixture()["whole"]["ids_plain"]));
}

#[test]
fn special_token_examples_match_the_reference() {
    let tok = qwen35();
    for (text, e) in fixture()["examples"].as_object().unwrap() {
        assert_eq!(tok.encode(text, true).unwrap(), ids(&e["ids"]), "{text:?}");
        assert_eq!(
            tok.encode(text, false).unwrap(),
            ids(&e["ids_plain"]),
            "{text:?}"
        );
        assert_eq!(
            tok.decode(&ids(&e["ids"])).unwrap(),
            e["decoded"].as_str().unwrap()
        );
    }
    // Written in text, the chat markers become single tokens only when parsing special tokens.
    assert_eq!(tok.encode("<|im_start|>", true).unwrap(), vec![248_045]);
    assert!(tok.encode("<|im_start|>", false).unwrap().len() > 1);
    assert_eq!(tok.encode("<think>", false).unwrap(), vec![248_068]);
}

#[test]
fn decode_inverts_encode_up_to_nfc() {
    let tok = qwen35();
    for seg in fixture()["segments"].as_array().unwrap() {
        let text = seg["text"].as_str().unwrap();
        let expect = seg.get("nfc").and_then(Value::as_str).unwrap_or(text);
        for parse_special in [true, false] {
            let ids = tok.encode(text, parse_special).unwrap();
            assert_eq!(tok.decode(&ids).unwrap(), expect);
        }
    }
    let whole = &fixture()["whole"];
    assert_eq!(
        tok.decode(&ids(&whole["ids"])).unwrap(),
        whole["nfc"].as_str().unwrap()
    );
}

#[test]
fn decode_rejects_ids_outside_the_vocabulary() {
    let tok = qwen35();
    assert!(tok.decode(&[248_320]).is_err());
    assert_eq!(
        tok.decode(&[248_319]).unwrap(),
        "",
        "padding rows decode to nothing"
    );
}

#[test]
fn stream_decoder_yields_only_whole_characters() {
    let tok = qwen35();
    let text = "盆栽🌳👨‍👩‍👧‍👦 👩🏽‍🔬 한국어 日本語テキスト 🇯🇵 العربية ✨❤️ 中文分词器测试";
    let ids = tok.encode(text, true).unwrap();
    assert!(ids.len() > 10);
    let mut dec = tok.stream_decoder();
    let mut out = String::new();
    let mut held_back = false;
    for &id in &ids {
        let piece = dec.push(id).unwrap();
        assert!(
            !piece.contains('\u{FFFD}'),
            "partial character leaked: {piece:?}"
        );
        held_back |= dec.pending_bytes() > 0;
        out.push_str(&piece);
    }
    assert!(
        held_back,
        "the text should split some characters across tokens"
    );
    assert_eq!(dec.finish(), "");
    assert_eq!(out, text);
}

#[test]
fn stream_decoder_concatenates_to_decode_on_the_corpus() {
    let tok = qwen35();
    let ids = ids(&fixture()["whole"]["ids"]);
    let mut dec = tok.stream_decoder();
    let mut out: String = ids.iter().map(|&id| dec.push(id).unwrap()).collect();
    out.push_str(&dec.finish());
    assert_eq!(out, tok.decode(&ids).unwrap());
}

#[test]
fn stream_decoder_finish_flushes_an_unfinished_character() {
    let tok = qwen35();
    // "🌳" is four bytes; feed the ids of its first token(s) only.
    let ids = tok.encode("🌳", true).unwrap();
    assert!(ids.len() >= 2, "{ids:?}");
    let mut dec = tok.stream_decoder();
    assert_eq!(dec.push(ids[0]).unwrap(), "");
    assert_eq!(dec.finish(), "\u{FFFD}");
    assert!(dec.push(u32::MAX).is_err());
}

#[test]
fn a_megabyte_of_text_with_many_added_tokens_round_trips() {
    let tok = qwen35();
    let corpus = std::fs::read_to_string(common::fixture("corpus.txt")).unwrap();
    let nfc = fixture()["whole"]["nfc"].as_str().unwrap();
    let text = corpus.repeat(40) + &"<think>".repeat(20_000) + &"!".repeat(100_000);
    let expect = nfc.repeat(40) + &"<think>".repeat(20_000) + &"!".repeat(100_000);
    let whole = ids(&fixture()["whole"]["ids_plain"]);
    for parse_special in [false, true] {
        let got = tok.encode(&text, parse_special).unwrap();
        if !parse_special {
            assert_eq!(got[..whole.len()], whole[..]);
        }
        assert_eq!(tok.decode(&got).unwrap(), expect);
    }
}

#[test]
fn a_gguf_without_tokenizer_metadata_is_an_error() {
    let md = gguf::Metadata::default();
    assert!(matches!(
        tokenizer::spec_from_metadata(&md),
        Err(tokenizer::TokenizerError::Metadata(_))
    ));
}
