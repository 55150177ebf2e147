//! Turning logits into a token: penalties, greedy or seeded random sampling with temperature,
//! top-k, top-p and min-p.

use std::collections::HashMap;

use model::rank::{exp_weight, rank_keys, top_k, weight_sums};

use crate::bands::RankedBands;
use crate::ranking::{Drawn, Listed, RankedRequest, Ranking, Unknown, RANKED_CANDIDATES};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1 disables.
    pub top_p: f32,
    /// 0 disables.
    pub min_p: f32,
    /// 1 disables. Divides positive logits and multiplies negative ones of tokens already seen.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token already generated.
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of every token already generated.
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at (0: all).
    pub penalty_window: usize,
    pub seed: u64,
}

impl SamplerConfig {
    /// Whether every pick is the largest raw logit (greedy, no penalties): the device may then
    /// pick it itself ([`crate::Backend::forward_argmax`]), and drafts can be verified.
    pub fn is_plain_greedy(&self) -> bool {
        self.temperature == 0.0 && !self.has_penalties()
    }

    fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_window: 0,
            seed: 0,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SamplerError {
    #[error("{name} = {value} is out of range ({range})")]
    OutOfRange {
        name: &'static str,
        value: f32,
        range: &'static str,
    },
    #[error("logits contain no finite value")]
    NoFiniteLogit,
}

impl SamplerConfig {
    pub fn validate(&self) -> Result<(), SamplerError> {
        let check = |name, value: f32, ok: bool, range| {
            if ok && value.is_finite() {
                Ok(())
            } else {
                Err(SamplerError::OutOfRange { name, value, range })
            }
        };
        check(
            "temperature",
            self.temperature,
            self.temperature >= 0.0,
            "≥ 0",
        )?;
        check(
            "top_p",
            self.top_p,
            self.top_p > 0.0 && self.top_p <= 1.0,
            "(0, 1]",
        )?;
        check(
            "min_p",
            self.min_p,
            (0.0..=1.0).contains(&self.min_p),
            "[0, 1]",
        )?;
        check(
            "repetition_penalty",
            self.repetition_penalty,
            self.repetition_penalty > 0.0,
            "> 0",
        )?;
        check(
            "presence_penalty",
            self.presence_penalty,
            self.presence_penalty.abs() <= 2.0,
            "[-2, 2]",
        )?;
        check(
            "frequency_penalty",
            self.frequency_penalty,
            self.frequency_penalty.abs() <= 2.0,
            "[-2, 2]",
        )?;
        Ok(())
    }
}

/// Index of the largest value ignoring NaN; ties go to the lowest index, on every path.
pub use model::ops::argmax;

pub struct Sampler {
    cfg: SamplerConfig,
    rng: ChaCha8Rng,
    /// The random number of a draw [`Sampler::sample_ranked`] left to the row.
    pending: Option<f32>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Result<Sampler, SamplerError> {
        cfg.validate()?;
        let rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        Ok(Sampler {
            cfg,
            rng,
            pending: None,
        })
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Whether every pick is the largest raw logit ([`SamplerConfig::is_plain_greedy`]).
    pub fn is_plain_greedy(&self) -> bool {
        self.cfg.is_plain_greedy()
    }

    /// What a device must return for a draw to be made from the best candidates alone (random
    /// sampling without penalties): with a top-k limit, its k best by logit / temperature; without
    /// one, [`RANKED_CANDIDATES`] of them and the row's weight sums
    /// (`model::rank::weight_sums`, `floor` min-p's). The device may then select them itself
    /// ([`crate::Backend::forward_top_k`]) and the draw is made by [`Sampler::sample_ranked`].
    pub fn ranked_draw(&self) -> Option<RankedRequest> {
        let c = &self.cfg;
        if c.temperature <= 0.0 || c.has_penalties() {
            return None;
        }
        let temperature = c.temperature.max(f32::MIN_POSITIVE);
        Some(if c.top_k > 0 {
            RankedRequest {
                k: c.top_k,
                temperature,
                floor: None,
            }
        } else {
            RankedRequest {
                k: RANKED_CANDIDATES,
                temperature,
                floor: Some(c.min_p),
            }
        })
    }

    /// The token [`Sampler::sample`] picks from a row of logits, every one finite or NaN, given
    /// only what [`Sampler::ranked_draw`] asked of it: `top`, [`model::rank::top_k`] of that
    /// row, and without a top-k limit `sums`, its weight sums. The same random draw, the same
    /// candidates, the same arithmetic on them. Without a top-k limit, a draw that reads past
    /// the candidates needs the row ([`Drawn::NeedsRow`], then [`Sampler::sample_from_row`]).
    pub fn sample_ranked(
        &mut self,
        top: &[(u32, f32)],
        sums: Option<(f32, f32)>,
    ) -> Result<Drawn, SamplerError> {
        let &(first, max) = top.first().ok_or(SamplerError::NoFiniteLogit)?;
        let r: f32 = self.rng.gen();
        if self.cfg.top_k > 0 {
            return Ok(Drawn::Token(
                pick(&self.probabilities(top.to_vec()), r).unwrap_or(first),
            ));
        }
        let Some((total, kept)) = sums else {
            self.pending = Some(r);
            return Ok(Drawn::NeedsRow);
        };
        let mut listed = Listed {
            top,
            complete: top.len() < RANKED_CANDIDATES,
        };
        match self.walk(&mut listed, max, total, kept, r) {
            Ok(id) => Ok(Drawn::Token(id.unwrap_or(first))),
            Err(Unknown) => {
                self.pending = Some(r);
                Ok(Drawn::NeedsRow)
            }
        }
    }

    /// Finishes the draw [`Sampler::sample_ranked`] began when it needed the row: the same
    /// random number, the row it was drawn against.
    pub fn sample_from_row(&mut self, logits: &[f32]) -> Result<u32, SamplerError> {
        let best = argmax(logits).ok_or(SamplerError::NoFiniteLogit)?;
        let r = match self.pending.take() {
            Some(r) => r,
            None => self.rng.gen(),
        };
        Ok(self
            .pick_unlimited(logits, logits[best], r)
            .unwrap_or(best as u32))
    }

    /// Applies repetition, presence and frequency penalties for the tokens in `history`.
    pub fn apply_penalties(&self, logits: &mut [f32], history: &[u32]) {
        let c = &self.cfg;
        if !c.has_penalties() {
            return;
        }
        let window = if c.penalty_window == 0 {
            history.len()
        } else {
            c.penalty_window.min(history.len())
        };
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in &history[history.len() - window..] {
            *counts.entry(t).or_default() += 1;
        }
        for (&t, &n) in &counts {
            let Some(l) = logits.get_mut(t as usize) else {
                continue;
            };
            if c.repetition_penalty != 1.0 {
                *l = if *l > 0.0 {
                    *l / c.repetition_penalty
                } else {
                    *l * c.repetition_penalty
                };
            }
            *l -= c.presence_penalty + c.frequency_penalty * n as f32;
        }
    }

    /// Picks the next token. `logits` is modified in place.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> Result<u32, SamplerError> {
        self.apply_penalties(logits, history);
        let best = argmax(logits).ok_or(SamplerError::NoFiniteLogit)?;
        if self.cfg.temperature == 0.0 || !logits[best].is_finite() {
            return Ok(best as u32);
        }
        let r: f32 = self.rng.gen();
        Ok(if self.cfg.top_k > 0 {
            pick(&self.distribution(logits), r)
        } else {
            self.pick_unlimited(logits, logits[best], r)
        }
        .unwrap_or(best as u32))
    }

