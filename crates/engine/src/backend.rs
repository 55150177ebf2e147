//! What the generation loop needs from a device: a forward pass over a sequence state. The CPU
//! model always provides it; the CUDA model does with the `cuda` feature.

use model::{Logits, Model, State};

use crate::error::Result;
use crate::sampler::{argmax, SamplerError};

pub trait Backend {
    /// Per-sequence state (KV cache and recurrent state) on this device.
    type State;

    /// Tokens the state has consumed.
    fn state_len(&self, state: &Self::State) -> usize;

    /// The most tokens a state can hold.
    fn context_length(&self, state: &Self::State) -> usize;

    /// Runs `tokens` after what `state` holds; logits as asked, `[n][vocab]`.
    fn forward(&self, state: &mut Self::State, tokens: &[u32], logits: Logits) -> Result<Vec<f32>>;

    /// Runs `tokens` and returns the most likely next token (the largest logit, ties to the
    /// lowest id, NaN never chosen), for greedy decoding that needs no logits. A device that can
    /// pick it where the logits are computed overrides this (the GPU: 8 bytes back per token
    /// instead of the vocabulary's row).
    fn forward_argmax(&self, state: &mut Self::State, tokens: &[u32]) -> Result<u32> {
        let logits = self.forward(state, tokens, Logits::Last)?;
        let best = argmax(&logits).ok_or(SamplerError::NoFiniteLogit)?;
        Ok(best as u32)
    }

    /// Runs `tokens` and returns what a draw with a top-k limit needs
    /// ([`crate::Sampler::ranked_draw`]): by default the row of logits. A device that can select
    /// the `k` best where the logits are computed overrides this (the GPU: k candidates back per
    /// token instead of the vocabulary's row).
    fn forward_top_k(
        &self,
        state: &mut Self::State,
        tokens: &[u32],
        k: usize,
        temperature: f32,
    ) -> Result<Ranked> {
        let _ = (k, temperature);
        Ok(Ranked::Row(self.forward(state, tokens, Logits::Last)?))
    }
}

/// What [`Backend::forward_top_k`] returns.
#[derive(Clone, Debug, PartialEq)]
pub enum Ranked {
    /// [`model::rank::top_k`] of the row: the row's logits are all finite or NaN.
    Top(Vec<(u32, f32)>),
    /// The row of logits: the device does not select, or the row holds an infinite logit (for
    /// which the sampler's rule is not a top-k one).
    Row(Vec<f32>),
}

impl Ranked {
    /// The device's side of the contract, on the host: `Top` unless the row holds ±∞.
    pub fn of_row(row: Vec<f32>, k: usize, temperature: f32) -> Ranked {
        if row.iter().any(|v| v.is_infinite()) {
            Ranked::Row(row)
        } else {
            Ranked::Top(model::rank::top_k(&row, k, temperature))
        }
    }
}

impl Backend for Model {
    type State = State;

    fn state_len(&self, state: &State) -> usize {
        state.len()
    }

    fn context_length(&self, _state: &State) -> usize {
        self.config.context_length
    }

    fn forward(&self, state: &mut State, tokens: &[u32], logits: Logits) -> Result<Vec<f32>> {
        Ok(Model::forward(self, state, tokens, logits)?)
    }
}

#[cfg(feature = "cuda")]
impl Backend for niwaki_cuda::CudaModel {
    type State = niwaki_cuda::CudaState;

    fn state_len(&self, state: &Self::State) -> usize {
        state.len()
    }

    fn context_length(&self, state: &Self::State) -> usize {
        state.context()
    }

    fn forward(&self, state: &mut Self::State, tokens: &[u32], logits: Logits) -> Result<Vec<f32>> {
        niwaki_cuda::CudaModel::forward(self, state, tokens, logits)
            .map_err(|e| crate::EngineError::Backend(e.to_string()))
    }

    fn forward_top_k(
        &self,
        state: &mut Self::State,
        tokens: &[u32],
        k: usize,
        temperature: f32,
    ) -> Result<Ranked> {
        let got = niwaki_cuda::CudaModel::forward_top_k(self, state, tokens, k, temperature)
            .map_err(|e| crate::EngineError::Backend(e.to_string()))?;
        Ok(match got {
            niwaki_cuda::TopK::Top(top) => Ranked::Top(top),
            niwaki_cuda::TopK::Row(row) => Ranked::Row(row),
        })
    }

    fn forward_argmax(&self, state: &mut Self::State, tokens: &[u32]) -> Result<u32> {
        let id = niwaki_cuda::CudaModel::forward_greedy(self, state, tokens)
            .map_err(|e| crate::EngineError::Backend(e.to_string()))?;
        // The device reports no token when every logit was NaN.
        if id as usize >= niwaki_cuda::CudaModel::vocab(self) {
            return Err(SamplerError::NoFiniteLogit.into());
        }
        Ok(id)
    }
}
