//! The forward pass on synthetic models: prefill against one-token steps, packed against f32,
//! state snapshots, the Hadamard rotation, and bad input.

use std::sync::Arc;

use gguf::{Gguf, GgufWriter, Value};
use model::synth::{self, Preset, Shape, TensorSpec};
use model::{Kernels, KvFormat, Logits, Model, ModelError};
use quant::Format;

const VOCAB: usize = 300;

fn open(w: &GgufWriter) -> Model {
    Model::from_gguf(Arc::new(Gguf::from_bytes(w.to_bytes().unwrap()).unwrap())).unwrap()
}

fn tiny(format: Format, seed: u64) -> (Shape, Vec<(TensorSpec, Vec<f32>)>) {
    let shape = Preset::Tiny.shape(VOCAB);
    let t = synth::random_f32_tensors(&shape, format, seed);
    (shape, t)
}

fn tokens(n: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 37 + 11) % VOCAB) as u32).collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn step_logits(m: &Model, toks: &[u32]) -> Vec<f32> {
    let mut s = m.new_state();
    toks.iter()
        .flat_map(|&t| m.forward(&mut s, &[t], Logits::Last).unwrap())
        .collect()
}

#[test]
fn chunked_prefill_equals_one_token_steps() {
    for (format, kernels) in [
        (Format::F32, Kernels::Exact),
        (Format::Q1_0, Kernels::Exact),
        (Format::Q1_0, Kernels::Int8),
        (Format::Q2_0, Kernels::Int8),
        (Format::Q2_0G128, Kernels::Int8),
        (Format::PTQ1_0, Kernels::Int8),
    ] {
        let (shape, t) = tiny(format, 1);
        let mut m = open(&synth::writer_from_f32(&shape, &t, format, "t").unwrap());
        m.set_kernels(kernels);
        let toks = tokens(40);
        let mut s = m.new_state();
        let mut prefill = m.forward(&mut s, &toks[..17], Logits::All).unwrap();
        prefill.extend(m.forward(&mut s, &toks[17..], Logits::All).unwrap());
        let steps = step_logits(&m, &toks);
        assert_eq!(max_abs_diff(&prefill, &steps), 0.0, "{format} {kernels:?}");
    }
}

#[test]
fn lossless_packed_models_match_their_f32_weights() {
    for format in [
        Format::Q1_0,
        Format::Q2_0,
        Format::Q2_0G128,
        Format::PQ2_0,
        Format::PTQ1_0,
    ] {
        let (shape, t) = tiny(format, 2);
        let mut packed = open(&synth::writer_from_f32(&shape, &t, format, "t").unwrap());
        let mut exact = open(&synth::writer_from_f32(&shape, &t, Format::F32, "t").unwrap());
        packed.set_kernels(Kernels::Exact);
        exact.set_kernels(Kernels::Exact);
        let toks = tokens(24);
        let a = packed
            .forward(&mut packed.new_state(), &toks, Logits::All)
            .unwrap();
        let b = exact
            .forward(&mut exact.new_state(), &toks, Logits::All)
            .unwrap();
        let d = max_abs_diff(&a, &b);
        assert!(d < 1e-4, "{format}: {d}");
    }
}

#[test]
fn int8_kernels_stay_close_to_exact_ones() {
    for format in [Format::Q1_0, Format::Q2_0, Format::PQ2_0, Format::PTQ1_0] {
        let (shape, t) = tiny(format, 2);
        let mut m = open(&synth::writer_from_f32(&shape, &t, format, "t").unwrap());
        let toks = tokens(24);
        m.set_kernels(Kernels::Exact);
        let a = m.forward(&mut m.new_state(), &toks, Logits::All).unwrap();
        m.set_kernels(Kernels::Int8);
        let b = m.forward(&mut m.new_state(), &toks, Logits::All).unwrap();
        let d = max_abs_diff(&a, &b);
        let mean = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).sum::<f32>() / a.len() as f32;
        // Logits have a standard deviation of about 1: int8 activations move them by a few
        // hundredths on average, a few tenths at worst.
        assert!(
            d > 0.0 && d < 1.0 && mean < 0.05,
            "{format}: max {d}, mean {mean}"
        );
    }
}

