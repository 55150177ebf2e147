//! Hyperparameters, read only from GGUF metadata so the same code runs the 27B and a 4-layer test
//! model.

use gguf::Metadata;

use crate::error::{ModelError, Result};

pub const ARCH: &str = "qwen35";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Gated delta net (linear attention with a recurrent state).
    Recurrent,
    /// Gated full attention with a KV cache.
    Attention,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub n_layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub context_length: usize,
    pub rms_eps: f32,
    /// Full attention.
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub rope_base: f32,
    pub rope_dims: usize,
    /// Gated delta net.
    pub conv_kernel: usize,
    pub gdn_key_heads: usize,
    pub gdn_key_dim: usize,
    pub gdn_value_heads: usize,
    pub gdn_value_dim: usize,
    pub layers: Vec<LayerKind>,
}

fn bad(key: &str, reason: impl Into<String>) -> ModelError {
    ModelError::BadConfig {
        key: key.to_string(),
        reason: reason.into(),
    }
}

fn positive(md: &Metadata, key: &str) -> Result<usize> {
    match md.get_u32_or_array(key)? {
        None => Err(bad(key, "missing")),
        Some(v) => match v.first() {
            Some(&x) if x > 0 && v.iter().all(|&y| y == x) => Ok(x as usize),
            Some(_) if v.iter().all(|&y| y == v[0]) => Err(bad(key, "must be positive")),
            _ => Err(bad(
                key,
                format!("per-layer values {v:?} differ; niwaki needs one value"),
            )),
        },
    }
}

impl Config {
    /// Reads the `qwen35.*` keys; `vocab` comes from the embedding tensor's row count.
    pub fn from_metadata(md: &Metadata, vocab: usize) -> Result<Config> {
        let arch = md.architecture()?;
        if arch != ARCH {
            return Err(ModelError::WrongArchitecture {
                found: arch.to_string(),
            });
        }
        let k = |s: &str| format!("{ARCH}.{s}");
        let n_layers = positive(md, &k("block_count"))?;
        let hidden = positive(md, &k("embedding_length"))?;
        let ffn = positive(md, &k("feed_forward_length"))?;
        let n_head = positive(md, &k("attention.head_count"))?;
        let n_head_kv = positive(md, &k("attention.head_count_kv"))?;
        let head_dim = positive(md, &k("attention.key_length"))?;
        if let Some(vl) = md.get_u32(&k("attention.value_length"))? {
            if vl as usize != head_dim {
                return Err(bad(&k("attention.value_length"), "must equal key_length"));
            }
        }
        let rms_eps = md.require_f32(&k("attention.layer_norm_rms_epsilon"))?;
        let rope_base = md.get_f32(&k("rope.freq_base"))?.unwrap_or(10_000.0);
        let rope_dims = md
            .get_u32(&k("rope.dimension_count"))?
            .map_or(head_dim, |d| d as usize);
        let context_length = positive(md, &k("context_length"))?;
        let conv_kernel = positive(md, &k("ssm.conv_kernel"))?;
        let gdn_key_dim = positive(md, &k("ssm.state_size"))?;
        let gdn_key_heads = positive(md, &k("ssm.group_count"))?;
        let gdn_value_heads = positive(md, &k("ssm.time_step_rank"))?;
        let inner = positive(md, &k("ssm.inner_size"))?;
        let interval = positive(md, &k("full_attention_interval"))?;

        if n_head % n_head_kv != 0 {
            return Err(bad(
                &k("attention.head_count_kv"),
                format!("{n_head_kv} does not divide {n_head} heads"),
            ));
        }
        if rope_dims > head_dim || rope_dims % 2 != 0 {
            return Err(bad(
                &k("rope.dimension_count"),
                format!("{rope_dims} must be even and ≤ {head_dim}"),
            ));
        }
        if inner % gdn_value_heads != 0 {
            return Err(bad(
                &k("ssm.inner_size"),
                format!("{inner} is not a multiple of {gdn_value_heads} value heads"),
            ));
        }
        if gdn_value_heads % gdn_key_heads != 0 {
            return Err(bad(
                &k("ssm.time_step_rank"),
                format!(
                    "{gdn_value_heads} value heads are not a multiple of {gdn_key_heads} key heads"
                ),
            ));
        }
        if conv_kernel < 2 {
            return Err(bad(
                &k("ssm.conv_kernel"),
                format!("{conv_kernel} must be at least 2"),
            ));
        }
        if !(rms_eps > 0.0 && rms_eps.is_finite()) {
            return Err(bad(
                &k("attention.layer_norm_rms_epsilon"),
                format!("{rms_eps} must be positive"),
            ));
        }
        let layers = (0..n_layers)
            .map(|il| {
                if (il + 1) % interval == 0 {
                    LayerKind::Attention
                } else {
                    LayerKind::Recurrent
                }
            })
            .collect();
        Ok(Config {
            n_layers,
            hidden,
            ffn,
            vocab,
            context_length,
            rms_eps,
            n_head,
            n_head_kv,
            head_dim,
            rope_base,
            rope_dims,
            conv_kernel,
            gdn_key_heads,
            gdn_key_dim,
            gdn_value_heads,
            gdn_value_dim: inner / gdn_value_heads,
            layers,
        })
    }

    /// Width of the GDN q|k|v projection and of its convolution.
    pub fn gdn_conv_channels(&self) -> usize {
        2 * self.gdn_key_heads * self.gdn_key_dim + self.gdn_inner()
    }

    pub fn gdn_inner(&self) -> usize {
        self.gdn_value_heads * self.gdn_value_dim
    }

    pub fn n_attention_layers(&self) -> usize {
        self.layers
            .iter()
            .filter(|&&l| l == LayerKind::Attention)
            .count()
    }

    /// Bytes of recurrent + conv state per sequence (f32).
    pub fn recurrent_state_bytes(&self) -> usize {
        let per = self.gdn_value_heads * self.gdn_key_dim * self.gdn_value_dim
            + (self.conv_kernel - 1) * self.gdn_conv_channels();
        4 * per * (self.n_layers - self.n_attention_layers())
    }

    /// Bytes of KV cache per token (f32 K and V for every attention layer).
    pub fn kv_bytes_per_token(&self) -> usize {
        4 * 2 * self.n_head_kv * self.head_dim * self.n_attention_layers()
    }
}
