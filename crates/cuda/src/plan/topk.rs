//! The passes of the top-k selection (`kernels/topk.cu`) that sampling on the GPU runs over a
//! logits row.

/// Keys one block of a pass sorts (`TOPK_CHUNK` in the kernel).
pub const TOPK_CHUNK: usize = 2048;

/// The largest k the GPU selects: each pass must at least halve what it is given, so that the
/// passes end.
pub const TOPK_MAX: usize = TOPK_CHUNK / 2;

/// One pass: `blocks` chunks of at most [`TOPK_CHUNK`] keys out of `inputs`, each keeping its
/// best k (so `blocks · k` keys come out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopkPass {
    pub inputs: usize,
    pub blocks: usize,
}

/// The passes that select the best `k` (1..=[`TOPK_MAX`]) of `n` logits: the first reads the
/// logits, every later one the keys the one before kept, and the last is a single block whose
/// first `k` keys are the answer, best first. `None` for a `k` outside that range or no logits.
pub fn topk_passes(n: usize, k: usize) -> Option<Vec<TopkPass>> {
    if k == 0 || k > TOPK_MAX || n == 0 {
        return None;
    }
    let mut passes = Vec::new();
    let mut inputs = n;
    loop {
        let blocks = inputs.div_ceil(TOPK_CHUNK);
        passes.push(TopkPass { inputs, blocks });
        if blocks == 1 {
            return Some(passes);
        }
        inputs = blocks * k;
    }
}

/// Keys of the largest pass's output (the last pass adds the ±∞ flag after its k, and the
/// weight sums, when asked for, take the slot after that): the scratch each of the two
/// alternating key buffers needs.
pub fn topk_scratch_keys(n: usize, k: usize) -> usize {
    topk_passes(n, k)
        .map(|p| p.iter().map(|p| p.blocks * k).max().unwrap_or(0) + 2)
        .unwrap_or(0)
}

/// Chunks of `model::rank::weight_sums` over `n` logits (one partial sum pair each).
pub fn weight_chunks(n: usize) -> usize {
    n.div_ceil(model::rank::WEIGHT_CHUNK)
}

/// The candidate a key names: its id and its scaled logit (the inverse of the kernel's
/// `topk_key`); `None` for the empty key 0.
pub fn topk_unkey(key: u64) -> Option<(u32, f32)> {
    if key == 0 {
        return None;
    }
    let b = (key >> 32) as u32;
    let bits = if b & 0x8000_0000 != 0 {
        b & 0x7fff_ffff
    } else {
        !b
    };
    Some((!(key as u32), f32::from_bits(bits)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's `topk_key`, for the tests: larger keys are better candidates.
    fn key(v: f32, t: f32, id: u32) -> u64 {
        if !v.is_finite() {
            return 0;
        }
        let b = (v / t).to_bits();
        let b = if b & 0x8000_0000 != 0 {
            !b
        } else {
            b | 0x8000_0000
        };
        (u64::from(b) << 32) | u64::from(!id)
    }

    #[test]
    fn the_27b_vocabulary_takes_three_passes_at_top_k_20() {
        let p = topk_passes(248_320, 20).unwrap();
        assert_eq!(
            p,
            vec![
                TopkPass {
                    inputs: 248_320,
                    blocks: 122
                },
                TopkPass {
                    inputs: 2440,
                    blocks: 2
                },
                TopkPass {
                    inputs: 40,
                    blocks: 1
                },
            ]
        );
        assert_eq!(topk_scratch_keys(248_320, 20), 2442);
        assert_eq!(weight_chunks(248_320), 243);
    }

    #[test]
    fn passes_chain_shrink_and_end_in_one_block() {
        for n in [1, 7, 2047, 2048, 2049, 4097, 100_000, 248_320] {
            for k in [1, 2, 20, 64, 500, 1023, 1024] {
                let p = topk_passes(n, k).unwrap();
                assert_eq!(p[0].inputs, n);
                assert_eq!(p.last().unwrap().blocks, 1, "n {n} k {k}");
                for w in p.windows(2) {
                    assert_eq!(w[1].inputs, w[0].blocks * k);
                    assert!(w[1].inputs < w[0].inputs, "n {n} k {k}: {p:?}");
                }
                for q in &p {
                    assert_eq!(q.blocks, q.inputs.div_ceil(TOPK_CHUNK));
                    assert!(q.blocks * k <= topk_scratch_keys(n, TOPK_MAX).max(k));
                }
            }
        }
        assert_eq!(topk_passes(100, 0), None);
        assert_eq!(topk_passes(100, TOPK_MAX + 1), None);
        assert_eq!(topk_passes(0, 5), None);
    }

    #[test]
    fn keys_order_as_the_sampler_ranks_and_give_back_the_scaled_logit() {
        let vals = [
            3.5,
            -0.0,
            0.0,
            -7.25,
            1e-30,
            -1e-30,
            3.5,
            f32::MAX,
            f32::MIN,
        ];
        let t = 0.7;
        let mut by_key: Vec<(u64, u32)> = vals
            .iter()
            .enumerate()
            .map(|(i, &v)| (key(v, t, i as u32), i as u32))
            .collect();
        by_key.sort_unstable_by_key(|p| std::cmp::Reverse(p.0));
        let mut by_rank: Vec<(u64, u32)> = vals
            .iter()
            .enumerate()
            .map(|(i, &v)| (model::rank::rank_key(i as u32, v / t), i as u32))
            .collect();
        by_rank.sort_unstable();
        let ids = |v: &[(u64, u32)]| v.iter().map(|p| p.1).collect::<Vec<_>>();
        assert_eq!(ids(&by_key), ids(&by_rank));
        for (i, &v) in vals.iter().enumerate() {
            let (id, x) = topk_unkey(key(v, t, i as u32)).unwrap();
            assert_eq!(id, i as u32);
            assert_eq!(x.to_bits(), (v / t).to_bits());
        }
        assert_eq!(topk_unkey(0), None);
        assert_eq!(key(f32::INFINITY, t, 3), 0);
        assert_eq!(key(f32::NAN, t, 3), 0);
    }
}
