//! Bit-exactness against llama.cpp: the fixtures in `fixtures/quant/` were written by
//! `tools/quant-ref/make_fixtures.py` from llama.cpp's `quantize_row_*_ref`, `dequantize_row_*`,
//! fp16/bf16 row converters and gguf-py's TQ1_0 codec.

use std::path::PathBuf;

use quant::Format;
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/quant")
        .join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (regenerate with tools/quant-ref)", path.display()));
    serde_json::from_str(&text).expect("fixture is JSON")
}

fn bytes(v: &Value) -> Vec<u8> {
    let s = v.as_str().expect("hex string");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

/// Little-endian f32 bit patterns (compared as bits, so NaN payloads and −0 count).
fn f32_bits(v: &Value) -> Vec<u32> {
    bytes(v)
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Asserts `got` are the fixture's bits. The fixtures were written on x86, where a NaN an
/// operation invents (`0 × ∞`) is negative; other CPUs invent positive ones (AArch64), so
/// there a NaN may differ from the fixture's in its sign alone. Everything else, NaN payloads
/// included, must match as written.
fn assert_bits(got: &[u32], want: &[u32], what: &str) {
    let invented_sign_may_differ = !cfg!(target_arch = "x86_64");
    let same = |g: u32, w: u32| {
        let nan = |x: u32| f32::from_bits(x).is_nan();
        g == w
            || (invented_sign_may_differ && nan(g) && nan(w) && g & 0x7fff_ffff == w & 0x7fff_ffff)
    };
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| !same(got[i], want[i])) {
        panic!(
            "{what}: value {i} is {:#010x}, want {:#010x}",
            got[i], want[i]
        );
    }
}

fn floats(v: &Value) -> Vec<f32> {
    f32_bits(v).into_iter().map(f32::from_bits).collect()
}

fn decode_bits(format: Format, src: &[u8], n: usize) -> Vec<u32> {
    let mut out = vec![0.0f32; n];
    quant::dequantize(format, src, &mut out).expect("valid row");
    out.iter().map(|v| v.to_bits()).collect()
}

fn check_block_format(format: Format, file: &str) {
    let fx = fixture(file);
    let cases = fx["cases"].as_array().expect("cases");
    assert!(cases.len() >= 10);
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let input = floats(&case["input"]);
        let want = bytes(&case["quantized"]);
        let got = quant::quantize(format, &input).expect("whole blocks");
        assert_eq!(got, want, "{format} quantize, case {name:?}");
        assert_bits(
            &decode_bits(format, &want, input.len()),
            &f32_bits(&case["dequantized"]),
            &format!("{format} dequantize, case {name:?}"),
        );
    }
    for case in fx["decode"].as_array().expect("decode cases") {
        let name = case["name"].as_str().expect("name");
        let src = bytes(&case["bytes"]);
        let want = f32_bits(&case["dequantized"]);
        assert_bits(
            &decode_bits(format, &src, want.len()),
            &want,
            &format!("{format} decode, {name:?}"),
        );
    }
}

#[test]
fn q1_0_matches_llama_cpp_bit_for_bit() {
    check_block_format(Format::Q1_0, "q1_0.json");
}

#[test]
fn q2_0_matches_llama_cpp_bit_for_bit() {
    check_block_format(Format::Q2_0, "q2_0.json");
}

#[test]
fn q8_0_matches_llama_cpp_bit_for_bit() {
    check_block_format(Format::Q8_0, "q8_0.json");
}

#[test]
fn q4_1_matches_llama_cpp_bit_for_bit() {
    check_block_format(Format::Q4_1, "q4_1.json");
}

#[test]
fn f16_and_bf16_conversions_match_ggml_bit_for_bit() {
    let fx = fixture("float.json");
    let input = floats(&fx["input"]);
    for (format, key) in [(Format::F16, "F16"), (Format::BF16, "BF16")] {
        let case = &fx[key];
        let got = quant::quantize(format, &input).expect("whole blocks");
        let want = bytes(&case["encoded"]);
        for (i, (g, w)) in got.chunks_exact(2).zip(want.chunks_exact(2)).enumerate() {
            assert_eq!(g, w, "{format} encode of {:#010x}", input[i].to_bits());
        }
        let src = bytes(&case["random_bits"]);
        assert_eq!(
            decode_bits(format, &src, src.len() / 2),
            f32_bits(&case["random_decoded"]),
            "{format} decode"
        );
    }
}

fn trits(v: &Value) -> Vec<u8> {
    v.as_str()
        .expect("trit string")
        .bytes()
        .map(|c| c - b'0')
        .collect()
}

#[test]
fn ptq1_0_packs_trits_as_gguf_py_tq1_0_does() {
    let fx = fixture("ptq1_0_tq1_0.json");
    let blocks = fx["blocks"].as_array().expect("blocks");
    assert_eq!(blocks.len(), 64);
    let one = half::f16::from_f32(1.0).to_bits().to_le_bytes();
    for (i, block) in blocks.iter().enumerate() {
        let t = trits(&block["trits"]);
        assert_eq!(
            t,
            trits(&block["decoded_trits"]),
            "gguf-py round trip, block {i}"
        );
        let packed = bytes(&block["packed"]);

        // Encode: values t − 1 with one forced ±1 so that d = 1 whatever the trits are.
        let x: Vec<f32> = t.iter().map(|&t| f32::from(t) - 1.0).collect();
        let got = quant::quantize(Format::PTQ1_0, &x).expect("one block");
        if x.iter().any(|&v| v != 0.0) {
            assert_eq!(&got[..26], &packed[..], "encode, block {i}");
            assert_eq!(&got[26..], &one, "scale, block {i}");
        }

        // Decode the gguf-py bytes with d = 1.
        let mut src = packed.clone();
        src.extend_from_slice(&one);
        let mut out = vec![0.0f32; 128];
        quant::dequantize(Format::PTQ1_0, &src, &mut out).expect("one block");
        assert_eq!(out, x, "decode, block {i}");
    }
}
