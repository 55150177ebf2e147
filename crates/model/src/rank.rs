//! The rank order of candidate tokens for sampling, and the best k of a logits row in it. The
//! sampler draws from these; a device that selects them itself (the GPU) is held to
//! [`top_k`].

use std::collections::BinaryHeap;

/// A key whose ascending order is the rank order of candidate `id` with scaled logit `x`:
/// larger values first (the bits mapped so that integer order is `total_cmp`'s, inverted), then
/// the lower id.
pub fn rank_key(id: u32, x: f32) -> u64 {
    let b = x.to_bits();
    let ordered = if b >> 31 == 1 { !b } else { b | 0x8000_0000 };
    (u64::from(!ordered) << 32) | u64::from(id)
}

/// The rank keys of the finite logits, by `logit / temperature`, in id order.
pub fn rank_keys(logits: &[f32], temperature: f32) -> impl Iterator<Item = u64> + '_ {
    logits
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .map(move |(i, &v)| rank_key(i as u32, v / temperature))
}

/// exp(d) for d ≤ 0: a sampling weight exp(x − max). Plain IEEE multiplies and adds in a fixed
/// order (no fused ones, no library call), so that a vectorized loop, any platform and a GPU
/// kernel written with the same operations give the same bits, and so that a pass over a
/// 248k-token row vectorizes (the library's `exp`, one call per token, took most of a
/// sampled step's host time). Relative error under 3 · 2^-23; exp(0) = 1 exactly; 0 below −87.3
/// (and for NaN).
#[inline(always)]
pub fn exp_weight(d: f32) -> f32 {
    // Constants by their bits, as `kernels/topk.cu` spells them.
    let log2e = f32::from_bits(0x3fb8_aa3b);
    // ln 2 split so that k · ln2_hi is exact for the |k| ≤ 126 used here.
    let ln2_hi = f32::from_bits(0x3f31_7200);
    let ln2_lo = f32::from_bits(0x35bf_be8e);
    // Adding 1.5 · 2^23 rounds to an integer (ties to even) and leaves it in the low bits.
    let magic = f32::from_bits(0x4b40_0000);
    let (c6, c24, c120, c720) = (
        f32::from_bits(0x3e2a_aaab),
        f32::from_bits(0x3d2a_aaab),
        f32::from_bits(0x3c08_8889),
        f32::from_bits(0x3ab6_0b61),
    );
    let z = d * log2e + magic;
    let kf = z - magic;
    let k = (z.to_bits() as i32).wrapping_sub(magic.to_bits() as i32);
    let r = (d - kf * ln2_hi) - kf * ln2_lo;
    // Taylor to degree 6 on |r| ≤ ln 2 / 2 (truncation under 1.1e-7 relative).
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (c6 + r * (c24 + r * (c120 + r * c720)))));
    let scale = f32::from_bits(((k.wrapping_add(127) as u32) & 0xff) << 23);
    if d > f32::from_bits(0xc2ae_999a) {
        p * scale
    } else {
        0.0
    }
}

/// The order of [`weight_sums`]: the row in chunks of `WEIGHT_CHUNK` ids; within a chunk, id i
/// goes to lane i mod `WEIGHT_LANES`, each lane summed in id order from zero and the lanes
/// added first to last; the chunks' sums added first to last. A vectorized loop on the host and
/// a kernel of one thread per lane and chunk on the GPU add in exactly this order.
pub const WEIGHT_LANES: usize = 16;
pub const WEIGHT_CHUNK: usize = 1024;

