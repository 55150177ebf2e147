//! Attention over a long context on more threads than a pass has (token, kv head) pairs: a
//! decode step of a 27B model has four, so its attention kept four threads busy whatever the
//! machine. Here it runs as three parallel sections — the scores in chunks of key tiles, each
//! head's softmax, the output in slices of the head's values — doing exactly the arithmetic of
//! [`attend_heads`](super::attend_heads) in the same order per value: the same bits.

use super::{gate_heads, Kernels, Pass, Scores, Values};
use crate::disjoint::Disjoint;
use crate::kv::{KEY_TILE, VALUE_CHUNK};
use crate::pool;

/// Fewest cached positions from which a pass splits: shorter, the per-head tasks end sooner than
/// three parallel sections start.
pub(super) const SPLIT_MIN_CTX: usize = 1024;
/// Fewest positions a scores task takes.
const MIN_CHUNK: usize = 256;
/// Fewest values of a head an output task takes (a chunk of the cached values).
const MIN_SLICE: usize = VALUE_CHUNK;

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

    /// Value range `i` of a head of `hd` values cut in `self.slices` (whole chunks; the last
    /// ranges may be empty).
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
    // Score rows of every (token, kv head, query head of the group), `n_pad` apart (whole key
    // tiles); token t uses the first pos0 + t + 1 of its row.
    let n_pad = (pass.pos0 + pass.tokens).div_ceil(KEY_TILE) * KEY_TILE;
    let mut scores = vec![0f32; heads * group * n_pad];
    let n_ctx = |h: usize| pass.n_ctx(h / n_kv);
    let head0 = |h: usize| pass.head0(h / n_kv, h % n_kv);
    let row = |h: usize, g: usize| (h * group + g) * n_pad;
    let kernels = Kernels::detect();

    let sc = Disjoint::new(&mut scores);
    pool::global().run(heads * split.chunks, |task| {
        let (h, c) = (task / split.chunks, task % split.chunks);
        let tiles = n_ctx(h).div_ceil(KEY_TILE);
        let (t0, t1) = (tiles * c / split.chunks, tiles * (c + 1) / split.chunks);
        if t0 == t1 {
            return;
        }
        let qs = &pass.q[head0(h) * hd..(head0(h) + group) * hd];
        let n = (t1 - t0) * KEY_TILE;
        let mut mine = vec![0f32; group * n];
        let keys = pass.cache.k(h % n_kv);
        let op = Scores {
            q: qs,
            hd,
            keys,
            tiles: t0..t1,
            scale: pass.scale,
        };
        kernels.scores(&op, &mut mine, n);
        for (g, s) in mine.chunks_exact(n).enumerate() {
            let at = row(h, g) + t0 * KEY_TILE;
            // SAFETY: tiles t0..t1 of (h, g)'s row are this task's alone (the chunks of a
            // head's tiles are disjoint), and lie within the scores.
            unsafe { sc.slice_mut(at..at + n) }.copy_from_slice(s);
        }
    });

    pool::global().run(heads * group, |task| {
        let (h, g) = (task / group, task % group);
        // SAFETY: row (h, g) is this task's alone.
        kernels.softmax(unsafe { sc.slice_mut(row(h, g)..row(h, g) + n_ctx(h)) });
    });

    // From here on the scores (now weights) are only read.
    let scores = &scores;
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
        let wts = &scores[row(h, 0)..];
        let op = Values {
            wts,
            wstride: n_pad,
            rows: v_rows,
            hd,
            d: d.clone(),
            pos: 0..n_ctx(h),
        };
        kernels.values(&op, &mut acc);
        for (g, acc) in acc.chunks_exact(w).enumerate() {
            let at = (h0 + g) * hd;
            // SAFETY: values d of the group's heads of this (token, kv head) are this task's
            // alone.
            let out = unsafe { dst.slice_mut(at + d.start..at + d.end) };
            out.copy_from_slice(acc);
            gate_heads(out, &pass.gate[at + d.start..at + d.end]);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::super::{attend_heads, noise};
    use super::*;
    use crate::kv::{KvCache, KvFormat};

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
        // Short of a chunk's positions per task: fewer chunks; never more slices than value
        // chunks.
        assert_eq!(
            Split::plan(1, 1, 64, 1024, 64),
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
        let cut: Vec<_> = (0..5).map(|i| s.slice(i, 128)).collect();
        assert_eq!(cut, [0..32, 32..64, 64..96, 96..128, 128..128]);
        // A head whose last chunk is narrower.
        let cut: Vec<_> = (0..3).map(|i| s.slice(i, 40)).collect();
        assert_eq!(cut, [0..32, 32..40, 40..40]);
    }
}
