//! The qwen35 forward pass on the GPU: weights uploaded once (re-tiled and stacked by input),
//! per-sequence state and scratch, and one CUDA graph per decode step. The weights' upload is in
//! `load`, the ops' launches in `exec`, the embedding rows in `embed`, greedy decoding ahead of
//! the host in `greedy`, the harness's measurements in `probe`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaGraph, CudaStream, PinnedHostSlice};
use gguf::Gguf;
use model::rank::Ranked;
use model::{Logits, ModelError};
use quant::Format;

use crate::error::{Context, CudaError, Result};
use crate::gpu::{
    Arg, DevBuf, DevMat, DeviceInfo, FoldKind, FoldOut, GemvIo, Gpu, NormIn, Prefetch, RmsIn,
};
use crate::plan::{
    self, attn_splits, check_fits, forward_ops, Dims, Fusion, Head, KvCache, Mat, Norm, Op, Out,
    Scratch, StateBytes, MAX_CHUNK,
};
use crate::repack::{self, GpuFormat};
use crate::topk::{Selected, TopkJob, TopkScratch};

mod attention;
mod chain;
mod checkpoint;
mod embed;
mod exec;
mod greedy;
mod load;
mod probe;
mod recurrence;

pub use chain::{ChainMode, ChainTimes, ChainWaits};
pub use checkpoint::CudaCheckpoint;
use embed::EmbedTable;

struct GdnW {
    inp: DevMat,
    /// α | β apart from qkv | z when only one of the two reads the input rotated.
    ab: Option<Box<DevMat>>,
    out: DevMat,
    conv: DevBuf,
    dt_bias: DevBuf,
    a: DevBuf,
    norm: DevBuf,
}

struct AttnW {
    inp: DevMat,
    out: DevMat,
    q_norm: DevBuf,
    k_norm: DevBuf,
}

enum MixW {
    Gdn(GdnW),
    Attn(AttnW),
}

struct LayerW {
    attn_norm: DevBuf,
    post_norm: DevBuf,
    mix: MixW,
    ffn_in: DevMat,
    ffn_down: DevMat,
}

/// A model's weights on the GPU.
pub struct CudaModel {
    gpu: Arc<Gpu>,
    dims: Dims,
    layers: Vec<LayerW>,
    output: DevMat,
    output_norm: DevBuf,
    file: Arc<Gguf>,
    embd_format: Format,
    /// Bytes of one row of the embedding table.
    embd_row_bytes: usize,
    weight_bytes: usize,
    /// Device bytes of the weights' tile images (`gpu/tile_image.rs`).
    image_bytes: usize,
    /// Device bytes of the weights' stage-ordered scales (`stage_scales.rs`).
    stage_scale_bytes: usize,
    /// Capture decode steps as CUDA graphs (on by default).
    pub use_graphs: bool,
    /// Passes of 2 to this many tokens run token by token ([`plan::short_passes`];
    /// `NIWAKI_CUDA_STEP_TOKENS` sets it).
    step_tokens: AtomicUsize,
    /// The embedding table where one-token passes look their row up on the device.
    embed_table: Option<EmbedTable>,
    /// Look one-token passes' rows up on the device where the table allows (on by default;
    /// `NIWAKI_CUDA_DEVICE_EMBED=0` turns it off): the host embeds them otherwise.
    device_embed: AtomicBool,
    /// Greedy decoding launches each step before the host has read the previous step's pick
    /// (on by default with the device's embedding; `NIWAKI_CUDA_RUN_AHEAD=0` turns it off).
    run_ahead: AtomicBool,
    /// Whether states save and rewind ([`CudaModel::save`]; [`plan::CHECKPOINTS`],
    /// `NIWAKI_CUDA_CHECKPOINTS=0` turns it off).
    checkpoints: AtomicBool,
    /// The KV cache type of the sequences [`CudaModel::new_state`] makes (f16 by default).
    pub kv_cache: KvCache,
    /// Each matrix and the one a decode step multiplies by next (for the L2 prefetch).
    next_mat: Vec<(Mat, Mat)>,
    /// Ternary-Bonsai-2's rotation: embedding rows are un-rotated on lookup, and the sign
    /// vectors of the rotated activations, by width.
    hadamard: Option<model::hadamard::Hadamard>,
    signs: Vec<(usize, DevBuf)>,
}

/// What a decode graph was captured for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct GraphKey {
    head: Head,
    tail: Tail,
    tile: usize,
    /// Its first kernel looks the row up (`embed_row`).
    device_embed: bool,
    /// Its attention layers take the one-kernel short attention (a short context).
    short_attn: bool,
}

