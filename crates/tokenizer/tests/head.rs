//! `Tokenizer::head_len` against encoding the head itself.

mod common;

use common::qwen35;

/// The head's own tokens, where they lead the whole text's.
fn by_encoding(text: &str, head: &str) -> Option<usize> {
    let tok = qwen35();
    let ids = tok.encode(text, true).ok()?;
    let head_ids = tok.encode(head, true).ok()?;
    ids.starts_with(&head_ids).then_some(head_ids.len())
}

#[test]
fn a_conversation_before_the_replys_opening() {
    let tok = qwen35();
    let head = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nCafe\u{301} déjà vu — 東京 🙂 x=1; y = 2;\n\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nFine.<|im_end|>\n<|im_start|>user\nAnd then?<|im_end|>\n";
    for opening in [
        "<|im_start|>assistant\n",
        "<|im_start|>assistant\n<think>\n",
    ] {
        let text = format!("{head}{opening}");
        let ids = tok.encode(&text, true).expect("encode");
        let n = tok.head_len(&text, head, &ids);
        assert!(n.is_some(), "{opening:?}");
        assert_eq!(n, by_encoding(&text, head), "{opening:?}");
    }
}

#[test]
fn none_where_the_rest_could_merge_with_the_head() {
    let tok = qwen35();
    // "hello" + " world": ordinary text after the cut, so no claim is made.
    let text = "hello world";
    let ids = tok.encode(text, true).expect("encode");
    assert_eq!(tok.head_len(text, "hello", &ids), None);
    // Not the text's head at all.
    assert_eq!(tok.head_len(text, "world", &ids), None);
    // The ids of another text.
    let other = tok.encode("<|im_start|>user\nhi", true).expect("encode");
    let text = "<|im_start|>user\nhello<|im_end|>\n";
    assert_eq!(tok.head_len(text, "<|im_start|>user\nhello", &other), None);
}
