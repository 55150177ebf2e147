//! The plan's unit tests (no GPU needed).

use super::*;
use model::synth::Preset;

mod attention;
mod b1_columns;
mod gemm;
mod gemv;
mod memory;
mod ops;
mod rotation;
mod shapes;

pub(crate) fn dims(p: Preset) -> Dims {
    let s = p.shape(248_320);
    let layers = (0..s.n_layers)
        .map(|il| {
            if (il + 1) % s.full_attention_interval == 0 {
                LayerKind::Attention
            } else {
                LayerKind::Recurrent
            }
        })
        .collect();
    Dims::from_config(&Config {
        n_layers: s.n_layers,
        hidden: s.hidden,
        ffn: s.ffn,
        vocab: s.vocab,
        context_length: s.context_length,
        rms_eps: 1e-6,
        n_head: s.n_head,
        n_head_kv: s.n_head_kv,
        head_dim: s.head_dim,
        rope_base: 1e7,
        rope_dims: s.rope_dims,
        conv_kernel: s.conv_kernel,
        gdn_key_heads: s.gdn_key_heads,
        gdn_key_dim: s.gdn_key_dim,
        gdn_value_heads: s.gdn_value_heads,
        gdn_value_dim: s.gdn_value_dim,
        layers,
    })
    .unwrap()
}

const NORM_ONLY: Fusion = Fusion {
    norm: true,
    gdn: false,
    attn: false,
    fold: false,
    swiglu: false,
    attn_short: false,
};
const ALL: Fusion = Fusion {
    norm: true,
    gdn: true,
    attn: true,
    fold: true,
    swiglu: true,
    attn_short: true,
};
