//! Per-sequence state: the conv and recurrent state of each gated-delta-net layer and the KV cache
//! of each attention layer. It is a plain value: clone it to snapshot, assign to restore.

use std::ops::Range;

use crate::config::{Config, LayerKind};
use crate::error::{ModelError, Result};
use crate::kv::{KvCache, KvFormat};
use crate::lineage::{Lineage, Mark};

#[derive(Clone, Debug, PartialEq)]
pub enum LayerState {
    Recurrent {
        /// The last `kernel − 1` conv inputs, oldest first: `[kernel − 1][channels]`.
        conv: Vec<f32>,
        /// Where this layer's recurrent state lies in [`State`]'s `ssm`: one
        /// `key_dim × value_dim` matrix per value head, row = key index.
        ssm: Range<usize>,
    },
    Attention(KvCache),
}

#[derive(Clone, Debug)]
pub struct State {
    /// Tokens consumed so far.
    pub(crate) pos: usize,
    pub(crate) layers: Vec<LayerState>,
    /// The recurrent states of every gated-delta-net layer, back to back (150 MB for 27B).
    pub(crate) ssm: Vec<f32>,
    /// Which checkpoints this sequence can go back to (a clone is another sequence).
    lineage: Lineage,
}

/// Two states are equal when they hold the same: which sequence each is does not count.
impl PartialEq for State {
    fn eq(&self, other: &Self) -> bool {
        self.pos == other.pos && self.layers == other.layers && self.ssm == other.ssm
    }
}

/// A state's position and recurrent part, saved by [`State::save`] for [`State::rewind`]:
/// what a speculative step keeps to go back to the tokens it verified (150 MB for 27B; a
/// checkpoint's buffers are reused from one save to the next).
#[derive(Clone, Debug, Default)]
pub struct Checkpoint {
    pos: usize,
    /// The sequence and the point in its rewinds it was saved at.
    mark: Mark,
    /// Each layer's conv inputs (empty for attention layers).
    conv: Vec<Vec<f32>>,
    ssm: Vec<f32>,
}

impl Checkpoint {
    /// The position saved.
    pub fn position(&self) -> usize {
        self.pos
    }
}

impl State {
    /// A fresh state whose KV caches hold f32 (the reference).
    pub fn new(c: &Config) -> State {
        Self::with_kv_format(c, KvFormat::F32)
    }

    /// A fresh state whose KV caches hold `kv`.
    pub fn with_kv_format(c: &Config, kv: KvFormat) -> State {
        let per_layer = c.gdn_value_heads * c.gdn_key_dim * c.gdn_value_dim;
        let mut next = 0;
        let layers = c
            .layers
            .iter()
            .map(|k| match k {
                LayerKind::Recurrent => {
                    next += per_layer;
                    LayerState::Recurrent {
                        conv: vec![0.0; (c.conv_kernel - 1) * c.gdn_conv_channels()],
                        ssm: next - per_layer..next,
                    }
                }
                LayerKind::Attention => {
                    LayerState::Attention(KvCache::with_format(c.n_head_kv, c.head_dim, kv))
                }
            })
            .collect();
        let mut ssm = vec![0.0; next];
        populate(&mut ssm);
        State {
            pos: 0,
            layers,
            ssm,
            lineage: Lineage::new(),
        }
    }

    /// Number of tokens this state has consumed.
    pub fn len(&self) -> usize {
        self.pos
    }

    pub fn is_empty(&self) -> bool {
        self.pos == 0
    }

