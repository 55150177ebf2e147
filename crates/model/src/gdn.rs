//! The gated delta net mixer, over a chunk of tokens processed in order.

use std::sync::Mutex;

use crate::config::Config;
use crate::input::{Ctx, Input};
use crate::ops::{l2_norm, matmul, rms_norm_heads, sigmoid, silu, softplus};
use crate::pool;
use crate::weights::GdnWeights;

/// Same epsilon as the reference implementation's q/k L2 normalisation.
const L2_EPS: f32 = 1e-6;

/// `h`: `[tokens][hidden]` normalised inputs; returns `[tokens][hidden]` mixer outputs.
pub fn forward(
    c: &Config,
    w: &GdnWeights,
    ctx: Ctx<'_>,
    conv_state: &mut [f32],
    ssm: &mut [f32],
    h: &[f32],
    tokens: usize,
) -> Vec<f32> {
    let ch = c.gdn_conv_channels();
    let vd = c.gdn_inner();
    let hv = c.gdn_value_heads;
    let hk = c.gdn_key_heads;
    let dk = c.gdn_key_dim;
    let dv = c.gdn_value_dim;
    let kern = c.conv_kernel;

    let mut qkv = vec![0f32; tokens * ch];
    let mut z = vec![0f32; tokens * vd];
    let mut alpha = vec![0f32; tokens * hv];
    let mut beta = vec![0f32; tokens * hv];
    let input = Input::new(h, tokens, ctx);
    matmul(&w.qkv, &input, &mut qkv);
    matmul(&w.gate, &input, &mut z);
    matmul(&w.alpha, &input, &mut alpha);
    matmul(&w.beta, &input, &mut beta);

    // Causal depthwise conv over the previous kernel−1 inputs and this one, then SiLU, token by
    // token; then q and k are L2-normalised per head.
    let mut conv_out = vec![0f32; tokens * ch];
    for t in 0..tokens {
        let x = &qkv[t * ch..(t + 1) * ch];
        let out = &mut conv_out[t * ch..(t + 1) * ch];
        for (cc, o) in out.iter_mut().enumerate() {
            let taps = &w.conv[cc * kern..(cc + 1) * kern];
            let mut acc = 0f32;
            for (j, &tap) in taps[..kern - 1].iter().enumerate() {
                acc += tap * conv_state[j * ch + cc];
            }
            acc += taps[kern - 1] * x[cc];
            *o = silu(acc);
        }
        conv_state.copy_within(ch.., 0);
        conv_state[(kern - 2) * ch..].copy_from_slice(x);
        out[..2 * hk * dk]
            .chunks_mut(dk)
            .for_each(|h| l2_norm(h, L2_EPS));
    }

    // The recurrence is independent per value head: heads run in parallel, tokens in order.
    let heads: Vec<Mutex<&mut [f32]>> = ssm.chunks_mut(dk * dv).map(Mutex::new).collect();
    let per_head: Vec<Mutex<Vec<f32>>> = (0..hv).map(|_| Mutex::new(Vec::new())).collect();
    let scale = 1.0 / (dk as f32).sqrt();
    pool::global().run(hv, |head| {
        let mut s = heads[head].lock().unwrap_or_else(|e| e.into_inner());
        let mut out = vec![0f32; tokens * dv];
        let mut kv_mem = vec![0f32; dv];
        let mut delta = vec![0f32; dv];
        // Value heads are stored tiled: value head `head` reads key head `head % hk`.
        let kh = head % hk;
        for t in 0..tokens {
            let row = &conv_out[t * ch..(t + 1) * ch];
            let qh = &row[kh * dk..(kh + 1) * dk];
            let kv = &row[hk * dk + kh * dk..hk * dk + (kh + 1) * dk];
            let vh = &row[2 * hk * dk + head * dv..2 * hk * dk + (head + 1) * dv];
            let g = (w.a[head] * softplus(alpha[t * hv + head] + w.dt_bias[head])).exp();
            let b = sigmoid(beta[t * hv + head]);
            step(
                &mut s,
                kv,
                vh,
                qh,
                g,
                b,
                scale,
                &mut kv_mem,
                &mut delta,
                &mut out[t * dv..(t + 1) * dv],
            );
        }
        *per_head[head].lock().unwrap_or_else(|e| e.into_inner()) = out;
    });
    let mut o = vec![0f32; tokens * vd];
    for (head, out) in per_head.into_iter().enumerate() {
        let out = out.into_inner().unwrap_or_else(|e| e.into_inner());
        for t in 0..tokens {
            o[t * vd + head * dv..t * vd + (head + 1) * dv]
                .copy_from_slice(&out[t * dv..(t + 1) * dv]);
        }
    }

    // Gated per-head norm, then the output projection.
    rms_norm_heads(&mut o, &w.norm, c.rms_eps);
    for (ov, &zv) in o.iter_mut().zip(&z) {
        *ov *= silu(zv);
    }
    let mut out = vec![0f32; tokens * c.hidden];
    let values = Input::gdn_values(&o, tokens, ctx);
    matmul(&w.out, &values, &mut out);
    out
}

/// One delta-rule update of a `dk × dv` state in two passes: `S ← g·S + k·δᵀ` with
/// `δ = (v − g·Sᵀk)·β`, and `o = Sᵀq·scale` from the updated state.
#[allow(clippy::too_many_arguments)]
fn step(
    s: &mut [f32],
    k: &[f32],
    v: &[f32],
    q: &[f32],
    g: f32,
    beta: f32,
    scale: f32,
    kv_mem: &mut [f32],
    delta: &mut [f32],
    o: &mut [f32],
) {
    let dv = v.len();
    kv_mem.fill(0.0);
    for (i, &ki) in k.iter().enumerate() {
        for (m, &sv) in kv_mem.iter_mut().zip(&s[i * dv..(i + 1) * dv]) {
            *m += sv * ki;
        }
    }
    for j in 0..dv {
        delta[j] = (v[j] - g * kv_mem[j]) * beta;
    }
    o.fill(0.0);
    for (i, (&ki, &qi)) in k.iter().zip(q).enumerate() {
        let qi = qi * scale;
        for ((sv, &dj), oj) in s[i * dv..(i + 1) * dv]
            .iter_mut()
            .zip(delta.iter())
            .zip(o.iter_mut())
        {
            *sv = g * *sv + ki * dj;
            *oj += *sv * qi;
        }
    }
}
