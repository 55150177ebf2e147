//! The report the harness writes, and the comparisons its checks share.

use std::sync::Arc;

use gguf::Gguf;
use model::Model;

pub(crate) type R<T> = Result<T, Box<dyn std::error::Error>>;

pub(crate) struct Report {
    pub(crate) md: String,
    pub(crate) failures: Vec<String>,
}

impl Report {
    pub(crate) fn line(&mut self, s: impl AsRef<str>) {
        println!("{}", s.as_ref());
        self.md.push_str(s.as_ref());
        self.md.push('\n');
    }
    pub(crate) fn check(&mut self, ok: bool, what: String) {
        if !ok {
            self.failures.push(what);
        }
    }
}

pub(crate) fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// The largest relative L2 distance between calls' logits, `a`'s against `b`'s call by call.
pub(crate) fn worst_rel_l2(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| rel_l2(x, y))
        .fold(0f64, f64::max)
}

pub(crate) fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub(crate) fn top2(x: &[f32]) -> (usize, f32) {
    let i = model::ops::argmax(x).unwrap_or(0);
    let second = x
        .iter()
        .enumerate()
        .filter(|&(j, _)| j != i)
        .map(|(_, v)| *v)
        .fold(f32::NEG_INFINITY, f32::max);
    (i, x[i] - second)
}

/// A model of `shape` with random weights drawn from `seed`, quantized to `format`.
pub(crate) fn random_model(
    shape: &model::synth::Shape,
    format: quant::Format,
    seed: u64,
) -> R<Model> {
    let t = model::synth::random_f32_tensors(shape, format, seed);
    open(&model::synth::writer_from_f32(shape, &t, format, "h")?)
}

/// A model of the 27B's widths but four layers (three recurrent, one attention), random packed
/// weights drawn from `seed`: its GEMVs take the kernels and tiles a block the 27B's take.
pub(crate) fn wide_27b(vocab: usize, format: quant::Format, seed: u64) -> R<Model> {
    let mut shape = model::synth::Preset::B27.shape(vocab);
    shape.n_layers = 4;
    open(&model::synth::random_packed(&shape, format, seed, "wide")?)
}

pub(crate) fn open(w: &gguf::GgufWriter) -> R<Model> {
    Ok(Model::from_gguf(Arc::new(Gguf::from_bytes(
        w.to_bytes()?,
    )?))?)
}
