//! Tensors the forward pass reads: packed matrices stay in the file mapping, small vectors are
//! decoded to f32 once at load.

use std::sync::Arc;

use gguf::Gguf;
use quant::{Format, Ternary, TiledMatrix};

use crate::config::{Config, LayerKind};
use crate::error::ModelError;

type Result<T, E = ModelError> = std::result::Result<T, E>;

/// A packed weight matrix `[rows, cols]` (ggml `ne = [cols, rows]`): each row is one output.
#[derive(Clone)]
pub struct Matrix {
    file: Arc<Gguf>,
    index: usize,
    pub format: Format,
    pub rows: usize,
    pub cols: usize,
    row_bytes: usize,
    /// The rows re-tiled for the AVX-512 kernels, when [`Weights::tile`] made them.
    tiled: Option<Arc<TiledMatrix>>,
}

impl std::fmt::Debug for Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Matrix({}, {}x{})", self.format, self.rows, self.cols)
    }
}

impl Matrix {
    pub fn data(&self) -> &[u8] {
        let info = &self.file.tensors()[self.index];
        self.file.view(info).data
    }

    pub fn name(&self) -> &str {
        &self.file.tensors()[self.index].name
    }

    pub fn row(&self, r: usize) -> &[u8] {
        &self.data()[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    pub fn tiled(&self) -> Option<&TiledMatrix> {
        self.tiled.as_deref()
    }

    /// Whether this matrix has a panel layout and is not yet held in it as `ternary` asks.
    fn needs_tiling(&self, ternary: Ternary) -> bool {
        let want = if self.format == Format::PTQ1_0 {
            ternary
        } else {
            Ternary::Packed
        };
        TiledMatrix::supports(self.format)
            && self.tiled.as_ref().is_none_or(|t| t.ternary() != want)
    }

    /// Re-tiles this matrix when the format has a panel layout, then drops the file pages the
    /// copy replaces from resident memory (the file mapping stays valid for the exact kernels).
    fn tile(&mut self, ternary: Ternary) {
        if !self.needs_tiling(ternary) {
            return;
        }
        // Shapes were validated at load, so this only fails for formats without a layout or when
        // the copy cannot be allocated; the native rows then stay in use, with identical
        // results.
        let t = TiledMatrix::with_ternary(self.format, self.data(), self.rows, self.cols, ternary);
        if let Ok(t) = t {
            self.tiled = Some(Arc::new(t));
            self.file.release(&self.file.tensors()[self.index]);
        }
    }
}

pub struct GdnWeights {
    pub qkv: Matrix,
    pub gate: Matrix,
    pub alpha: Matrix,
    pub beta: Matrix,
    pub out: Matrix,
    /// `[channels][kernel]`.
    pub conv: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// Stored as −exp(A_log).
    pub a: Vec<f32>,
    pub norm: Vec<f32>,
}

pub struct AttnWeights {
    pub q: Matrix,
    pub k: Matrix,
    pub v: Matrix,
    pub out: Matrix,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
}

pub enum Mixer {
    Recurrent(GdnWeights),
    Attention(AttnWeights),
}

pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub post_norm: Vec<f32>,
    pub mixer: Mixer,
    pub ffn_gate: Matrix,
    pub ffn_up: Matrix,
    pub ffn_down: Matrix,
}

pub struct Weights {
    pub token_embd: Matrix,
    pub output_norm: Vec<f32>,
    pub output: Matrix,
    pub layers: Vec<LayerWeights>,
}

/// Looks tensors up by name and checks their shapes against the config.
pub(crate) struct Loader<'a> {
    pub file: &'a Arc<Gguf>,
}

impl Loader<'_> {
    fn find(&self, name: &str) -> Result<usize> {
        self.file
            .tensors()
            .iter()
            .position(|t| t.name == name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    fn check_shape(&self, name: &str, index: usize, expected: &[u64]) -> Result<()> {
        let found = &self.file.tensors()[index].dims;
        // Trailing 1s are insignificant in ggml shapes.
        let trim = |d: &[u64]| {
            let mut v = d.to_vec();
            while v.len() > 1 && v.last() == Some(&1) {
                v.pop();
            }
            v
        };
        if trim(found) != trim(expected) {
            return Err(ModelError::ShapeMismatch {
                name: name.to_string(),
                found: found.clone(),
                expected: expected.to_vec(),
            });
        }
        Ok(())
    }

    /// A matrix mapping `cols` inputs to `rows` outputs.
    pub fn matrix(&self, name: &str, cols: usize, rows: usize) -> Result<Matrix> {
        let index = self.find(name)?;
        self.check_shape(name, index, &[cols as u64, rows as u64])?;
        let format = self.file.tensors()[index].format;
        let row_bytes = format
            .row_bytes(cols)
            .map_err(|source| ModelError::Decode {
                name: name.to_string(),
                source,
            })?;
        Ok(Matrix {
            file: self.file.clone(),
            index,
            format,
            rows,
            cols,
            row_bytes,
            tiled: None,
        })
    }

    /// A small tensor decoded to f32, of the given shape.
    pub fn vector(&self, name: &str, dims: &[u64]) -> Result<Vec<f32>> {
        let index = self.find(name)?;
        self.check_shape(name, index, dims)?;
        let info = &self.file.tensors()[index];
        let v = self
            .file
            .view(info)
            .to_f32()
            .map_err(|source| ModelError::Decode {
                name: name.to_string(),
                source,
            })?;
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(ModelError::NonFinite {
                name: name.to_string(),
                index: i,
            });
        }
        Ok(v)
    }
}

