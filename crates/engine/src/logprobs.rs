//! Log-probabilities of sampled tokens and their strongest alternatives, as OpenAI's `logprobs`
//! reports them.

/// One position: the chosen token's log-probability and the `top` most likely tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    /// Most likely first (ties by lowest id).
    pub top: Vec<(u32, f32)>,
}

/// Log-softmax of `logits` at `id`, and the `top` highest entries. −∞ logits (masked tokens)
/// have probability zero.
pub fn token_logprob(logits: &[f32], id: u32, top: usize) -> TokenLogprob {
    let max = logits
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .filter(|v| v.is_finite())
        .map(|&v| ((v - max) as f64).exp())
        .sum();
    let log_z = max as f64 + sum.ln();
    let lp = |v: f32| {
        if v.is_finite() {
            (v as f64 - log_z) as f32
        } else {
            f32::NEG_INFINITY
        }
    };
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &v) in logits.iter().enumerate() {
            if !v.is_finite() {
                continue;
            }
            if best.len() == top && v <= best[top - 1].1 {
                continue;
            }
            let at = best.partition_point(|&(_, b)| b >= v);
            best.insert(at, (i as u32, v));
            best.truncate(top);
        }
    }
    TokenLogprob {
        id,
        logprob: logits
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |&v| lp(v)),
        top: best.into_iter().map(|(i, v)| (i, lp(v))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_a_log_softmax() {
        let l = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
        let t = token_logprob(&l, 1, 2);
        assert!((t.logprob - 0.3f32.ln()).abs() < 1e-6);
        assert_eq!(t.top.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1]);
        assert!((t.top[0].1 - 0.5f32.ln()).abs() < 1e-6);
    }

    #[test]
    fn masked_tokens_have_no_probability() {
        let l = [1.0, f32::NEG_INFINITY, 1.0];
        let t = token_logprob(&l, 2, 5);
        assert!((t.logprob - 0.5f32.ln()).abs() < 1e-6);
        assert_eq!(t.top.len(), 2);
        assert_eq!(token_logprob(&l, 1, 0).logprob, f32::NEG_INFINITY);
    }
}