#[test]
fn widened_ternary_rows_give_the_packed_rows_bits() {
    let (shape, t) = tiny(Format::PTQ1_0, 4);
    let mut m = open(&synth::writer_from_f32(&shape, &t, Format::PTQ1_0, "t").unwrap());
    let toks = tokens(24);
    m.set_kernels(Kernels::Int8);
    let packed = m.forward(&mut m.new_state(), &toks, Logits::All).unwrap();
    m.set_ternary(quant::Ternary::Wide);
    m.set_kernels(Kernels::Int8);
    let wide = m.forward(&mut m.new_state(), &toks, Logits::All).unwrap();
    assert_eq!(max_abs_diff(&packed, &wide), 0.0);
    m.set_ternary(quant::Ternary::Packed);
    m.set_kernels(Kernels::Int8);
    let again = m.forward(&mut m.new_state(), &toks, Logits::All).unwrap();
    assert_eq!(max_abs_diff(&packed, &again), 0.0);
}

#[test]
fn an_f16_kv_cache_stays_close_to_the_f32_one_and_prefills_as_it_steps() {
    let (shape, t) = tiny(Format::Q1_0, 5);
    let mut m = open(&synth::writer_from_f32(&shape, &t, Format::Q1_0, "t").unwrap());
    let toks = tokens(40);
    let reference = m.forward(&mut m.new_state(), &toks, Logits::All).unwrap();
    m.set_kernels(Kernels::Int8);
    let exact = m.forward(&mut m.new_state(), &toks, Logits::All).unwrap();
    let mut f32_state = m.new_state();
    m.forward(&mut f32_state, &toks, Logits::None).unwrap();
    m.set_kv_format(KvFormat::F16);
    let mut s = m.new_state();
    let mut half = m.forward(&mut s, &toks[..17], Logits::All).unwrap();
    half.extend(m.forward(&mut s, &toks[17..], Logits::All).unwrap());
    // Chunked prefill and one-token steps read the same f16 values.
    assert_eq!(max_abs_diff(&half, &step_logits(&m, &toks)), 0.0);
    // f16 keeps about three decimal digits of each key and value: the logits (standard
    // deviation about 1) move, by a fraction of what the int8 activations move them.
    let mean = |a: &[f32], b: &[f32]| {
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f32>() / a.len() as f32
    };
    let (by_cache, by_int8) = (mean(&exact, &half), mean(&reference, &exact));
    let d = max_abs_diff(&exact, &half);
    assert!(
        d > 0.0 && d < 0.1 && by_cache < 0.25 * by_int8,
        "max {d}, mean {by_cache} (int8 activations: {by_int8})"
    );
    let argmax = |row: &[f32]| {
        row.iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i)
    };
    let same = exact
        .chunks(VOCAB)
        .zip(half.chunks(VOCAB))
        .filter(|(a, b)| argmax(a) == argmax(b))
        .count();
    assert_eq!(same, toks.len());
    // The cache holds half the bytes.
    let cache = |st: &model::State| st.bytes() - m.config.recurrent_state_bytes();
    assert!(cache(&s) > 0);
    assert_eq!(2 * cache(&s), cache(&f32_state));
}

#[test]
fn restored_state_continues_identically() {
    let (shape, t) = tiny(Format::Q1_0, 3);
    let m = open(&synth::writer_from_f32(&shape, &t, Format::Q1_0, "t").unwrap());
    let toks = tokens(30);
    let mut s = m.new_state();
    m.forward(&mut s, &toks[..20], Logits::None).unwrap();
    let snap = s.clone();
    let a = m.forward(&mut s, &toks[20..], Logits::All).unwrap();
    let other = m.forward(&mut s, &toks[..5], Logits::All).unwrap();
    assert_ne!(a[..VOCAB], other[..VOCAB]);
    let mut s = snap;
    let b = m.forward(&mut s, &toks[20..], Logits::All).unwrap();
    assert_eq!(a, b);
    assert_eq!(s.len(), 30);
}