impl Weights {
    /// Visits every packed matrix, stopping at the first error.
    pub fn for_each_matrix<E>(&self, mut f: impl FnMut(&Matrix) -> Result<(), E>) -> Result<(), E> {
        f(&self.token_embd)?;
        f(&self.output)?;
        for l in &self.layers {
            match &l.mixer {
                Mixer::Recurrent(g) => [&g.qkv, &g.gate, &g.alpha, &g.beta, &g.out]
                    .into_iter()
                    .try_for_each(&mut f)?,
                Mixer::Attention(a) => [&a.q, &a.k, &a.v, &a.out]
                    .into_iter()
                    .try_for_each(&mut f)?,
            }
            [&l.ffn_gate, &l.ffn_up, &l.ffn_down]
                .into_iter()
                .try_for_each(&mut f)?;
        }
        Ok(())
    }

    /// Every matrix the forward pass multiplies (all but the embedding table, which is only
    /// looked up by row).
    fn multiplied_mut(&mut self) -> Vec<&mut Matrix> {
        let mut v = vec![&mut self.output];
        for l in &mut self.layers {
            match &mut l.mixer {
                Mixer::Recurrent(g) => v.extend([
                    &mut g.qkv,
                    &mut g.gate,
                    &mut g.alpha,
                    &mut g.beta,
                    &mut g.out,
                ]),
                Mixer::Attention(a) => v.extend([&mut a.q, &mut a.k, &mut a.v, &mut a.out]),
            }
            v.extend([&mut l.ffn_gate, &mut l.ffn_up, &mut l.ffn_down]);
        }
        v
    }

    /// Re-tiles every multiplied matrix that has a panel layout (see `quant::TiledMatrix`),
    /// calling `progress(done, total)` in packed bytes after each.
    pub(crate) fn tile(&mut self, ternary: Ternary, progress: &mut dyn FnMut(u64, u64)) {
        let mut todo = self.multiplied_mut();
        todo.retain(|m| m.needs_tiling(ternary));
        let total: u64 = todo.iter().map(|m| m.data().len() as u64).sum();
        let mut done = 0;
        for m in todo {
            m.tile(ternary);
            done += m.data().len() as u64;
            progress(done, total);
        }
    }

    /// Drops the tiled copies (the exact kernels read the file's rows).
    pub(crate) fn untile(&mut self) {
        for m in self.multiplied_mut() {
            m.tiled = None;
        }
    }

    pub(crate) fn load(file: &Arc<Gguf>, c: &Config) -> Result<Weights> {
        let l = Loader { file };
        let e = c.hidden;
        let token_embd = l.matrix("token_embd.weight", e, c.vocab)?;
        let output = l.matrix("output.weight", e, c.vocab)?;
        let output_norm = l.vector("output_norm.weight", &[e as u64])?;
        let mut layers = Vec::with_capacity(c.n_layers);
        for (il, kind) in c.layers.iter().enumerate() {
            let n = |s: &str| format!("blk.{il}.{s}");
            let mixer = match kind {
                LayerKind::Recurrent => {
                    let ch = c.gdn_conv_channels();
                    let vd = c.gdn_inner();
                    let hv = c.gdn_value_heads as u64;
                    Mixer::Recurrent(GdnWeights {
                        qkv: l.matrix(&n("attn_qkv.weight"), e, ch)?,
                        gate: l.matrix(&n("attn_gate.weight"), e, vd)?,
                        alpha: l.matrix(&n("ssm_alpha.weight"), e, c.gdn_value_heads)?,
                        beta: l.matrix(&n("ssm_beta.weight"), e, c.gdn_value_heads)?,
                        out: l.matrix(&n("ssm_out.weight"), vd, e)?,
                        conv: l
                            .vector(&n("ssm_conv1d.weight"), &[c.conv_kernel as u64, ch as u64])?,
                        dt_bias: l.vector(&n("ssm_dt.bias"), &[hv])?,
                        a: l.vector(&n("ssm_a"), &[hv])?,
                        norm: l.vector(&n("ssm_norm.weight"), &[c.gdn_value_dim as u64])?,
                    })
                }
                LayerKind::Attention => {
                    let hd = c.head_dim;
                    Mixer::Attention(AttnWeights {
                        q: l.matrix(&n("attn_q.weight"), e, 2 * c.n_head * hd)?,
                        k: l.matrix(&n("attn_k.weight"), e, c.n_head_kv * hd)?,
                        v: l.matrix(&n("attn_v.weight"), e, c.n_head_kv * hd)?,
                        out: l.matrix(&n("attn_output.weight"), c.n_head * hd, e)?,
                        q_norm: l.vector(&n("attn_q_norm.weight"), &[hd as u64])?,
                        k_norm: l.vector(&n("attn_k_norm.weight"), &[hd as u64])?,
                    })
                }
            };
            layers.push(LayerWeights {
                attn_norm: l.vector(&n("attn_norm.weight"), &[e as u64])?,
                post_norm: l.vector(&n("post_attention_norm.weight"), &[e as u64])?,
                mixer,
                ffn_gate: l.matrix(&n("ffn_gate.weight"), e, c.ffn)?,
                ffn_up: l.matrix(&n("ffn_up.weight"), e, c.ffn)?,
                ffn_down: l.matrix(&n("ffn_down.weight"), c.ffn, e)?,
            });
        }
        Ok(Weights {
            token_embd,
            output_norm,
            output,
            layers,
        })
    }
}
