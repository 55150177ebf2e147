//! The model's weights read from its file, re-tiled and uploaded once, with what follows from
//! them at load: the short-pass rule of their format, the Hadamard signs, the order in which a
//! step meets its matrices, and the switches read at start.

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;

use gguf::Gguf;
use model::{LayerKind, Model, ModelError};
use quant::Format;

use super::{AttnW, CudaModel, EmbedTable, GdnW, LayerW, MixW};
use crate::error::{Context, CudaError, Result};
use crate::gpu::{DevMat, Gpu};
use crate::plan::{self, check_fits, forward_ops, Dims, Head, KvCache};
use crate::repack::{self, Packed};

fn vector(file: &Gguf, name: &str) -> Result<Vec<f32>> {
    let t = file
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
    t.to_f32().map_err(|source| {
        CudaError::Model(ModelError::Decode {
            name: name.into(),
            source,
        })
    })
}

fn packed(file: &Gguf, name: &str) -> Result<(String, Format, Packed)> {
    let t = file
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
    let (cols, rows) = (t.info.row_len() as usize, t.info.rows() as usize);
    let p = repack::repack(name, t.format(), t.data, rows, cols)?;
    Ok((name.to_string(), t.format(), p))
}

impl CudaModel {
    /// Compiles the kernels for this model's shapes and uploads its weights.
    pub fn load(m: &Model) -> Result<CudaModel> {
        let mut dims = Dims::from_config(&m.config)?;
        if let Some(hd) = m.hadamard() {
            dims.rotation = plan::Rotation::from_hadamard(hd, &dims)?;
        }
        let rot = dims.rotation;
        let gpu = Arc::new(Gpu::new(&dims)?);
        let file = m.file().clone();
        let f = &*file;
        let (mut weight_bytes, mut image_bytes, mut stage_scale_bytes) = (0usize, 0usize, 0usize);
        let mut up = |parts: Vec<(String, Format, Packed)>| -> Result<DevMat> {
            let name = parts[0].0.clone();
            let p = repack::concat(parts)?;
            let free = gpu.free_bytes()?;
            let image = gpu.tile_image_need(&p);
            let staged = gpu.stage_scale_need(&p);
            let mut parts = vec![(name.as_str(), p.bytes())];
            if image > 0 {
                parts.push(("its tile image (NIWAKI_CUDA_B1_IMAGE=0 makes none)", image));
            }
            if staged > 0 {
                parts.push(("its scales in stage order (for the f16 GEMM)", staged));
            }
            check_fits(&format!("weights ({name})"), &parts, free)?;
            let d = gpu.upload_packed(&p, &name)?;
            weight_bytes += d.bytes();
            image_bytes += d.image_bytes();
            stage_scale_bytes += d.stage_scale_bytes();
            Ok(d)
        };
        let mut layers = Vec::with_capacity(dims.layers.len());
        for (il, kind) in dims.layers.iter().enumerate() {
            let n = |s: &str| format!("blk.{il}.{s}");
            let mix = match kind {
                LayerKind::Recurrent => {
                    let qkvz = vec![
                        packed(f, &n("attn_qkv.weight"))?,
                        packed(f, &n("attn_gate.weight"))?,
                    ];
                    let ab = vec![
                        packed(f, &n("ssm_alpha.weight"))?,
                        packed(f, &n("ssm_beta.weight"))?,
                    ];
                    // Stacked, unless only one of the two reads the input rotated.
                    let (inp, ab) = if rot.split_gdn_in() {
                        (up(qkvz)?, Some(Box::new(up(ab)?)))
                    } else {
                        (up([qkvz, ab].concat())?, None)
                    };
                    MixW::Gdn(GdnW {
                        inp,
                        ab,
                        out: up(vec![packed(f, &n("ssm_out.weight"))?])?,
                        conv: gpu.upload(&vector(f, &n("ssm_conv1d.weight"))?, "conv")?,
                        dt_bias: gpu.upload(&vector(f, &n("ssm_dt.bias"))?, "dt")?,
                        a: gpu.upload(&vector(f, &n("ssm_a"))?, "a")?,
                        norm: gpu.upload(&vector(f, &n("ssm_norm.weight"))?, "norm")?,
                    })
                }
                LayerKind::Attention => MixW::Attn(AttnW {
                    inp: up(vec![
                        packed(f, &n("attn_q.weight"))?,
                        packed(f, &n("attn_k.weight"))?,
                        packed(f, &n("attn_v.weight"))?,
                    ])?,
                    out: up(vec![packed(f, &n("attn_output.weight"))?])?,
                    q_norm: gpu.upload(&vector(f, &n("attn_q_norm.weight"))?, "q_norm")?,
                    k_norm: gpu.upload(&vector(f, &n("attn_k_norm.weight"))?, "k_norm")?,
                }),
            };
            layers.push(LayerW {
                attn_norm: gpu.upload(&vector(f, &n("attn_norm.weight"))?, "norm")?,
                post_norm: gpu.upload(&vector(f, &n("post_attention_norm.weight"))?, "norm")?,
                mix,
                ffn_in: up(vec![
                    packed(f, &n("ffn_gate.weight"))?,
                    packed(f, &n("ffn_up.weight"))?,
                ])?,
                ffn_down: up(vec![packed(f, &n("ffn_down.weight"))?])?,
            });
        }
        // Short passes by the layers' format, unless a switch sets them.
        let short = layers.first().map_or(plan::ShortPasses::UNMEASURED, |l| {
            plan::short_passes(l.ffn_down.format)
        });
        gpu.default_gemm_min_tokens(short.gemm_from);
        let output = up(vec![packed(f, "output.weight")?])?;
        let output_norm = gpu.upload(&vector(f, "output_norm.weight")?, "norm")?;
        let embd = file
            .tensor("token_embd.weight")
            .ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
        let embd_format = embd.format();
        let embd_row_bytes =
            embd_format
                .row_bytes(dims.hidden)
                .map_err(|source| ModelError::Decode {
                    name: "token_embd.weight".into(),
                    source,
                })?;
        let embed_table = EmbedTable::upload(&gpu, &embd, embd_row_bytes, &dims, m.hadamard())?;
        let mut signs = Vec::new();
        if let Some(hd) = m.hadamard() {
            for w in [
                dims.hidden,
                dims.ffn,
                dims.gdn_inner(),
                dims.n_head * dims.head_dim,
            ] {
                if let (Some(v), false) = (hd.signs(w), signs.iter().any(|(x, _)| *x == w)) {
                    signs.push((w, gpu.upload(v, "hadamard signs")?));
                }
            }
        }
        gpu.stream.synchronize().ctx(|| "weight upload".into())?;
        // Fusion merges only small ops: the matrices come in the same order either way.
        let next_mat = plan::next_matrices(&forward_ops(
            &dims,
            1,
            Head::Last,
            true,
            plan::Fusion::default(),
        ));
        Ok(CudaModel {
            gpu,
            dims,
            layers,
            output,
            output_norm,
            embd_format,
            embd_row_bytes,
            file,
            weight_bytes,
            image_bytes,
            stage_scale_bytes,
            use_graphs: true,
            step_tokens: AtomicUsize::new(crate::knobs::number(
                "NIWAKI_CUDA_STEP_TOKENS",
                short.step,
            )),
            embed_table,
            device_embed: AtomicBool::new(crate::knobs::flag("NIWAKI_CUDA_DEVICE_EMBED", true)),
            run_ahead: AtomicBool::new(crate::knobs::flag("NIWAKI_CUDA_RUN_AHEAD", true)),
            checkpoints: AtomicBool::new(crate::knobs::flag(
                "NIWAKI_CUDA_CHECKPOINTS",
                plan::CHECKPOINTS,
            )),
            kv_cache: KvCache::F16,
            next_mat,
            hadamard: m.hadamard().cloned(),
            signs,
        })
    }
}
