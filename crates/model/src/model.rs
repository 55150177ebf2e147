//! The qwen35 forward pass on the CPU.

use std::path::Path;
use std::sync::Arc;

use gguf::Gguf;

use crate::config::Config;
use crate::error::{ModelError, Result};
use crate::hadamard::Hadamard;
use crate::input::{Ctx, Input, Kernels};
use crate::kv::KvFormat;
use crate::ops::{add_in_place, matmul, rms_norm, silu, zip_in_place};
use crate::state::{LayerState, State};
use crate::weights::{LayerWeights, Mixer, Weights};
use crate::{attention, gdn};

/// Which positions of a forward call produce logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    None,
    Last,
    All,
}

pub struct Model {
    pub config: Config,
    weights: Weights,
    hadamard: Option<Hadamard>,
    kernels: Kernels,
    /// How the int8 kernels hold PTQ1_0 rows.
    ternary: quant::Ternary,
    /// How new states' KV caches hold keys and values.
    kv: KvFormat,
    file: Arc<Gguf>,
}

impl Model {
    pub fn open(path: impl AsRef<Path>) -> Result<Model> {
        Self::from_gguf(Arc::new(Gguf::open(path)?))
    }

    pub fn from_gguf(file: Arc<Gguf>) -> Result<Model> {
        let md = file.metadata();
        let arch = md.architecture()?;
        if arch != crate::config::ARCH {
            return Err(ModelError::WrongArchitecture {
                found: arch.to_string(),
            });
        }
        let embd = file
            .tensor("token_embd.weight")
            .ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
        let vocab = embd.info.rows() as usize;
        let config = Config::from_metadata(md, vocab)?;
        let weights = Weights::load(&file, &config)?;
        let hadamard = Hadamard::from_metadata(md, &config)?;
        if let Some(hd) = &hadamard {
            weights.for_each_matrix(|m| hd.check_matrix(m))?;
        }
        Ok(Model {
            config,
            weights,
            hadamard,
            kernels: Kernels::default(),
            ternary: quant::Ternary::default(),
            kv: KvFormat::default(),
            file,
        })
    }

    /// Lowers the context limit below what the model was trained for (never raises it).
    pub fn limit_context(&mut self, tokens: usize) {
        self.config.context_length = self.config.context_length.min(tokens.max(1));
    }

    /// Chooses the dot kernels (see [`Kernels`]).
    pub fn set_kernels(&mut self, kernels: Kernels) {
        self.set_kernels_with_progress(kernels, &mut |_, _| {})
    }

    /// [`Model::set_kernels`], reporting `(done, total)` packed bytes while the int8 kernels'
    /// weights are re-tiled (seconds for a 27B file). On a CPU with AVX-512 VNNI/VBMI the int8
    /// kernels run on 16-row panels (`quant::TiledMatrix`): the copy replaces the file's pages
    /// in resident memory, so memory use stays near the file size.
    pub fn set_kernels_with_progress(
        &mut self,
        kernels: Kernels,
        progress: &mut dyn FnMut(u64, u64),
    ) {
        self.kernels = kernels;
        match kernels {
            Kernels::Int8 if quant::TiledMatrix::fast() => {
                self.weights.tile(self.ternary, progress)
            }
            _ => self.weights.untile(),
        }
    }

    /// How the int8 kernels hold PTQ1_0 rows: packed as in the file (the default) or widened to
    /// 2-bit codes (faster, 23% more memory for those rows). Takes effect at the next
    /// [`Model::set_kernels`].
    pub fn set_ternary(&mut self, ternary: quant::Ternary) {
        self.ternary = ternary;
    }