    /// The token a uniform draw `r` selects from [`Sampler::distribution`] without a top-k
    /// limit, without ordering the whole vocabulary (`best`: the largest logit, finite):
    /// sampling from a 248k-token vocabulary sorted it every token (9–17 ms on the host against
    /// a 4 ms GPU step). The weights exp(x − max) are summed as `model::rank::weight_sums`
    /// orders it; the candidates are visited in rank order, gathered in bands below the best
    /// ([`RankedBands`]) only as far as the nucleus (top-p) and the draw reach. The same
    /// distribution as `distribution`'s; a draw within float rounding of a boundary may land on
    /// the neighbour.
    fn pick_unlimited(&self, logits: &[f32], best: f32, r: f32) -> Option<u32> {
        let t = self.cfg.temperature.max(f32::MIN_POSITIVE);
        // Division by t > 0 is monotone: the best scaled logit is the best logit scaled.
        let max = best / t;
        let (total, kept) = weight_sums(logits, t, max, self.cfg.min_p);
        let mut ranked = RankedBands::new(logits, t, max);
        self.walk(&mut ranked, max, total, kept, r).unwrap_or(None)
    }

    /// The draw `r` over candidates in rank order, weighted exp(x − max) (`total`, `all_kept`:
    /// [`weight_sums`] of the row): through the nucleus (top-p) first, then to the candidate
    /// where the running weight passes `r` times the kept weight (min-p's floor applied).
    fn walk(
        &self,
        ranked: &mut impl Ranking,
        max: f32,
        total: f32,
        all_kept: f32,
        r: f32,
    ) -> Result<Option<u32>, Unknown> {
        let c = &self.cfg;
        let weight = |x: f32| exp_weight(x - max);
        // min-p keeps weights of at least min_p times the largest (1).
        let floor = c.min_p;
        let mut end = usize::MAX;
        let kept_sum = if c.top_p < 1.0 {
            let (mut acc, mut kept, mut i) = (0f32, 0f32, 0);
            while let Some((_, x)) = ranked.get(i)? {
                let w = weight(x);
                acc += w;
                if w >= floor {
                    kept += w;
                }
                i += 1;
                if acc >= c.top_p * total {
                    break;
                }
            }
            end = i;
            kept
        } else {
            all_kept
        };
        let target = r * kept_sum;
        let (mut acc, mut last, mut i) = (0f32, None, 0);
        while i < end {
            let Some((id, x)) = ranked.get(i)? else {
                break;
            };
            let w = weight(x);
            if w < floor {
                // Rank order: every later weight is smaller still.
                break;
            }
            acc += w;
            last = Some(id);
            if target < acc {
                return Ok(Some(id));
            }
            i += 1;
        }
        Ok(last)
    }

