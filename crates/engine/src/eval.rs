//! Comparing logits: perplexity, KL divergence and top-1 agreement against reference logits,
//! as llama.cpp's `llama-perplexity --kl-divergence` reports them.

use crate::sampler::argmax;

/// log-softmax of one row, in f64.
pub fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    row.iter().map(|&v| v as f64 - lse).collect()
}

/// KL(p‖q) for two rows of logits, p being the reference.
pub fn kl_divergence(reference: &[f32], test: &[f32]) -> f64 {
    let lp = log_softmax(reference);
    let lq = log_softmax(test);
    lp.iter()
        .zip(&lq)
        .map(|(&a, &b)| a.exp() * (a - b))
        .sum::<f64>()
        .max(0.0)
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Comparison {
    pub positions: usize,
    pub mean_kl: f64,
    pub max_kl: f64,
    /// Fraction of positions whose argmax agrees.
    pub top1: f64,
    pub max_abs_diff: f32,
}

/// Compares `[n][vocab]` logits row by row.
pub fn compare(reference: &[f32], test: &[f32], vocab: usize) -> Comparison {
    assert_eq!(reference.len(), test.len(), "logit arrays differ in size");
    let n = reference.len() / vocab;
    let mut c = Comparison {
        positions: n,
        ..Comparison::default()
    };
    let mut agree = 0usize;
    for (r, t) in reference.chunks(vocab).zip(test.chunks(vocab)) {
        let kl = kl_divergence(r, t);
        c.mean_kl += kl;
        c.max_kl = c.max_kl.max(kl);
        if argmax(r) == argmax(t) {
            agree += 1;
        }
        for (a, b) in r.iter().zip(t) {
            c.max_abs_diff = c.max_abs_diff.max((a - b).abs());
        }
    }
    if n > 0 {
        c.mean_kl /= n as f64;
        c.top1 = agree as f64 / n as f64;
    }
    c
}

/// Perplexity of `tokens[1..]` given the logits at each previous position.
pub fn perplexity(logits: &[f32], tokens: &[u32], vocab: usize) -> f64 {
    let n = tokens.len().saturating_sub(1);
    if n == 0 {
        return f64::NAN;
    }
    let nll: f64 = (0..n)
        .map(|t| -log_softmax(&logits[t * vocab..(t + 1) * vocab])[tokens[t + 1] as usize])
        .sum();
    (nll / n as f64).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_logits_have_zero_kl_and_full_agreement() {
        let a = [1.0, 2.0, 3.0, 0.5, 0.1, -1.0];
        let c = compare(&a, &a, 3);
        assert_eq!((c.mean_kl, c.top1, c.max_abs_diff), (0.0, 1.0, 0.0));
    }

    #[test]
    fn kl_matches_a_hand_computation() {
        // p = softmax([0, ln 3]) = [1/4, 3/4]; q = [1/2, 1/2].
        let kl = kl_divergence(&[0.0, 3f32.ln()], &[0.0, 0.0]);
        let want = 0.25 * (0.25f64 / 0.5).ln() + 0.75 * (0.75f64 / 0.5).ln();
        assert!((kl - want).abs() < 1e-7);
    }

    #[test]
    fn uniform_logits_have_perplexity_equal_to_vocab() {
        let logits = vec![0.0f32; 4 * 10];
        assert!((perplexity(&logits, &[1, 2, 3, 4], 10) - 10.0).abs() < 1e-9);
    }
}