    pub fn kernels(&self) -> Kernels {
        self.kernels
    }

    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            hadamard: self.hadamard.as_ref(),
            kernels: self.kernels,
        }
    }

    pub fn file(&self) -> &Arc<Gguf> {
        &self.file
    }

    pub fn hadamard(&self) -> Option<&Hadamard> {
        self.hadamard.as_ref()
    }

    /// How the KV caches of states made from now on hold keys and values.
    pub fn set_kv_format(&mut self, kv: KvFormat) {
        self.kv = kv;
    }

    pub fn kv_format(&self) -> KvFormat {
        self.kv
    }

    pub fn new_state(&self) -> State {
        State::with_kv_format(&self.config, self.kv)
    }

    /// Runs `tokens` through the model after what `state` has seen, as one chunk: every weight
    /// row is read once for the whole chunk. Returns logits as asked (`[n][vocab]`).
    pub fn forward(&self, state: &mut State, tokens: &[u32], logits: Logits) -> Result<Vec<f32>> {
        let c = &self.config;
        if tokens.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= c.vocab) {
            return Err(ModelError::TokenOutOfRange { id, vocab: c.vocab });
        }
        if state.pos + tokens.len() > c.context_length {
            return Err(ModelError::ContextFull {
                have: state.pos,
                adding: tokens.len(),
                limit: c.context_length,
            });
        }
        if !state.matches(c) {
            return Err(ModelError::StateMismatch);
        }
        let n = tokens.len();
        let e = c.hidden;
        let mut x = vec![0f32; n * e];
        for (t, &id) in tokens.iter().enumerate() {
            self.embed(id, &mut x[t * e..(t + 1) * e])?;
        }

        let mut h = vec![0f32; n * e];
        for (lw, ls) in self.weights.layers.iter().zip(state.layers.iter_mut()) {
            for t in 0..n {
                rms_norm(
                    &x[t * e..(t + 1) * e],
                    &lw.attn_norm,
                    c.rms_eps,
                    &mut h[t * e..(t + 1) * e],
                );
            }
            let mixed = match (&lw.mixer, ls) {
                (Mixer::Recurrent(w), LayerState::Recurrent { conv, ssm }) => {
                    let ssm = state
                        .ssm
                        .get_mut(ssm.clone())
                        .ok_or(ModelError::StateMismatch)?;
                    gdn::forward(c, w, self.ctx(), conv, ssm, &h, n)
                }
                (Mixer::Attention(w), LayerState::Attention(kv)) => {
                    attention::forward(c, w, self.ctx(), kv, &h, n, state.pos)
                }
                _ => return Err(ModelError::StateMismatch),
            };
            add_in_place(&mut x, &mixed);
            for t in 0..n {
                rms_norm(
                    &x[t * e..(t + 1) * e],
                    &lw.post_norm,
                    c.rms_eps,
                    &mut h[t * e..(t + 1) * e],
                );
            }
            let ffn_out = self.ffn(lw, &h, n);
            add_in_place(&mut x, &ffn_out);
        }
        state.pos += n;

        let rows: Vec<usize> = match logits {
            Logits::None => return Ok(Vec::new()),
            Logits::Last => vec![n - 1],
            Logits::All => (0..n).collect(),
        };
        let mut normed = vec![0f32; rows.len() * e];
        for (i, &t) in rows.iter().enumerate() {
            rms_norm(
                &x[t * e..(t + 1) * e],
                &self.weights.output_norm,
                c.rms_eps,
                &mut normed[i * e..(i + 1) * e],
            );
        }
        let normed = Input::new(&normed, rows.len(), self.ctx());
        let mut out = vec![0f32; rows.len() * c.vocab];
        matmul(&self.weights.output, &normed, &mut out);
        Ok(out)
    }

    fn ffn(&self, lw: &LayerWeights, h: &[f32], n: usize) -> Vec<f32> {
        let f = self.config.ffn;
        let input = Input::new(h, n, self.ctx());
        let mut gate = vec![0f32; n * f];
        let mut up = vec![0f32; n * f];
        matmul(&lw.ffn_gate, &input, &mut gate);
        matmul(&lw.ffn_up, &input, &mut up);
        zip_in_place(&mut gate, &up, |g, u| silu(g) * u);
        let act = Input::new(&gate, n, self.ctx());
        let mut out = vec![0f32; n * self.config.hidden];
        matmul(&lw.ffn_down, &act, &mut out);
        out
    }

    fn embed(&self, id: u32, out: &mut [f32]) -> Result<()> {
        let m = &self.weights.token_embd;
        quant::dequantize(m.format, m.row(id as usize), out).map_err(|source| {
            ModelError::Decode {
                name: m.name().to_string(),
                source,
            }
        })?;
        if let Some(hd) = &self.hadamard {
            hd.unrotate_embedding(out);
        }
        Ok(())
    }
}