#[test]
fn a_rewound_state_is_the_state_that_never_went_further() {
    let (shape, t) = tiny(Format::Q2_0, 4);
    let mut m = open(&synth::writer_from_f32(&shape, &t, Format::Q2_0, "t").unwrap());
    m.set_kernels(Kernels::Int8);
    let toks = tokens(90);
    for kv in [KvFormat::F32, KvFormat::F16] {
        m.set_kv_format(kv);
        // 20 positions end inside a key tile (16) and a value tile (64); the 50 more that are
        // forgotten fill and start further tiles of both.
        let mut s = m.new_state();
        m.forward(&mut s, &toks[..20], Logits::None).unwrap();
        let mut c = model::Checkpoint::default();
        s.save(&mut c);
        assert_eq!(c.position(), 20);
        let gone = m.forward(&mut s, &toks[20..70], Logits::All).unwrap();
        s.rewind(&c).unwrap();
        let mut plain = m.new_state();
        m.forward(&mut plain, &toks[..20], Logits::None).unwrap();
        assert_eq!(s, plain, "{kv:?}: the rewound state");
        // It goes on as the plain one does, and as it went the first time.
        let again = m.forward(&mut s, &toks[20..], Logits::All).unwrap();
        assert_eq!(
            again,
            m.forward(&mut plain, &toks[20..], Logits::All).unwrap()
        );
        assert_eq!(again[..gone.len()], gone[..]);
        // The same checkpoint, its buffers reused, saved again later.
        s.save(&mut c);
        m.forward(&mut s, &toks[..3], Logits::None).unwrap();
        s.rewind(&c).unwrap();
        assert_eq!(s, plain, "{kv:?}: rewound a second time");
    }
}

#[test]
fn a_checkpoint_of_another_sequence_or_one_a_rewind_went_below_is_refused() {
    let (shape, t) = tiny(Format::Q1_0, 6);
    let m = open(&synth::writer_from_f32(&shape, &t, Format::Q1_0, "t").unwrap());
    let toks = tokens(20);
    let mut s = m.new_state();
    m.forward(&mut s, &toks[..8], Logits::None).unwrap();
    let mut at8 = model::Checkpoint::default();
    s.save(&mut at8);
    // Another sequence, a clone (another sequence from there on) and a checkpoint never saved.
    let mut short = m.new_state();
    m.forward(&mut short, &toks[..3], Logits::None).unwrap();
    let kept = short.clone();
    assert!(matches!(
        short.rewind(&at8),
        Err(ModelError::CheckpointOfOtherSequence)
    ));
    assert!(matches!(
        s.clone().rewind(&at8),
        Err(ModelError::CheckpointOfOtherSequence)
    ));
    assert!(matches!(
        s.rewind(&model::Checkpoint::default()),
        Err(ModelError::CheckpointOfOtherSequence)
    ));
    assert_eq!(short, kept, "a refused rewind changes nothing");
    // On to 12 and saved; back to 8 and on with other tokens: the cache rows 8..12 the
    // checkpoint at 12 relied on now hold those, so it is refused; the one at 8 still holds.
    m.forward(&mut s, &toks[8..12], Logits::None).unwrap();
    let mut at12 = model::Checkpoint::default();
    s.save(&mut at12);
    s.rewind(&at8).unwrap();
    m.forward(&mut s, &toks[12..18], Logits::None).unwrap();
    let before = s.clone();
    assert!(matches!(
        s.rewind(&at12),
        Err(ModelError::CheckpointOverwritten { pos: 12, low: 8 })
    ));
    assert_eq!(s, before, "a refused rewind changes nothing");
    s.rewind(&at8).unwrap();
    assert_eq!(s.len(), 8);
}

#[test]
fn bad_tokens_and_lengths_are_errors() {
    let (shape, t) = tiny(Format::F32, 4);
    let m = open(&synth::writer_from_f32(&shape, &t, Format::F32, "t").unwrap());
    let mut s = m.new_state();
    assert!(matches!(
        m.forward(&mut s, &[], Logits::Last),
        Err(ModelError::EmptyInput)
    ));
    assert!(matches!(
        m.forward(&mut s, &[VOCAB as u32], Logits::Last),
        Err(ModelError::TokenOutOfRange { id, vocab: VOCAB }) if id == VOCAB as u32
    ));
    let too_long = vec![1u32; shape.context_length + 1];
    let err = m.forward(&mut s, &too_long, Logits::Last).unwrap_err();
    assert!(matches!(err, ModelError::ContextFull { .. }), "{err}");
    assert!(err.to_string().contains(&shape.context_length.to_string()));
    assert!(s.is_empty(), "a refused call leaves the state untouched");
}

fn writer_without(shape: &Shape, t: &[(TensorSpec, Vec<f32>)], skip: &str) -> GgufWriter {
    let kept: Vec<_> = t.iter().filter(|(s, _)| s.name != skip).cloned().collect();
    synth::writer_from_f32(shape, &kept, Format::F32, "t").unwrap()
}

