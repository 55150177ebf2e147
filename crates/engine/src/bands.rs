//! The candidates of a draw without a top-k limit, in rank order, gathered only as far as the
//! draw reads them.

use std::f32::consts::LN_2;

use model::rank::{rank_key, raw_bound_below};

use crate::ranking::{Ranking, Unknown};

/// How far below the best scaled logit each band reaches: weights down to 2^-8, 2^-16, 2^-32
/// and 2^-64 of the best, then the rest. A peaked distribution's draw ends in the first band, a
/// few dozen candidates gathered by one comparison per token of the vocabulary (selecting the
/// best 64 of 248k keys took 0.4 ms on the development machine).
const BAND_DEPTHS: [f32; 4] = [8.0 * LN_2, 16.0 * LN_2, 32.0 * LN_2, 64.0 * LN_2];

/// The finite logits ranked by `logit / t` (best first, ties to the lower id), produced band by
/// band: the keys of a band are gathered and sorted when the walk first reaches it.
pub(crate) struct RankedBands<'a> {
    logits: &'a [f32],
    t: f32,
    max: f32,
    ranked: Vec<u64>,
    bands: usize,
}

impl<'a> RankedBands<'a> {
    /// `max`: the largest `logit / t` of a finite logit.
    pub(crate) fn new(logits: &'a [f32], t: f32, max: f32) -> Self {
        RankedBands {
            logits,
            t,
            max,
            ranked: Vec::new(),
            bands: 0,
        }
    }

    /// The id ranked `i`-th (0: the best), if there are that many.
    pub(crate) fn get(&mut self, i: usize) -> Option<u32> {
        while i >= self.ranked.len() {
            if self.bands > BAND_DEPTHS.len() {
                return None;
            }
            self.gather_next();
        }
        Some(self.ranked[i] as u32)
    }

    /// The lowest scaled logit of band `b` (−∞ for the last).
    fn floor_of(&self, b: usize) -> f32 {
        BAND_DEPTHS
            .get(b)
            .map_or(f32::NEG_INFINITY, |d| self.max - d)
    }

    fn gather_next(&mut self) {
        let b = self.bands;
        let lo = self.floor_of(b);
        let above = (b > 0).then(|| self.floor_of(b - 1));
        // A bound on the raw logit below every member, so that most of the vocabulary costs
        // one comparison.
        let raw_lo = raw_bound_below(lo * self.t);
        let start = self.ranked.len();
        for (id, &v) in self.logits.iter().enumerate() {
            if v >= raw_lo && v.is_finite() {
                let x = v / self.t;
                if x >= lo && above.is_none_or(|a| x < a) {
                    self.ranked.push(rank_key(id as u32, x));
                }
            }
        }
        self.ranked[start..].sort_unstable();
        self.bands += 1;
    }
}

impl Ranking for RankedBands<'_> {
    fn get(&mut self, i: usize) -> Result<Option<(u32, f32)>, Unknown> {
        Ok(RankedBands::get(self, i).map(|id| (id, self.logits[id as usize] / self.t)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_give_the_full_rank_order() {
        let mut s = 0x2545_f491_u32;
        let logits: Vec<f32> = (0..20_000)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                match i % 501 {
                    0 => f32::NAN,
                    1 => f32::NEG_INFINITY,
                    // A long tail far below the best, into the last band, and ties.
                    _ => (s % 400) as f32 * 0.25 - 90.0,
                }
            })
            .collect();
        for t in [0.3f32, 1.0, 2.5] {
            let mut all: Vec<u64> = model::rank::rank_keys(&logits, t).collect();
            all.sort_unstable();
            let max = logits[all[0] as u32 as usize] / t;
            let mut bands = RankedBands::new(&logits, t, max);
            let got: Vec<u32> = (0..).map_while(|i| bands.get(i)).collect();
            let want: Vec<u32> = all.iter().map(|&k| k as u32).collect();
            assert_eq!(got, want, "t {t}");
            assert_eq!(bands.bands, BAND_DEPTHS.len() + 1);
        }
    }

    #[test]
    fn a_walk_that_stops_early_gathers_one_band() {
        let logits = [0.0, 10.0, 9.5, -50.0, 3.0];
        let mut bands = RankedBands::new(&logits, 1.0, 10.0);
        assert_eq!((bands.get(0), bands.get(1)), (Some(1), Some(2)));
        assert_eq!(bands.bands, 1);
        let rest: Vec<Option<u32>> = (2..6).map(|i| bands.get(i)).collect();
        assert_eq!(rest, [Some(4), Some(0), Some(3), None]);
    }
}