    /// The candidate tokens and their probabilities after temperature, top-k, top-p and min-p,
    /// most probable first (ties by lowest id), summing to one.
    pub fn distribution(&self, logits: &[f32]) -> Vec<(u32, f32)> {
        let c = &self.cfg;
        let t = c.temperature.max(f32::MIN_POSITIVE);
        let cand: Vec<(u32, f32)> = if c.top_k > 0 {
            top_k(logits, c.top_k, t)
        } else {
            // Every candidate: integer keys sort several times faster than compared pairs.
            let mut keys: Vec<u64> = rank_keys(logits, t).collect();
            keys.sort_unstable();
            keys.into_iter()
                .map(|k| {
                    let id = k as u32;
                    (id, logits[id as usize] / t)
                })
                .collect()
        };
        self.probabilities(cand)
    }

    /// [`Sampler::distribution`] from its candidates: `(id, logit / temperature)` in rank order.
    fn probabilities(&self, mut cand: Vec<(u32, f32)>) -> Vec<(u32, f32)> {
        let c = &self.cfg;
        let max = cand[0].1;
        let mut sum = 0f32;
        for x in cand.iter_mut() {
            x.1 = exp_weight(x.1 - max);
            sum += x.1;
        }
        cand.iter_mut().for_each(|x| x.1 /= sum);
        if c.top_p < 1.0 {
            let mut acc = 0f32;
            let keep = cand
                .iter()
                .position(|x| {
                    acc += x.1;
                    acc >= c.top_p
                })
                .map_or(cand.len(), |i| i + 1);
            cand.truncate(keep);
        }
        if c.min_p > 0.0 {
            let floor = cand[0].1 * c.min_p;
            cand.retain(|x| x.1 >= floor);
        }
        let sum: f32 = cand.iter().map(|x| x.1).sum();
        cand.iter_mut().for_each(|x| x.1 /= sum);
        cand
    }
}

/// The token a uniform draw `r` selects from a distribution, most probable first.
fn pick(probs: &[(u32, f32)], r: f32) -> Option<u32> {
    let mut acc = 0f32;
    for &(id, p) in probs {
        acc += p;
        if r < acc {
            return Some(id);
        }
    }
    probs.last().map(|&(id, _)| id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(f: impl FnOnce(&mut SamplerConfig)) -> Sampler {
        let mut c = SamplerConfig::default();
        f(&mut c);
        Sampler::new(c).unwrap()
    }

    #[test]
    fn greedy_ties_go_to_the_lowest_id() {
        let mut s = sampler(|_| {});
        assert_eq!(s.sample(&mut [1.0, 3.0, 3.0, 2.0], &[]).unwrap(), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, 0.5]), Some(1));
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.7).sin()).collect();
        let run = |seed| {
            let mut s = sampler(|c| {
                c.temperature = 1.0;
                c.seed = seed;
            });
            (0..20)
                .map(|_| s.sample(&mut logits.clone(), &[]).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn candidates_come_in_the_order_a_full_sort_gives_top_k_or_not() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for (n, k) in [
            (1000usize, 20usize),
            (300, 1),
            (50, 49),
            (2000, 64),
            (700, 0),
        ] {
            // Few distinct values (negative, zero and positive): many ties, which go to the
            // lowest id.
            let logits: Vec<f32> = (0..n)
                .map(|_| (rng.gen_range(0..40) as f32 - 20.0) * 0.25)
                .collect();
            let s = sampler(|c| {
                c.temperature = 0.7;
                c.top_k = k;
            });
            let got = s.distribution(&logits);
            let mut order: Vec<u32> = (0..n as u32).collect();
            order.sort_by(|&a, &b| {
                logits[b as usize]
                    .total_cmp(&logits[a as usize])
                    .then(a.cmp(&b))
            });
            if k > 0 {
                order.truncate(k);
            }
            let ids: Vec<u32> = got.iter().map(|x| x.0).collect();
            assert_eq!(ids, order, "n {n}, k {k}");
        }
    }

    #[test]
    fn sampling_without_top_k_draws_what_the_full_distribution_draws() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let configs = [
            (1.0, 1.0, 0.0),
            (0.7, 0.95, 0.0),
            (1.3, 1.0, 0.05),
            (0.5, 0.8, 0.1),
        ];
        let (mut draws, mut near) = (0, 0);
        for (n, spread) in [(5000usize, 12.0f32), (300, 1.0), (2000, 40.0)] {
            let mut logits: Vec<f32> = (0..n).map(|_| rng.gen_range(-spread..spread)).collect();
            // Ties, and values the candidates must skip.
            logits[7] = logits[3];
            logits[11] = f32::NAN;
            logits[12] = f32::NEG_INFINITY;
            for (temperature, top_p, min_p) in configs {
                let s = sampler(|c| {
                    c.temperature = temperature;
                    c.top_p = top_p;
                    c.min_p = min_p;
                });
                let probs = s.distribution(&logits);
                let best = logits[argmax(&logits).unwrap()];
                for i in 0..400 {
                    let r = (i as f32 + 0.5) / 400.0;
                    let want = pick(&probs, r);
                    let got = s.pick_unlimited(&logits, best, r);
                    draws += 1;
                    if got != want {
                        // Only where float rounding of the sums can move the boundary.
                        let mut acc = 0f32;
                        let close = probs.iter().any(|&(_, p)| {
                            acc += p;
                            (acc - r).abs() < 1e-4
                        });
                        assert!(close, "n {n}, config {temperature}/{top_p}/{min_p}, r {r}: {got:?} vs {want:?}");
                        near += 1;
                    }
                }
            }
        }
        assert!(near * 100 < draws, "{near} of {draws} draws differ");
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut s = sampler(|c| {
            c.temperature = 5.0;
            c.top_k = 1;
        });
        for _ in 0..20 {
            assert_eq!(s.sample(&mut [0.1, 0.3, 0.2], &[]).unwrap(), 1);
        }
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_p() {
        let s = sampler(|c| {
            c.temperature = 1.0;
            c.top_p = 0.7;
        });
        let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
        let d = s.distribution(&logits);
        assert_eq!(d.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1]);
        assert!((d[0].1 - 0.625).abs() < 1e-5);
    }

    #[test]
    fn min_p_drops_tokens_below_the_floor() {
        let s = sampler(|c| {
            c.temperature = 1.0;
            c.min_p = 0.5;
        });
        let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
        assert_eq!(
            s.distribution(&logits)
                .iter()
                .map(|x| x.0)
                .collect::<Vec<_>>(),
            vec![0, 1]
        );
    }

    #[test]
    fn penalties_lower_seen_tokens() {
        let s = sampler(|c| {
            c.repetition_penalty = 2.0;
            c.presence_penalty = 0.5;
            c.frequency_penalty = 0.25;
        });
        let mut l = [2.0, -2.0, 1.0];
        s.apply_penalties(&mut l, &[0, 1, 1]);
        assert_eq!(l, [2.0 / 2.0 - 0.5 - 0.25, -2.0 * 2.0 - 0.5 - 0.5, 1.0]);
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let mut s = sampler(|c| {
            c.temperature = 1.0;
            c.seed = 3;
        });
        let logits = [0.7f32.ln(), 0.3f32.ln()];
        let n = 4000;
        let zeros = (0..n)
            .filter(|_| s.sample(&mut logits.clone(), &[]).unwrap() == 0)
            .count();
        let frac = zeros as f32 / n as f32;
        assert!((frac - 0.7).abs() < 0.03, "{frac}");
    }

    #[test]
    fn bad_parameters_are_refused() {
        let c = SamplerConfig {
            top_p: 0.0,
            ..Default::default()
        };
        assert!(Sampler::new(c).is_err());
        let c = SamplerConfig {
            temperature: -1.0,
            ..Default::default()
        };
        assert!(Sampler::new(c).is_err());
    }
}
