//! Per-sequence state: the conv and recurrent state of each gated-delta-net layer and the KV cache
//! of each attention layer. It is a plain value: clone it to snapshot, assign to restore.

use std::ops::Range;

use crate::config::{Config, LayerKind};

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

/// Keys and values of every position so far, f32: for each kv head its rows of `head_dim`
/// values, position after position (`k[head][position · head_dim + i]`). A decode step's
/// attention reads one kv head's rows from first to last; with each position's heads side by
/// side instead, a 27B head's rows lay 4 KiB apart, each on a page of its own.
#[derive(Clone, Debug, PartialEq)]
pub struct KvCache {
    head_dim: usize,
    pub k: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
}

impl KvCache {
    pub fn new(n_head_kv: usize, head_dim: usize) -> KvCache {
        KvCache {
            head_dim,
            k: vec![Vec::new(); n_head_kv],
            v: vec![Vec::new(); n_head_kv],
        }
    }

    /// Bytes of the cached keys and values.
    pub fn bytes(&self) -> usize {
        4 * self.k.iter().chain(&self.v).map(Vec::len).sum::<usize>()
    }

    /// Appends positions' keys and values, `[position][kv head][head_dim]` as the projections
    /// make them. A full head's rows grow by an eighth of what they hold (or by what is
    /// appended, or by [`KV_GROW_MIN`] floats, whichever is most) instead of doubling: a
    /// doubling `Vec` could hold nearly twice the memory a long context needs (a 27B model's
    /// 262,144 positions are 34 GB of f32).
    pub fn append(&mut self, k: &[f32], v: &[f32]) {
        let hd = self.head_dim;
        let row = self.k.len() * hd;
        assert!(
            row > 0 && k.len().is_multiple_of(row) && v.len() == k.len(),
            "KV rows of {} values expected, got {} keys and {} values",
            row,
            k.len(),
            v.len()
        );
        let add = k.len() / row * hd;
        for (cache, new) in [(&mut self.k, k), (&mut self.v, v)] {
            for (h, rows) in cache.iter_mut().enumerate() {
                if rows.capacity() - rows.len() < add {
                    rows.reserve_exact(add.max(rows.len() / 8).max(KV_GROW_MIN));
                }
                for pos in new.chunks_exact(row) {
                    rows.extend_from_slice(&pos[h * hd..(h + 1) * hd]);
                }
            }
        }
    }

    /// Adds `positions` positions of zeros, with room for `room` more.
    fn seek(&mut self, positions: usize, room: usize) {
        let hd = self.head_dim;
        for rows in self.k.iter_mut().chain(&mut self.v) {
            rows.reserve_exact((positions + room) * hd);
            rows.resize(rows.len() + positions * hd, 0.0);
        }
    }
}

/// Fewest floats a head's KV rows grow by: short caches then grow every few tokens, not every
/// one.
const KV_GROW_MIN: usize = 4096;

#[derive(Clone, Debug, PartialEq)]
pub struct State {
    /// Tokens consumed so far.
    pub(crate) pos: usize,
    pub(crate) layers: Vec<LayerState>,
    /// The recurrent states of every gated-delta-net layer, back to back (150 MB for 27B).
    pub(crate) ssm: Vec<f32>,
}

impl State {
    pub fn new(c: &Config) -> State {
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
                    LayerState::Attention(KvCache::new(c.n_head_kv, c.head_dim))
                }
            })
            .collect();
        let mut ssm = vec![0.0; next];
        populate(&mut ssm);
        State {
            pos: 0,
            layers,
            ssm,
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
                        kv.k.len() == c.n_head_kv && kv.head_dim == c.head_dim
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_growing_kv_cache_keeps_each_heads_rows_in_order_with_at_most_an_eighth_more_room() {
        let (heads, hd) = (4, 256);
        let row = heads * hd;
        let mut kv = KvCache::new(heads, hd);
        let (mut k_all, mut v_all) = (Vec::new(), Vec::new());
        for pos in 0..3000usize {
            // Mostly single positions, now and then a prompt chunk.
            let n = if pos % 500 == 0 { 37 } else { 1 };
            let k: Vec<f32> = (0..n * row).map(|i| (pos * 7 + i) as f32).collect();
            let v: Vec<f32> = k.iter().map(|x| -x).collect();
            kv.append(&k, &v);
            k_all.extend_from_slice(&k);
            v_all.extend_from_slice(&v);
            for c in kv.k.iter().chain(&kv.v) {
                let bound = c.len() + (c.len() / 8).max(n * hd).max(KV_GROW_MIN);
                assert!(c.capacity() <= bound, "{} > {bound}", c.capacity());
            }
        }
        let positions = k_all.len() / row;
        assert!(kv.k.iter().chain(&kv.v).all(|r| r.len() == positions * hd));
        assert_eq!(kv.bytes(), 4 * 2 * k_all.len());
        for h in 0..heads {
            for p in [0, 1, 499, 500, 536, positions - 1] {
                let at = p * row + h * hd;
                assert_eq!(
                    kv.k[h][p * hd..(p + 1) * hd],
                    k_all[at..at + hd],
                    "k {h} {p}"
                );
                assert_eq!(
                    kv.v[h][p * hd..(p + 1) * hd],
                    v_all[at..at + hd],
                    "v {h} {p}"
                );
            }
        }
    }

    #[test]
    #[should_panic(expected = "KV rows of 1024 values")]
    fn a_kv_cache_refuses_rows_of_another_width() {
        KvCache::new(4, 256).append(&[0.0; 1000], &[0.0; 1000]);
    }
}