/// Σ exp_weight(logit / temperature − max) over the finite logits (the softmax's denominator),
/// and the same over the weights of at least `floor` (min-p's kept mass), in the order
/// [`WEIGHT_CHUNK`] describes.
pub fn weight_sums(logits: &[f32], temperature: f32, max: f32, floor: f32) -> (f32, f32) {
    let (mut total, mut kept) = (0f32, 0f32);
    for chunk in logits.chunks(WEIGHT_CHUNK) {
        let mut lt = [0f32; WEIGHT_LANES];
        let mut lk = [0f32; WEIGHT_LANES];
        for part in chunk.chunks(WEIGHT_LANES) {
            for (j, &v) in part.iter().enumerate() {
                let w = exp_weight(v / temperature - max);
                let w = if v.is_finite() { w } else { 0.0 };
                lt[j] += w;
                lk[j] += if w >= floor { w } else { 0.0 };
            }
        }
        total += lt.iter().fold(0f32, |a, &b| a + b);
        kept += lk.iter().fold(0f32, |a, &b| a + b);
    }
    (total, kept)
}

/// A bound under which no raw logit `v` can have `v / temperature` at or above the scaled value
/// whose raw counterpart is `raw` (a raw logit, or a scaled one times the temperature): it
/// sits below `raw` by more than the rounding of the division and of that product, so that a
/// pass can reject most of the vocabulary by one comparison and still reach every tie.
pub fn raw_bound_below(raw: f32) -> f32 {
    raw - raw.abs() * 1e-6 - f32::MIN_POSITIVE
}

/// The `k` best finite logits by `logit / temperature`, as `(id, logit / temperature)`, best
/// first, ties to the lower id (fewer when fewer are finite).
///
/// One pass with a heap of k: sorting all 248k candidates held a GPU decode step to 60 tok/s
/// (10 ms per token on the host; the heap: well under one). The rank order is total (ids are
/// unique), so the k kept are those a full sort would keep.
pub fn top_k(logits: &[f32], k: usize, temperature: f32) -> Vec<(u32, f32)> {
    let mut heap = BinaryHeap::with_capacity(k + 1);
    // Once the heap is full, a raw logit under this bound cannot enter it: one comparison
    // instead of a division for most of the vocabulary.
    let mut raw_lo = f32::NEG_INFINITY;
    for (id, &v) in logits.iter().enumerate() {
        if v < raw_lo || !v.is_finite() {
            continue;
        }
        let key = rank_key(id as u32, v / temperature);
        if heap.len() < k {
            heap.push(key);
        } else if heap.peek().is_some_and(|&worst| key < worst) {
            heap.pop();
            heap.push(key);
        } else {
            continue;
        }
        if heap.len() == k {
            if let Some(&worst) = heap.peek() {
                raw_lo = raw_bound_below(logits[worst as u32 as usize]);
            }
        }
    }
    heap.into_sorted_vec()
        .into_iter()
        .map(|key| {
            let id = key as u32;
            (id, logits[id as usize] / temperature)
        })
        .collect()
}

/// What a device gives a draw from the best candidates (the engine's `Backend::forward_top_k`).
#[derive(Clone, Debug, PartialEq)]
pub enum Ranked {
    /// [`top_k`] of the row, and with a floor asked for its [`weight_sums`] (total, kept), the
    /// best candidate's scaled logit as the maximum. The row's logits are all finite or NaN.
    Top {
        top: Vec<(u32, f32)>,
        sums: Option<(f32, f32)>,
    },
    /// The row of logits: the device does not select, or the row holds an infinite logit (for
    /// which the sampler's rule is not a ranked one).
    Row(Vec<f32>),
}

