//! niwaki's logits against the independent references recorded in `fixtures/oracle/`:
//! Hugging Face transformers (the math) and llama.cpp (the peer engine) on the same files.

use std::path::PathBuf;
use std::sync::Arc;

use engine::eval::{compare, Comparison};
use gguf::Gguf;
use model::{Kernels, Logits, Model};
use quant::Format;
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/oracle")
        .join(name)
}

fn npy(name: &str) -> Vec<f32> {
    let bytes = std::fs::read(fixture(name)).unwrap();
    npyz::NpyFile::new(&bytes[..])
        .unwrap()
        .into_vec::<f32>()
        .unwrap()
}

fn json(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(name)).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn tokens96() -> Vec<u32> {
    ids(&json("tokens-96.json"))
}

fn model(name: &str) -> Model {
    Model::open(fixture(name)).unwrap()
}

fn model_with(name: &str, kernels: Kernels) -> Model {
    let mut m = model(name);
    m.set_kernels(kernels);
    m
}

/// Logits of every position, fed `chunk` tokens at a time.
fn run(m: &Model, toks: &[u32], chunk: usize) -> Vec<f32> {
    let mut s = m.new_state();
    toks.chunks(chunk)
        .flat_map(|c| m.forward(&mut s, c, Logits::All).unwrap())
        .collect()
}

fn llamacpp(run: &str) -> Comparison {
    let r = &json("summary.json")["runs"][run];
    Comparison {
        positions: r["positions"].as_u64().unwrap() as usize,
        mean_kl: r["mean_kl"].as_f64().unwrap(),
        max_kl: r["max_kl"].as_f64().unwrap(),
        top1: r["top1_agreement"].as_f64().unwrap(),
        max_abs_diff: r["max_abs_dlogit"].as_f64().unwrap() as f32,
    }
}

fn report(what: &str, c: &Comparison) {
    println!(
        "{what}: mean KL {:.3e}, max KL {:.3e}, top-1 {:.4}, max |Δlogit| {:.3e} over {} positions",
        c.mean_kl, c.max_kl, c.top1, c.max_abs_diff, c.positions
    );
}

#[test]
fn f32_model_matches_transformers_in_prefill_and_steps() {
    let m = model("tiny-f32.gguf");
    let hf = npy("tiny-f32.hf-logits.npy");
    let toks = tokens96();
    for (mode, chunk) in [("prefill", 32), ("step", 1)] {
        let ours = run(&m, &toks, chunk);
        let c = compare(&hf, &ours, m.config.vocab);
        report(&format!("tiny-f32 {mode} vs transformers"), &c);
        assert!(c.max_abs_diff <= 2e-3, "{mode}: {}", c.max_abs_diff);
        assert_eq!(c.top1, 1.0, "{mode}");
    }
    report(
        "tiny-f32 llama.cpp vs transformers",
        &llamacpp("tiny-f32/llama.cpp"),
    );
}

/// On the same quantized file, niwaki's exact kernels are at least as accurate as llama.cpp
/// against the exact answer, in KL and top-1. The int8 kernels (16-value activation groups with
/// f32 scales, against llama.cpp's 32 with f16) beat its KL here; their top-1 over 96 positions
/// is reported, and asserted over 2048 positions in the test below.
fn at_least_as_good_as_llamacpp(file: &str, hf: &str, run_name: &str) {
    let peer = llamacpp(run_name);
    report(&format!("{file} llama.cpp"), &peer);
    let m = model(file);
    assert_eq!(m.kernels(), Kernels::Exact, "the default kernels");
    let c = compare(&npy(hf), &run(&m, &tokens96(), 32), m.config.vocab);
    report(&format!("{file} niwaki (exact kernels)"), &c);
    assert!(
        c.mean_kl <= peer.mean_kl,
        "KL {} > llama.cpp {}",
        c.mean_kl,
        peer.mean_kl
    );
    assert!(
        c.top1 >= peer.top1,
        "top-1 {} < llama.cpp {}",
        c.top1,
        peer.top1
    );

    let m = model_with(file, Kernels::Int8);
    let c = compare(&npy(hf), &run(&m, &tokens96(), 32), m.config.vocab);
    report(&format!("{file} niwaki (int8 kernels)"), &c);
    assert!(
        c.mean_kl <= peer.mean_kl,
        "int8 KL {} > llama.cpp {}",
        c.mean_kl,
        peer.mean_kl
    );
}

#[test]
fn q1_0_is_at_least_as_accurate_as_llamacpp() {
    at_least_as_good_as_llamacpp(
        "tiny-exact-q1.Q1_0.gguf",
        "tiny-exact-q1.hf-logits.npy",
        "tiny-exact-q1.Q1_0/llama.cpp",
    );
}

#[test]
fn q2_0_is_at_least_as_accurate_as_llamacpp() {
    at_least_as_good_as_llamacpp(
        "tiny-exact-q2g64.Q2_0.gguf",
        "tiny-exact-q2g64.hf-logits.npy",
        "tiny-exact-q2g64.Q2_0/llama.cpp",
    );
}

