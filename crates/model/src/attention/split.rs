//! Attention over a long context on more threads than a pass has (token, kv head) pairs: a
//! decode step of a 27B model has four, so its attention kept four threads busy whatever the
//! machine. Here it runs as three parallel sections — the scores in chunks of positions, each
//! head's softmax, the output in slices of the head's values — doing exactly the arithmetic of
//! [`attend_heads`](super::attend_heads) in the same order per value: the same bits.

use super::{softmax_unnormed, Pass, AHEAD};
use crate::disjoint::Disjoint;
use crate::ops::{axpys, dots, sigmoid};
use crate::pool;

/// Fewest cached positions from which a pass splits: shorter, the per-head tasks end sooner than
/// three parallel sections start.
pub(super) const SPLIT_MIN_CTX: usize = 1024;
/// Fewest positions a scores task takes.
const MIN_CHUNK: usize = 256;
/// Fewest values of a head an output task takes (a cache line of f32).
const MIN_SLICE: usize = 16;

/// How a pass splits: position chunks per (token, kv head) for the scores, value slices per
/// (token, kv head) for the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Split {
    chunks: usize,
    slices: usize,
}

impl Split {
    /// The split of a pass of `tokens` tokens with `n_kv` kv heads of `head_dim` values, its
    /// last token seeing `n_ctx` positions, on `threads` threads; `None` where a task per
    /// (token, kv head) already keeps every thread busy, or the context is short.
    pub(super) fn plan(
        tokens: usize,
        n_kv: usize,
        head_dim: usize,
        n_ctx: usize,
        threads: usize,
    ) -> Option<Split> {
        let heads = tokens * n_kv;
        if heads == 0 || heads >= threads || n_ctx < SPLIT_MIN_CTX {
            return None;
        }
        let per = threads.div_ceil(heads);
        Some(Split {
            // Twice the threads' share, so that chunks of unequal speed even out.
            chunks: (2 * per).min(n_ctx / MIN_CHUNK).max(1),
            slices: per.min(head_dim / MIN_SLICE).max(1),
        })
    }

    /// Value range `i` of a head of `hd` values cut in `self.slices` (whole cache lines; the
    /// last ranges may be empty).
    fn slice(self, i: usize, hd: usize) -> std::ops::Range<usize> {
        let width = hd.div_ceil(self.slices).next_multiple_of(MIN_SLICE);
        (i * width).min(hd)..((i + 1) * width).min(hd)
    }
}

