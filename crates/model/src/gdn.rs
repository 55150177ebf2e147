//! The gated delta net mixer, over a chunk of tokens processed in order.

use std::sync::Mutex;

use crate::config::Config;
use crate::disjoint::Disjoint;
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

    let mut conv_out = conv(&w.conv, kern, conv_state, &qkv, ch, tokens);
    // q and k are L2-normalised per head.
    for out in conv_out.chunks_exact_mut(ch) {
        out[..2 * hk * dk]
            .chunks_mut(dk)
            .for_each(|h| l2_norm(h, L2_EPS));
    }

    // The recurrence is independent per value head: heads run in parallel, tokens in order.
    let heads: Vec<Mutex<&mut [f32]>> = ssm.chunks_mut(dk * dv).map(Mutex::new).collect();
    let mut o = vec![0f32; tokens * vd];
    let dst = Disjoint::new(&mut o);
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
        // Gated per-head norm, here while the head is in cache.
        for (t, ot) in out.chunks_exact_mut(dv).enumerate() {
            rms_norm_heads(ot, &w.norm, c.rms_eps);
            let zt = &z[t * vd + head * dv..t * vd + (head + 1) * dv];
            for (j, (&v, &zv)) in ot.iter().zip(zt).enumerate() {
                // SAFETY: value head `head` of each token belongs to this task alone, and
                // `t * vd + head * dv + j < tokens * vd`.
                unsafe { dst.write(t * vd + head * dv + j, v * silu(zv)) };
            }
        }
    });

    // The output projection.
    let mut out = vec![0f32; tokens * c.hidden];
    let values = Input::gdn_values(&o, tokens, ctx);
    matmul(&w.out, &values, &mut out);
    out
}

/// Channels per task of [`conv`].
const CONV_CHUNK: usize = 512;

/// Causal depthwise conv of `x` (`[tokens][ch]`) over the previous kernel−1 inputs (`state`,
/// `[kern − 1][ch]`, oldest first) and each token's own, then SiLU; `state` moves on by `tokens`.
/// Channels are independent, so they run in parallel, each over its tokens in order.
fn conv(
    taps: &[f32],
    kern: usize,
    state: &mut [f32],
    x: &[f32],
    ch: usize,
    tokens: usize,
) -> Vec<f32> {
    assert_eq!(taps.len(), ch * kern);
    assert_eq!(state.len(), (kern - 1) * ch);
    assert_eq!(x.len(), tokens * ch);
    let mut out = vec![0f32; tokens * ch];
    let (dst, st) = (Disjoint::new(&mut out), Disjoint::new(state));
    pool::global().run(ch.div_ceil(CONV_CHUNK), |task| {
        let chans = task * CONV_CHUNK..((task + 1) * CONV_CHUNK).min(ch);
        if tokens == 1 {
            return conv_one(taps, kern, st, x, dst, ch, chans);
        }
        for cc in chans {
            let taps = &taps[cc * kern..(cc + 1) * kern];
            // The channel's inputs in time order: the state's kern − 1, then the tokens'.
            // Read by index rather than shifted through a window: shifting three floats by
            // `rotate_left` was a `memmove` call per channel and token.
            let seq = |i: usize| {
                if i < kern - 1 {
                    // SAFETY: channel `cc` of every state row belongs to this task alone, and
                    // `i * ch + cc` lies inside `state` (asserted).
                    unsafe { st.read(i * ch + cc) }
                } else {
                    x[(i - (kern - 1)) * ch + cc]
                }
            };
            for t in 0..tokens {
                let mut acc = 0f32;
                for (j, &tap) in taps[..kern - 1].iter().enumerate() {
                    acc += tap * seq(t + j);
                }
                acc += taps[kern - 1] * x[t * ch + cc];
                // SAFETY: channel `cc` belongs to this task alone and `t < tokens`.
                unsafe { dst.write(t * ch + cc, silu(acc)) };
            }
            // The last kern − 1 inputs become the state; read before any is overwritten,
            // oldest first (a state value moves to an earlier row only).
            for j in 0..kern - 1 {
                let v = seq(tokens + j);
                // SAFETY: as above; `j < kern − 1`, inside `state` (asserted).
                unsafe { st.write(j * ch + cc, v) };
            }
        }
    });
    out
}

