//! The device: context, compiled kernels, buffers and raw launches. Pointers are passed to the
//! kernels as plain 64-bit device addresses so that a whole token can be captured as one graph.
//! Here the state a [`Gpu`] holds; beside it, one file a part of what it does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};

use crate::plan;

mod bandwidth;
mod decode_gemv;
mod device;
mod io;
mod launch;
mod matmul;
mod memory;
mod modules;
mod open;
mod quantize;
mod settings;
mod tile_image;
mod trace;

pub use device::{available, DeviceInfo};
pub use io::{FoldKind, FoldOut, GemvIo, NormIn, Prefetch, RmsIn};
pub use launch::{planes_twin, serial_launches, Arg};
pub use memory::{DevBuf, DevMat};
pub use settings::ATTN_TILE_BY_CACHE;
pub use tile_image::ImageUse;
pub(crate) use tile_image::TileImage;
pub(crate) use trace::capacity_from_env as trace_capacity_from_env;
pub use trace::{TraceKind, TraceRecord, TRACE_MARKS};

/// The context, the main stream and the compiled kernels.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    /// The program's parts, loaded (one where the kernels keep timeline records).
    modules: Vec<Arc<CudaModule>>,
    /// Timeline records the kernels hold (0: compiled without them; `gpu/trace.rs`).
    trace_capacity: usize,
    funcs: HashMap<&'static str, CudaFunction>,
    pub info: DeviceInfo,
    /// Seconds NVRTC took (0 when the PTX came from the cache).
    pub compile_secs: f64,
    pub from_cache: bool,
    /// Seconds the driver took to load the program's parts (its JIT of the PTX to the device's
    /// code, unless its own cache has it or the part came as device code).
    pub load_secs: f64,
    /// The program's parts loaded from NVRTC's device code rather than PTX
    /// (`NIWAKI_CUDA_CUBIN`, [`crate::compile::LOAD_CUBIN`]).
    pub device_code_parts: usize,
    /// Launch kernels with programmatic stream serialization (sm_90 and later; the kernels wait
    /// for their predecessor with `griddepcontrol.wait`). `NIWAKI_CUDA_PDL=0` turns it off.
    pdl: AtomicBool,
    /// Use the bulk-copy decode GEMV (sm_90 and later). `NIWAKI_CUDA_GEMV1=0` turns it off.
    gemv1: AtomicBool,
    /// The decode GEMV's consumers release each tile without multiplying (wrong results: a
    /// probe for the harness, [`Gpu::set_gemv1_probe`]).
    gemv1_nodot: AtomicBool,
    /// Where the dp4a decode GEMV's activations are staged by one tensor-map copy into the
    /// swizzled layout rather than piece-major by every thread: [`plan::prefers_x_copy`]
    /// (`NIWAKI_CUDA_X_COPY=0`: nowhere; `=all`: wherever the row allows, for measuring).
    x_copy: AtomicUsize,
    /// Launches of the swizzled (`_x`) decode GEMVs so far, for the harness to see them run.
    x_copy_launches: AtomicUsize,
    /// Launches of the 2-bit binary decode GEMVs from tile images (`gemv_b2*_i`).
    image_launches: AtomicUsize,
    /// Decode GEMVs launched with a folded norm (for checking that a path ran).
    fold_launches: AtomicUsize,
    /// Decode GEMVs launched with a folded SwiGLU.
    swiglu_launches: AtomicUsize,
    /// Decode GEMVs launched with the norm's fold gathered in a cluster.
    cluster_fold_launches: AtomicUsize,
    /// The kernels one-token passes leave out (`NIWAKI_CUDA_SKIP`, a measurement only).
    skip: Option<plan::Skip>,
    /// Decode GEMVs launched on their activations' plane words.
    planes_launches: AtomicUsize,
    /// One-kernel short attentions launched.
    attn_short_launches: AtomicUsize,
    /// 1-bit decode GEMVs on the binary tensor cores (`gemv_b1_*`) rather than dp4a, for the
    /// matrices [`plan::prefers_b1`] gives them (sm_90; `NIWAKI_CUDA_B1=0` turns them off).
    b1: AtomicBool,
    /// 2-bit decode GEMVs on the binary tensor cores too (`gemv_b2*`), for the matrices whose
    /// shape their plan takes (sm_90; `NIWAKI_CUDA_B2=0` turns them off). Measured on the H200
    /// against dp4a, `niwaki bench --device cuda -p 8 -n 128 -r 3` (host logits) alternated in
    /// two calls: Q2_0 274.0 / 267.5 / 277.0 / 271.8 against 267.7 / 270.5 / 265.6 / 269.5
    /// tok/s (+1.6% on average), PQ2_0 282.1 / 279.3 against 275.7 / 273.2 (+2.2%).
    b2: AtomicBool,
    /// Blocks per multiprocessor and shared-memory budget of the binary decode GEMV in place of
    /// its defaults (`NIWAKI_CUDA_B1_BLOCKS`, `NIWAKI_CUDA_B1_SMEM_KIB`; 0: default), for
    /// measuring them; the budget is still lowered to what that many blocks can hold.
    b1_knobs: (usize, usize),
    /// Rows per tile the binary decode GEMV asks for: 32 ([`plan::B1_TILE_ROWS`]), or 16 with
    /// `NIWAKI_CUDA_B1_TILE_ROWS=16` ([`plan::gemv_b1_launch`] says where 32 is taken).
    b1_tile_rows: AtomicUsize,
    /// The widest 1-bit rows' binary decode GEMV stages its activations in shared memory by
    /// bulk copies ([`plan::x_staged`]; `NIWAKI_CUDA_B1_X_STAGE`, default
    /// [`plan::B1_X_STAGE`]).
    b1_x_stage: AtomicBool,
    /// The 2-bit binary decode GEMVs copy each tile from an image of their stage's layout, one
    /// bulk copy a tile (`gpu/tile_image.rs`; `NIWAKI_CUDA_B1_IMAGE=0` turns it off): an
    /// [`ImageUse`].
    image_use: AtomicU8,
    /// How many of a decode GEMV's first tiles are requested before its wait for the previous
    /// kernel (`NIWAKI_CUDA_EARLY_TILES`; default [`plan::EARLY_TILES`]).
    early_tiles: AtomicUsize,
    /// Tiles per multiprocessor from which a 1-bit matrix takes the binary kernel
    /// (`NIWAKI_CUDA_B1_MIN_TILES`; default [`plan::B1_MIN_TILES_PER_SM`]).
    b1_min_tiles: usize,
    /// Multiply passes of [`Gpu::gemm_min_tokens`] tokens or more on the tensor cores (sm_80
    /// and later). `NIWAKI_CUDA_MMA=0` turns it off.
    mma: AtomicBool,
    /// The longest pass launched with PDL (`NIWAKI_CUDA_PDL_TOKENS`, at least 1: a one-token
    /// pass always is; default [`plan::PDL_TOKENS`]); longer passes launch plainly
    /// stream-ordered.
    pdl_tokens: AtomicUsize,
    /// The fewest tokens a pass multiplies on the tensor cores (`NIWAKI_CUDA_GEMM_MIN_TOKENS`;
    /// else [`plan::GEMM_MIN_TOKENS`] until a model sets its format's [`plan::short_passes`]);
    /// shorter passes take the dp4a kernels.
    gemm_min_tokens: AtomicUsize,
    /// Whether `NIWAKI_CUDA_GEMM_MIN_TOKENS` set [`Gpu::gemm_min_tokens`], which a model's
    /// format then leaves as it is.
    gemm_min_tokens_switched: bool,
    /// Whether the f16 GEMM takes narrower tiles for short passes (`NIWAKI_CUDA_HGEMM_NARROW`;
    /// default [`plan::HGEMM_NARROW`]).
    hgemm_narrow: AtomicBool,
    /// Whether the f16 GEMM of a pass launched with programmatic dependent launch takes
    /// [`plan::SHORT_PASS_SPLITS`] K splits where they fit (`NIWAKI_CUDA_SHORT_PASS_SPLITS`;
    /// default [`plan::SHORT_PASS_SPLITS_ON`]).
    short_pass_splits: bool,
    /// The GEMM kernel set by [`Gpu::set_gemm_kernel`] (none: each matrix gets
    /// [`plan::GemmKernel::preferred`]).
    gemm_kernel: Mutex<Option<plan::GemmKernel>>,
    /// Run the recurrence of passes of [`plan::GDN_CHUNK_MIN_TOKENS`] tokens or more in chunks
    /// (`NIWAKI_CUDA_GDN_CHUNK=1`; off by default: in f32 on the CUDA cores it measured twice
    /// as slow as token by token on the H200, 303 against 156 µs per layer for 256 tokens).
    gdn_chunked: AtomicBool,
    /// Whether `gdn_chunk_prep`'s shared memory fits this device.
    gdn_chunks_fit: bool,
    /// Key rows per lane of the recurrent step in multi-token passes (one of
    /// [`plan::GDN_STEP_ROWS`]; `NIWAKI_CUDA_GDN_ROWS` sets it).
    gdn_rows: AtomicUsize,
    /// Warps of a decode step's `quant_swiglu` block where nothing is rotated (one of
    /// [`plan::SWIGLU_WARPS`]; [`plan::SWIGLU_DECODE_WARPS`] unless `NIWAKI_CUDA_SWIGLU_WARPS`
    /// sets it).
    swiglu_warps: usize,
    /// Which decode GEMVs norm their input themselves ([`plan::NormFusion`]; none by default,
    /// `NIWAKI_CUDA_FUSE_NORM=binary` or `=1`). Into the dp4a kernels it measured 1-8% slower
    /// decode on the H200 (their every block norms and stages the whole row before its first
    /// tile), into the binary ones 2-3%.
    norm_fusion: Mutex<plan::NormFusion>,
    /// A decode step's conv, recurrent step and gated norm in one kernel per layer
    /// (`gdn_decode`; on by default, `NIWAKI_CUDA_FUSE_GDN=0` runs the three kernels: the same
    /// bits, 5.9 against 4.4 µs per layer on the H200).
    fuse_gdn: AtomicBool,
    /// A decode step's attention merge and its output's quantization in one kernel
    /// (`attn_combine_quant`; on by default, `NIWAKI_CUDA_FUSE_ATTN=0` runs the two: the same
    /// bits).
    fuse_attn: AtomicBool,
    /// Each norm after a decode step's residual GEMV folded into that GEMV's last writes
    /// (`fold_arrive`, kernels/quant.cu), the GEMV after it scaling its outputs: 128 of a 27B
    /// token's 129 norm launches gone. On by default (`NIWAKI_CUDA_FOLD_NORM=0` runs the norms
    /// apart): on the H200, 27B decode (`niwaki bench --device cuda -p 8 -n 128 -r 3`, medians,
    /// four rounds alternated) Q1_0 351.5 / 360.7 / 366.4 / 350.6 → 376.9 / 381.5 / 368.9 /
    /// 374.3 tok/s, Q2_0 266.0 / 268.7 / 269.7 → 273.0 / 275.5 / 273.0 / 276.3.
    fold_norm: AtomicBool,
    /// With the norms folded, each SwiGLU of a decode step folded into the gate | up GEMV's
    /// last writes (`fold_arrive`), whose pieces of gate and up count on one counter: the same
    /// bits as `quant_swiglu`, 64 of a 27B token's launches gone. Opt-in
    /// (`NIWAKI_CUDA_FOLD_SWIGLU=1`), being slower: on the H200, 27B decode (`niwaki bench
    /// --device cuda -p 8 -n 128 -r 3`, medians, four rounds alternated) Q2_0 267.7 / 267.7 /
    /// 274.3 / 260.8 tok/s apart against 255.7 / 252.1 / 255.5 / 248.1 folded, Q1_0 360.5 /
    /// 357.6 / 367.4 / 363.4 against 336.4 / 328.0 / 327.4 / 329.8 (a warp's completed pieces
    /// loaded four at a time: no better). Arriving a tile at a time, so that pieces complete and
    /// fold between a block's tiles rather than all in the GEMV's tail, was as slow (2026-12-04,
    /// `-p 0`: Q2_0 303.1 → 283.6, Q1_0 388.2 → 343.5, against this form's 306.6 → 285.3 and
    /// 401.8 → 363.2 in another lease), so the tail is not the cost. A likely one, unmeasured:
    /// while `quant_swiglu`'s 17 blocks run, the down GEMV's blocks are already resident and
    /// request their first tiles, which no fold at the gate | up GEMV's end makes room for.
    fold_swiglu: AtomicBool,
    /// With the norms folded, which residual GEMVs on the binary kernels gather each 128-row
    /// piece in a cluster of eight blocks' shared memory (`fold_cluster`, kernels/gemv_b1.cu)
    /// rather than by an arrival counter and a read back from L2 (`fold_arrive`): the same
    /// bits, two round trips fewer after the last tile ([`plan::ClusterFold`]'s code: those of
    /// Q2_0 g64 rows by default, `NIWAKI_CUDA_FOLD_CLUSTER=0` none, `=1` every format's).
    fold_cluster: AtomicU8,
    /// One-token passes of models with 1-bit matrices have every quantization of their
    /// activations write the plane words the binary GEMV's lanes take too (`quant128`'s
    /// `xp_tok`, kernels/quant.cu), and the 1-bit binary GEMVs that take the norm apart read
    /// those rather than forming them from the codes (their `_p` kernels): the same bits
    /// (`NIWAKI_CUDA_B1_PLANES`).
    b1_planes: AtomicBool,
    /// Select the candidates of a draw with a top-k limit on the GPU (`kernels/topk.cu`;
    /// `NIWAKI_CUDA_TOPK=0` copies the row to the host instead, for measuring it).
    topk: AtomicBool,
    /// Also the weight sums of a draw without a top-k limit (`NIWAKI_CUDA_TOPK_SUMS=0` copies
    /// the row instead). Checked on the H200 (kernels against `model::rank::weight_sums`, the
    /// decode graph against the host, in every bit); 27B synthetic decode at temperature 0.3:
    /// 192-196 against 170-184 tok/s; at temperature 1 on its flat rows, where nearly every
    /// draw still takes the row, 71.1 against 71.0 (one row copy more, 0.27 ms).
    topk_sums: AtomicBool,
    /// Cache positions per warp tile of the attention split (one of [`plan::ATTN_TILES`]).
    attn_tile: AtomicUsize,
    /// Blocks of each attention-split kernel this device runs that one multiprocessor holds at
    /// once (kernels it cannot run are absent).
    attn_blocks_per_sm: HashMap<&'static str, usize>,
    /// The split attention's staging (compiled in).
    attn_ring: plan::AttnRing,
    /// The split kernels' grid order the program was compiled for: whether its defines hold
    /// [`crate::compile::ATTN_TOKEN_MAJOR_DEFINE`].
    attn_token_major: bool,
    /// The 2-bit binary GEMVs' scale pairs by lane ([`plan::LANE_PAIRS`]) the program was
    /// compiled for: whether its defines hold [`crate::compile::LANE_PAIRS_DEFINE`].
    lane_pairs: bool,
    /// The one-kernel short attention's launch for each cache type this device holds its
    /// shared memory for ([`plan::attn_short_launch`]).
    attn_short: Vec<(plan::KvCache, plan::AttnLaunch)>,
    /// The longest context whose one-token passes take it ([`plan::ATTN_SHORT_MAX`] on sm_90,
    /// where it was measured, else 0; `NIWAKI_CUDA_ATTN_SHORT`, 0: never).
    attn_short_max: AtomicUsize,
    /// The query-tiled attention's launch for each cache type where it runs
    /// ([`plan::attn_prefill_launch`]: sm_80+, its shared memory), and how many of its blocks
    /// the device holds at once.
    attn_prefill: Vec<(plan::KvCache, plan::PrefillLaunch, usize)>,
    /// Whether multi-token passes take it, over an f16 cache ([`plan::ATTN_PREFILL`];
    /// `NIWAKI_CUDA_ATTN_PREFILL`) and over a q8_0 one ([`plan::ATTN_PREFILL_Q8`];
    /// `NIWAKI_CUDA_ATTN_PREFILL_Q8`).
    attn_prefill_on: [bool; 2],
    /// Waves of its blocks a pass's splits aim for (1; `NIWAKI_CUDA_ATTN_PREFILL_WAVES`, a
    /// measurement: one block a multiprocessor leaves the last wave's stragglers alone).
    attn_prefill_waves: usize,
    /// How its passes pick their split count ([`plan::ATTN_PREFILL_SPLIT_RULE`];
    /// `NIWAKI_CUDA_ATTN_PREFILL_SPLITS=wave|time`).
    attn_prefill_rule: plan::SplitRule,
    /// The warpgroup-MMA form for an f16 cache where the device runs it (sm_90, its shared
    /// memory; [`plan::attn_prefill_wg_launch`]) and its places, an entry of
    /// [`plan::WgEntry::ALL`] each; which of them multi-token passes take
    /// ([`plan::ATTN_PREFILL_WG_ENTRY`]; `NIWAKI_CUDA_ATTN_PREFILL_WG_ENTRY`), and whether they
    /// take it in place of the f16 entry of `attn_prefill` ([`plan::ATTN_PREFILL_WG`];
    /// `NIWAKI_CUDA_ATTN_PREFILL_WG`).
    attn_prefill_wg_forms: [Option<(plan::PrefillLaunch, usize)>; plan::WgEntry::ALL.len()],
    attn_prefill_wg_entry: plan::WgEntry,
    attn_prefill_wg_on: bool,
    /// A one-token pass's splits per kv head where `NIWAKI_CUDA_ATTN_SPLITS` sets them (a
    /// measurement), else one wave of the split kernel's blocks ([`plan::attn_decode_splits`]).
    attn_decode_splits: Option<usize>,
    /// A multi-token GEMM's K splits where `NIWAKI_CUDA_GEMM_SPLITS` (a measurement) or
    /// [`Gpu::set_gemm_splits`] sets them and they fit ([`plan::gemm_split_fits`]); 0:
    /// [`plan::gemm_splits`]'s.
    gemm_splits: AtomicUsize,
    /// Bytes of the next matrix a one-token GEMV pulls into the L2 cache, where set for every
    /// matrix (`NIWAKI_CUDA_PREFETCH_MB`, or [`Gpu::set_prefetch`]); [`PREFETCH_BY_MATRIX`]:
    /// each matrix's default, [`plan::default_prefetch_bytes`]. Always 0 before sm_90.
    prefetch_bytes: AtomicUsize,
    /// Decode-GEMV blocks per multiprocessor and shared-memory budget (0: the defaults of
    /// [`Gemv1Tuning::for_shape`]).
    blocks_per_sm: AtomicUsize,
    smem_budget: AtomicUsize,
    /// Whether the wide 2-bit rows take the shared-lanes decode GEMV
    /// ([`plan::SHARED_WIDE_ROWS`]; `NIWAKI_CUDA_GEMV1_SHARE`).
    gemv1_share: AtomicBool,
    /// Shared memory a block may opt in to.
    pub smem_limit: usize,
}