/// The attention of `pass` split as `split` says, into `attn` (`[tokens][n_head][head_dim]`,
/// zeroed).
pub(super) fn attend(pass: &Pass<'_>, split: Split, attn: &mut [f32]) {
    let (hd, n_kv, group) = (pass.head_dim, pass.n_head_kv(), pass.group());
    let heads = pass.tokens * n_kv;
    // Score rows of every (token, kv head, query head of the group), `n_max` apart; token t
    // uses the first pos0 + t + 1 of its row.
    let n_max = pass.pos0 + pass.tokens;
    let mut scores = vec![0f32; heads * group * n_max];
    let mut sums = vec![0f32; heads * group];
    let n_ctx = |h: usize| pass.n_ctx(h / n_kv);
    let head0 = |h: usize| pass.head0(h / n_kv, h % n_kv);
    let row = |h: usize, g: usize| (h * group + g) * n_max;

    let sc = Disjoint::new(&mut scores);
    pool::global().run(heads * split.chunks, |task| {
        let (h, c) = (task / split.chunks, task % split.chunks);
        let n = n_ctx(h);
        let (p0, p1) = (n * c / split.chunks, n * (c + 1) / split.chunks);
        let k_rows = pass.cache.k(h % n_kv);
        let qs = &pass.q[head0(h) * hd..(head0(h) + group) * hd];
        let mut s = vec![0f32; group];
        let mut buf = vec![0f32; hd];
        for p in p0..p1 {
            if p + AHEAD < p1 {
                k_rows.prefetch((p + AHEAD) * hd..(p + AHEAD + 1) * hd);
            }
            dots(qs, k_rows.read(p * hd..(p + 1) * hd, &mut buf), &mut s);
            for (g, &v) in s.iter().enumerate() {
                // SAFETY: position p of (h, g)'s row is this task's alone (the chunks of a
                // head's positions are disjoint), and the index lies within the scores.
                unsafe { sc.write(row(h, g) + p, v * pass.scale) };
            }
        }
    });

    let sm = Disjoint::new(&mut sums);
    pool::global().run(heads * group, |task| {
        let (h, g) = (task / group, task % group);
        // SAFETY: row (h, g) and its sum are this task's alone.
        let r = unsafe { sc.slice_mut(row(h, g)..row(h, g) + n_ctx(h)) };
        let mut sum = 0.0;
        softmax_unnormed(r, &mut sum);
        // SAFETY: as above.
        unsafe { sm.write(task, sum) };
    });

    // From here on the scores and sums are only read.
    let (scores, sums) = (&scores, &sums);
    let dst = Disjoint::new(attn);
    pool::global().run(heads * split.slices, |task| {
        let (h, i) = (task / split.slices, task % split.slices);
        let d = split.slice(i, hd);
        if d.is_empty() {
            return;
        }
        let v_rows = pass.cache.v(h % n_kv);
        let h0 = head0(h);
        // The group's values d, accumulated here and written once: tasks writing neighbouring
        // slices of one row in place shared its cache lines at every position.
        let w = d.len();
        let mut acc = vec![0f32; group * w];
        let sums = &sums[h * group..(h + 1) * group];
        let mut wgt = vec![0f32; group];
        let mut buf = vec![0f32; w];
        // Values d of position p's row.
        let at = |p: usize| p * hd + d.start..p * hd + d.end;
        for p in 0..n_ctx(h) {
            if p + AHEAD < n_ctx(h) {
                v_rows.prefetch(at(p + AHEAD));
            }
            for (g, x) in wgt.iter_mut().enumerate() {
                *x = scores[row(h, g) + p] / sums[g];
            }
            axpys(&mut acc, &wgt, v_rows.read(at(p), &mut buf));
        }
        for (g, acc) in acc.chunks_exact(w).enumerate() {
            let at = (h0 + g) * hd;
            let gates = &pass.gate[at + d.start..at + d.end];
            // SAFETY: values d of the group's heads of this (token, kv head) are this task's
            // alone.
            let out = unsafe { dst.slice_mut(at + d.start..at + d.end) };
            for ((o, &a), &x) in out.iter_mut().zip(acc).zip(gates) {
                *o = a * sigmoid(x);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::super::attend_heads;
    use super::*;
    use crate::kv::{KvCache, KvFormat};

    /// Random values in [-2, 2) from a small LCG (no test dependency needed).
    fn noise(n: usize, seed: u64) -> Vec<f32> {
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

    /// Attention over `cache` for every (token, head) of a case, by task per kv head.
    fn per_head(case: (usize, usize, usize, usize, usize), cache: &KvCache, seed: u64) -> Vec<f32> {
        let (tokens, pos0, n_kv, group, hd) = case;
        let nh = n_kv * group;
        let q = noise(tokens * nh * hd, seed + 3);
        let gate = noise(tokens * nh * hd, seed + 4);
        let pass = Pass {
            q: &q,
            gate: &gate,
            cache,
            tokens,
            pos0,
            n_head: nh,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        let mut want = vec![0f32; tokens * nh * hd];
        attend_heads(&pass, &mut want);
        assert!(want.iter().all(|x| x.is_finite()) && want.iter().any(|&x| x != 0.0));
        // Every split gives the same bits.
        for (chunks, slices) in [(1, 1), (3, 5), (7, 2), (3, 3), (64, 16)] {
            let mut got = vec![0f32; tokens * nh * hd];
            attend(&pass, Split { chunks, slices }, &mut got);
            let differ = want
                .iter()
                .zip(&got)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(differ, 0, "{case:?}, {chunks} chunks, {slices} slices");
        }
        want
    }

    #[test]
    fn the_split_attention_gives_the_per_head_bits_and_an_f16_cache_those_of_its_values() {
        // (tokens, pos0, kv heads, group, head_dim), and splits that cut positions and values
        // unevenly (more chunks or slices than divide them; slices past the head; a head of 40
        // values, whose last slice ends inside a cache line).
        for (i, &case) in [
            (1, 300, 4, 6, 256),
            (3, 97, 2, 3, 64),
            (1, 40, 1, 8, 48),
            (2, 50, 2, 2, 40),
        ]
        .iter()
        .enumerate()
        {
            let (tokens, pos0, n_kv, _, hd) = case;
            let n = pos0 + tokens;
            let seed = 10 * i as u64;
            let (k, v) = (
                noise(n * n_kv * hd, seed + 1),
                noise(n * n_kv * hd, seed + 2),
            );
            let mut exact = KvCache::new(n_kv, hd);
            exact.append(&k, &v);
            let mut half = KvCache::with_format(n_kv, hd, KvFormat::F16);
            half.append(&k, &v);
            // The f16 cache's values, held in f32.
            let round = |x: &[f32]| -> Vec<f32> {
                x.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
            };
            let mut rounded = KvCache::new(n_kv, hd);
            rounded.append(&round(&k), &round(&v));
            let a = per_head(case, &exact, seed);
            let b = per_head(case, &half, seed);
            let c = per_head(case, &rounded, seed);
            // The f16 cache reads its values in f32 and then does the same arithmetic.
            assert!(
                b.iter().zip(&c).all(|(x, y)| x.to_bits() == y.to_bits()),
                "case {i}"
            );
            // Rounding moves the output, by about f16's step.
            let err = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(err > 0.0 && err < 1e-2, "case {i}: {err}");
        }
    }

    #[test]
    fn a_pass_splits_only_where_the_heads_leave_threads_idle_at_long_contexts() {
        // A 27B decode step: 4 kv heads of 256 values.
        assert_eq!(Split::plan(1, 4, 256, 16384, 2), None);
        assert_eq!(Split::plan(1, 4, 256, 16384, 4), None);
        assert_eq!(Split::plan(1, 4, 256, SPLIT_MIN_CTX - 1, 32), None);
        assert_eq!(
            Split::plan(1, 4, 256, 16384, 16),
            Some(Split {
                chunks: 8,
                slices: 4
            })
        );
        // Short of a chunk's positions per task: fewer chunks; never more slices than lines.
        assert_eq!(
            Split::plan(1, 1, 32, 1024, 64),
            Some(Split {
                chunks: 4,
                slices: 2
            })
        );
        // A prefill pass of many tokens keeps its tasks per (token, kv head).
        assert_eq!(Split::plan(256, 4, 256, 16384, 64), None);
        let s = Split {
            chunks: 1,
            slices: 5,
        };
        let cut: Vec<_> = (0..5).map(|i| s.slice(i, 64)).collect();
        assert_eq!(cut, [0..16, 16..32, 32..48, 48..64, 64..64]);
    }
}
