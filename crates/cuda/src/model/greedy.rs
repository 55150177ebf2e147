//! Greedy decoding with the host off the critical path. A greedy pass leaves its pick on the
//! device (the argmax key), where the next one-token pass's first kernel looks its row up; so
//! each step goes on the stream before the host has read the previous step's pick, and the GPU
//! goes from step to step without waiting for the host. The step run ahead consumed the pick
//! before the caller chose to feed it: it is kept (counted in the state's length) when the
//! caller does, and dropped otherwise — it changed nothing that the next pass reads (the
//! recurrent and conv states are double-buffered by the position's parity, the KV cache is
//! written at its position, which the next pass rewrites).

use std::sync::atomic::Ordering;

use cudarc::driver::{result, sys, CudaEvent, PinnedHostSlice};

use super::{CudaModel, CudaState, Feed, Tail};
use crate::error::{Context, CudaError, Result};
use crate::gpu::Gpu;
use crate::plan::{self, Head};

/// A greedy step on the stream ahead of the host: it consumes `fed`, and its pick lands in
/// `slot`.
pub(super) struct Ahead {
    fed: u32,
    slot: usize,
}

/// Page-locked landing places for greedy passes' picks (two: a step's and the one run ahead of
/// it), each with the event marking its arrival.
pub(super) struct Picks {
    host: PinnedHostSlice<u64>,
    landed: [CudaEvent; 2],
    next: usize,
}

impl Picks {
    pub(super) fn new(gpu: &Gpu) -> Result<Picks> {
        let event = || {
            gpu.ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .ctx(|| "creating an event".into())
        };
        Ok(Picks {
            // SAFETY: a slot is read only after the copy into it has landed (its event).
            host: unsafe { gpu.ctx.alloc_pinned_with_flags(2, 0) }
                .ctx(|| "16 bytes of page-locked host memory".into())?,
            landed: [event()?, event()?],
            next: 0,
        })
    }
}

impl CudaState {
    /// Whether a greedy step is on the stream ahead of the host (for the harness's checks).
    #[doc(hidden)]
    pub fn ahead_pending(&self) -> bool {
        self.ahead.is_some()
    }

    /// Forgets the step run ahead, if any.
    pub(super) fn drop_ahead(&mut self) {
        self.ahead = None;
    }

    /// Writes `v` at device address `at` in stream order, from no host memory (a pageable
    /// copy could wait for the stream).
    fn set_u32(&self, at: u64, v: u32) -> Result<()> {
        // SAFETY: `at` is a 4-byte word of this state's scratch.
        unsafe { sys::cuMemsetD32Async(at, v, 1, self.stream.cu_stream()) }
            .result()
            .ctx(|| "setting a word on the device".into())
    }

    /// Puts the state's position where the kernels read it.
    pub(super) fn set_pos(&self) -> Result<()> {
        self.set_u32(self.s("pos"), self.pos as u32)
    }

    /// Puts the host's token where a one-token pass looks its row up (the argmax key's low
    /// word: the id's complement).
    pub(super) fn set_key(&self, id: u32) -> Result<()> {
        self.set_u32(self.s("argmax"), !id)
    }

    /// Copies the argmax key into the next landing place; returns which.
    fn enqueue_pick(&mut self) -> Result<usize> {
        let slot = self.picks.next;
        self.picks.next ^= 1;
        let src = self.s("argmax");
        let dst = self
            .picks
            .host
            .as_mut_slice()
            .ctx(|| "greedy picks".into())?;
        // SAFETY: the key is 8 bytes; the slot is read after the event recorded below.
        unsafe {
            result::memcpy_dtoh_async(&mut dst[slot..slot + 1], src, self.stream.cu_stream())
        }
        .ctx(|| "device to host copy".into())?;
        self.picks.landed[slot]
            .record(&self.stream)
            .ctx(|| "recording an event".into())
            .map(|()| slot)
    }

    /// Waits for the pick in `slot` and returns its token (`u32::MAX` where no logit was
    /// finite).
    fn wait_pick(&mut self, slot: usize) -> Result<u32> {
        self.picks.landed[slot]
            .synchronize()
            .ctx(|| "waiting for a greedy pick".into())?;
        let host = self.picks.host.as_slice().ctx(|| "greedy picks".into())?;
        Ok(!(host[slot] as u32))
    }
}

impl CudaModel {
    /// Runs `tokens` and returns the greedy next token, computed on the GPU (only 8 bytes come
    /// back). Ties go to the lowest id and NaN logits are skipped, as `model::ops::argmax`; a
    /// row of NaNs gives `u32::MAX`. Before waiting for the pick it launches the step that
    /// feeds it (see the module's docs), which the next call keeps if it feeds that pick.
    pub fn forward_greedy(&self, st: &mut CudaState, tokens: &[u32]) -> Result<u32> {
        self.check(st, tokens)?;
        let slot = match st.ahead.take() {
            Some(a) if tokens == [a.fed] => {
                st.pos += 1;
                a.slot
            }
            _ => self.enqueue_greedy(st, tokens)?,
        };
        let room = st.pos < st.ctx;
        let ahead = self.run_ahead.load(Ordering::Relaxed);
        let next = if ahead && self.use_graphs && self.embeds_on_device() && room {
            let launched = self
                .enqueue_pass(st, Feed::Picked, Head::Last, Tail::Argmax)
                .and_then(|()| st.enqueue_pick());
            match launched {
                Ok(s) => Some(s),
                Err(e) => return Err(self.fail(st, e)),
            }
        } else {
            None
        };
        let id = match st.wait_pick(slot) {
            Ok(id) => id,
            Err(e) => return Err(self.fail(st, e)),
        };
        if let Some(slot) = next.filter(|_| (id as usize) < self.dims.vocab) {
            st.ahead = Some(Ahead { fed: id, slot });
        }
        Ok(id)
    }

    /// Turns running greedy steps ahead of the host on or off; returns the previous setting.
    pub fn set_run_ahead(&self, on: bool) -> bool {
        self.run_ahead.swap(on, Ordering::Relaxed)
    }

    /// Enqueues `tokens` (all but the last pass waited for), the last pass's pick copied to
    /// the host; counts them in the state; returns the pick's landing place.
    fn enqueue_greedy(&self, st: &mut CudaState, tokens: &[u32]) -> Result<usize> {
        let n = tokens.len();
        for (s, len) in plan::chunks(n) {
            if s + len < n {
                self.run(st, &tokens[s..s + len], Head::None, Tail::None)?;
                continue;
            }
            // A short pass token by token (`plan::short_passes`): all but its last waited for.
            let split = if self.stepped(len) { n - 1 } else { s };
            if split > s {
                self.run(st, &tokens[s..split], Head::None, Tail::None)?;
            }
            let feed = Feed::Tokens(&tokens[split..]);
            let launched = self
                .enqueue_pass(st, feed, Head::Last, Tail::Argmax)
                .and_then(|()| st.enqueue_pick());
            let slot = launched.map_err(|e| self.fail(st, e))?;
            st.pos += n - split;
            return Ok(slot);
        }
        Err(CudaError::Unsupported(
            "a greedy call without tokens".into(),
        ))
    }

    /// After an error with passes on the stream: waits for them (the host's rows stay
    /// untouched until then) and drops any step run ahead.
    fn fail(&self, st: &mut CudaState, e: CudaError) -> CudaError {
        let _ = st.stream.synchronize();
        st.drop_ahead();
        e
    }
}

impl Drop for CudaState {
    /// Passes still on the stream may copy into this state's page-locked memory.
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
    }
}
