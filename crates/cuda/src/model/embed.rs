//! A pass's embedding rows: dequantized by the host for prompts, looked up by the device's
//! first kernel (`embed_row`) for one-token passes where the table's format allows, so that a
//! decode step needs nothing from the host.

use rayon::prelude::*;

use gguf::TensorView;
use model::hadamard::Hadamard;
use model::ModelError;

use std::sync::atomic::Ordering;

use super::{CudaModel, CudaState};
use crate::error::{CudaError, Result};
use crate::gpu::{Arg, DevBuf, Gpu};
use crate::plan::{self, check_fits, Dims, EmbedFormat, ROT_BLOCK};

/// Tokens from which a pass's embedding rows are dequantized on several host threads.
const EMBED_PARALLEL_MIN: usize = 16;

/// The embedding table on the device, as the file stores it.
pub(super) struct EmbedTable {
    table: DevBuf,
    format: EmbedFormat,
    row_bytes: usize,
    /// The sign vector of the hidden width, for an embedding stored rotated.
    rotated: bool,
}

impl EmbedTable {
    /// Uploads the table where `embed_row` can read it (else `None`: the host embeds).
    pub(super) fn upload(
        gpu: &Gpu,
        t: &TensorView,
        row_bytes: usize,
        d: &Dims,
        hd: Option<&Hadamard>,
    ) -> Result<Option<EmbedTable>> {
        let inverse = hd.filter(|h| h.embedding_inverse());
        let Some(format) = plan::device_embedding(t.format(), d.hidden, inverse.map(|h| h.block()))
        else {
            return Ok(None);
        };
        let what = "token_embd.weight (the device's embedding table)";
        check_fits(what, &[(what, t.data.len())], gpu.free_bytes()?)?;
        Ok(Some(EmbedTable {
            table: gpu.upload(t.data, "embedding table")?,
            format,
            row_bytes,
            rotated: inverse.is_some(),
        }))
    }
}

impl CudaModel {
    /// Whether the embedding table is on the device (its format is one `embed_row` decodes).
    pub fn has_device_embedding(&self) -> bool {
        self.embed_table.is_some()
    }

    /// Whether one-token passes look their rows up on the device.
    pub(super) fn embeds_on_device(&self) -> bool {
        self.device_embed.load(Ordering::Relaxed) && self.embed_table.is_some()
    }

    /// Turns the device's lookup of one-token passes' rows on or off; returns the previous
    /// setting.
    pub fn set_device_embed(&self, on: bool) -> bool {
        self.device_embed.swap(on, Ordering::Relaxed)
    }

    /// Launches `embed_row` for the token in the state's argmax key, into `x`.
    pub(super) fn embed_on_device(&self, st: &CudaState) -> Result<()> {
        let e = self
            .embed_table
            .as_ref()
            .ok_or_else(|| CudaError::Unsupported("no embedding table on the device".into()))?;
        let signs = if e.rotated {
            self.signs_if(true, self.dims.hidden)?
        } else {
            0
        };
        debug_assert!(signs == 0 || self.dims.hidden.is_multiple_of(ROT_BLOCK));
        self.gpu.launch(
            &st.stream,
            "embed_row",
            (self.dims.hidden.div_ceil(ROT_BLOCK) as u32, 1, 1),
            (256, 1, 1),
            &[
                Arg::Ptr(e.table.ptr),
                Arg::I32(e.format.code()),
                Arg::I32(self.dims.hidden as i32),
                Arg::U64(e.row_bytes as u64),
                Arg::I32(self.dims.vocab as i32),
                Arg::Ptr(st.s("argmax")),
                Arg::Ptr(signs),
                Arg::Ptr(st.s("x")),
            ],
        )
    }

    /// Dequantizes the embedding rows of `tokens` into `x` (`[tokens][hidden]`), spread over the
    /// host's cores for a prefill pass: it sits on the pass's critical path (one core took ~5 ms
    /// for 512 tokens of a 27B file).
    pub(super) fn embed(&self, tokens: &[u32], x: &mut [f32]) -> Result<()> {
        let e = self.dims.hidden;
        let t = self
            .file
            .tensor("token_embd.weight")
            .ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
        let rb = self.embd_row_bytes;
        let one = |(&id, out): (&u32, &mut [f32])| -> Result<()> {
            let row = t.data.get(id as usize * rb..(id as usize + 1) * rb).ok_or(
                ModelError::TokenOutOfRange {
                    id,
                    vocab: self.dims.vocab,
                },
            )?;
            quant::dequantize(self.embd_format, row, out).map_err(|source| {
                CudaError::from(ModelError::Decode {
                    name: "token_embd.weight".into(),
                    source,
                })
            })?;
            // Ternary-Bonsai-2 stores the embedding rotated.
            if let Some(hd) = &self.hadamard {
                hd.unrotate_embedding(out);
            }
            Ok(())
        };
        let x = &mut x[..tokens.len() * e];
        if tokens.len() >= EMBED_PARALLEL_MIN {
            tokens.par_iter().zip(x.par_chunks_mut(e)).try_for_each(one)
        } else {
            tokens.iter().zip(x.chunks_mut(e)).try_for_each(one)
        }
    }
}
