//! The qwen35 forward pass on the GPU: weights uploaded once (re-tiled and stacked by input),
//! per-sequence state and scratch, and one CUDA graph per decode step.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaGraph, CudaStream, PinnedHostSlice};
use gguf::Gguf;
use model::rank::Ranked;
use model::{LayerKind, Logits, Model, ModelError};
use quant::Format;

use crate::error::{Context, CudaError, Result};
use crate::gpu::{
    Arg, DevBuf, DevMat, DeviceInfo, FoldKind, FoldOut, GemvIo, Gpu, NormIn, Prefetch, RmsIn,
};
use crate::plan::{
    self, attn_splits, check_fits, forward_ops, Dims, Fusion, Head, KvCache, Mat, Norm, Op, Out,
    Scratch, StateBytes, MAX_CHUNK,
};
use crate::repack::{self, GpuFormat, Packed};
use crate::topk::{Selected, TopkJob, TopkScratch};

mod embed;
mod greedy;

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
    weight_bytes: usize,
    /// Capture decode steps as CUDA graphs (on by default).
    pub use_graphs: bool,
    /// The embedding table where one-token passes look their row up on the device.
    embed_table: Option<EmbedTable>,
    /// Look one-token passes' rows up on the device where the table allows (on by default;
    /// `NIWAKI_CUDA_DEVICE_EMBED=0` turns it off): the host embeds them otherwise.
    device_embed: AtomicBool,
    /// Greedy decoding launches each step before the host has read the previous step's pick
    /// (on by default with the device's embedding; `NIWAKI_CUDA_RUN_AHEAD=0` turns it off).
    run_ahead: AtomicBool,
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
        let mut weight_bytes = 0usize;
        let mut up = |parts: Vec<(String, Format, Packed)>| -> Result<DevMat> {
            let name = parts[0].0.clone();
            let p = repack::concat(parts)?;
            let free = gpu.free_bytes()?;
            check_fits(&format!("weights ({name})"), &[(&name, p.bytes())], free)?;
            let d = gpu.upload_packed(&p, &name)?;
            weight_bytes += d.bytes();
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
        let output = up(vec![packed(f, "output.weight")?])?;
        let output_norm = gpu.upload(&vector(f, "output_norm.weight")?, "norm")?;
        let embd = file
            .tensor("token_embd.weight")
            .ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
        let embd_format = embd.format();
        let embed_table = EmbedTable::upload(&gpu, &embd, &dims, m.hadamard())?;
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
            file,
            weight_bytes,
            use_graphs: true,
            embed_table,
            device_embed: AtomicBool::new(crate::gpu::env_on("NIWAKI_CUDA_DEVICE_EMBED")),
            run_ahead: AtomicBool::new(crate::gpu::env_on("NIWAKI_CUDA_RUN_AHEAD")),
            kv_cache: KvCache::F16,
            next_mat,
            hadamard: m.hadamard().cloned(),
            signs,
        })
    }

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

    /// Seconds NVRTC spent (0 if the kernels came from the on-disk cache).
    pub fn compile_secs(&self) -> f64 {
        self.gpu.compile_secs
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
        let layout = Scratch::new(&self.dims, MAX_CHUNK);
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
        let mut row = vec![0f32; self.dims.vocab];
        self.gpu.read(&st.stream, st.s("logits"), &mut row)?;
        Ok(row)
    }

    /// One GPU pass over at most `MAX_CHUNK` tokens, waited for.
    fn run(&self, st: &mut CudaState, tokens: &[u32], head: Head, tail: Tail) -> Result<()> {
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
        match feed {
            Feed::Tokens(tokens) if !on_device => {
                let dst = st.s("x");
                let x = st.host_x.as_mut_slice().ctx(|| "host embeddings".into())?;
                self.embed(tokens, x)?;
                self.gpu
                    .write(&st.stream, dst, &x[..n * self.dims.hidden])?;
            }
            // The row is looked up by the pass's first kernel.
            Feed::Tokens(&[id]) => st.set_key(id)?,
            Feed::Tokens(_) => unreachable!("only one-token passes embed on the device"),
            Feed::Picked => {
                if !on_device {
                    return Err(CudaError::Unsupported(
                        "a pass fed by the device without its embedding table".into(),
                    ));
                }
            }
        }
        st.set_u32(st.s("pos"), st.pos as u32)?;
        let key = GraphKey {
            head,
            tail,
            tile: self.gpu.attn_tile_for(st.bytes.kv_cache, st.pos + 1, 1),
            device_embed: on_device,
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

    /// Where a pass of `ntok` tokens spends its time: for each kind of op, the seconds one
    /// launch takes inside a CUDA graph of `reps` launches (cycling through the layers' ops of
    /// that kind, so that a matrix is not served from L2 by its own previous launch; median of
    /// 5 replays), with how often the op occurs per pass. Launched as `forward` would (PDL for
    /// one token only). The ops run on `st` as they are (its contents are meaningless
    /// afterwards).
    #[doc(hidden)]
    pub fn profile(
        &self,
        st: &mut CudaState,
        ntok: usize,
        reps: usize,
    ) -> Result<Vec<(String, usize, f64)>> {
        // The kernels read the position from the device: make it the one the host plans with.
        self.gpu
            .write(&st.stream, st.s("pos"), &[st.pos as u32, 0])?;
        let mut kinds: Vec<(String, Vec<Op>)> = Vec::new();
        let argmax = ntok == 1;
        for op in forward_ops(&self.dims, ntok, Head::Last, argmax, self.gpu.fusion()) {
            let name = match op {
                Op::Gemv { mat, .. } => format!("Gemv {}", mat.kind()),
                Op::NormGemv { mat, .. } => format!("NormGemv {}", mat.kind()),
                Op::GemvFold { mat, .. } => format!("GemvFold {}", mat.kind()),
                Op::GemvScaled { mat, .. } => format!("GemvScaled {}", mat.kind()),
                Op::GemvSwiglu { mat, .. } => format!("GemvSwiglu {}", mat.kind()),
                other => format!("{other:?}"),
            };
            let key: String = name
                .split(['(', '{'])
                .next()
                .unwrap_or_default()
                .trim()
                .to_string();
            match kinds.iter_mut().find(|k| k.0 == key) {
                Some(k) => k.1.push(op),
                None => kinds.push((key, vec![op])),
            }
        }
        let mut out = Vec::new();
        for (key, ops) in kinds {
            let secs = self.time_graph(st, || {
                let run = || (0..reps).try_for_each(|i| self.exec(st, &ops[i % ops.len()]));
                if ntok == 1 {
                    run()
                } else {
                    crate::gpu::serial_launches(run)
                }
            })?;
            out.push((key, ops.len(), secs / reps as f64));
        }
        st.stream.synchronize().ctx(|| "profile".into())?;
        Ok(out)
    }

    /// Seconds per replay of a one-token pass's graph (GPU argmax) holding only the ops `keep`
    /// accepts, median of 5: the results are meaningless, the time says where a token's time
    /// goes when ops run back to back as in decode (the GEMVs alone against the rest).
    #[doc(hidden)]
    pub fn time_decode_subset(
        &self,
        st: &mut CudaState,
        keep: &dyn Fn(&Op) -> bool,
    ) -> Result<f64> {
        self.gpu
            .write(&st.stream, st.s("pos"), &[st.pos as u32, 0])?;
        let ops: Vec<Op> = forward_ops(&self.dims, 1, Head::Last, true, self.gpu.fusion())
            .into_iter()
            .filter(|op| keep(op))
            .collect();
        let secs = self.time_graph(st, || ops.iter().try_for_each(|op| self.exec(st, op)))?;
        st.stream.synchronize().ctx(|| "decode subset".into())?;
        Ok(secs)
    }

    /// The words of the folded output norm's input that a one-token pass left (codes, group
    /// pairs, the pieces' sums of squares) and that its twin, `quant_rms` unscaled on the
    /// residual the pass ended with, writes differently; and the words compared. Meaningful
    /// right after a one-token pass with [`Fusion::fold`] on (the last residual GEMV then
    /// folds the output norm).
    #[doc(hidden)]
    pub fn fold_twin_differences(&self, st: &CudaState) -> Result<(usize, usize)> {
        let g = &*self.gpu;
        let e = self.dims.hidden;
        let names = ["fold_xq", "fold_xs", "fold_ss"];
        let bufs = names
            .iter()
            .map(|&n| g.alloc(st.layout.size(n), "fold twin"))
            .collect::<Result<Vec<_>>>()?;
        self.norm_quant(
            st,
            Norm::Output,
            0,
            1,
            false,
            (bufs[0].ptr, bufs[1].ptr, bufs[2].ptr),
        )?;
        let regions: Vec<(u64, u64, usize)> = names
            .iter()
            .zip(&bufs)
            .map(|(&name, b)| {
                // Only the pieces a row has carry sums.
                let n = match name {
                    "fold_ss" => 4 * e / 128,
                    _ => st.layout.size(name),
                };
                (st.s(name), b.ptr, n)
            })
            .collect();
        self.words_differing(st, &regions)
    }

    /// Of `(a, b, bytes)` regions of device memory, the 4-byte words where a and b differ, and
    /// the words compared.
    fn words_differing(
        &self,
        st: &CudaState,
        regions: &[(u64, u64, usize)],
    ) -> Result<(usize, usize)> {
        let (mut differing, mut words) = (0, 0);
        for &(a, b, n) in regions {
            let mut x = vec![0u32; n / 4];
            let mut y = vec![0u32; n / 4];
            self.gpu.read(&st.stream, a, &mut x)?;
            self.gpu.read(&st.stream, b, &mut y)?;
            differing += x.iter().zip(&y).filter(|(p, q)| p != q).count();
            words += x.len();
        }
        Ok((differing, words))
    }

    /// The words of the last layer's SwiGLU that a one-token pass left quantized (codes and
    /// group pairs) and that `quant_swiglu` on the projection the pass ended with writes
    /// differently; and the words compared. Meaningful right after a one-token pass with
    /// [`Fusion::swiglu`] on (the last gate | up GEMV then folds its SwiGLU, and nothing after
    /// the last down GEMV writes the activations or the projection).
    #[doc(hidden)]
    pub fn swiglu_twin_differences(&self, st: &CudaState) -> Result<(usize, usize)> {
        let g = &*self.gpu;
        let f = self.dims.ffn;
        let sizes = [("xq", f), ("xs", 8 * f / 64)];
        let twin = sizes
            .iter()
            .map(|&(_, n)| g.alloc(n, "swiglu twin"))
            .collect::<Result<Vec<_>>>()?;
        self.swiglu_quant(st, 1, (twin[0].ptr, twin[1].ptr))?;
        let regions: Vec<(u64, u64, usize)> = sizes
            .iter()
            .zip(&twin)
            .map(|(&(name, n), b)| (st.s(name), b.ptr, n))
            .collect();
        self.words_differing(st, &regions)
    }

    /// Where a decode step's time goes, from the kernels' timeline records: per kind of op,
    /// its launches and their mean run, the dependence's latency before each and how early
    /// its blocks were resident ([`crate::timeline`]), over the replays of the step's graph
    /// that [`CudaModel::time_decode_subset`] times. `None` where the kernels keep no records
    /// (`NIWAKI_CUDA_TRACE` unset). GEMVs are named by matrix, other ops by kernel.
    #[doc(hidden)]
    pub fn trace_decode(
        &self,
        st: &mut CudaState,
    ) -> Result<Option<Vec<crate::timeline::OpTimes>>> {
        if !self.gpu.tracing() {
            return Ok(None);
        }
        self.gpu.take_trace()?;
        self.time_decode_subset(st, &|_| true)?;
        let Some(records) = self.gpu.take_trace()? else {
            return Ok(None);
        };
        let mut gemvs = std::collections::HashMap::new();
        for op in forward_ops(&self.dims, 1, Head::Last, true, self.gpu.fusion()) {
            if let Op::Gemv { mat, .. }
            | Op::NormGemv { mat, .. }
            | Op::GemvFold { mat, .. }
            | Op::GemvScaled { mat, .. }
            | Op::GemvSwiglu { mat, .. } = op
            {
                gemvs.insert(self.mat(mat).scales.ptr, format!("Gemv {}", mat.kind()));
            }
        }
        let name = |k: crate::gpu::TraceKind, tag: u64| {
            gemvs.get(&tag).cloned().unwrap_or_else(|| format!("{k:?}"))
        };
        let launches = crate::timeline::launches(&records, name);
        Ok(Some(crate::timeline::summarize(&launches)))
    }

    /// The persistent-step probe (`kernels/gemv_chain.cu`) on a decode step's GEMVs, in the
    /// step's order, in tiles of [`plan::CHAIN_WARPS`] rows: seconds per replay of a graph launching
    /// the probe once per GEMV, and of one launching it once for all of them with a grid-wide
    /// barrier between GEMVs; the number of GEMVs; and how many logits of the last GEMV (the
    /// LM head, after the whole chain in one launch) differ in any bit from the decode GEMV's.
    /// `dot` false: the consumers release each tile without multiplying (no comparison: 0).
    /// 1-bit and 2-bit g64 weights only (else `None`). The outputs go where the step's would;
    /// the state's contents are meaningless afterwards.
    #[doc(hidden)]
    pub fn time_gemv_chain(
        &self,
        st: &mut CudaState,
        dot: bool,
    ) -> Result<Option<(f64, f64, usize, usize)>> {
        let fmt = match self.output.format {
            GpuFormat::Q1 => "q1",
            GpuFormat::Q2G64 => "q2g64",
            GpuFormat::Q2G128 => return Ok(None),
        };
        let kernel = format!("gemv_chain_{fmt}{}", if dot { "" } else { "_nodot" });
        let g = &self.gpu;
        // One descriptor per GEMV (kernels/gemv_chain.cu's ChainGemv: 5 pointers, 4 ints).
        let mut desc: Vec<u64> = Vec::new();
        let mut max_cols = 0;
        let mut max_tile = 0;
        for op in forward_ops(&self.dims, 1, Head::Last, true, Fusion::default()) {
            let Op::Gemv { mat, out, .. } = op else {
                continue;
            };
            let (m, io) = (self.mat(mat), self.gemv_io(st, mat, 1, out));
            if m.format != self.output.format {
                return Ok(None);
            }
            max_cols = max_cols.max(m.cols);
            max_tile = max_tile.max(plan::chain_tile_bytes(m.format, m.cols));
            desc.extend([m.codes.ptr, m.scales.ptr, io.xq, io.xs, io.out]);
            desc.push(m.rows as u64 | (m.cols as u64) << 32);
            desc.push(u64::from(io.accumulate));
        }
        let n = desc.len() / 7;
        let descs = g.upload(&desc, "chain descriptors")?;
        let count = g.alloc(8, "chain barrier")?;
        let x_bytes = plan::x_bytes(max_cols, false);
        let smem = g.smem_limit.saturating_sub(plan::GEMV1_STATIC_SMEM);
        let ring = smem.saturating_sub(x_bytes) / 128 * 128;
        let threads = 32 * (plan::CHAIN_WARPS + 1);
        if ring < max_tile || g.blocks_per_sm(&kernel, threads, smem)? < 1 {
            return Ok(None);
        }
        let grid = (g.info.multiprocessors.max(1) as u32, 1, 1);
        let launch = |first: usize, ng: usize| {
            g.launch_smem(
                &st.stream,
                &kernel,
                grid,
                (threads as u32, 1, 1),
                smem as u32,
                &[
                    Arg::Ptr(descs.ptr + 56 * first as u64),
                    Arg::I32(ng as i32),
                    Arg::I32(x_bytes as i32),
                    Arg::I32(ring as i32),
                    Arg::Ptr(count.ptr),
                ],
            )
        };
        let zero = || {
            g.launch(
                &st.stream,
                "fill_u64",
                (1, 1, 1),
                (64, 1, 1),
                &[Arg::Ptr(count.ptr), Arg::I32(1), Arg::U64(0)],
            )
        };
        let each = self.time_graph(st, || (0..n).try_for_each(|i| launch(i, 1)))?;
        let once = self.time_graph(st, || {
            zero()?;
            launch(0, n)
        })?;
        let mut differing = 0;
        if dot {
            let logits = |st: &CudaState| -> Result<Vec<u32>> {
                let mut v = vec![0u32; self.dims.vocab];
                g.read(&st.stream, st.s("logits"), &mut v)?;
                Ok(v)
            };
            zero()?;
            launch(0, n)?;
            let chained = logits(st)?;
            // Against the dp4a decode GEMV, whose arithmetic the probe's is.
            let (b1, b2) = (g.set_b1(false), g.set_b2(false));
            let plain = self.exec(
                st,
                &Op::Gemv {
                    mat: Mat::Output,
                    ntok: 1,
                    out: Out::Logits { argmax: false },
                },
            );
            g.set_b1(b1);
            g.set_b2(b2);
            plain?;
            differing = chained
                .iter()
                .zip(&logits(st)?)
                .filter(|(a, b)| a != b)
                .count();
        }
        st.stream.synchronize().ctx(|| "gemv chain".into())?;
        Ok(Some((each, once, n, differing)))
    }

    /// Median seconds of 5 replays of the graph `record` captures on the state's stream (after
    /// one warm-up replay).
    fn time_graph(&self, st: &CudaState, record: impl FnOnce() -> Result<()>) -> Result<f64> {
        st.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .ctx(|| "beginning graph capture".into())?;
        let res = record();
        let g = st
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .ctx(|| "ending graph capture".into())?;
        res?;
        let g = g.ok_or_else(|| CudaError::Unsupported("empty graph".into()))?;
        g.launch().ctx(|| "graph warm-up".into())?;
        self.gpu
            .time(&st.stream, 5, || g.launch().ctx(|| "graph launch".into()))
    }

    /// Sampling's selection after a pass's logits (stream-ordered launches: `Gpu::top_k_enqueue`).
    fn topk_tail(&self, st: &CudaState, k: usize, t: u32, floor: Option<u32>) -> Result<()> {
        let scratch = st.topk_scratch();
        let job = TopkJob {
            logits: st.s("logits"),
            n: self.dims.vocab,
            k,
            temperature: f32::from_bits(t),
        };
        self.gpu.top_k_enqueue(&st.stream, job, scratch)?;
        match floor {
            Some(f) => self
                .gpu
                .weight_sums_enqueue(&st.stream, job, f32::from_bits(f), scratch),
            None => Ok(()),
        }
    }

    fn exec_all(&self, st: &CudaState, n: usize, head: Head, tail: Tail) -> Result<()> {
        let argmax = tail == Tail::Argmax;
        let ops = forward_ops(&self.dims, n, head, argmax, self.gpu.fusion());
        let all = || {
            ops.iter().try_for_each(|op| self.exec(st, op))?;
            if let Tail::TopK { k, t, floor } = tail {
                self.topk_tail(st, k, t, floor)?;
            }
            Ok(())
        };
        if n == 1 {
            all()
        } else {
            crate::gpu::serial_launches(all)
        }
    }

    fn mat(&self, m: Mat) -> &DevMat {
        match m {
            Mat::Output => &self.output,
            Mat::FfnIn(l) => &self.layers[l].ffn_in,
            Mat::FfnDown(l) => &self.layers[l].ffn_down,
            Mat::GdnIn(l) | Mat::GdnOut(l) | Mat::GdnAb(l) => match &self.layers[l].mix {
                MixW::Gdn(g) => match m {
                    Mat::GdnIn(_) => &g.inp,
                    Mat::GdnAb(_) => g
                        .ab
                        .as_deref()
                        .expect("the plan splits alpha | beta only where they were uploaded apart"),
                    _ => &g.out,
                },
                MixW::Attn(_) => unreachable!("layer {l} is not recurrent"),
            },
            Mat::AttnIn(l) | Mat::AttnOut(l) => match &self.layers[l].mix {
                MixW::Attn(a) => {
                    if matches!(m, Mat::AttnIn(_)) {
                        &a.inp
                    } else {
                        &a.out
                    }
                }
                MixW::Gdn(_) => unreachable!("layer {l} is not attention"),
            },
        }
    }

    fn norm_weight(&self, norm: Norm) -> &DevBuf {
        match norm {
            Norm::Attn(l) => &self.layers[l].attn_norm,
            Norm::Post(l) => &self.layers[l].post_norm,
            Norm::Output => &self.output_norm,
        }
    }

    /// The device sign vector for rotating a `width`-wide activation when `rot`, else 0 (the
    /// kernels' "no rotation").
    fn signs_if(&self, rot: bool, width: usize) -> Result<u64> {
        if !rot {
            return Ok(0);
        }
        self.signs
            .iter()
            .find(|(w, _)| *w == width)
            .map(|(_, b)| b.ptr)
            .ok_or_else(|| {
                CudaError::Unsupported(format!("no Hadamard sign vector of width {width}"))
            })
    }

    /// RMS norm and quantization of residual rows `tok0..tok0 + ntok` into `(xq, xs)`, rotated
    /// with `rot`; with a third address, one token left unscaled with its pieces' sums of
    /// squares there (the twin of a folded norm, kernels/quant.cu).
    fn norm_quant(
        &self,
        st: &CudaState,
        norm: Norm,
        tok0: usize,
        ntok: usize,
        rot: bool,
        (xq, xs, piece_ss): (u64, u64, u64),
    ) -> Result<()> {
        let (g, d) = (&*self.gpu, &self.dims);
        let e = d.hidden;
        let xh = g.wants_f16_acts(ntok).then(|| st.s("xh"));
        g.launch(
            &st.stream,
            "quant_rms",
            // A block per 1024 values for one token (latency), one per token for many.
            (
                if ntok == 1 {
                    e.div_ceil(1024) as u32
                } else {
                    1
                },
                ntok as u32,
                1,
            ),
            (256, 1, 1),
            &[
                Arg::Ptr(st.s("x")),
                Arg::I32(e as i32),
                Arg::I32(tok0 as i32),
                Arg::Ptr(self.norm_weight(norm).ptr),
                Arg::F32(d.rms_eps),
                Arg::Ptr(xq),
                Arg::Ptr(xs),
                Arg::Ptr(if piece_ss == 0 { xh.unwrap_or(0) } else { 0 }),
                Arg::Ptr(self.signs_if(rot, e)?),
                Arg::Ptr(piece_ss),
            ],
        )
    }

    /// Where the residual GEMV of `mat` leaves the folded `norm`'s input.
    fn fold_out(&self, st: &CudaState, mat: Mat, norm: Norm) -> Result<FoldOut> {
        let slot = plan::fold_slot(mat).ok_or_else(|| {
            CudaError::Unsupported(format!("no folded norm after {}", mat.kind()))
        })?;
        Ok(FoldOut {
            counters: st.s("fold_cnt") + (4 * plan::FOLD_MAX_PIECES * slot) as u64,
            xq: st.s("fold_xq"),
            xs: st.s("fold_xs"),
            kind: FoldKind::Norm {
                weight: self.norm_weight(norm).ptr,
                piece_ss: st.s("fold_ss"),
            },
        })
    }

    /// Where the gate | up GEMV `mat` leaves its folded SwiGLU: the activations ffn_down reads,
    /// with its layer's counters.
    fn swiglu_fold_out(&self, st: &CudaState, mat: Mat) -> Result<FoldOut> {
        let Mat::FfnIn(l) = mat else {
            return Err(CudaError::Unsupported(format!(
                "a folded SwiGLU after {}",
                mat.kind()
            )));
        };
        let ffn = self.dims.ffn;
        Ok(FoldOut {
            counters: st.s("swiglu_cnt") + (4 * (ffn / 128) * l) as u64,
            xq: st.s("xq"),
            xs: st.s("xs"),
            kind: FoldKind::Swiglu { ffn },
        })
    }

    /// The one-token GEMV of `mat` after a folded `norm`: the decode kernel on the fold's
    /// input, its outputs scaled, or where no decode kernel takes the matrix, the norm apart
    /// from the residual (which the fold left intact) and the GEMV.
    fn gemv_scaled(&self, st: &CudaState, mat: Mat, norm: Norm, out: Out) -> Result<()> {
        let (g, s, m) = (&*self.gpu, &*st.stream, self.mat(mat));
        if g.gemv_decode(s, m, &self.scaled_io(st, mat, out), None)? {
            return Ok(());
        }
        self.norm_quant(st, norm, 0, 1, false, (st.s("xq"), st.s("xs"), 0))?;
        g.gemv(s, m, &self.gemv_io(st, mat, 1, out))
    }

    /// A one-token GEMV of `mat` reading the input a folded norm left (unscaled, in the fold's
    /// buffers), its outputs times the norm's 1/rms.
    fn scaled_io(&self, st: &CudaState, mat: Mat, out: Out) -> GemvIo {
        GemvIo {
            xq: st.s("fold_xq"),
            xs: st.s("fold_xs"),
            rms_in: Some(RmsIn {
                piece_ss: st.s("fold_ss"),
                eps: self.dims.rms_eps,
            }),
            ..self.gemv_io(st, mat, 1, out)
        }
    }

    /// A GEMV of `ntok` tokens from the scratch activations to `out`.
    fn gemv_io(&self, st: &CudaState, mat: Mat, ntok: usize, out: Out) -> GemvIo {
        let m = self.mat(mat);
        let (out, out_stride, accumulate, argmax) = match out {
            // α | β uploaded apart go to their rows of the stacked projection.
            Out::Proj if matches!(mat, Mat::GdnAb(_)) => {
                let d = &self.dims;
                let at = d.gdn_in_rows() - 2 * d.value_heads;
                (st.s("proj") + 4 * at as u64, d.gdn_in_rows(), false, None)
            }
            Out::Proj if matches!(mat, Mat::GdnIn(_)) => {
                (st.s("proj"), self.dims.gdn_in_rows(), false, None)
            }
            Out::Proj => (st.s("proj"), m.rows, false, None),
            Out::Residual => (st.s("x"), self.dims.hidden, true, None),
            Out::Logits { argmax } => (
                st.s("logits"),
                self.dims.vocab,
                false,
                argmax.then(|| st.s("argmax")),
            ),
        };
        GemvIo {
            xq: st.s("xq"),
            xs: st.s("xs"),
            xh: self.gpu.wants_f16_acts(ntok).then(|| st.s("xh")),
            ntok,
            out,
            out_stride,
            accumulate,
            argmax,
            split_scratch: Some((st.s("gemm_part"), st.layout.size("gemm_part") / 4)),
            prefetch: match self.next_mat.iter().find(|p| p.0 == mat) {
                Some(&(_, next)) if ntok == 1 => {
                    let next = self.mat(next);
                    Prefetch::of(next, self.gpu.prefetch_for(next))
                }
                _ => None,
            },
            rms_in: None,
            fold: None,
        }
    }

    /// What the recurrence's kernels read of a layer: the conv output, the projection (its row
    /// stride and where the gate inputs α and β start), the decay parameters.
    fn gdn_inputs(&self, st: &CudaState, l: usize) -> [Arg; 7] {
        let d = &self.dims;
        let w = self.gdn(l);
        let (ch, vd) = (d.conv_channels(), d.gdn_inner());
        [
            Arg::Ptr(st.s("conv")),
            Arg::Ptr(st.s("proj")),
            Arg::I32(d.gdn_in_rows() as i32),
            Arg::I32((ch + vd) as i32),
            Arg::I32((ch + vd + d.value_heads) as i32),
            Arg::Ptr(w.a.ptr),
            Arg::Ptr(w.dt_bias.ptr),
        ]
    }

    fn gdn(&self, l: usize) -> &GdnW {
        match &self.layers[l].mix {
            MixW::Gdn(g) => g,
            MixW::Attn(_) => unreachable!("layer {l} is not recurrent"),
        }
    }

    fn attn(&self, l: usize) -> &AttnW {
        match &self.layers[l].mix {
            MixW::Attn(a) => a,
            MixW::Gdn(_) => unreachable!("layer {l} is not attention"),
        }
    }

    /// Device address of a recurrent layer's conv / ssm state and an attention layer's K / V.
    fn conv_state(&self, st: &CudaState, l: usize) -> u64 {
        let d = &self.dims;
        st.state.at(d.kind_index(l) * StateBytes::conv_per_layer(d))
    }
    fn ssm_state(&self, st: &CudaState, l: usize) -> u64 {
        let d = &self.dims;
        st.state
            .at(st.bytes.conv + d.kind_index(l) * StateBytes::ssm_per_layer(d))
    }
    /// Layer `l`'s K values, V values, K scales and V scales (the scales of a q8_0 cache).
    fn kv(&self, st: &CudaState, l: usize) -> [Arg; 4] {
        let d = &self.dims;
        let at = st.bytes.kv_layer(d.kind_index(l), d.n_attention());
        let q8 = st.bytes.kv_cache == KvCache::Q8_0;
        [
            Arg::Ptr(st.state.at(at[0])),
            Arg::Ptr(st.state.at(at[1])),
            Arg::Ptr(if q8 { st.state.at(at[2]) } else { 0 }),
            Arg::Ptr(if q8 { st.state.at(at[3]) } else { 0 }),
        ]
    }

    /// The attention-split launch of a pass of `ntok` tokens and its split count (the merge must
    /// use the same).
    fn attn_split_plan(&self, st: &CudaState, ntok: usize) -> (plan::AttnLaunch, usize) {
        let kv = st.bytes.kv_cache;
        let tile = self.gpu.attn_tile_for(kv, st.pos + ntok, ntok);
        let (a, decode) = self.gpu.attn_launch(&self.dims, kv, tile);
        (a, attn_splits(st.pos + ntok, ntok, decode))
    }

    /// An attention kernel's name for the state's cache type.
    fn kv_kernel(st: &CudaState, f16: &'static str, q8: &'static str) -> &'static str {
        match st.bytes.kv_cache {
            KvCache::F16 => f16,
            KvCache::Q8_0 => q8,
        }
    }

    /// silu(gate)·up of `ntok` tokens of the projection, quantized into `(xq, xs)` (and the
    /// f16 activations where the pass's GEMMs read them).
    fn swiglu_quant(&self, st: &CudaState, ntok: usize, (xq, xs): (u64, u64)) -> Result<()> {
        let (g, d) = (&*self.gpu, &self.dims);
        let xh = g.wants_f16_acts(ntok).then(|| st.s("xh"));
        g.launch(
            &st.stream,
            "quant_swiglu",
            (d.ffn.div_ceil(1024) as u32, ntok as u32, 1),
            (256, 1, 1),
            &[
                Arg::Ptr(st.s("proj")),
                Arg::I32(d.ffn_in_rows() as i32),
                Arg::I32(d.ffn as i32),
                Arg::Ptr(xq),
                Arg::Ptr(xs),
                Arg::Ptr(xh.unwrap_or(0)),
                Arg::Ptr(self.signs_if(d.rotation.ffn_down, d.ffn)?),
            ],
        )
    }

    fn exec(&self, st: &CudaState, op: &Op) -> Result<()> {
        let g = &*self.gpu;
        let s = &*st.stream;
        let d = &self.dims;
        let (xq, xs) = (st.s("xq"), st.s("xs"));
        // The quantizations of a pass whose GEMMs read f16 activations also write those.
        let xh = |ntok: usize| g.wants_f16_acts(ntok).then(|| st.s("xh"));
        let (proj, pos) = (st.s("proj"), st.s("pos"));
        match *op {
            Op::NormQuant {
                norm,
                tok0,
                ntok,
                rot,
            } => self.norm_quant(st, norm, tok0, ntok, rot, (xq, xs, 0)),
            Op::GemvFold { mat, norm } => {
                let m = self.mat(mat);
                let mut io = self.gemv_io(st, mat, 1, Out::Residual);
                io.fold = Some(self.fold_out(st, mat, norm)?);
                if g.gemv_decode(s, m, &io, None)? {
                    return Ok(());
                }
                // No decode kernel takes the matrix: the GEMV, then the fold's twin.
                io.fold = None;
                g.gemv(s, m, &io)?;
                let out = (st.s("fold_xq"), st.s("fold_xs"), st.s("fold_ss"));
                self.norm_quant(st, norm, 0, 1, false, out)
            }
            Op::GemvScaled { mat, norm, out } => self.gemv_scaled(st, mat, norm, out),
            Op::GemvSwiglu { mat, norm } => {
                let io = GemvIo {
                    fold: Some(self.swiglu_fold_out(st, mat)?),
                    ..self.scaled_io(st, mat, Out::Proj)
                };
                if g.gemv_decode(s, self.mat(mat), &io, None)? {
                    return Ok(());
                }
                // No decode kernel takes the matrix: the scaled GEMV's path, then the SwiGLU
                // apart.
                self.gemv_scaled(st, mat, norm, Out::Proj)?;
                self.swiglu_quant(st, 1, (xq, xs))
            }
            Op::Gemv { mat, ntok, out } => {
                let m = self.mat(mat);
                g.gemv(s, m, &self.gemv_io(st, mat, ntok, out))
            }
            Op::NormGemv {
                norm,
                tok0,
                mat,
                out,
            } => {
                let m = self.mat(mat);
                let io = self.gemv_io(st, mat, 1, out);
                let pre = NormIn {
                    x: st.s("x"),
                    tok0,
                    weight: self.norm_weight(norm).ptr,
                    eps: d.rms_eps,
                };
                // A GEMV that adds into the residual must not also read it.
                if out != Out::Residual && g.gemv_decode(s, m, &io, Some(pre))? {
                    return Ok(());
                }
                self.norm_quant(st, norm, tok0, 1, false, (xq, xs, 0))?;
                g.gemv(s, m, &io)
            }
            Op::Conv { layer, ntok } => {
                let ch = d.conv_channels();
                g.launch(
                    s,
                    "gdn_conv",
                    (ch.div_ceil(32) as u32, 1, 1),
                    // Up to 8 tokens at once per channel; a decode step's one token needs one row.
                    (32, ntok.min(8) as u32, 1),
                    &[
                        Arg::Ptr(proj),
                        Arg::I32(d.gdn_in_rows() as i32),
                        Arg::I32(ntok as i32),
                        Arg::Ptr(pos),
                        Arg::Ptr(self.conv_state(st, layer)),
                        Arg::Ptr(self.gdn(layer).conv.ptr),
                        Arg::Ptr(st.s("conv")),
                    ],
                )
            }
            Op::GdnPrep { layer, ntok } => {
                let [conv, proj, stride, aoff, boff, a, dt_bias] = self.gdn_inputs(st, layer);
                g.launch(
                    s,
                    "gdn_prep",
                    (d.key_heads as u32, ntok as u32, 1),
                    (32, 2, 1),
                    &[
                        conv,
                        proj,
                        stride,
                        aoff,
                        boff,
                        a,
                        dt_bias,
                        Arg::Ptr(st.s("gdn_qk")),
                        Arg::Ptr(st.s("gdn_gb")),
                    ],
                )
            }
            Op::GdnStep { layer, ntok } if g.gdn_chunked(ntok) => {
                let [conv, proj, stride, aoff, _, a, dt_bias] = self.gdn_inputs(st, layer);
                let chunks = ntok.div_ceil(plan::GDN_CHUNK);
                g.launch_smem(
                    s,
                    "gdn_chunk_prep",
                    (d.value_heads as u32, chunks as u32, 1),
                    (256, 1, 1),
                    plan::gdn_prep_smem(d) as u32,
                    &[
                        conv,
                        proj,
                        stride,
                        aoff,
                        a,
                        dt_bias,
                        Arg::Ptr(st.s("gdn_qk")),
                        Arg::Ptr(st.s("gdn_gb")),
                        Arg::I32(ntok as i32),
                        Arg::Ptr(st.s("gdn_chunks")),
                    ],
                )?;
                g.launch(
                    s,
                    "gdn_chunk_scan",
                    (d.value_heads as u32, (d.value_dim / 32) as u32, 1),
                    (256, 1, 1),
                    &[
                        Arg::Ptr(st.s("gdn_chunks")),
                        Arg::I32(chunks as i32),
                        Arg::Ptr(st.s("gdn_qk")),
                        Arg::I32(ntok as i32),
                        Arg::Ptr(pos),
                        Arg::Ptr(self.ssm_state(st, layer)),
                        Arg::Ptr(st.s("gdn")),
                    ],
                )
            }
            Op::GdnStep { layer, ntok } => {
                let [conv, proj, stride, aoff, boff, a, dt_bias] = self.gdn_inputs(st, layer);
                let prepped = crate::plan::gdn_prepped(ntok);
                let rows = g.gdn_rows_for(ntok);
                g.launch(
                    s,
                    plan::gdn_step_kernel(rows),
                    plan::gdn_step_grid(d, rows),
                    (32, 4, 1),
                    &[
                        conv,
                        proj,
                        stride,
                        aoff,
                        boff,
                        Arg::I32(ntok as i32),
                        a,
                        dt_bias,
                        Arg::Ptr(if prepped { st.s("gdn_qk") } else { 0 }),
                        Arg::Ptr(if prepped { st.s("gdn_gb") } else { 0 }),
                        Arg::Ptr(pos),
                        Arg::Ptr(self.ssm_state(st, layer)),
                        Arg::Ptr(st.s("gdn")),
                    ],
                )
            }
            Op::GdnDecode { layer } => {
                let [_, proj, _, aoff, boff, a, dt_bias] = self.gdn_inputs(st, layer);
                g.launch(
                    s,
                    "gdn_decode",
                    (d.value_heads as u32, 1, 1),
                    (32, 16, 1),
                    &[
                        proj,
                        aoff,
                        boff,
                        Arg::I32(d.conv_channels() as i32),
                        Arg::Ptr(pos),
                        Arg::Ptr(self.conv_state(st, layer)),
                        Arg::Ptr(self.gdn(layer).conv.ptr),
                        a,
                        dt_bias,
                        Arg::Ptr(self.ssm_state(st, layer)),
                        Arg::Ptr(self.gdn(layer).norm.ptr),
                        Arg::F32(d.rms_eps),
                        Arg::Ptr(xq),
                        Arg::Ptr(xs),
                        Arg::Ptr(xh(1).unwrap_or(0)),
                    ],
                )
            }
            Op::GatedQuant { layer, ntok } => g.launch(
                s,
                "quant_gated",
                (d.value_heads.div_ceil(8) as u32, ntok as u32, 1),
                (256, 1, 1),
                &[
                    Arg::Ptr(st.s("gdn")),
                    Arg::Ptr(proj),
                    Arg::I32(d.gdn_in_rows() as i32),
                    Arg::I32(d.conv_channels() as i32),
                    Arg::Ptr(self.gdn(layer).norm.ptr),
                    Arg::F32(d.rms_eps),
                    Arg::Ptr(xq),
                    Arg::Ptr(xs),
                    Arg::Ptr(xh(ntok).unwrap_or(0)),
                    Arg::Ptr(self.signs_if(d.rotation.gdn_out, d.gdn_inner())?),
                    Arg::I32(i32::from(d.rotation.gdn_out && d.rotation.gdn_v_grouped)),
                ],
            ),
            Op::AttnPrep { layer, ntok } => {
                let w = self.attn(layer);
                let kv = self.kv(st, layer);
                g.launch(
                    s,
                    Self::kv_kernel(st, "attn_prep", "attn_prep_q8"),
                    ((d.n_head + d.n_head_kv) as u32, ntok as u32, 1),
                    (d.head_dim as u32, 1, 1),
                    &[
                        &[
                            Arg::Ptr(proj),
                            Arg::I32(d.attn_in_rows() as i32),
                            Arg::Ptr(pos),
                            Arg::Ptr(w.q_norm.ptr),
                            Arg::Ptr(w.k_norm.ptr),
                            Arg::F32(d.rms_eps),
                            Arg::F32(d.rope_base),
                            Arg::Ptr(st.s("q")),
                        ][..],
                        &kv,
                    ]
                    .concat(),
                )
            }
            Op::AttnSplit { layer, ntok } => {
                let [k, v, ks, vs] = self.kv(st, layer);
                let (a, nsplit) = self.attn_split_plan(st, ntok);
                g.launch_smem(
                    s,
                    a.kernel,
                    (d.n_head_kv as u32, nsplit as u32, ntok as u32),
                    (a.threads as u32, 1, 1),
                    a.smem_bytes as u32,
                    &[
                        Arg::Ptr(st.s("q")),
                        k,
                        v,
                        ks,
                        vs,
                        Arg::Ptr(pos),
                        Arg::F32(1.0 / (d.head_dim as f32).sqrt()),
                        Arg::I32(nsplit as i32),
                        Arg::Ptr(st.s("part")),
                    ],
                )
            }
            Op::AttnCombine { ntok, .. } => {
                // One-token passes: small blocks over all splits (up to 128 at depth);
                // multi-token passes: a block per row (the same bits, far fewer blocks).
                let (kernel, grid, block) = if ntok == 1 {
                    let z = (d.head_dim / 32) as u32;
                    ("attn_combine", (d.n_head as u32, 1, z), (256, 1, 1))
                } else {
                    let grid = (d.n_head as u32, ntok as u32, 1);
                    ("attn_combine_rows", grid, (d.head_dim as u32, 1, 1))
                };
                g.launch(
                    s,
                    kernel,
                    grid,
                    block,
                    &[
                        Arg::Ptr(st.s("part")),
                        Arg::I32(self.attn_split_plan(st, ntok).1 as i32),
                        Arg::Ptr(pos),
                        Arg::Ptr(proj),
                        Arg::I32(d.attn_in_rows() as i32),
                        Arg::Ptr(st.s("attn")),
                    ],
                )
            }
            Op::AttnCombineQuant { .. } => g.launch(
                s,
                "attn_combine_quant",
                (d.n_head as u32, 1, (d.head_dim / 128) as u32),
                (256, 1, 1),
                &[
                    Arg::Ptr(st.s("part")),
                    Arg::I32(self.attn_split_plan(st, 1).1 as i32),
                    Arg::Ptr(pos),
                    Arg::Ptr(proj),
                    Arg::I32(d.attn_in_rows() as i32),
                    Arg::Ptr(st.s("attn")),
                    Arg::Ptr(xq),
                    Arg::Ptr(xs),
                ],
            ),
            Op::PlainQuant { ntok } => {
                let w = d.n_head * d.head_dim;
                let signs = self.signs_if(d.rotation.attn_out, w)?;
                g.quantize_rotated(
                    s,
                    st.s("attn"),
                    w,
                    ntok,
                    xq,
                    xs,
                    xh(ntok),
                    (signs != 0).then_some(signs),
                )
            }
            Op::SwigluQuant { ntok } => self.swiglu_quant(st, ntok, (xq, xs)),
            Op::ResetArgmax { ntok } => g.launch(
                s,
                "fill_u64",
                (1, 1, 1),
                (64, 1, 1),
                &[Arg::Ptr(st.s("argmax")), Arg::I32(ntok as i32), Arg::U64(0)],
            ),
        }
    }
}
