//! Bonsai-shaped qwen35 models with random weights: for benchmarks (the 27B shapes, in every
//! Bonsai format) and for tests (small shapes, or weights a test supplies).

use gguf::{GgufWriter, Value};
use quant::Format;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::config::ARCH;

pub mod hadamard;

/// Hyperparameters of a synthetic model.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    pub n_layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub rope_dims: usize,
    pub gdn_key_heads: usize,
    pub gdn_key_dim: usize,
    pub gdn_value_heads: usize,
    pub gdn_value_dim: usize,
    pub conv_kernel: usize,
    pub full_attention_interval: usize,
    pub context_length: usize,
    pub vocab: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// 4 layers, hidden 128: the oracle fixtures' shape.
    Tiny,
    /// 8 layers, hidden 1024: widths are multiples of 1024, so it can carry a Hadamard rotation.
    Small,
    /// Bonsai 27B.
    B27,
}

impl Preset {
    pub fn parse(s: &str) -> Option<Preset> {
        match s {
            "tiny" => Some(Preset::Tiny),
            "small" => Some(Preset::Small),
            "27b" | "27B" => Some(Preset::B27),
            _ => None,
        }
    }

    pub fn shape(self, vocab: usize) -> Shape {
        match self {
            Preset::Tiny => Shape {
                n_layers: 4,
                hidden: 128,
                ffn: 256,
                n_head: 4,
                n_head_kv: 2,
                head_dim: 64,
                rope_dims: 16,
                gdn_key_heads: 2,
                gdn_key_dim: 128,
                gdn_value_heads: 4,
                gdn_value_dim: 128,
                conv_kernel: 4,
                full_attention_interval: 4,
                context_length: 4096,
                vocab,
            },
            Preset::Small => Shape {
                n_layers: 8,
                hidden: 1024,
                ffn: 3072,
                n_head: 8,
                n_head_kv: 2,
                head_dim: 128,
                rope_dims: 32,
                gdn_key_heads: 4,
                gdn_key_dim: 128,
                gdn_value_heads: 8,
                gdn_value_dim: 128,
                conv_kernel: 4,
                full_attention_interval: 4,
                context_length: 32768,
                vocab,
            },
            Preset::B27 => Shape {
                n_layers: 64,
                hidden: 5120,
                ffn: 17408,
                n_head: 24,
                n_head_kv: 4,
                head_dim: 256,
                rope_dims: 64,
                gdn_key_heads: 16,
                gdn_key_dim: 128,
                gdn_value_heads: 48,
                gdn_value_dim: 128,
                conv_kernel: 4,
                full_attention_interval: 4,
                context_length: 262144,
                vocab,
            },
        }
    }
}

/// What a tensor holds, which decides how random values for it are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A projection: packed in the model's format.
    Matrix,
    /// A norm weight (stored as 1 + w, so values near 1).
    Norm,
    /// ssm_norm (stored as is).
    GatedNorm,
    Conv,
    DtBias,
    /// −exp(A_log): negative.
    DecayA,
}

#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: String,
    /// ggml order.
    pub dims: Vec<u64>,
    pub role: Role,
}

impl Shape {
    pub fn gdn_channels(&self) -> usize {
        2 * self.gdn_key_heads * self.gdn_key_dim + self.gdn_value_heads * self.gdn_value_dim
    }

    /// Every tensor of a qwen35 model of this shape, in file order.
    pub fn tensors(&self) -> Vec<TensorSpec> {
        let e = self.hidden as u64;
        let t = |name: String, dims: &[u64], role| TensorSpec {
            name,
            dims: dims.to_vec(),
            role,
        };
        let mut out = vec![t(
            "token_embd.weight".into(),
            &[e, self.vocab as u64],
            Role::Matrix,
        )];
        let vd = (self.gdn_value_heads * self.gdn_value_dim) as u64;
        let hv = self.gdn_value_heads as u64;
        let hd = self.head_dim as u64;
        for il in 0..self.n_layers {
            let n = |s: &str| format!("blk.{il}.{s}");
            out.push(t(n("attn_norm.weight"), &[e], Role::Norm));
            if (il + 1) % self.full_attention_interval == 0 {
                out.push(t(
                    n("attn_q.weight"),
                    &[e, 2 * self.n_head as u64 * hd],
                    Role::Matrix,
                ));
                out.push(t(
                    n("attn_k.weight"),
                    &[e, self.n_head_kv as u64 * hd],
                    Role::Matrix,
                ));
                out.push(t(
                    n("attn_v.weight"),
                    &[e, self.n_head_kv as u64 * hd],
                    Role::Matrix,
                ));
                out.push(t(
                    n("attn_output.weight"),
                    &[self.n_head as u64 * hd, e],
                    Role::Matrix,
                ));
                out.push(t(n("attn_q_norm.weight"), &[hd], Role::Norm));
                out.push(t(n("attn_k_norm.weight"), &[hd], Role::Norm));
            } else {
                let ch = self.gdn_channels() as u64;
                out.push(t(n("attn_qkv.weight"), &[e, ch], Role::Matrix));
                out.push(t(n("attn_gate.weight"), &[e, vd], Role::Matrix));
                out.push(t(
                    n("ssm_conv1d.weight"),
                    &[self.conv_kernel as u64, ch],
                    Role::Conv,
                ));
                out.push(t(n("ssm_dt.bias"), &[hv], Role::DtBias));
                out.push(t(n("ssm_a"), &[hv], Role::DecayA));
                out.push(t(n("ssm_alpha.weight"), &[e, hv], Role::Matrix));
                out.push(t(n("ssm_beta.weight"), &[e, hv], Role::Matrix));
                out.push(t(
                    n("ssm_norm.weight"),
                    &[self.gdn_value_dim as u64],
                    Role::GatedNorm,
                ));
                out.push(t(n("ssm_out.weight"), &[vd, e], Role::Matrix));
            }
            out.push(t(n("post_attention_norm.weight"), &[e], Role::Norm));
            out.push(t(n("ffn_gate.weight"), &[e, self.ffn as u64], Role::Matrix));
            out.push(t(n("ffn_up.weight"), &[e, self.ffn as u64], Role::Matrix));
            out.push(t(n("ffn_down.weight"), &[self.ffn as u64, e], Role::Matrix));
        }
        out.push(t("output_norm.weight".into(), &[e], Role::Norm));
        out.push(t(
            "output.weight".into(),
            &[e, self.vocab as u64],
            Role::Matrix,
        ));
        out
    }