#[test]
fn ternary_g128_formats_match_the_exact_reference() {
    let file = Arc::new(Gguf::open(fixture("tiny-exact-t128.gguf")).unwrap());
    let hf = npy("tiny-exact-t128.hf-logits.npy");
    for format in [Format::PQ2_0, Format::Q2_0G128, Format::PTQ1_0] {
        let bytes = model::requant::requantize(file.clone(), format)
            .unwrap()
            .to_bytes()
            .unwrap();
        let g = Gguf::from_bytes(bytes).unwrap();
        assert!(g.tensors().iter().any(|t| t.format == format), "{format}");
        let mut m = Model::from_gguf(Arc::new(g)).unwrap();
        m.set_kernels(Kernels::Exact);
        let c = compare(&hf, &run(&m, &tokens96(), 32), m.config.vocab);
        report(&format!("tiny-exact-t128 as {format}, exact kernels"), &c);
        // The weights are exact in these formats and activations stay f32.
        assert!(c.mean_kl <= 1e-6 && c.top1 == 1.0, "{format}");
        m.set_kernels(Kernels::Int8);
        let c = compare(&hf, &run(&m, &tokens96(), 32), m.config.vocab);
        report(&format!("tiny-exact-t128 as {format}, int8 kernels"), &c);
        // llama.cpp's Q2_0 g64 on the same kind of model is the reference for the int8 path.
        let peer = llamacpp("tiny-exact-q2g64.Q2_0/llama.cpp");
        assert!(c.mean_kl <= peer.mean_kl, "{format}: int8 KL {}", c.mean_kl);
    }
}

/// The int8 kernels against the exact kernels (pinned to transformers by the tests above) over all
/// 2048 positions of the long sequence, next to llama.cpp's figures on the same files and
/// positions (`tools/oracle/long_accuracy.py`): 96 positions are too few to rank engines by
/// top-1, where one position is a whole percent.
#[test]
fn int8_kernels_beat_llamacpp_in_kl_and_top1_over_2048_positions() {
    let toks = ids(&json("tiny-f32.long-2048.json"));
    let peers = json("long-2048-llamacpp.json");
    for name in ["tiny-exact-q1.Q1_0.gguf", "tiny-exact-q2g64.Q2_0.gguf"] {
        let exact = run(&model_with(name, Kernels::Exact), &toks, 256);
        let m = model_with(name, Kernels::Int8);
        let c = compare(&exact, &run(&m, &toks, 256), m.config.vocab);
        let peer = &peers["runs"][name]["llama.cpp"];
        let (peer_kl, peer_top1) = (
            peer["mean_kl"].as_f64().unwrap(),
            peer["top1"].as_f64().unwrap(),
        );
        report(&format!("{name} int8 kernels, 2048 positions"), &c);
        println!("{name} llama.cpp, 2048 positions: mean KL {peer_kl:.3e}, top-1 {peer_top1:.4}");
        assert_eq!(c.positions, 2048);
        assert!(
            c.mean_kl <= peer_kl,
            "{name}: KL {} > llama.cpp {peer_kl}",
            c.mean_kl
        );
        assert!(
            c.top1 >= peer_top1,
            "{name}: top-1 {} < llama.cpp {peer_top1}",
            c.top1
        );
    }
}

#[test]
fn niwaki_quantizes_lossless_weights_to_llamacpps_exact_bytes() {
    // Decoding llama.cpp's packed file and re-packing it must give the same bytes back.
    for (name, format) in [
        ("tiny-exact-q1.Q1_0.gguf", Format::Q1_0),
        ("tiny-exact-q2g64.Q2_0.gguf", Format::Q2_0),
    ] {
        let g = Gguf::open(fixture(name)).unwrap();
        let mut checked = 0;
        for t in g.tensors().iter().filter(|t| t.format == format) {
            let v = g.view(t);
            let again = quant::quantize(format, &v.to_f32().unwrap()).unwrap();
            assert!(again == v.data, "{name}: {}", t.name);
            checked += 1;
        }
        assert!(checked > 10, "{name}: only {checked} packed tensors");
    }
}

#[test]
fn long_sequence_prefill_steps_and_transformers_agree() {
    let m = model("tiny-f32.gguf");
    let long = json("tiny-f32.long-2048.json");
    let toks = ids(&long);
    assert_eq!(toks.len(), 2048);
    let vocab = m.config.vocab;
    let mut s = m.new_state();
    let mut steps = Vec::with_capacity(toks.len() * vocab);
    for &t in &toks {
        steps.extend(m.forward(&mut s, &[t], Logits::All).unwrap());
    }
    let prefill = run(&m, &toks, 256);
    let c = compare(&steps, &prefill, vocab);
    report("2048 positions: prefill vs steps", &c);
    assert!(c.max_abs_diff <= 1e-4);

    let positions: Vec<usize> = long["logit_positions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    let hf = npy("tiny-f32.long-2048.hf-logits.npy");
    let ours: Vec<f32> = positions
        .iter()
        .flat_map(|&p| prefill[p * vocab..(p + 1) * vocab].to_vec())
        .collect();
    let c = compare(&hf, &ours, vocab);
    report(
        "2048 positions: niwaki vs transformers (sampled positions)",
        &c,
    );
    assert!(c.max_abs_diff <= 2e-3, "{}", c.max_abs_diff);

    // Argmax at every position, except where transformers itself has a near-tie.
    let argmax = long["argmax"].as_array().unwrap();
    let margin = long["top2_margin"].as_array().unwrap();
    let mut disagree = 0;
    for p in 0..toks.len() {
        let ours = engine::sampler::argmax(&prefill[p * vocab..(p + 1) * vocab]).unwrap();
        if ours as u64 != argmax[p].as_u64().unwrap() {
            assert!(
                margin[p].as_f64().unwrap() < 1e-3,
                "position {p}: argmax differs with margin {}",
                margin[p]
            );
            disagree += 1;
        }
    }
    println!("2048 positions: argmax differs from transformers at {disagree} near-tie positions");
}