impl Ranked {
    /// A selecting device's answer, computed on the host from the row: `Top` unless it holds ±∞.
    pub fn of_row(row: &[f32], k: usize, temperature: f32, floor: Option<f32>) -> Ranked {
        if row.iter().any(|v| v.is_infinite()) {
            return Ranked::Row(row.to_vec());
        }
        let top = top_k(row, k, temperature);
        let sums = match (floor, top.first()) {
            (Some(floor), Some(&(_, max))) => Some(weight_sums(row, temperature, max, floor)),
            _ => None,
        };
        Ranked::Top { top, sums }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_come_first_and_ties_go_to_the_lower_id() {
        let logits = [
            1.0,
            f32::NAN,
            3.0,
            f32::INFINITY,
            3.0,
            -2.0,
            f32::NEG_INFINITY,
            0.5,
        ];
        assert_eq!(
            top_k(&logits, 4, 0.5),
            vec![(2, 6.0), (4, 6.0), (0, 2.0), (7, 1.0)]
        );
        // Fewer finite logits than k: all of them.
        assert_eq!(top_k(&logits, 100, 1.0).len(), 5);
        assert!(top_k(&[f32::NAN, f32::INFINITY], 3, 1.0).is_empty());
    }

    #[test]
    fn the_weight_is_exp_within_3_epsilon_and_one_at_zero() {
        assert_eq!(exp_weight(0.0).to_bits(), 1f32.to_bits());
        assert_eq!(exp_weight(-0.0).to_bits(), 1f32.to_bits());
        assert_eq!(exp_weight(-90.0), 0.0);
        assert_eq!(exp_weight(f32::NAN), 0.0);
        assert_eq!(exp_weight(f32::NEG_INFINITY), 0.0);
        let mut worst = 0f64;
        let mut d = 0f32;
        while d > -87.2 {
            let got = f64::from(exp_weight(d));
            let want = f64::from(d).exp();
            worst = worst.max((got - want).abs() / (f64::from(f32::EPSILON) * want));
            d -= 0.000_731;
        }
        assert!(worst < 3.0, "{worst} epsilon");
    }

    #[test]
    fn weight_sums_add_by_chunk_and_lane_and_skip_non_finite_logits() {
        let logits: Vec<f32> = (0..3000)
            .map(|i| match i % 97 {
                0 => f32::NAN,
                1 => f32::INFINITY,
                _ => (i % 13) as f32 * 0.3 - 2.0,
            })
            .collect();
        let (t, max, floor) = (0.8, 1.6 / 0.8 + 0.1, 0.05);
        let (mut total, mut kept) = (0f32, 0f32);
        for c in 0..logits.len().div_ceil(WEIGHT_CHUNK) {
            let mut lanes = [[0f32; 2]; WEIGHT_LANES];
            for i in c * WEIGHT_CHUNK..logits.len().min((c + 1) * WEIGHT_CHUNK) {
                let v = logits[i];
                if v.is_finite() {
                    let w = exp_weight(v / t - max);
                    lanes[i % WEIGHT_LANES][0] += w;
                    if w >= floor {
                        lanes[i % WEIGHT_LANES][1] += w;
                    }
                }
            }
            total += lanes.iter().fold(0f32, |a, l| a + l[0]);
            kept += lanes.iter().fold(0f32, |a, l| a + l[1]);
        }
        let (gt, gk) = weight_sums(&logits, t, max, floor);
        assert_eq!(
            (gt.to_bits(), gk.to_bits()),
            (total.to_bits(), kept.to_bits())
        );
        assert!(gk < gt && gk > 0.0);
    }

    #[test]
    fn equals_a_full_sort() {
        let mut s = 0x9e37_79b9_u32;
        let logits: Vec<f32> = (0..5000)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                // Few distinct values: many ties.
                (s % 97) as f32 * 0.25 - 12.0
            })
            .collect();
        // A row whose values sit a few ulp apart, so that the heap's bound on raw logits is
        // tested where the division rounds neighbours together.
        let dense: Vec<f32> = (0..5000)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                1.0 + (s % 3000) as f32 * 1.2e-7
            })
            .collect();
        for (logits, k, t) in [
            (&logits, 1, 1.0),
            (&logits, 20, 0.6),
            (&logits, 777, 1.7),
            (&dense, 20, 0.7),
            (&dense, 300, 3.0),
        ] {
            let mut all: Vec<u64> = logits
                .iter()
                .enumerate()
                .map(|(i, &v)| rank_key(i as u32, v / t))
                .collect();
            all.sort_unstable();
            let want: Vec<(u32, f32)> = all[..k]
                .iter()
                .map(|&key| (key as u32, logits[key as u32 as usize] / t))
                .collect();
            assert_eq!(top_k(logits, k, t), want, "k {k}");
        }
    }
}
