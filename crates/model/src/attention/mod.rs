//! Gated full attention with QK-norm, partial NEOX RoPE and a growing KV cache.

use crate::config::Config;
use crate::disjoint::Disjoint;
use crate::input::{Ctx, Input};
use crate::kv::{KvCache, KEY_TILE};
use crate::ops::{matmul, rms_norm_heads, rope_neox, sigmoid};
use crate::pool;
use crate::weights::AttnWeights;

mod kernels;
mod split;

use kernels::{Kernels, Scores, Values};

/// What the attention of a pass reads: the normed, rotated queries and the output gates
/// (`[tokens][n_head][head_dim]`), the cache holding every position up to the pass's last, the
/// pass's first position and the score scale.
struct Pass<'a> {
    q: &'a [f32],
    gate: &'a [f32],
    cache: &'a KvCache,
    tokens: usize,
    pos0: usize,
    n_head: usize,
    head_dim: usize,
    scale: f32,
}

impl Pass<'_> {
    fn n_head_kv(&self) -> usize {
        self.cache.n_head_kv()
    }

    fn group(&self) -> usize {
        self.n_head / self.n_head_kv()
    }

    /// Positions token `t` of the pass attends to (itself included).
    fn n_ctx(&self, t: usize) -> usize {
        self.pos0 + t + 1
    }

    /// The first query head of kv head `kvh`'s group for token `t`, counted over the pass.
    fn head0(&self, t: usize, kvh: usize) -> usize {
        t * self.n_head + kvh * self.group()
    }
}

/// Attention of every (token, kv head) as one task, its `group` query heads together: each
/// cached key and value is read once for all of them (a task per query head read each
/// `group` times: at 4096 cached positions a 27B Q1_0 decode step ran at a quarter of its
/// speed at depth 0). Each head's arithmetic is that of [`kernels`], whatever the thread count.
/// `attn`: `[tokens][n_head][head_dim]`, zeroed.
fn attend_heads(pass: &Pass<'_>, attn: &mut [f32]) {
    let (hd, n_kv, group) = (pass.head_dim, pass.n_head_kv(), pass.group());
    let dst = Disjoint::new(attn);
    let kernels = Kernels::detect();
    pool::global().run(pass.tokens * n_kv, |task| {
        let (t, kvh) = (task / n_kv, task % n_kv);
        let n_ctx = pass.n_ctx(t);
        let head0 = pass.head0(t, kvh);
        let qs = &pass.q[head0 * hd..(head0 + group) * hd];
        // scores[g · stride + p]: head g of the group, position p (rows of whole key tiles).
        let tiles = n_ctx.div_ceil(KEY_TILE);
        let stride = tiles * KEY_TILE;
        let mut scores = vec![0f32; group * stride];
        let keys = pass.cache.k(kvh);
        let op = Scores {
            q: qs,
            hd,
            keys,
            tiles: 0..tiles,
            scale: pass.scale,
        };
        kernels.scores(&op, &mut scores, stride);
        for row in scores.chunks_exact_mut(stride) {
            kernels.softmax(&mut row[..n_ctx]);
        }
        // SAFETY: the group's heads of token `t` are this task's alone, and the range lies
        // within `tokens · nh · hd`.
        let out = unsafe { dst.slice_mut(head0 * hd..(head0 + group) * hd) };
        let op = Values {
            wts: &scores,
            wstride: stride,
            rows: pass.cache.v(kvh),
            hd,
            d: 0..hd,
            pos: 0..n_ctx,
        };
        kernels.values(&op, out);
        gate_heads(out, &pass.gate[head0 * hd..(head0 + group) * hd]);
    });
}

/// Random values in [-2, 2) from a small LCG (no test dependency needed).
#[cfg(test)]
pub(crate) fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

/// Attention's outputs times the sigmoid of their gates.
fn gate_heads(out: &mut [f32], gates: &[f32]) {
    out.iter_mut()
        .zip(gates)
        .for_each(|(o, &g)| *o *= sigmoid(g));
}

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
    cache.append(&k, &v);

    let scale = 1.0 / (hd as f32).sqrt();
    let mut attn = vec![0f32; tokens * nh * hd];
    let pass = Pass {
        q: &q,
        gate: &gate,
        cache,
        tokens,
        pos0,
        n_head: nh,
        head_dim: hd,
        scale,
    };
    match split::Split::plan(
        tokens,
        c.n_head_kv,
        hd,
        pos0 + tokens,
        pool::global().threads(),
    ) {
        Some(s) => split::attend(&pass, s, &mut attn),
        None => attend_heads(&pass, &mut attn),
    }
    let mut out = vec![0f32; tokens * c.hidden];
    let attn = Input::new(&attn, tokens, ctx);
    matmul(&w.out, &attn, &mut out);
    out
}