fn load_err(w: &GgufWriter) -> String {
    match Model::from_gguf(Arc::new(Gguf::from_bytes(w.to_bytes().unwrap()).unwrap())) {
        Ok(_) => panic!("model loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn missing_tensor_is_named() {
    let (shape, t) = tiny(Format::F32, 5);
    let msg = load_err(&writer_without(&shape, &t, "blk.2.ssm_out.weight"));
    assert!(
        msg.contains("blk.2.ssm_out.weight") && msg.contains("missing"),
        "{msg}"
    );
}

#[test]
fn shape_mismatch_is_named() {
    let (shape, mut t) = tiny(Format::F32, 6);
    let (spec, v) = t
        .iter_mut()
        .find(|(s, _)| s.name == "blk.0.ffn_up.weight")
        .unwrap();
    spec.dims[1] -= 1;
    v.truncate(v.len() - shape.hidden);
    let msg = load_err(&synth::writer_from_f32(&shape, &t, Format::F32, "t").unwrap());
    assert!(
        msg.contains("blk.0.ffn_up.weight") && msg.contains("shape"),
        "{msg}"
    );
}

#[test]
fn wrong_architecture_is_refused() {
    let (shape, t) = tiny(Format::F32, 7);
    let mut w = synth::writer_from_f32(&shape, &t, Format::F32, "t").unwrap();
    w.set("general.architecture", Value::String("llama".into()));
    let msg = load_err(&w);
    assert!(msg.contains("llama") && msg.contains("qwen35"), "{msg}");
    assert!(!msg.contains("DSpark"), "{msg}");
    // A published drafter file says what it is.
    w.set("general.architecture", Value::String("dspark".into()));
    let msg = load_err(&w);
    assert!(
        msg.contains("\"dspark\"") && msg.contains("DSpark drafter"),
        "{msg}"
    );
}

#[test]
fn missing_hyperparameter_is_named() {
    let (shape, t) = tiny(Format::F32, 8);
    let w = synth::writer_from_f32(&shape, &t, Format::F32, "t").unwrap();
    let mut w2 = GgufWriter::new();
    for (k, v) in w
        .metadata()
        .iter()
        .filter(|(k, _)| *k != "qwen35.ssm.state_size")
    {
        w2.set(k, v.clone());
    }
    for (spec, v) in &t {
        w2.add_tensor(
            &spec.name,
            &spec.dims,
            Format::F32,
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
        .unwrap();
    }
    let msg = load_err(&w2);
    assert!(msg.contains("qwen35.ssm.state_size"), "{msg}");
}

// ---- Hadamard rotation -------------------------------------------------------------------

#[test]
fn folded_hadamard_rotation_leaves_logits_unchanged() {
    let shape = Preset::Small.shape(VOCAB);
    let plain = synth::random_f32_tensors(&shape, Format::F32, 9);
    let signs = synth::hadamard::signs(&shape, 10).unwrap();
    let rotated = synth::hadamard::fold(&shape, &plain, &signs);

    let base = open(&synth::writer_from_f32(&shape, &plain, Format::F32, "plain").unwrap());
    let mut w = synth::writer_from_f32(&shape, &rotated, Format::F32, "rotated").unwrap();
    synth::hadamard::write_metadata(&mut w, &shape, &signs);
    let rot = open(&w);
    assert!(rot.hadamard().is_some());

    let toks = tokens(12);
    let a = base
        .forward(&mut base.new_state(), &toks, Logits::All)
        .unwrap();
    let b = rot
        .forward(&mut rot.new_state(), &toks, Logits::All)
        .unwrap();
    let d = max_abs_diff(&a, &b);
    assert!(d <= 2e-3, "max |Δlogit| {d}");
    // And the rotation matters: the rotated weights without the metadata give other logits.
    let bare = open(&synth::writer_from_f32(&shape, &rotated, Format::F32, "bare").unwrap());
    let c = bare
        .forward(&mut bare.new_state(), &toks, Logits::All)
        .unwrap();
    assert!(max_abs_diff(&a, &c) > 0.1);
}

#[test]
fn a_state_of_other_attention_heads_is_refused_not_written() {
    let (shape, t) = tiny(Format::Q2_0, 3);
    let m = open(&synth::writer_from_f32(&shape, &t, Format::Q2_0, "t").unwrap());
    // The same layers, the KV cache of another head count or head size.
    for (heads, dim) in [(2, 1), (1, 2)] {
        let mut c = m.config.clone();
        c.n_head_kv *= heads;
        c.head_dim *= dim;
        let mut st = model::State::new(&c);
        let r = m.forward(&mut st, &tokens(3), Logits::Last);
        assert!(matches!(r, Err(ModelError::StateMismatch)), "{heads} {dim}");
    }
}
