//! Gated full attention with QK-norm, partial NEOX RoPE and a growing KV cache.

use crate::config::Config;
use crate::disjoint::Disjoint;
use crate::input::{Ctx, Input};
use crate::ops::{dot, matmul, rms_norm_heads, rope_neox, sigmoid};
use crate::pool;
use crate::state::KvCache;
use crate::weights::AttnWeights;

/// `h`: `[tokens][hidden]` normalised inputs at positions `pos0..pos0+tokens`; appends to the
/// cache and returns `[tokens][hidden]`.
pub fn forward(
    c: &Config,
    w: &AttnWeights,
    ctx: Ctx<'_>,
    cache: &mut KvCache,
    h: &[f32],
    tokens: usize,
    pos0: usize,
) -> Vec<f32> {
    let hd = c.head_dim;
    let nh = c.n_head;
    let kvw = c.n_head_kv * hd;
    let group = nh / c.n_head_kv;

    let mut qg = vec![0f32; tokens * 2 * nh * hd];
    let mut k = vec![0f32; tokens * kvw];
    let mut v = vec![0f32; tokens * kvw];
    let input = Input::new(h, tokens, ctx);
    matmul(&w.q, &input, &mut qg);
    matmul(&w.k, &input, &mut k);
    matmul(&w.v, &input, &mut v);

    // Split each head's [query | gate] and normalise + rotate.
    let mut q = vec![0f32; tokens * nh * hd];
    let mut gate = vec![0f32; tokens * nh * hd];
    for t in 0..tokens {
        for head in 0..nh {
            let src = &qg[(t * nh + head) * 2 * hd..(t * nh + head + 1) * 2 * hd];
            q[(t * nh + head) * hd..(t * nh + head + 1) * hd].copy_from_slice(&src[..hd]);
            gate[(t * nh + head) * hd..(t * nh + head + 1) * hd].copy_from_slice(&src[hd..]);
        }
    }
    rms_norm_heads(&mut q, &w.q_norm, c.rms_eps);
    rms_norm_heads(&mut k, &w.k_norm, c.rms_eps);
    for t in 0..tokens {
        let pos = pos0 + t;
        q[t * nh * hd..(t + 1) * nh * hd]
            .chunks_mut(hd)
            .for_each(|x| rope_neox(x, pos, c.rope_dims, c.rope_base));
        k[t * kvw..(t + 1) * kvw]
            .chunks_mut(hd)
            .for_each(|x| rope_neox(x, pos, c.rope_dims, c.rope_base));
    }
    cache.k.extend_from_slice(&k);
    cache.v.extend_from_slice(&v);
    let (k_cache, v_cache) = (&cache.k, &cache.v);

    let scale = 1.0 / (hd as f32).sqrt();
    let mut attn = vec![0f32; tokens * nh * hd];
    let dst = Disjoint::new(&mut attn);
    // Every (token, head) on its own: in parallel, each computed the same way whatever the
    // thread count.
    pool::global().run(tokens * nh, |task| {
        let (t, head) = (task / nh, task % nh);
        let n_ctx = pos0 + t + 1;
        let kvh = head / group;
        let qh = &q[(t * nh + head) * hd..(t * nh + head + 1) * hd];
        let mut scores: Vec<f32> = (0..n_ctx)
            .map(|p| dot(qh, &k_cache[p * kvw + kvh * hd..p * kvw + (kvh + 1) * hd]) * scale)
            .collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        scores.iter_mut().for_each(|s| {
            *s = (*s - max).exp();
            sum += *s;
        });
        // SAFETY: head `head` of token `t` is this task's alone, and the range lies within
        // `tokens · nh · hd`.
        let out = unsafe { dst.slice_mut((t * nh + head) * hd..(t * nh + head + 1) * hd) };
        for (p, &s) in scores.iter().enumerate() {
            let vp = &v_cache[p * kvw + kvh * hd..p * kvw + (kvh + 1) * hd];
            let wgt = s / sum;
            out.iter_mut().zip(vp).for_each(|(o, &x)| *o += wgt * x);
        }
        let gh = &gate[(t * nh + head) * hd..(t * nh + head + 1) * hd];
        out.iter_mut().zip(gh).for_each(|(o, &g)| *o *= sigmoid(g));
    });
    let mut out = vec![0f32; tokens * c.hidden];
    let attn = Input::new(&attn, tokens, ctx);
    matmul(&w.out, &attn, &mut out);
    out
}
