//! Per-sequence state: the conv and recurrent state of each gated-delta-net layer and the KV cache
//! of each attention layer. It is a plain value: clone it to snapshot, assign to restore.

use crate::config::{Config, LayerKind};

#[derive(Clone, Debug, PartialEq)]
pub enum LayerState {
    Recurrent {
        /// The last `kernel − 1` conv inputs, oldest first: `[kernel − 1][channels]`.
        conv: Vec<f32>,
        /// One `key_dim × value_dim` matrix per value head, row = key index.
        ssm: Vec<f32>,
    },
    Attention(KvCache),
}

/// Keys and values of every position so far: `[position][kv_heads × head_dim]`, f32.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KvCache {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct State {
    /// Tokens consumed so far.
    pub(crate) pos: usize,
    pub(crate) layers: Vec<LayerState>,
}

impl State {
    pub fn new(c: &Config) -> State {
        let layers = c
            .layers
            .iter()
            .map(|k| match k {
                LayerKind::Recurrent => LayerState::Recurrent {
                    conv: vec![0.0; (c.conv_kernel - 1) * c.gdn_conv_channels()],
                    ssm: vec![0.0; c.gdn_value_heads * c.gdn_key_dim * c.gdn_value_dim],
                },
                LayerKind::Attention => LayerState::Attention(KvCache::default()),
            })
            .collect();
        State { pos: 0, layers }
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
                LayerState::Attention(kv) => 4 * (kv.k.len() + kv.v.len()),
            })
            .sum()
    }

    /// Whether this state fits a model of this shape.
    pub(crate) fn matches(&self, c: &Config) -> bool {
        self.layers.len() == c.n_layers
            && self.layers.iter().zip(&c.layers).all(|(s, k)| {
                matches!(
                    (s, k),
                    (LayerState::Recurrent { .. }, LayerKind::Recurrent)
                        | (LayerState::Attention(_), LayerKind::Attention)
                )
            })
    }
}
