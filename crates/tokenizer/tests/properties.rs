//! Properties over arbitrary text and arbitrary id sequences, on the real vocabulary.

mod common;

use common::qwen35;
use proptest::prelude::*;
use unicode_normalization::UnicodeNormalization;

const REPLACEMENT: char = '\u{FFFD}';

fn text() -> impl Strategy<Value = String> {
    // Mix ASCII, whitespace, combining marks, CJK, emoji and the chat markers.
    let piece = prop_oneof![
        "[a-zA-Z0-9 .,!?'\"-]{0,12}",
        "[ \t\r\n]{1,5}",
        "[\u{300}-\u{36f}\u{4e00}-\u{4e80}\u{ac00}-\u{ac40}\u{600}-\u{650}]{1,6}",
        "[\u{1f300}-\u{1f6ff}\u{200d}\u{fe0f}\u{1f3fb}-\u{1f3ff}]{1,4}",
        Just("<|im_start|>".to_owned()),
        Just("<think>".to_owned()),
        any::<char>().prop_map(String::from),
    ];
    prop::collection::vec(piece, 0..12).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn decode_of_encode_is_the_nfc_text(s in text(), parse_special in any::<bool>()) {
        let tok = qwen35();
        let ids = tok.encode(&s, parse_special).unwrap();
        let nfc: String = s.nfc().collect();
        prop_assert_eq!(tok.decode(&ids).unwrap(), nfc);
    }

    #[test]
    fn streamed_pieces_concatenate_to_decode(ids in prop::collection::vec(0u32..248_320, 0..40)) {
        let tok = qwen35();
        let mut dec = tok.stream_decoder();
        let mut out = String::new();
        for &id in &ids {
            out.push_str(&dec.push(id).unwrap());
        }
        out.push_str(&dec.finish());
        prop_assert_eq!(out, tok.decode(&ids).unwrap());
    }

    #[test]
    fn streaming_valid_text_never_emits_replacement_characters(s in text()) {
        let tok = qwen35();
        let ids = tok.encode(&s, true).unwrap();
        let mut dec = tok.stream_decoder();
        let had_replacement = s.contains(REPLACEMENT);
        for &id in &ids {
            let piece = dec.push(id).unwrap();
            prop_assert!(had_replacement || !piece.contains(REPLACEMENT), "partial character in {:?}", piece);
        }
        prop_assert_eq!(dec.finish(), "");
    }
}