    /// The `qwen35.*` hyperparameter keys, as llama.cpp's converter writes them.
    pub fn write_metadata(&self, w: &mut GgufWriter, name: &str) {
        let k = |s: &str| format!("{ARCH}.{s}");
        let u = |v: usize| Value::U32(v as u32);
        w.set("general.architecture", Value::String(ARCH.into()))
            .set("general.name", Value::String(name.into()))
            .set(&k("block_count"), u(self.n_layers))
            .set(&k("context_length"), u(self.context_length))
            .set(&k("embedding_length"), u(self.hidden))
            .set(&k("feed_forward_length"), u(self.ffn))
            .set(&k("attention.head_count"), u(self.n_head))
            .set(&k("attention.head_count_kv"), u(self.n_head_kv))
            .set(&k("attention.key_length"), u(self.head_dim))
            .set(&k("attention.value_length"), u(self.head_dim))
            .set(&k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6))
            .set(&k("rope.freq_base"), Value::F32(1e7))
            .set(&k("rope.dimension_count"), u(self.rope_dims))
            .set(
                &k("rope.dimension_sections"),
                Value::i32s(mrope_sections(self.rope_dims)),
            )
            .set(&k("ssm.conv_kernel"), u(self.conv_kernel))
            .set(&k("ssm.state_size"), u(self.gdn_key_dim))
            .set(&k("ssm.group_count"), u(self.gdn_key_heads))
            .set(&k("ssm.time_step_rank"), u(self.gdn_value_heads))
            .set(
                &k("ssm.inner_size"),
                u(self.gdn_value_heads * self.gdn_value_dim),
            )
            .set(
                &k("full_attention_interval"),
                u(self.full_attention_interval),
            );
    }
}

/// Qwen's text mRoPE sections ([11, 11, 10, 0] for 64 rotary dims), scaled to `rope_dims`.
fn mrope_sections(rope_dims: usize) -> Vec<i32> {
    let half = (rope_dims / 2) as i32;
    let a = (half * 11 + 31) / 32;
    let b = a;
    vec![a, b, half - a - b, 0]
}

/// Random f32 values for a small tensor of the given role.
pub fn random_vector(role: Role, n: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u: f32 = rng.gen_range(-1.0..1.0);
            match role {
                Role::Norm => 1.0 + 0.1 * u,
                Role::GatedNorm => 1.0 + 0.1 * u,
                Role::Conv => 0.5 * u,
                Role::DtBias => 0.5 * u,
                Role::DecayA => -(0.5 + 0.5 * (u + 1.0)),
                Role::Matrix => u,
            }
        })
        .collect()
}

/// A random matrix `rows × cols` whose values are exactly representable in `format`: each block
/// is ±d (binary) or {−d, 0, +d} (ternary) with an f16 `d` around `1/√cols`, so quantizing it is
/// lossless and the f32 model is the exact reference for the packed one.
pub fn random_matrix(format: Format, rows: usize, cols: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
    let binary = format == Format::Q1_0;
    let group = match format {
        Format::Q1_0 | Format::Q2_0 | Format::Q2_0G128 | Format::PQ2_0 | Format::PTQ1_0 => {
            format.block_len()
        }
        _ => cols,
    };
    let base = if binary {
        1.0 / (cols as f32).sqrt()
    } else {
        1.0 / (cols as f32 * 2.0 / 3.0).sqrt()
    };
    let mut out = Vec::with_capacity(rows * cols);
    for _ in 0..rows * cols / group {
        let d = half::f16::from_f32(base * rng.gen_range(0.6f32..1.4)).to_f32();
        for _ in 0..group {
            let v = if binary {
                if rng.gen::<bool>() {
                    d
                } else {
                    -d
                }
            } else {
                (rng.gen_range(0..3) as f32 - 1.0) * d
            };
            out.push(v);
        }
    }
    out
}

