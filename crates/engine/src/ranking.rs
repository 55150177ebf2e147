//! What a draw from the best candidates asks of a device and gives back
//! ([`crate::Sampler::ranked_draw`], [`crate::Sampler::sample_ranked`]), and the rank orders a
//! draw walks: the device's list of candidates, or the row's bands (`bands.rs`).

use model::rank::Ranked;

/// Candidates a device returns for a draw without a top-k limit: enough for a peaked
/// distribution's nucleus and draw; a draw that reads past them takes the row.
pub const RANKED_CANDIDATES: usize = 256;

/// What [`crate::Sampler::ranked_draw`] asks of a device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RankedRequest {
    /// Candidates: the best `k` by logit / temperature.
    pub k: usize,
    pub temperature: f32,
    /// With `Some(floor)`, the row's weight sums too (`model::rank::weight_sums` with that
    /// floor, the best candidate's scaled logit as the maximum).
    pub floor: Option<f32>,
}

impl RankedRequest {
    /// What a selecting device answers for `row` ([`Ranked::of_row`]), computed on the host.
    pub fn answer(&self, row: &[f32]) -> Ranked {
        Ranked::of_row(row, self.k, self.temperature, self.floor)
    }
}

/// What [`crate::Sampler::sample_ranked`] gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drawn {
    Token(u32),
    /// The draw reads past the candidates: [`crate::Sampler::sample_from_row`] finishes it.
    NeedsRow,
}

/// A walk read past what a ranking knows.
pub(crate) struct Unknown;

/// Candidates in rank order, as far as a walk reads them: the `i`-th as (id, logit /
/// temperature), `None` past the last finite logit.
pub(crate) trait Ranking {
    fn get(&mut self, i: usize) -> Result<Option<(u32, f32)>, Unknown>;
}

/// The best candidates a device selected: all there are when `complete`.
pub(crate) struct Listed<'a> {
    pub(crate) top: &'a [(u32, f32)],
    pub(crate) complete: bool,
}

impl Ranking for Listed<'_> {
    fn get(&mut self, i: usize) -> Result<Option<(u32, f32)>, Unknown> {
        match self.top.get(i) {
            Some(&c) => Ok(Some(c)),
            None if self.complete => Ok(None),
            None => Err(Unknown),
        }
    }
}