/// Where a pass's tokens come from.
#[derive(Clone, Copy)]
enum Feed<'a> {
    /// The host's.
    Tokens(&'a [u32]),
    /// The previous pass's pick, on the device (one token).
    Picked,
}

impl Feed<'_> {
    fn len(&self) -> usize {
        match self {
            Feed::Tokens(t) => t.len(),
            Feed::Picked => 1,
        }
    }
}

/// What a pass computes on the GPU after the logits of its last token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tail {
    None,
    /// The argmax (8 bytes back).
    Argmax,
    /// Sampling's best `k` by logit / temperature (`t`: its bits), `k + 1` keys back, and the
    /// weight sums with min-p's floor (its bits) when asked for.
    TopK {
        k: usize,
        t: u32,
        floor: Option<u32>,
    },
}

/// One sequence on the GPU: recurrent state, KV cache (f16 or q8_0) sized for `ctx` tokens, scratch
/// buffers and the captured decode graphs.
pub struct CudaState {
    ctx: usize,
    pos: usize,
    stream: Arc<CudaStream>,
    state: DevBuf,
    scratch: DevBuf,
    layout: Scratch,
    bytes: StateBytes,
    /// Each by its head, tail, attention tile (a context past [`plan::ATTN_MMA_FROM`] takes
    /// another kernel, so another graph) and where its row is embedded.
    graphs: Vec<(GraphKey, CudaGraph)>,
    /// The greedy step launched ahead of the host, not yet counted in `pos`.
    ahead: Option<greedy::Ahead>,
    /// The logits row is from before a rewind (`CudaModel::rewind`) and no pass has run since.
    row_stale: bool,
    /// Which checkpoints this sequence can go back to.
    lineage: model::lineage::Lineage,
    /// Where greedy passes' picks land, and when.
    picks: greedy::Picks,
    /// Page-locked landing place for one row of logits: a decode step's copy to the host then
    /// runs at bus speed instead of through the driver's pageable staging.
    host_row: PinnedHostSlice<f32>,
    /// Page-locked landing place for a pass's embedded tokens (`MAX_CHUNK` rows): the copy to
    /// the device then runs at bus speed (from pageable memory the driver stages it first).
    host_x: PinnedHostSlice<f32>,
}

// SAFETY: the graphs and stream are used only through `&mut CudaState` (one thread at a time);
// CUDA handles may be used from any thread once the context is bound, which every call does.
unsafe impl Send for CudaState {}

impl CudaState {
    /// Tokens this state has consumed.
    pub fn len(&self) -> usize {
        self.pos
    }
    pub fn is_empty(&self) -> bool {
        self.pos == 0
    }
    /// The context it was sized for.
    pub fn context(&self) -> usize {
        self.ctx
    }
    /// Device bytes held (state, KV cache and scratch).
    pub fn device_bytes(&self) -> usize {
        self.state.bytes + self.scratch.bytes
    }

    /// Pretends `pos` tokens were consumed (the KV cache keeps whatever it holds, zeros for a
    /// fresh state; the conv and recurrent states are read from the buffers of `pos`'s parity,
    /// which may be the older ones). For depth benchmarks only.
    #[doc(hidden)]
    pub fn bench_seek(&mut self, pos: usize) {
        assert!(pos < self.ctx);
        self.ahead = None;
        if pos < self.pos {
            // Checkpoints above it no longer hold.
            self.lineage.rewound(pos);
        }
        self.pos = pos;
    }

    fn s(&self, region: &str) -> u64 {
        self.scratch.at(self.layout.offset(region))
    }

    fn topk_scratch(&self) -> TopkScratch {
        let half = (self.layout.size("topk") / 2) as u64;
        TopkScratch {
            keys: [self.s("topk"), self.s("topk") + half],
            flag: self.s("topk_flag"),
            chunks: self.s("weight_chunks"),
        }
    }
}

