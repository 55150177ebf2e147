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
