//! What the generation loop needs from a device: a forward pass over a sequence state. The CPU
//! model always provides it; the CUDA model does with the `cuda` feature.

use model::{Checkpoint, Logits, Model, State};

use crate::error::{EngineError, Result};
use crate::ranking::RankedRequest;
use crate::sampler::{argmax, SamplerError};

pub trait Backend {
    /// Per-sequence state (KV cache and recurrent state) on this device.
    type State;

    /// What [`Backend::save`] keeps of a state to rewind it to ([`Backend::verifies_drafts`]).
    type Checkpoint: Default;

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

    /// Runs `tokens` and returns what a draw from the best candidates needs
    /// ([`crate::Sampler::ranked_draw`]): by default the row of logits. A device that can select
    /// them where the logits are computed overrides this (the GPU: k candidates back per token
    /// instead of the vocabulary's row), and [`Backend::last_row`] with it.
    fn forward_top_k(
        &self,
        state: &mut Self::State,
        tokens: &[u32],
        _request: RankedRequest,
    ) -> Result<Ranked> {
        Ok(Ranked::Row(self.forward(state, tokens, Logits::Last)?))
    }

    /// The row of logits of the last [`Backend::forward_top_k`] that returned
    /// [`Ranked::Top`], for a draw that reads past its candidates.
    fn last_row(&self, _state: &mut Self::State) -> Result<Vec<f32>> {
        Err(EngineError::Backend(
            "this device returns whole rows only".into(),
        ))
    }

    /// Whether tokens drafted ahead can be verified without changing the output: a pass over
    /// several tokens gives each position the logits one-token passes would, bit for bit, and
    /// a state can be saved and rewound ([`Backend::save`], [`Backend::rewind`]).
    fn verifies_drafts(&self) -> bool {
        false
    }

    /// Whether [`Backend::save`] and [`Backend::rewind`] work here.
    fn can_rewind(&self) -> bool {
        false
    }

    /// Saves `state`'s position and what a rewind to it needs into `into`.
    fn save(&self, _state: &Self::State, _into: &mut Self::Checkpoint) -> Result<()> {
        Err(EngineError::Backend(
            "this device cannot rewind a sequence".into(),
        ))
    }

    /// Takes `state` back to where `to` was saved from it, forgetting the tokens since.
    fn rewind(&self, _state: &mut Self::State, _to: &Self::Checkpoint) -> Result<()> {
        Err(EngineError::Backend(
            "this device cannot rewind a sequence".into(),
        ))
    }
}

/// What [`Backend::forward_top_k`] returns.
pub use model::rank::Ranked;

impl Backend for Model {
    type State = State;
    type Checkpoint = Checkpoint;

    fn state_len(&self, state: &State) -> usize {
        state.len()
    }

    fn context_length(&self, _state: &State) -> usize {
        self.config.context_length
    }

    fn forward(&self, state: &mut State, tokens: &[u32], logits: Logits) -> Result<Vec<f32>> {
        Ok(Model::forward(self, state, tokens, logits)?)
    }

    /// Each (row, token) product and each token's recurrence step are computed alike whatever
    /// the pass's token count (`model::ops::matmul`; the model's chunked-prefill test).
    fn verifies_drafts(&self) -> bool {
        true
    }

    fn can_rewind(&self) -> bool {
        true
    }

    fn save(&self, state: &State, into: &mut Checkpoint) -> Result<()> {
        state.save(into);
        Ok(())
    }

    fn rewind(&self, state: &mut State, to: &Checkpoint) -> Result<()> {
        Ok(state.rewind(to)?)
    }
}

#[cfg(feature = "cuda")]
impl Backend for niwaki_cuda::CudaModel {
    type State = niwaki_cuda::CudaState;
    // Its several-token passes run other kernels than its one-token ones (GEMMs, not the
    // decode GEMVs): their logits differ in the last bits, so drafts are not verified here
    // ([`Backend::verifies_drafts`] stays false); a state still saves and rewinds (a
    // benchmark's tests from one filled depth).
    type Checkpoint = Option<niwaki_cuda::CudaCheckpoint>;

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
        request: RankedRequest,
    ) -> Result<Ranked> {
        let RankedRequest {
            k,
            temperature,
            floor,
        } = request;
        niwaki_cuda::CudaModel::forward_top_k(self, state, tokens, k, temperature, floor)
            .map_err(|e| crate::EngineError::Backend(e.to_string()))
    }

    fn last_row(&self, state: &mut Self::State) -> Result<Vec<f32>> {
        niwaki_cuda::CudaModel::last_row(self, state)
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

    fn can_rewind(&self) -> bool {
        niwaki_cuda::CudaModel::checkpoints_on(self)
    }

    fn save(&self, state: &Self::State, into: &mut Self::Checkpoint) -> Result<()> {
        niwaki_cuda::CudaModel::save(self, state, into)
            .map_err(|e| crate::EngineError::Backend(e.to_string()))
    }

    fn rewind(&self, state: &mut Self::State, to: &Self::Checkpoint) -> Result<()> {
        let Some(to) = to else {
            return Err(crate::EngineError::Backend(
                "no checkpoint was saved to rewind to".into(),
            ));
        };
        niwaki_cuda::CudaModel::rewind(self, state, to)
            .map_err(|e| crate::EngineError::Backend(e.to_string()))
    }
}