    /// Bytes held by this state (recurrent state plus the KV cache as filled so far).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Recurrent { conv, ssm } => 4 * (conv.len() + ssm.len()),
                LayerState::Attention(kv) => kv.bytes(),
            })
            .sum()
    }

    /// Pretends `depth` more tokens were consumed: every attention layer's cache grows by
    /// `depth` positions of zeros, with room for `room` more (the recurrent state is left as it
    /// is). For benchmarks of decode at depth, which need a context's cache reads, not its
    /// contents, and not the cache's reallocation in the timed steps.
    pub fn bench_seek(&mut self, depth: usize, room: usize) {
        for l in &mut self.layers {
            if let LayerState::Attention(kv) = l {
                kv.seek(depth, room);
            }
        }
        self.pos += depth;
    }

    /// Records this state's position and recurrent part in `into` (its buffers reused), for
    /// [`State::rewind`] to come back to: the KV caches need no copy, as the tokens that follow
    /// only add positions to them.
    pub fn save(&self, into: &mut Checkpoint) {
        into.pos = self.pos;
        into.mark = self.lineage.mark();
        into.ssm.clone_from(&self.ssm);
        into.conv.resize(self.layers.len(), Vec::new());
        for (c, l) in into.conv.iter_mut().zip(&self.layers) {
            match l {
                LayerState::Recurrent { conv, .. } => c.clone_from(conv),
                LayerState::Attention(_) => c.clear(),
            }
        }
    }

    /// Takes this state back to where `c` was saved from it: the recurrent part as it was
    /// there, every KV cache cut back to its position. Only the tokens consumed since are
    /// forgotten, so `c` must come from this state, saved since its last rewind to an earlier
    /// position: refused otherwise ([`Lineage`]), and where `c` holds a later position than
    /// this state or another shape.
    pub fn rewind(&mut self, c: &Checkpoint) -> Result<()> {
        self.lineage
            .check(c.mark, c.pos)
            .map_err(|why| ModelError::stale_checkpoint(why, c.pos))?;
        if c.pos > self.pos {
            return Err(ModelError::RewindPastEnd {
                to: c.pos,
                have: self.pos,
            });
        }
        let shapes_match = c.ssm.len() == self.ssm.len()
            && c.conv.len() == self.layers.len()
            && self.layers.iter().zip(&c.conv).all(|(l, saved)| match l {
                LayerState::Recurrent { conv, .. } => conv.len() == saved.len(),
                LayerState::Attention(_) => saved.is_empty(),
            });
        if !shapes_match {
            return Err(ModelError::StateMismatch);
        }
        self.ssm.copy_from_slice(&c.ssm);
        for (l, saved) in self.layers.iter_mut().zip(&c.conv) {
            match l {
                LayerState::Recurrent { conv, .. } => conv.copy_from_slice(saved),
                LayerState::Attention(kv) => kv.truncate(c.pos),
            }
        }
        self.pos = c.pos;
        self.lineage.rewound(c.pos);
        Ok(())
    }

    /// Whether this state fits a model of this shape.
    pub(crate) fn matches(&self, c: &Config) -> bool {
        self.layers.len() == c.n_layers
            && self
                .layers
                .iter()
                .zip(&c.layers)
                .all(|(s, k)| match (s, k) {
                    (LayerState::Recurrent { .. }, LayerKind::Recurrent) => true,
                    (LayerState::Attention(kv), LayerKind::Attention) => {
                        kv.n_head_kv() == c.n_head_kv && kv.head_dim() == c.head_dim
                    }
                    _ => false,
                })
    }
}

/// Maps the pages of a fresh zeroed buffer now, on huge pages where the kernel allows: the
/// first token would otherwise take a page fault per 4 KiB of recurrent state (about 37,000 for
/// 27B, most of a second on a virtual machine), and every token a TLB miss per 4 KiB.
fn populate(buf: &mut [f32]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = buf.as_mut_ptr() as usize;
        let end = start + std::mem::size_of_val(buf);
        let (lo, hi) = (start.div_ceil(HUGE) * HUGE, end / HUGE * HUGE);
        if hi > lo {
            // SAFETY: [lo, hi) lies inside `buf`'s allocation; MADV_HUGEPAGE is advice about
            // how to back the range and never changes its contents.
            unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE) };
        }
    }
    // One write per page faults it in; a volatile write so it is not elided as redundant.
    for v in buf.iter_mut().step_by(1024) {
        // SAFETY: `v` is a valid, aligned, exclusive reference.
        unsafe { std::ptr::write_volatile(v, 0.0) };
    }
}
