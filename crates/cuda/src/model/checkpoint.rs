//! A sequence's checkpoint on the device: its position and its conv and recurrent states, so
//! that the tokens consumed after it can be forgotten (a benchmark's tests, each from one
//! filled depth). The KV cache needs no copy: later passes only add positions to it, which the
//! passes after a rewind write again.

use std::sync::atomic::Ordering;

use super::*;

/// What [`CudaModel::save`] keeps of one state, for [`CudaModel::rewind`] to take it back to.
pub struct CudaCheckpoint {
    pos: usize,
    /// The sequence and the point in its rewinds it was saved at.
    mark: model::lineage::Mark,
    ctx: usize,
    /// The state's first `bytes` (its conv then recurrent states, both parities' buffers).
    recurrent: DevBuf,
    bytes: usize,
}

impl CudaState {
    /// Bytes of the conv and recurrent states at the start of `state`.
    fn recurrent_bytes(&self) -> usize {
        self.bytes.conv + self.bytes.ssm
    }

    /// Copies `bytes` from device address `src` to `dst` in this state's stream order, after
    /// the passes enqueued before it, and waits for it: a checkpoint's memory is freed on
    /// another stream, with no order to this one's copies.
    fn copy_on_stream(&self, dst: u64, src: u64, bytes: usize, what: &str) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: both addresses start allocations of at least `bytes` (the state's recurrent
        // region and a checkpoint made for it), on this context.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }
            .ctx(|| format!("{what} ({bytes} bytes)"))?;
        self.stream.synchronize().ctx(|| what.into())
    }
}

impl CudaModel {
    /// Turns saving and rewinding states on or off ([`plan::CHECKPOINTS`]); returns the
    /// previous setting.
    pub fn set_checkpoints(&self, on: bool) -> bool {
        self.checkpoints.swap(on, Ordering::Relaxed)
    }

    /// Whether states save and rewind here ([`CudaModel::set_checkpoints`]).
    pub fn checkpoints_on(&self) -> bool {
        self.checkpoints.load(Ordering::Relaxed)
    }

    /// Saves `st`'s position and recurrent part into `into` (allocated on the device the first
    /// time, or again for a state of another size). Both parities' buffers are copied, so that
    /// a greedy step run ahead (which writes only the other parity's) changes nothing saved.
    pub fn save(&self, st: &CudaState, into: &mut Option<CudaCheckpoint>) -> Result<()> {
        if !self.checkpoints_on() {
            return Err(CudaError::Unsupported(
                "saving a sequence's state is turned off here \
                 (NIWAKI_CUDA_CHECKPOINTS=0 in the environment, or set_checkpoints(false))"
                    .into(),
            ));
        }
        let bytes = st.recurrent_bytes();
        let mut c = match into.take().filter(|c| c.bytes == bytes && c.ctx == st.ctx) {
            Some(c) => c,
            None => {
                let recurrent = self.gpu.alloc(bytes, "a sequence's checkpoint")?;
                // The allocation is zeroed on the device's stream: done before this state's
                // copy.
                self.gpu
                    .stream
                    .synchronize()
                    .ctx(|| "zeroing a checkpoint".into())?;
                CudaCheckpoint {
                    pos: 0,
                    mark: model::lineage::Mark::default(),
                    ctx: st.ctx,
                    recurrent,
                    bytes,
                }
            }
        };
        st.copy_on_stream(c.recurrent.ptr, st.state.ptr, bytes, "saving a checkpoint")?;
        c.pos = st.pos;
        c.mark = st.lineage.mark();
        *into = Some(c);
        Ok(())
    }

    /// Takes `st` back to `to`, saved from it at a position no later than its own: the
    /// recurrent part as saved, the position, no step run ahead, no row of logits until the
    /// next pass ([`CudaModel::last_row`] refuses the forgotten one). Refused for a checkpoint of
    /// another sequence, one the sequence has since gone back below (its cache rows from there
    /// hold other tokens now: [`model::lineage::Lineage`]), of a state of another shape or at a
    /// later position.
    pub fn rewind(&self, st: &mut CudaState, to: &CudaCheckpoint) -> Result<()> {
        st.lineage
            .check(to.mark, to.pos)
            .map_err(|why| ModelError::stale_checkpoint(why, to.pos))?;
        if to.ctx != st.ctx || to.bytes != st.recurrent_bytes() {
            return Err(ModelError::StateMismatch.into());
        }
        if to.pos > st.pos {
            return Err(ModelError::RewindPastEnd {
                to: to.pos,
                have: st.pos,
            }
            .into());
        }
        st.copy_on_stream(
            st.state.ptr,
            to.recurrent.ptr,
            to.bytes,
            "rewinding to a checkpoint",
        )?;
        st.drop_ahead();
        st.row_stale = true;
        st.pos = to.pos;
        st.lineage.rewound(to.pos);
        Ok(())
    }
}