/// [`conv`]'s task for one token over channels `chans`: a pass over the channels per tap, so
/// that the loops run across channels (sixteen to a register) where the token-by-token loop
/// went channel by channel (~30 cycles each, 48 layers × 10240 channels a 27B token). Each
/// channel's sum takes its terms in the same order: the same bits.
fn conv_one(
    taps: &[f32],
    kern: usize,
    st: Disjoint<'_>,
    x: &[f32],
    dst: Disjoint<'_>,
    ch: usize,
    chans: std::ops::Range<usize>,
) {
    let (c0, n) = (chans.start, chans.len());
    let mut acc = [0f32; CONV_CHUNK];
    let acc = &mut acc[..n];
    let taps = &taps[c0 * kern..(c0 + n) * kern];
    for j in 0..kern - 1 {
        // SAFETY: channels `chans` of every state row belong to this task alone.
        let row = unsafe { st.slice_mut(j * ch + c0..j * ch + c0 + n) };
        for ((a, &s), t) in acc.iter_mut().zip(row.iter()).zip(taps.chunks_exact(kern)) {
            *a += t[j] * s;
        }
    }
    let xs = &x[chans.clone()];
    for ((a, &v), t) in acc.iter_mut().zip(xs).zip(taps.chunks_exact(kern)) {
        *a += t[kern - 1] * v;
    }
    // SAFETY: as above, for the output's channels.
    let out = unsafe { dst.slice_mut(chans.clone()) };
    for (o, &a) in out.iter_mut().zip(acc.iter()) {
        *o = silu(a);
    }
    // The window moves on by one: each state row takes the next, the last the token's input.
    let rows = |j: usize| j * ch + c0..j * ch + c0 + n;
    for j in 1..kern - 1 {
        // SAFETY: channels `chans` of every state row belong to this task alone, and rows
        // j − 1 and j do not overlap.
        let (earlier, later) = unsafe { (st.slice_mut(rows(j - 1)), st.slice_mut(rows(j))) };
        earlier.copy_from_slice(later);
    }
    if kern > 1 {
        // SAFETY: as above, for the last row alone.
        unsafe { st.slice_mut(rows(kern - 2)) }.copy_from_slice(xs);
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The conv as the reference writes it: token by token over a sliding window of the whole
    /// channel vector.
    fn conv_by_tokens(
        taps: &[f32],
        kern: usize,
        state: &mut [f32],
        x: &[f32],
        ch: usize,
    ) -> Vec<f32> {
        let mut out = vec![0f32; x.len()];
        for (xt, ot) in x.chunks_exact(ch).zip(out.chunks_exact_mut(ch)) {
            for (cc, o) in ot.iter_mut().enumerate() {
                let mut acc = 0f32;
                for j in 0..kern - 1 {
                    acc += taps[cc * kern + j] * state[j * ch + cc];
                }
                acc += taps[cc * kern + kern - 1] * xt[cc];
                *o = silu(acc);
            }
            state.copy_within(ch.., 0);
            state[(kern - 2) * ch..].copy_from_slice(xt);
        }
        out
    }

    #[test]
    fn parallel_conv_equals_the_token_by_token_reference() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for (ch, kern, tokens) in [
            (1037, 4, 1),
            (3, 2, 1),
            (2 * CONV_CHUNK + 13, 3, 1),
            (1037, 4, 5),
            (3, 2, 7),
            (2 * CONV_CHUNK, 3, 2),
        ] {
            let taps: Vec<f32> = (0..ch * kern).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let state0: Vec<f32> = (0..(kern - 1) * ch)
                .map(|_| rng.gen_range(-1.0..1.0))
                .collect();
            let x: Vec<f32> = (0..tokens * ch).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let (mut want_state, mut got_state) = (state0.clone(), state0.clone());
            let want = conv_by_tokens(&taps, kern, &mut want_state, &x, ch);
            let got = conv(&taps, kern, &mut got_state, &x, ch, tokens);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got),
                bits(&want),
                "outputs, {ch} channels, {tokens} tokens"
            );
            assert_eq!(bits(&got_state), bits(&want_state), "state, {ch} channels");
        }
    }
}