impl CudaModel {
    pub fn device(&self) -> &DeviceInfo {
        &self.gpu.info
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Bytes of weights on the device (the bytes a decode step streams).
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// Device bytes of the 2-bit decode GEMVs' tile images, beside [`CudaModel::weight_bytes`]
    /// (`gpu/tile_image.rs`; 0 without them).
    pub fn tile_image_bytes(&self) -> usize {
        self.image_bytes
    }

    /// Device bytes of the f16 GEMM's stage-ordered scales, beside [`CudaModel::weight_bytes`]
    /// (`stage_scales.rs`; 0 without them).
    pub fn stage_scale_bytes(&self) -> usize {
        self.stage_scale_bytes
    }

    /// Seconds NVRTC spent (0 if the kernels came from the on-disk cache).
    pub fn compile_secs(&self) -> f64 {
        self.gpu.compile_secs
    }

    /// Whether the kernels came from the on-disk cache.
    pub fn kernels_from_cache(&self) -> bool {
        self.gpu.from_cache
    }

    /// Seconds the driver spent loading the kernels (its JIT, for parts loaded from PTX).
    pub fn kernel_load_secs(&self) -> f64 {
        self.gpu.load_secs
    }

    /// The program's parts loaded from NVRTC's device code, with no JIT (`NIWAKI_CUDA_CUBIN`).
    pub fn kernel_device_code_parts(&self) -> usize {
        self.gpu.device_code_parts
    }

    /// A fresh sequence with room for `ctx` tokens.
    pub fn new_state(&self, ctx: usize) -> Result<CudaState> {
        let ctx = ctx.max(1);
        if ctx > self.dims.context_length {
            return Err(CudaError::ContextTooLong {
                ctx,
                limit: self.dims.context_length,
            });
        }
        let bytes = StateBytes::new(&self.dims, ctx, self.kv_cache);
        // The partial rows of the query-tiled attention where multi-token passes take it.
        let tiled = self.gpu.attn_prefill_for(self.kv_cache, 2);
        let rule = self.gpu.attn_prefill_rule();
        let rows = plan::attn_part_rows(&self.dims, MAX_CHUNK, tiled, rule);
        let layout = Scratch::new(&self.dims, MAX_CHUNK, rows, self.reads_planes());
        check_fits(
            &format!("a sequence of {ctx} tokens"),
            &[
                ("KV cache", bytes.kv),
                ("recurrent state", bytes.conv + bytes.ssm),
                ("scratch", layout.bytes),
            ],
            self.gpu.free_bytes()?,
        )?;
        let state = self.gpu.alloc(bytes.total(), "sequence state")?;
        let scratch = self.gpu.alloc(layout.bytes, "scratch")?;
        self.gpu
            .stream
            .synchronize()
            .ctx(|| "zeroing state".into())?;
        Ok(CudaState {
            ctx,
            pos: 0,
            stream: self.gpu.new_stream()?,
            state,
            scratch,
            layout,
            bytes,
            graphs: Vec::new(),
            ahead: None,
            row_stale: false,
            lineage: model::lineage::Lineage::new(),
            picks: greedy::Picks::new(&self.gpu)?,
            // SAFETY: every element is written by a device copy before it is read.
            host_row: unsafe { self.gpu.ctx.alloc_pinned_with_flags(self.dims.vocab, 0) }
                .ctx(|| format!("{} bytes of page-locked host memory", 4 * self.dims.vocab))?,
            // SAFETY: as above; `embed` writes a pass's rows before they are copied.
            host_x: unsafe {
                self.gpu
                    .ctx
                    .alloc_pinned_with_flags(MAX_CHUNK * self.dims.hidden, 0)
            }
            .ctx(|| {
                format!(
                    "{} bytes of page-locked host memory",
                    4 * MAX_CHUNK * self.dims.hidden
                )
            })?,
        })
    }

    fn check(&self, st: &CudaState, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(ModelError::EmptyInput.into());
        }
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= self.dims.vocab) {
            return Err(ModelError::TokenOutOfRange {
                id,
                vocab: self.dims.vocab,
            }
            .into());
        }
        if st.pos + tokens.len() > st.ctx {
            return Err(CudaError::ContextFull {
                ctx: st.ctx,
                have: st.pos,
                adding: tokens.len(),
            });
        }
        Ok(())
    }

    /// Same contract as `model::Model::forward`: runs `tokens` after what `state` has seen and
    /// returns logits as asked (`[n][vocab]`).
    pub fn forward(&self, st: &mut CudaState, tokens: &[u32], logits: Logits) -> Result<Vec<f32>> {
        self.check(st, tokens)?;
        st.drop_ahead();
        let mut out = Vec::new();
        let n = tokens.len();
        for (s, len) in plan::chunks(n) {
            let last = s + len == n;
            let head = match logits {
                Logits::None => Head::None,
                Logits::All => Head::All,
                Logits::Last if last => Head::Last,
                Logits::Last => Head::None,
            };
            self.run(st, &tokens[s..s + len], head, Tail::None)?;
            let rows = match head {
                Head::None => 0,
                Head::Last => 1,
                Head::All => len,
            };
            if rows == 1 {
                let src = st.s("logits");
                let row = st.host_row.as_mut_slice().ctx(|| "host logits".into())?;
                // SAFETY: the logits buffer holds at least one row; the stream is synchronised
                // before the row is read.
                unsafe { result::memcpy_dtoh_async(row, src, st.stream.cu_stream()) }
                    .ctx(|| "device to host copy".into())?;
                st.stream.synchronize().ctx(|| "synchronising".into())?;
                out.extend_from_slice(st.host_row.as_slice().ctx(|| "host logits".into())?);
            } else if rows > 1 {
                let at = out.len();
                out.resize(at + rows * self.dims.vocab, 0.0);
                self.gpu.read(&st.stream, st.s("logits"), &mut out[at..])?;
            }
        }
        st.stream.synchronize().ctx(|| "forward".into())?;
        Ok(out)
    }

    /// The vocabulary size (rows of the logits).
    pub fn vocab(&self) -> usize {
        self.dims.vocab
    }

    /// Runs `tokens` and returns the `k` best next tokens by logit / `temperature` as
    /// `model::rank::top_k` gives them, selected on the GPU (only the k candidates come back),
    /// and with `floor` the row's `model::rank::weight_sums` too; or the row of logits when it
    /// holds ±∞, `k` is more than [`plan::TOPK_MAX`] or the selection is off ([`Gpu::topk`],
    /// [`Gpu::topk_sums`] for the sums): the contract of `engine::Backend::forward_top_k`.
    pub fn forward_top_k(
        &self,
        st: &mut CudaState,
        tokens: &[u32],
        k: usize,
        temperature: f32,
        floor: Option<f32>,
    ) -> Result<Ranked> {
        let selectable = self.gpu.topk()
            && (floor.is_none() || self.gpu.topk_sums())
            && k <= plan::TOPK_MAX
            && temperature > 0.0
            && temperature.is_finite();
        if !selectable {
            return Ok(Ranked::Row(self.forward(st, tokens, Logits::Last)?));
        }
        let tail = Tail::TopK {
            k,
            t: temperature.to_bits(),
            floor: floor.map(f32::to_bits),
        };
        self.run_to_last(st, tokens, tail)?;
        // The k keys, the flag and the sums, through the page-locked row (8 KiB at most).
        let at = st.topk_scratch().answer(self.dims.vocab, k);
        let words = 2 * (k + 1 + usize::from(floor.is_some()));
        let row = st.host_row.as_mut_slice().ctx(|| "host logits".into())?;
        self.gpu.read(&st.stream, at, &mut row[..words])?;
        let keys: Vec<u64> = row[..words]
            .chunks_exact(2)
            .map(|w| u64::from(w[0].to_bits()) | (u64::from(w[1].to_bits()) << 32))
            .collect();
        let sums = floor.map(|_| crate::topk::unpack_sums(keys[k + 1]));
        match Selected::from_keys(&keys[..k + 1]) {
            Selected::Top(top) => Ok(Ranked::Top { top, sums }),
            Selected::Infinite => Ok(Ranked::Row(self.last_row(st)?)),
        }
    }

    /// Runs `tokens` in passes, the last token's logits and then `tail` computed by the last.
    fn run_to_last(&self, st: &mut CudaState, tokens: &[u32], tail: Tail) -> Result<()> {
        self.check(st, tokens)?;
        st.drop_ahead();
        let n = tokens.len();
        for (s, len) in plan::chunks(n) {
            let (head, tail) = if s + len == n {
                (Head::Last, tail)
            } else {
                (Head::None, Tail::None)
            };
            self.run(st, &tokens[s..s + len], head, tail)?;
        }
        Ok(())
    }

    /// The logits row of the last token of the last call that computed one.
    pub fn last_row(&self, st: &mut CudaState) -> Result<Vec<f32>> {
        if st.ahead.is_some() {
            // The step run ahead has overwritten the row.
            return Err(CudaError::Unsupported(
                "the logits of a greedy step (only its pick is kept)".into(),
            ));
        }
        if st.row_stale {
            return Err(CudaError::Unsupported(
                "the logits of a token a rewind has forgotten".into(),
            ));
        }
        let mut row = vec![0f32; self.dims.vocab];
        self.gpu.read(&st.stream, st.s("logits"), &mut row)?;
        Ok(row)
    }

    /// One GPU pass over at most `MAX_CHUNK` tokens, waited for; a short one (see
    /// [`plan::short_passes`]) as one-token passes, the last computing what this one would.
    fn run(&self, st: &mut CudaState, tokens: &[u32], head: Head, tail: Tail) -> Result<()> {
        match tokens.split_last() {
            Some((&last, rest)) if self.stepped(tokens.len()) && head != Head::All => {
                for &t in rest {
                    self.run_pass(st, &[t], Head::None, Tail::None)?;
                }
                self.run_pass(st, &[last], head, tail)
            }
            _ => self.run_pass(st, tokens, head, tail),
        }
    }

    /// Passes of 2 to this many tokens run token by token ([`plan::short_passes`]).
    pub fn step_tokens(&self) -> usize {
        self.step_tokens.load(Ordering::Relaxed)
    }

    /// Whether a pass of `n` tokens runs token by token.
    fn stepped(&self, n: usize) -> bool {
        n > 1 && n <= self.step_tokens()
    }

    /// Sets [`CudaModel::step_tokens`] (0: never); returns the previous setting.
    pub fn set_step_tokens(&self, n: usize) -> usize {
        self.step_tokens.swap(n, Ordering::Relaxed)
    }

    /// One GPU pass, waited for.
    fn run_pass(&self, st: &mut CudaState, tokens: &[u32], head: Head, tail: Tail) -> Result<()> {
        let launched = self.enqueue_pass(st, Feed::Tokens(tokens), head, tail);
        // Whatever happened, the stream is synchronized before `host_x` can be written again.
        let synced = st.stream.synchronize().ctx(|| "forward pass".into());
        launched?;
        synced?;
        st.pos += tokens.len();
        Ok(())
    }

    /// Enqueues one pass at position `st.pos` (which it leaves as it is): its input rows, then
    /// its kernels (a captured graph for one token). Rows from the host come through the
    /// page-locked `host_x`, which must not be written again before the stream has passed the
    /// copy.
    fn enqueue_pass(&self, st: &mut CudaState, feed: Feed, head: Head, tail: Tail) -> Result<()> {
        let n = feed.len();
        let on_device = n == 1 && self.embeds_on_device();
        st.row_stale = false;
        match feed {
            // The row is looked up by the pass's first kernel.
            Feed::Tokens(&[id]) if on_device => st.set_key(id)?,
            Feed::Tokens(tokens) => {
                let dst = st.s("x");
                let x = st.host_x.as_mut_slice().ctx(|| "host embeddings".into())?;
                self.embed(tokens, x)?;
                self.gpu
                    .write(&st.stream, dst, &x[..n * self.dims.hidden])?;
            }
            // The previous pass's pick is where the first kernel looks.
            Feed::Picked if on_device => {}
            Feed::Picked => {
                return Err(CudaError::Unsupported(
                    "a pass fed by the device without its embedding table".into(),
                ))
            }
        }
        st.set_pos()?;
        let key = GraphKey {
            head,
            tail,
            tile: self.gpu.attn_tile_for(st.bytes.kv_cache, st.pos + 1, 1),
            device_embed: on_device,
            short_attn: self.short_attn(st, n),
        };
        if n == 1 && self.use_graphs {
            let i = match st.graphs.iter().position(|(k, _)| *k == key) {
                Some(i) => i,
                None => {
                    st.stream
                        .begin_capture(
                            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                        )
                        .ctx(|| "beginning graph capture".into())?;
                    let res = self.exec_pass(st, 1, &key);
                    let g = st
                        .stream
                        .end_capture(sys::CUgraphInstantiate_flags(0))
                        .ctx(|| "ending graph capture".into())?;
                    res?;
                    let g = g.ok_or_else(|| {
                        CudaError::Unsupported("graph capture produced no graph".into())
                    })?;
                    // One top-k graph at a time: its k and temperature are baked in, and a
                    // server's requests may each bring their own.
                    if matches!(tail, Tail::TopK { .. }) {
                        st.graphs
                            .retain(|(k, _)| !matches!(k.tail, Tail::TopK { .. }));
                    }
                    st.graphs.push((key, g));
                    st.graphs.len() - 1
                }
            };
            st.graphs[i]
                .1
                .launch()
                .ctx(|| "launching the decode graph".into())
        } else {
            self.exec_pass(st, n, &key)
        }
    }

    /// A pass's kernels: the row's lookup where the device embeds it, then the forward's.
    fn exec_pass(&self, st: &CudaState, n: usize, key: &GraphKey) -> Result<()> {
        if key.device_embed {
            self.embed_on_device(st)?;
        }
        self.exec_all(st, n, key.head, key.tail)
    }
}