/// Packed blocks drawn from a pool: fast enough to fill a 27B file in seconds, varied enough for
/// benchmarks (every block a real quantization of random values).
pub struct BlockPool {
    format: Format,
    blocks: Vec<u8>,
}

const POOL_BLOCKS: usize = 1 << 14;

impl BlockPool {
    pub fn new(format: Format, cols: usize, seed: u64) -> Result<BlockPool, quant::QuantError> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let bl = format.block_len().max(32);
        let values = random_matrix(format, POOL_BLOCKS * bl / cols.max(1) + 1, cols, &mut rng);
        let n = values.len() / format.block_len() * format.block_len();
        let blocks = quant::quantize(format, &values[..n])?;
        Ok(BlockPool { format, blocks })
    }

    /// `bytes` bytes of random whole blocks.
    pub fn fill(&self, bytes: usize, seed: u64) -> Vec<u8> {
        let bb = self.format.block_bytes();
        let n_pool = self.blocks.len() / bb;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut out = Vec::with_capacity(bytes);
        while out.len() < bytes {
            let i = rng.gen_range(0..n_pool);
            out.extend_from_slice(&self.blocks[i * bb..(i + 1) * bb]);
        }
        out.truncate(bytes);
        out
    }
}

fn name_seed(seed: u64, name: &str) -> u64 {
    name.bytes().fold(seed ^ 0x9e37_79b9_7f4a_7c15, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Random f32 weights for every tensor, matrices exactly representable in `exact_for`.
pub fn random_f32_tensors(
    shape: &Shape,
    exact_for: Format,
    seed: u64,
) -> Vec<(TensorSpec, Vec<f32>)> {
    shape
        .tensors()
        .into_iter()
        .map(|spec| {
            let mut rng = ChaCha8Rng::seed_from_u64(name_seed(seed, &spec.name));
            let n = spec.dims.iter().product::<u64>() as usize;
            let values = match spec.role {
                Role::Matrix => random_matrix(
                    exact_for,
                    spec.dims[1] as usize,
                    spec.dims[0] as usize,
                    &mut rng,
                ),
                role => random_vector(role, n, &mut rng),
            };
            (spec, values)
        })
        .collect()
}

/// A model file from explicit f32 weights: matrices packed in `format`, everything else f32.
pub fn writer_from_f32(
    shape: &Shape,
    tensors: &[(TensorSpec, Vec<f32>)],
    format: Format,
    name: &str,
) -> Result<GgufWriter, SynthError> {
    let mut w = GgufWriter::new();
    shape.write_metadata(&mut w, name);
    for (spec, values) in tensors {
        let (f, bytes) = match spec.role {
            Role::Matrix => (format, quant::quantize(format, values)?),
            _ => (
                Format::F32,
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
        };
        w.add_tensor(&spec.name, &spec.dims, f, bytes)?;
    }
    Ok(w)
}

/// A model file with random packed matrices, generated tensor by tensor while writing.
pub fn random_packed(
    shape: &Shape,
    format: Format,
    seed: u64,
    name: &str,
) -> Result<GgufWriter, SynthError> {
    let mut w = GgufWriter::new();
    shape.write_metadata(&mut w, name);
    let mut pools: std::collections::HashMap<u64, std::sync::Arc<BlockPool>> =
        std::collections::HashMap::new();
    for spec in shape.tensors() {
        let tseed = name_seed(seed, &spec.name);
        match spec.role {
            Role::Matrix => {
                let cols = spec.dims[0];
                let pool = match pools.get(&cols) {
                    Some(p) => p.clone(),
                    None => {
                        let p = std::sync::Arc::new(BlockPool::new(
                            format,
                            cols as usize,
                            seed ^ cols,
                        )?);
                        pools.insert(cols, p.clone());
                        p
                    }
                };
                let bytes = format
                    .tensor_bytes(spec.dims.iter().product())
                    .ok_or(SynthError::Shape(spec.name.clone()))?;
                w.add_tensor_lazy(
                    &spec.name,
                    &spec.dims,
                    format,
                    Box::new(move || pool.fill(bytes as usize, tseed)),
                )?;
            }
            role => {
                let n = spec.dims.iter().product::<u64>() as usize;
                let mut rng = ChaCha8Rng::seed_from_u64(tseed);
                let bytes = random_vector(role, n, &mut rng)
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect();
                w.add_tensor(&spec.name, &spec.dims, Format::F32, bytes)?;
            }
        }
    }
    Ok(w)
}

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error(transparent)]
    Quant(#[from] quant::QuantError),
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    #[error("tensor {0}: shape does not fit its format")]
    Shape(String),
}
