//! The device: context, compiled kernels, buffers and raw launches. Pointers are passed to the
//! kernels as plain 64-bit device addresses so that a whole token can be captured as one graph.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    result, sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr,
};

use crate::compile;
use crate::error::{Context, CudaError, Result};
use crate::knobs;
use crate::plan::{self, Dims, Gemv1Tuning, GEMV_ROWS, GEMV_TOKENS, TILE_PAD_ROWS};
use crate::repack::{GpuFormat, Packed, X_GROUP};
use crate::tma::{self, TensorMap};

mod bandwidth;
mod decode_gemv;
mod tile_image;
mod trace;

pub use tile_image::ImageUse;
pub(crate) use tile_image::TileImage;
pub(crate) use trace::capacity_from_env as trace_capacity_from_env;
pub use trace::{TraceKind, TraceRecord, TRACE_MARKS};

use decode_gemv::{X_COPY_ALL, X_COPY_OFF, X_COPY_PLAN};

/// The prefetch setting that leaves each matrix its default ([`Gpu::prefetch_for`]).
const PREFETCH_BY_MATRIX: usize = usize::MAX;
/// [`Gpu::attn_tile`]'s setting for "the cache type's default tile".
pub const ATTN_TILE_BY_CACHE: usize = 0;

/// Whether an attention tile names a kernel a device runs (the tensor-core ones, 16, from
/// sm_80).
fn attn_tile_runs(tile: usize, ampere: bool) -> bool {
    plan::ATTN_TILES.contains(&tile) && (tile != 16 || ampere)
}

/// What `available()` reports about the first GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub compute_capability: (i32, i32),
    pub multiprocessors: i32,
    pub total_bytes: usize,
    pub free_bytes: usize,
    /// As `cuDriverGetVersion` reports it (13000 = 13.0).
    pub driver_version: i32,
}

impl DeviceInfo {
    /// The NVRTC target, e.g. `sm_90a`: an sm_90 device gets its architecture-specific
    /// features (warpgroup MMA), which the PTX then needs.
    pub fn arch(&self) -> String {
        let (major, minor) = self.compute_capability;
        format!("sm_{major}{minor}{}", if self.wgmma() { "a" } else { "" })
    }

    /// Whether the device runs warpgroup MMA (sm_90: the f16 GEMM).
    pub fn wgmma(&self) -> bool {
        self.compute_capability == (9, 0)
    }

    /// Whether the device is sm_90 or later, where the decode paths built on the copy engine,
    /// programmatic launches and clusters run (and every switch of those paths may be on).
    pub fn sm90(&self) -> bool {
        self.compute_capability.0 >= 9
    }
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}, {} SMs, {:.1} GiB, driver {}.{})",
            self.name,
            self.arch(),
            self.multiprocessors,
            self.total_bytes as f64 / (1u64 << 30) as f64,
            self.driver_version / 1000,
            self.driver_version % 1000 / 10
        )
    }
}

fn open_context() -> Result<Arc<CudaContext>> {
    // SAFETY: only checks whether the shared library can be opened; nothing is called yet.
    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::NoDriver("libcuda.so not found".into()));
    }
    let n = CudaContext::device_count().map_err(|e| CudaError::NoDriver(e.to_string()))?;
    if n < 1 {
        return Err(CudaError::NoDevice);
    }
    let ctx = CudaContext::new(0).ctx(|| "creating a context on GPU 0".into())?;
    // SAFETY: the backend orders all work itself (one stream per sequence, synchronised at the
    // end of each call), so cudarc's per-buffer events are not needed; they would also get in
    // the way of graph capture.
    unsafe { ctx.disable_event_tracking() };
    Ok(ctx)
}

fn device_info(ctx: &CudaContext) -> Result<DeviceInfo> {
    let (free_bytes, total_bytes) = ctx.mem_get_info().ctx(|| "memory info".into())?;
    let mut driver_version = 0i32;
    // SAFETY: writes one int.
    unsafe { sys::cuDriverGetVersion(&mut driver_version) }
        .result()
        .ctx(|| "driver version".into())?;
    Ok(DeviceInfo {
        name: ctx.name().ctx(|| "device name".into())?,
        compute_capability: ctx
            .compute_capability()
            .ctx(|| "compute capability".into())?,
        multiprocessors: ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .ctx(|| "SM count".into())?,
        total_bytes,
        free_bytes,
        driver_version,
    })
}

/// Whether a GPU can be used, and which. Never panics: without a driver or a GPU it returns the
/// reason as an error.
pub fn available() -> Result<DeviceInfo, CudaError> {
    match std::panic::catch_unwind(|| open_context().and_then(|c| device_info(&c))) {
        Ok(r) => r,
        Err(_) => Err(CudaError::NoDriver(
            "the CUDA driver library could not be loaded".into(),
        )),
    }
}

/// A device allocation with its raw address.
pub struct DevBuf {
    _mem: CudaSlice<u8>,
    pub ptr: u64,
    pub bytes: usize,
}

impl DevBuf {
    pub fn at(&self, offset: usize) -> u64 {
        debug_assert!(offset <= self.bytes);
        self.ptr + offset as u64
    }
}

/// A re-tiled weight matrix on the device.
pub struct DevMat {
    pub format: GpuFormat,
    pub rows: usize,
    pub cols: usize,
    pub codes: DevBuf,
    pub scales: DevBuf,
    /// The codes again in the binary decode kernel's tiles, where it takes them from an image
    /// (`gpu/tile_image.rs`).
    pub(crate) image: Option<TileImage>,
}

impl DevMat {
    /// The leading kernel arguments of every GEMV and GEMM: codes, scales, rows, columns.
    fn args(&self) -> [Arg; 4] {
        [
            Arg::Ptr(self.codes.ptr),
            Arg::Ptr(self.scales.ptr),
            Arg::I32(self.rows as i32),
            Arg::I32(self.cols as i32),
        ]
    }

    /// The tensor map through which the binary decode kernels copy the codes: boxes of 128
    /// bytes by `tile_rows` rows of the padded upload, with the 128-byte swizzle.
    pub fn codes_map(&self, tile_rows: usize) -> Result<TensorMap> {
        let row_bytes = self.cols / self.format.chunk_values() * 16;
        tma::encode(
            self.codes.ptr,
            &tma::Tile {
                elem: tma::Elem::U8,
                cols: row_bytes,
                rows: self.rows.div_ceil(TILE_PAD_ROWS) * TILE_PAD_ROWS,
                row_bytes,
                box_cols: 128,
                box_rows: tile_rows,
                swizzle: tma::Swizzle::B128,
            },
        )
    }

    /// Bytes of the matrix proper (the upload's padding rows are not counted).
    pub fn bytes(&self) -> usize {
        let f = self.format;
        self.rows * (self.cols / f.chunk_values() * 16 + self.cols / f.scale_values() * 2)
    }

    /// Device bytes of the matrix's tile image (0: none).
    pub fn image_bytes(&self) -> usize {
        self.image.as_ref().map_or(0, |im| im.buf.bytes)
    }
}

/// What a GEMV reads and writes: int8 activations `xq` with their group scales `xs` (and
/// maybe the f16 `xh`) for `ntok` tokens, and `out[t][row]` at `out + 4·(t·out_stride + row)`, added to when
/// `accumulate`; `argmax`, when set, receives each token's argmax key.
#[derive(Clone, Copy, Debug)]
pub struct GemvIo {
    pub xq: u64,
    pub xs: u64,
    /// The same activations as plane words (kernels/quant.cu, `quant128`), where the
    /// quantization wrote them (one token).
    pub xp: Option<u64>,
    /// The same activations as f16, in the f16 GEMM's order (kernels/quant.cu), where the
    /// quantization wrote them.
    pub xh: Option<u64>,
    pub ntok: usize,
    pub out: u64,
    pub out_stride: usize,
    pub accumulate: bool,
    pub argmax: Option<u64>,
    /// Scratch for the partial sums of a split-K GEMM: address and capacity in floats (`None`:
    /// never split).
    pub split_scratch: Option<(u64, usize)>,
    /// Weights of the next GEMV for a one-token GEMV to pull into the L2 cache.
    pub prefetch: Option<Prefetch>,
    /// One token: the activations are a folded norm's, unscaled ([`FoldOut`]): the outputs
    /// take its 1/rms.
    pub rms_in: Option<RmsIn>,
    /// One token, adding into the residual: the next norm folded into the last writes.
    pub fold: Option<FoldOut>,
    /// One token: two zeroed u32 counters from which a binary GEMV built with dynamic tiles
    /// ([`crate::plan::DYN_TILES`]) hands out its tiles past each block's first fill (the
    /// launch leaves them zeroed); `None`, or a GEMV that folds, takes its tiles statically.
    pub tile_counter: Option<u64>,
}

/// Where a folded norm left the 1/rms of the activations a GEMV reads: its pieces' sums of
/// squares (`cols` / 128 floats) and the norm's epsilon.
#[derive(Clone, Copy, Debug)]
pub struct RmsIn {
    pub piece_ss: u64,
    pub eps: f32,
}

/// What a one-token GEMV folds into its last writes (kernels/quant.cu, `FoldOut`): the
/// pieces' arrival counters (zeroed once, never reset), where the codes and their group pairs
/// go, and what they quantize.
#[derive(Clone, Copy, Debug)]
pub struct FoldOut {
    pub counters: u64,
    pub xq: u64,
    pub xs: u64,
    /// Where the codes' plane words go too, if anywhere.
    pub xp: Option<u64>,
    pub kind: FoldKind,
}

/// What a fold quantizes, and what its arithmetic needs besides the GEMV's outputs.
#[derive(Clone, Copy, Debug)]
pub enum FoldKind {
    /// A residual GEMV leaves the next norm's input, x·w unscaled (`weight`: the norm's), with
    /// the pieces' sums of squares at `piece_ss`.
    Norm { weight: u64, piece_ss: u64 },
    /// A gate | up GEMV of `ffn` rows each leaves silu(gate)·up for the down GEMV.
    Swiglu { ffn: usize },
}

/// The first bytes of a matrix (codes and scales in proportion, as its tiles are read), which
/// a one-token GEMV asks the L2 cache to fetch for the GEMV after it: the memory then keeps
/// streaming while the kernels between the two wait on each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefetch {
    pub codes: u64,
    pub code_bytes: usize,
    pub scales: u64,
    pub scale_bytes: usize,
}

impl Prefetch {
    /// Up to `limit` bytes of `m`, from its start; `None` for a zero limit.
    pub fn of(m: &DevMat, limit: usize) -> Option<Prefetch> {
        let total = m.codes.bytes + m.scales.bytes;
        if limit == 0 || total == 0 {
            return None;
        }
        let part =
            |bytes: usize| (bytes as u128 * limit.min(total) as u128 / total as u128) as usize;
        Some(Prefetch {
            codes: m.codes.ptr,
            code_bytes: part(m.codes.bytes),
            scales: m.scales.ptr,
            scale_bytes: part(m.scales.bytes),
        })
    }
}

impl GemvIo {
    /// One token into `out` (overwritten), no argmax.
    pub fn one(xq: u64, xs: u64, out: u64) -> GemvIo {
        GemvIo {
            xq,
            xs,
            xp: None,
            xh: None,
            ntok: 1,
            out,
            out_stride: 0,
            accumulate: false,
            argmax: None,
            split_scratch: None,
            prefetch: None,
            rms_in: None,
            fold: None,
            tile_counter: None,
        }
    }
}

/// The residual row a fused decode GEMV RMS-norms and quantizes itself.
#[derive(Clone, Copy, Debug)]
pub struct NormIn {
    /// The residual stream, `[tokens][cols]` f32.
    pub x: u64,
    pub tok0: usize,
    /// The norm's weight, `cols` f32.
    pub weight: u64,
    pub eps: f32,
}

/// A quantizing kernel's name and arguments: `name` and `args`, or where its codes' plane words
/// go too (`xp`), its `_p` twin's, which takes their address after `args` (kernels/quant.cu,
/// `quant128`).
pub fn planes_twin(name: &str, args: &[Arg], xp: Option<u64>) -> (String, Vec<Arg>) {
    match xp {
        None => (name.to_string(), args.to_vec()),
        Some(xp) => (format!("{name}_p"), [args, &[Arg::Ptr(xp)]].concat()),
    }
}

/// A kernel argument.
#[derive(Clone, Debug)]
pub enum Arg {
    Ptr(u64),
    I32(i32),
    F32(f32),
    U64(u64),
    /// A tensor map, passed by value (`const __grid_constant__` in the kernel); boxed, as its
    /// 128 bytes and 128-byte alignment would make every argument that large.
    Map(Box<TensorMap>),
}

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
    /// code, unless its own cache has it).
    pub load_secs: f64,
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
    /// The same for the 2-bit rows' (`NIWAKI_CUDA_B2_X_STAGE`, default [`plan::B2_X_STAGE`]).
    b2_x_stage: AtomicBool,
    /// The 2-bit binary decode GEMVs copy each tile from an image of their stage's layout, one
    /// bulk copy a tile (`gpu/tile_image.rs`; `NIWAKI_CUDA_B1_IMAGE=0` turns it off): an
    /// [`ImageUse`].
    image_use: AtomicU8,
    /// How many of a decode GEMV's first tiles are requested before its wait for the previous
    /// kernel (`NIWAKI_CUDA_EARLY_TILES`; default [`plan::EARLY_TILES`]).
    early_tiles: AtomicUsize,
    /// Which 2-bit binary GEMVs run four blocks a multiprocessor (`NIWAKI_CUDA_B2_FOUR`), as the
    /// program was compiled for.
    b2_four: plan::B2Four,
    /// The program hands the binary GEMVs' tiles out from a counter ([`plan::DYN_TILES`]):
    /// their kernels then take the counter's address.
    dyn_tiles: bool,
    /// Tiles per multiprocessor from which a 1-bit matrix takes the binary kernel
    /// (`NIWAKI_CUDA_B1_MIN_TILES`; default [`plan::B1_MIN_TILES_PER_SM`]).
    b1_min_tiles: usize,
    /// Multiply passes of [`plan::GEMM_MIN_TOKENS`] tokens or more on the tensor cores (sm_80
    /// and later). `NIWAKI_CUDA_MMA=0` turns it off.
    mma: AtomicBool,
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
    /// Cache positions in flight per warp of the SIMT attention split (compiled in).
    attn_ring: usize,
    /// The one-kernel short attention's launch for each cache type this device holds its
    /// shared memory for ([`plan::attn_short_launch`]).
    attn_short: Vec<(plan::KvCache, plan::AttnLaunch)>,
    /// The longest context whose one-token passes take it ([`plan::ATTN_SHORT_MAX`] on sm_90,
    /// where it was measured, else 0; `NIWAKI_CUDA_ATTN_SHORT`, 0: never).
    attn_short_max: AtomicUsize,
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

thread_local! {
    static SERIAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with this thread's launches plainly stream-ordered (no programmatic dependent
/// launch). Prefill passes use it: there, dependents resident early beside long kernels
/// (the 64-token recurrent step) measured 17% slower pp512, while one-token passes gain.
pub fn serial_launches<T>(f: impl FnOnce() -> T) -> T {
    let before = SERIAL.with(|c| c.replace(true));
    let out = f();
    SERIAL.with(|c| c.set(before));
    out
}

/// Blocks of `f` (kernel `name`, `threads` threads, `smem` bytes of dynamic shared memory) one
/// multiprocessor holds at once.
fn occupancy(f: &CudaFunction, name: &str, threads: usize, smem: usize) -> Result<usize> {
    let mut n: std::ffi::c_int = 0;
    // SAFETY: a function handle of this context; n outlives the call.
    unsafe {
        sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
            &mut n,
            f.cu_function(),
            threads as i32,
            smem,
        )
    }
    .result()
    .ctx(|| format!("occupancy of {name}"))?;
    Ok(n.max(0) as usize)
}

/// Lets kernel `name` use `bytes` of dynamic shared memory per block (above the 48 KiB every
/// kernel may use without asking).
fn raise_dynamic_smem(f: &CudaFunction, name: &str, bytes: usize) -> Result<()> {
    // SAFETY: a function handle of this context and a documented attribute.
    unsafe {
        sys::cuFuncSetAttribute(
            f.cu_function(),
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        )
    }
    .result()
    .ctx(|| format!("raising the shared memory limit of {name} to {bytes} bytes"))
}

impl Gpu {
    /// Opens GPU 0 and compiles the kernels for `dims`.
    pub fn new(dims: &Dims) -> Result<Gpu> {
        knobs::check_env()?;
        if let Some(what) = compile::ablation() {
            // A measurement switch left set would otherwise serve wrong outputs (or, with
            // `watch`, slower ones) without a word.
            let effect = if what == "watch" {
                "makes traced binary GEMVs watch their first tile before their wait"
            } else {
                "takes part of the kernels' work out: outputs are wrong"
            };
            eprintln!("warning: NIWAKI_CUDA_ABLATE={what} {effect} (for measuring only)");
        }
        let ctx = open_context()?;
        let info = device_info(&ctx)?;
        let smem_limit = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .ctx(|| "shared memory limit".into())?
            .max(0) as usize;
        let attn_ring = plan::attn_ring_positions(dims, smem_limit);
        let t = std::time::Instant::now();
        let trace_capacity = trace::capacity_from_env();
        let defines = compile::program_defines(dims, smem_limit, trace_capacity);
        let dyn_tiles = defines.iter().any(|d| d == compile::DYN_TILES_DEFINE);
        let b2_four = plan::B2Four::from_defines(&defines);
        // In parts side by side, but whole where the kernels keep timeline records: the
        // timeline reads them from one module's symbols.
        let (ptxs, from_cache) =
            compile::nvrtc_compile(&info.arch(), &defines, trace_capacity == 0)?;
        let compile_secs = t.elapsed().as_secs_f64();
        // Each kernel from the one part that emits it.
        let parts = compile::kernel_parts(&ptxs)?;
        let t = std::time::Instant::now();
        let mut modules = Vec::new();
        let mut funcs = HashMap::new();
        for (i, ptx) in ptxs.into_iter().enumerate() {
            let module = ctx
                .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
                .ctx(|| "loading the kernels' PTX".into())?;
            for (&k, _) in compile::KERNELS.iter().zip(&parts).filter(|(_, &p)| p == i) {
                funcs.insert(
                    k,
                    module
                        .load_function(k)
                        .ctx(|| format!("finding kernel {k}"))?,
                );
            }
            modules.push(module);
        }
        let load_secs = t.elapsed().as_secs_f64();
        let stream = ctx.new_stream().ctx(|| "creating a stream".into())?;
        let hopper = info.sm90();
        let ampere = info.compute_capability.0 >= 8;
        let wgmma = info.wgmma();
        // The chunked recurrence's preparation needs more shared memory than devices before
        // Volta's successors offer; where it does not fit, the recurrence stays token by token.
        let gdn_chunks_fit = plan::gdn_prep_smem(dims) <= smem_limit;
        if gdn_chunks_fit {
            raise_dynamic_smem(
                &funcs["gdn_chunk_prep"],
                "gdn_chunk_prep",
                plan::gdn_prep_smem(dims),
            )?;
        }
        if ampere {
            for (k, kernel) in compile::KERNELS
                .iter()
                .filter_map(|k| plan::GemmKernel::of_name(k).map(|g| (k, g)))
                .filter(|(_, g)| wgmma || matches!(g, plan::GemmKernel::Int8 { .. }))
            {
                raise_dynamic_smem(&funcs[*k], k, kernel.smem_bytes())?;
            }
        }
        // The attention-split variants this device can run (the tensor-core one from sm_80, each
        // within the per-block shared memory), their limits raised, and their blocks per SM.
        let mut attn_blocks_per_sm = HashMap::new();
        for (kv, tile) in [plan::KvCache::F16, plan::KvCache::Q8_0]
            .into_iter()
            .flat_map(|kv| plan::ATTN_TILES.map(|t| (kv, t)))
        {
            let a = plan::attn_split_launch(dims, kv, tile, attn_ring);
            let k = a.kernel;
            if (k.ends_with("_mma") && !ampere)
                || a.smem_bytes + plan::ATTN_STATIC_SMEM > smem_limit.max(48 << 10)
            {
                continue;
            }
            if a.smem_bytes > 48 << 10 {
                raise_dynamic_smem(&funcs[k], k, a.smem_bytes)?;
            }
            attn_blocks_per_sm.insert(k, occupancy(&funcs[k], k, a.threads, a.smem_bytes)?);
        }
        let mut attn_short = Vec::new();
        for kv in [plan::KvCache::F16, plan::KvCache::Q8_0] {
            if let Some(a) = plan::attn_short_launch(dims, kv, smem_limit.max(48 << 10)) {
                for k in [a.kernel.to_string(), format!("{}_p", a.kernel)] {
                    if a.smem_bytes > 48 << 10 {
                        raise_dynamic_smem(&funcs[k.as_str()], &k, a.smem_bytes)?;
                    }
                }
                attn_short.push((kv, a));
            }
        }
        if hopper {
            // The bulk-copy kernels: all the shared memory their static part leaves.
            for k in compile::KERNELS {
                let fixed = if k.starts_with("gemv_b1_") || k.starts_with("gemv_b2") {
                    plan::GEMV_B1_STATIC_SMEM
                } else if k.starts_with("gemv1_") || k.starts_with("gemv_chain_") {
                    plan::GEMV1_STATIC_SMEM
                } else if k == "pdl_copy" {
                    // The probe's blocks may take a decode GEMV's shared memory; its barrier
                    // is all it has beside.
                    1 << 10
                } else {
                    continue;
                };
                raise_dynamic_smem(&funcs[k], k, smem_limit.saturating_sub(fixed))?;
            }
        }
        Ok(Gpu {
            ctx,
            stream,
            modules,
            trace_capacity,
            funcs,
            info,
            compile_secs,
            load_secs,
            from_cache,
            pdl: AtomicBool::new(hopper && knobs::flag("NIWAKI_CUDA_PDL", true)),
            gemv1: AtomicBool::new(hopper && knobs::flag("NIWAKI_CUDA_GEMV1", true)),
            gemv1_nodot: AtomicBool::new(false),
            x_copy_launches: AtomicUsize::new(0),
            image_launches: AtomicUsize::new(0),
            fold_launches: AtomicUsize::new(0),
            swiglu_launches: AtomicUsize::new(0),
            cluster_fold_launches: AtomicUsize::new(0),
            planes_launches: AtomicUsize::new(0),
            attn_short_launches: AtomicUsize::new(0),
            x_copy: AtomicUsize::new(match knobs::word("NIWAKI_CUDA_X_COPY").as_deref() {
                Some("0") => X_COPY_OFF,
                Some("all") => X_COPY_ALL,
                _ => X_COPY_PLAN,
            }),
            b1: AtomicBool::new(hopper && knobs::flag("NIWAKI_CUDA_B1", true)),
            b2: AtomicBool::new(hopper && knobs::flag("NIWAKI_CUDA_B2", true)),
            mma: AtomicBool::new(ampere && knobs::flag("NIWAKI_CUDA_MMA", true)),
            gemm_kernel: Mutex::new(None),
            gdn_chunked: AtomicBool::new(
                gdn_chunks_fit && knobs::flag("NIWAKI_CUDA_GDN_CHUNK", false),
            ),
            gdn_chunks_fit,
            gdn_rows: AtomicUsize::new(
                knobs::word("NIWAKI_CUDA_GDN_ROWS")
                    .and_then(|v| v.parse().ok())
                    .filter(|r| plan::GDN_STEP_ROWS.contains(r))
                    .unwrap_or(plan::GDN_STEP_DEFAULT_ROWS),
            ),
            norm_fusion: Mutex::new(plan::NormFusion::from_setting(
                knobs::word("NIWAKI_CUDA_FUSE_NORM").as_deref(),
            )),
            fuse_gdn: AtomicBool::new(knobs::flag("NIWAKI_CUDA_FUSE_GDN", true)),
            fuse_attn: AtomicBool::new(knobs::flag("NIWAKI_CUDA_FUSE_ATTN", true)),
            fold_norm: AtomicBool::new(hopper && knobs::flag("NIWAKI_CUDA_FOLD_NORM", true)),
            fold_swiglu: AtomicBool::new(hopper && knobs::flag("NIWAKI_CUDA_FOLD_SWIGLU", false)),
            fold_cluster: AtomicU8::new(
                if hopper {
                    plan::ClusterFold::from_setting(knobs::flag_set("NIWAKI_CUDA_FOLD_CLUSTER"))
                } else {
                    plan::ClusterFold::Off
                }
                .code(),
            ),
            b1_planes: AtomicBool::new(
                hopper && knobs::flag("NIWAKI_CUDA_B1_PLANES", plan::B1_PLANES),
            ),
            topk: AtomicBool::new(knobs::flag("NIWAKI_CUDA_TOPK", true)),
            topk_sums: AtomicBool::new(knobs::flag("NIWAKI_CUDA_TOPK_SUMS", true)),
            attn_tile: AtomicUsize::new(
                knobs::word("NIWAKI_CUDA_ATTN_TILE")
                    .and_then(|v| v.parse().ok())
                    .filter(|&t| attn_tile_runs(t, ampere))
                    .unwrap_or(ATTN_TILE_BY_CACHE),
            ),
            attn_blocks_per_sm,
            attn_ring,
            attn_short,
            // Measured on the H200 only: elsewhere off unless asked for.
            attn_short_max: AtomicUsize::new(knobs::number(
                "NIWAKI_CUDA_ATTN_SHORT",
                if hopper { plan::ATTN_SHORT_MAX } else { 0 },
            )),
            prefetch_bytes: AtomicUsize::new(if hopper {
                knobs::number_set("NIWAKI_CUDA_PREFETCH_MB").map_or(PREFETCH_BY_MATRIX, |mb| {
                    mb.saturating_mul(1 << 20).min(PREFETCH_BY_MATRIX - 1)
                })
            } else {
                0
            }),
            blocks_per_sm: AtomicUsize::new(0),
            gemv1_share: AtomicBool::new(knobs::flag(
                "NIWAKI_CUDA_GEMV1_SHARE",
                plan::SHARED_WIDE_ROWS,
            )),
            smem_budget: AtomicUsize::new(0),
            b1_knobs: (
                knobs::number("NIWAKI_CUDA_B1_BLOCKS", 0),
                knobs::number("NIWAKI_CUDA_B1_SMEM_KIB", 0) << 10,
            ),
            b1_min_tiles: knobs::number("NIWAKI_CUDA_B1_MIN_TILES", plan::B1_MIN_TILES_PER_SM),
            b1_tile_rows: AtomicUsize::new(
                match knobs::word("NIWAKI_CUDA_B1_TILE_ROWS").as_deref() {
                    Some("32") => 32,
                    Some("16") => 16,
                    _ => plan::B1_TILE_ROWS,
                },
            ),
            b1_x_stage: AtomicBool::new(knobs::flag("NIWAKI_CUDA_B1_X_STAGE", plan::B1_X_STAGE)),
            b2_x_stage: AtomicBool::new(knobs::flag("NIWAKI_CUDA_B2_X_STAGE", plan::B2_X_STAGE)),
            image_use: if hopper && knobs::flag("NIWAKI_CUDA_B1_IMAGE", true) {
                ImageUse::Taken
            } else {
                ImageUse::Off
            }
            .atomic(),
            dyn_tiles,
            b2_four,
            early_tiles: AtomicUsize::new(knobs::number(
                "NIWAKI_CUDA_EARLY_TILES",
                plan::EARLY_TILES,
            )),
            smem_limit,
        })
    }

    /// Whether draws with a top-k limit select their candidates on the GPU.
    pub fn topk(&self) -> bool {
        self.topk.load(Ordering::Relaxed)
    }

    /// Whether draws without a top-k limit get their candidates and weight sums on the GPU.
    pub fn topk_sums(&self) -> bool {
        self.topk() && self.topk_sums.load(Ordering::Relaxed)
    }

    /// Sets the sums' part of [`Gpu::topk_sums`] (the harness checks them).
    pub fn set_topk_sums(&self, on: bool) {
        self.topk_sums.store(on, Ordering::Relaxed);
    }

    /// Whether kernels are launched with programmatic dependent launch.
    pub fn pdl(&self) -> bool {
        self.pdl.load(Ordering::Relaxed)
    }

    /// Whether one-token GEMVs use the bulk-copy kernel.
    pub fn gemv1(&self) -> bool {
        self.gemv1.load(Ordering::Relaxed)
    }

    /// Whether a pass of `ntok` tokens runs the recurrence in chunks.
    pub fn gdn_chunked(&self, ntok: usize) -> bool {
        ntok >= plan::GDN_CHUNK_MIN_TOKENS && self.gdn_chunked.load(Ordering::Relaxed)
    }

    /// Turns the chunked recurrence on (where its shared memory fits the device) or off (token
    /// by token); returns the previous setting.
    pub fn set_gdn_chunked(&self, on: bool) -> bool {
        self.gdn_chunked
            .swap(on && self.gdn_chunks_fit, Ordering::Relaxed)
    }

    /// Key rows per lane of the recurrent step in multi-token passes.
    pub fn gdn_rows(&self) -> usize {
        self.gdn_rows.load(Ordering::Relaxed)
    }

    /// Key rows per lane of the recurrent step in a pass of `ntok` tokens.
    pub fn gdn_rows_for(&self, ntok: usize) -> usize {
        if ntok > 1 {
            self.gdn_rows()
        } else {
            plan::GDN_STEP_DECODE_ROWS
        }
    }

    /// Sets [`Gpu::gdn_rows`] (one of [`plan::GDN_STEP_ROWS`], for measuring the variants).
    pub fn set_gdn_rows(&self, rows: usize) {
        assert!(
            plan::GDN_STEP_ROWS.contains(&rows),
            "no recurrent step of {rows} rows per lane"
        );
        self.gdn_rows.store(rows, Ordering::Relaxed);
    }

    /// Whether multi-token passes multiply on the tensor cores.
    pub fn mma(&self) -> bool {
        self.mma.load(Ordering::Relaxed)
    }

    /// Turns the tensor-core GEMM off or back on (never on for a device without it).
    pub fn set_mma(&self, on: bool) {
        self.mma
            .store(on && self.info.compute_capability.0 >= 8, Ordering::Relaxed);
    }

    /// Cache positions in flight per warp of the SIMT attention split.
    pub fn attn_ring(&self) -> usize {
        self.attn_ring
    }

    /// Whether this device runs the attention-split kernel `name`.
    pub fn attn_runs(&self, name: &str) -> bool {
        self.attn_blocks_per_sm.contains_key(name)
    }

    /// Cache positions per warp tile of the attention split: one of [`plan::ATTN_TILES`], or
    /// [`ATTN_TILE_BY_CACHE`] (the default, `NIWAKI_CUDA_ATTN_TILE` unset): by cache type,
    /// context and pass, [`plan::default_attn_tile`].
    pub fn attn_tile(&self) -> usize {
        self.attn_tile.load(Ordering::Relaxed)
    }

    /// The tile a pass of `ntok` tokens over a context of `n_ctx` positions of a `kv` cache
    /// takes.
    pub fn attn_tile_for(&self, kv: plan::KvCache, n_ctx: usize, ntok: usize) -> usize {
        match self.attn_tile() {
            ATTN_TILE_BY_CACHE => plan::default_attn_tile(kv, n_ctx, ntok),
            t => t,
        }
    }

    /// The one-kernel short attention's launch where a one-token pass over `n_ctx` positions of
    /// a `kv` cache takes it (heads of whole 128-value pieces, the shared memory there, the
    /// context at most [`Gpu::set_attn_short_max`]'s).
    pub fn attn_short_for(&self, kv: plan::KvCache, n_ctx: usize) -> Option<plan::AttnLaunch> {
        if n_ctx > self.attn_short_max.load(Ordering::Relaxed) {
            return None;
        }
        self.attn_short_launch(kv)
    }

    /// The one-kernel short attention's launch for a `kv` cache, where this device holds it.
    pub fn attn_short_launch(&self, kv: plan::KvCache) -> Option<plan::AttnLaunch> {
        self.attn_short
            .iter()
            .find(|(k, _)| *k == kv)
            .map(|&(_, a)| a)
    }

    /// Sets the longest context whose one-token passes take the short attention (0: none);
    /// returns the previous. A state's captured graphs keep what they were captured with.
    pub fn set_attn_short_max(&self, n: usize) -> usize {
        self.attn_short_max.swap(n, Ordering::Relaxed)
    }

    /// Sets [`Gpu::attn_tile`] (for measuring the variants; others, and the tensor-core
    /// kernels' 16 before sm_80, are ignored).
    pub fn set_attn_tile(&self, tile: usize) {
        let ampere = self.info.compute_capability.0 >= 8;
        if tile == ATTN_TILE_BY_CACHE || attn_tile_runs(tile, ampere) {
            self.attn_tile.store(tile, Ordering::Relaxed);
        }
    }

    /// The attention-split launch for a cache type and tile ([`Gpu::attn_tile_for`]), and its
    /// splits per kv head in a one-token pass (one wave of blocks).
    pub fn attn_launch(
        &self,
        dims: &Dims,
        kv: plan::KvCache,
        tile: usize,
    ) -> (plan::AttnLaunch, usize) {
        let mut a = plan::attn_split_launch(dims, kv, tile, self.attn_ring);
        if !self.attn_blocks_per_sm.contains_key(a.kernel) {
            // A variant this device cannot run: the SIMT kernel with tiles of 8, which fits.
            a = plan::attn_split_launch(dims, kv, 8, self.attn_ring);
        }
        let bps = self.attn_blocks_per_sm.get(a.kernel).copied().unwrap_or(1);
        let sms = self.info.multiprocessors.max(1) as usize;
        (a, plan::attn_decode_splits(bps, sms, dims.n_head_kv))
    }

    /// Bytes of `next` that the one-token GEMV before it pulls into the L2 cache (0: none). By
    /// default, by the kernel `next` goes to without a folded norm: with one it goes to the
    /// same kernel (a binary kernel declining the norm runs it apart, [`Gpu::gemv_decode`]).
    pub fn prefetch_for(&self, next: &DevMat) -> usize {
        match self.prefetch_bytes.load(Ordering::Relaxed) {
            PREFETCH_BY_MATRIX => plan::default_prefetch_bytes(self.takes_b1(next, false)),
            bytes => bytes,
        }
    }

    /// The prefetch's setting: bytes for every matrix, or `None` for each matrix's default.
    pub fn prefetch_setting(&self) -> Option<usize> {
        match self.prefetch_bytes.load(Ordering::Relaxed) {
            PREFETCH_BY_MATRIX => None,
            bytes => Some(bytes),
        }
    }

    /// Sets [`Gpu::prefetch_setting`] (for measuring it; never on before sm_90, and captured
    /// graphs keep what they were built with).
    pub fn set_prefetch(&self, bytes: Option<usize>) {
        let hopper = self.info.sm90();
        let v = match bytes {
            _ if !hopper => 0,
            None => PREFETCH_BY_MATRIX,
            Some(b) => b.min(PREFETCH_BY_MATRIX - 1),
        };
        self.prefetch_bytes.store(v, Ordering::Relaxed);
    }

    /// Which ops of a one-token pass run merged.
    pub fn fusion(&self) -> plan::Fusion {
        plan::Fusion {
            norm: self.gemv1() && self.norm_fusion() != plan::NormFusion::Apart,
            gdn: self.fuse_gdn.load(Ordering::Relaxed),
            attn: self.fuse_attn.load(Ordering::Relaxed),
            fold: self.gemv1() && self.fold_norm.load(Ordering::Relaxed),
            swiglu: self.gemv1() && self.fold_swiglu.load(Ordering::Relaxed),
            // A property of each pass (its context): the model sets it.
            attn_short: false,
        }
    }

    /// Turns the SwiGLUs folded into the gate | up GEMVs of one-token passes on or off (sm_90
    /// only, and only where the norms are folded too); returns the previous setting.
    pub fn set_fold_swiglu(&self, on: bool) -> bool {
        self.swap_on_hopper(&self.fold_swiglu, on)
    }

    /// Sets a switch of an sm_90-only path (never on elsewhere); returns the previous setting.
    fn swap_on_hopper(&self, switch: &AtomicBool, on: bool) -> bool {
        switch.swap(on && self.info.sm90(), Ordering::Relaxed)
    }

    /// Sets which residual GEMVs gather their folded norms' pieces in clusters (sm_90 only:
    /// none elsewhere); returns the previous setting. A state's captured graphs keep what they
    /// were captured with.
    pub fn set_fold_cluster(&self, c: plan::ClusterFold) -> plan::ClusterFold {
        let c = if self.info.sm90() {
            c
        } else {
            plan::ClusterFold::Off
        };
        plan::ClusterFold::from_code(self.fold_cluster.swap(c.code(), Ordering::Relaxed))
    }

    /// Which residual GEMVs gather their folded norms' pieces in clusters.
    pub fn fold_cluster(&self) -> plan::ClusterFold {
        plan::ClusterFold::from_code(self.fold_cluster.load(Ordering::Relaxed))
    }

    /// Turns the plane words of one-token passes on or off (sm_90 only); returns the previous
    /// setting. A state's captured graphs keep what they were captured with.
    pub fn set_b1_planes(&self, on: bool) -> bool {
        self.swap_on_hopper(&self.b1_planes, on)
    }

    /// Whether one-token passes of models with 1-bit matrices use plane words.
    pub(crate) fn b1_planes(&self) -> bool {
        self.b1_planes.load(Ordering::Relaxed)
    }

    /// Decode GEMVs this device has launched on their activations' plane words.
    #[doc(hidden)]
    pub fn planes_launches(&self) -> usize {
        self.planes_launches.load(Ordering::Relaxed)
    }

    /// One-kernel short attentions this device has launched.
    #[doc(hidden)]
    pub fn attn_short_launches(&self) -> usize {
        self.attn_short_launches.load(Ordering::Relaxed)
    }

    /// Counts a launch of the one-kernel short attention.
    pub(crate) fn count_attn_short(&self) {
        self.attn_short_launches.fetch_add(1, Ordering::Relaxed);
    }

    /// Decode GEMVs this device has launched with the norm's fold gathered in a cluster.
    #[doc(hidden)]
    pub fn cluster_fold_launches(&self) -> usize {
        self.cluster_fold_launches.load(Ordering::Relaxed)
    }

    /// Counts a decode GEMV launched with its fold gathered in a cluster.
    pub(crate) fn count_cluster_fold(&self) {
        self.cluster_fold_launches.fetch_add(1, Ordering::Relaxed);
    }

    /// Turns the norms folded into the residual GEMVs of one-token passes on or off (sm_90
    /// only); returns the previous setting (as [`Gpu::set_fuse_gdn`]).
    pub fn set_fold_norm(&self, on: bool) -> bool {
        self.swap_on_hopper(&self.fold_norm, on)
    }

    /// Turns the one-kernel recurrence of one-token passes on or off (for checking it against
    /// the three kernels it replaces); returns the previous setting. A state's captured graphs
    /// keep what they were captured with.
    pub fn set_fuse_gdn(&self, on: bool) -> bool {
        self.fuse_gdn.swap(on, Ordering::Relaxed)
    }

    /// Turns the one-kernel attention merge and quantization of one-token passes on or off;
    /// returns the previous setting (as [`Gpu::set_fuse_gdn`]).
    pub fn set_fuse_attn(&self, on: bool) -> bool {
        self.fuse_attn.swap(on, Ordering::Relaxed)
    }

    /// The decode-GEMV tuning for a matrix: the defaults, or the knobs set by
    /// [`Gpu::set_gemv1_knobs`].
    pub fn gemv1_tuning(&self, format: GpuFormat, cols: usize) -> Gemv1Tuning {
        let shared = self.gemv1_share.load(Ordering::Relaxed);
        let mut t = Gemv1Tuning::for_shape_with(format, cols, shared);
        match self.blocks_per_sm.load(Ordering::Relaxed) {
            0 => {}
            n => t.blocks_per_sm = n,
        }
        match self.smem_budget.load(Ordering::Relaxed) {
            0 => {}
            n => t.smem_budget = n,
        }
        t
    }

    /// Which decode GEMVs norm their input themselves.
    pub fn norm_fusion(&self) -> plan::NormFusion {
        *self
            .norm_fusion
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sets norm fusion and the dp4a decode GEMV's blocks per multiprocessor and shared-memory
    /// budget (0: default), for measuring them; captured graphs keep what they were built with.
    pub fn set_gemv1_knobs(
        &self,
        norm: plan::NormFusion,
        blocks_per_sm: usize,
        smem_budget: usize,
    ) {
        *self
            .norm_fusion
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = norm;
        self.blocks_per_sm.store(blocks_per_sm, Ordering::Relaxed);
        self.smem_budget.store(smem_budget, Ordering::Relaxed);
    }

    /// Turns the sm_90 launch paths off or back on (for measuring what each brings; a state's
    /// captured graphs keep the setting they were captured with). Never turns on what the
    /// device lacks.
    pub fn set_fast_paths(&self, pdl: bool, gemv1: bool) {
        let hopper = self.info.sm90();
        self.pdl.store(pdl && hopper, Ordering::Relaxed);
        self.gemv1.store(gemv1 && hopper, Ordering::Relaxed);
    }

    /// Turns the binary-tensor-core decode GEMV of 1-bit rows off or back on (never on where
    /// the device lacks it); returns the previous setting.
    pub fn set_b1(&self, on: bool) -> bool {
        self.swap_on_hopper(&self.b1, on)
    }

    /// Whether 2-bit decode GEMVs go to the binary tensor cores where their plan takes them.
    pub fn b2(&self) -> bool {
        self.b2.load(Ordering::Relaxed)
    }

    /// Turns the binary-tensor-core decode GEMV of 2-bit rows on or off (as [`Gpu::set_b1`]);
    /// returns the previous setting.
    pub fn set_b2(&self, on: bool) -> bool {
        self.swap_on_hopper(&self.b2, on)
    }

    /// How many of a decode GEMV's first tiles are requested before its wait for the previous
    /// kernel.
    pub(super) fn early_tiles(&self) -> usize {
        self.early_tiles.load(Ordering::Relaxed)
    }

    /// Sets [`Gpu::early_tiles`]; returns the previous setting. For the harness's comparisons.
    #[doc(hidden)]
    pub fn set_early_tiles(&self, n: usize) -> usize {
        self.early_tiles.swap(n, Ordering::Relaxed)
    }

    /// Rows per tile the binary decode GEMV asks for (16 or 32).
    #[doc(hidden)]
    pub fn b1_tile_rows(&self) -> usize {
        self.b1_tile_rows.load(Ordering::Relaxed)
    }

    /// Sets [`Gpu::b1_tile_rows`] (16 or 32); returns the previous setting. For the harness's
    /// comparison of the two.
    #[doc(hidden)]
    pub fn set_b1_tile_rows(&self, rows: usize) -> usize {
        self.b1_tile_rows
            .swap(if rows == 32 { 32 } else { 16 }, Ordering::Relaxed)
    }

    /// Whether the binary decode GEMVs of `format`'s rows stage their activations in shared
    /// memory where their plan has such a kernel ([`plan::x_staged`]); returns the previous
    /// setting. For the harness's checks.
    #[doc(hidden)]
    pub fn set_x_stage(&self, format: GpuFormat, on: bool) -> bool {
        self.x_stage_flag(format).swap(on, Ordering::Relaxed)
    }

    /// Whether the binary decode GEMVs of `format`'s rows stage their activations in shared
    /// memory ([`plan::x_staged`]).
    pub fn x_stage(&self, format: GpuFormat) -> bool {
        self.x_stage_flag(format).load(Ordering::Relaxed)
    }

    /// Whether the program hands the binary GEMVs' tiles out from a counter
    /// ([`plan::DYN_TILES`]).
    pub fn dyn_tiles(&self) -> bool {
        self.dyn_tiles
    }

    fn x_stage_flag(&self, format: GpuFormat) -> &AtomicBool {
        match format {
            GpuFormat::Q1 => &self.b1_x_stage,
            GpuFormat::Q2G64 | GpuFormat::Q2G128 => &self.b2_x_stage,
        }
    }

    /// Where the dp4a decode GEMV stages its activations by the tensor-map copy: `Some(true)`
    /// wherever the row allows, `Some(false)` nowhere, `None` as the plan prefers (the default);
    /// returns the previous setting. For the harness's checks of both layouts.
    #[doc(hidden)]
    pub fn set_x_copy(&self, everywhere: Option<bool>) -> Option<bool> {
        let v = match everywhere {
            Some(true) => X_COPY_ALL,
            Some(false) => X_COPY_OFF,
            None => X_COPY_PLAN,
        };
        match self.x_copy.swap(v, Ordering::Relaxed) {
            X_COPY_ALL => Some(true),
            X_COPY_OFF => Some(false),
            _ => None,
        }
    }

    /// Decode GEMVs this device has launched with a folded norm.
    #[doc(hidden)]
    pub fn fold_launches(&self) -> usize {
        self.fold_launches.load(Ordering::Relaxed)
    }

    /// Decode GEMVs this device has launched with a folded SwiGLU.
    #[doc(hidden)]
    pub fn swiglu_launches(&self) -> usize {
        self.swiglu_launches.load(Ordering::Relaxed)
    }

    /// Counts a decode GEMV launched with `fold`.
    fn count_fold(&self, fold: Option<FoldOut>) {
        let counter = match fold.map(|f| f.kind) {
            Some(FoldKind::Norm { .. }) => &self.fold_launches,
            Some(FoldKind::Swiglu { .. }) => &self.swiglu_launches,
            None => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Launches of the 2-bit binary decode GEMVs from tile images this device has made.
    #[doc(hidden)]
    pub fn image_launches(&self) -> usize {
        self.image_launches.load(Ordering::Relaxed)
    }

    /// Launches of the swizzled decode GEMVs (`gemv1_*_x`) this device has made.
    #[doc(hidden)]
    pub fn x_copy_launches(&self) -> usize {
        self.x_copy_launches.load(Ordering::Relaxed)
    }

    /// With `nodot`, decode GEMVs (of the formats that have the probe) stream their weights and
    /// multiply nothing: their outputs are wrong. For timing the memory pipeline against the
    /// arithmetic; returns the previous setting.
    #[doc(hidden)]
    pub fn set_gemv1_probe(&self, nodot: bool) -> bool {
        self.gemv1_nodot.swap(nodot, Ordering::Relaxed)
    }

    pub fn free_bytes(&self) -> Result<usize> {
        Ok(self.ctx.mem_get_info().ctx(|| "memory info".into())?.0)
    }

    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.ctx.new_stream().ctx(|| "creating a stream".into())
    }

    /// A zeroed allocation of `bytes` (at least 1).
    pub fn alloc(&self, bytes: usize, what: &str) -> Result<DevBuf> {
        let mem =
            self.stream
                .alloc_zeros::<u8>(bytes.max(1))
                .map_err(|e| match self.free_bytes() {
                    Ok(free) => CudaError::OutOfMemory {
                        what: what.into(),
                        need_mib: (bytes as u64).div_ceil(1 << 20),
                        free_mib: free as u64 >> 20,
                        breakdown: e.to_string(),
                    },
                    Err(_) => CudaError::Driver {
                        what: format!("allocating {bytes} bytes for {what}"),
                        source: e,
                    },
                })?;
        let ptr = mem.device_ptr(&self.stream).0;
        Ok(DevBuf {
            _mem: mem,
            ptr,
            bytes,
        })
    }

    pub fn upload<T: Copy>(&self, data: &[T], what: &str) -> Result<DevBuf> {
        let bytes = std::mem::size_of_val(data);
        let buf = self.alloc(bytes, what)?;
        self.write(&self.stream, buf.ptr, data)?;
        Ok(buf)
    }

    /// Host → device copy on `stream`. Pageable host data is staged before this returns;
    /// page-locked data is read by the copy itself, later: the caller keeps it unchanged until
    /// the stream is synchronized.
    pub fn write<T: Copy>(&self, stream: &CudaStream, dst: u64, data: &[T]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: `dst` is an allocation of this context at least `size_of_val(data)` long
        // (callers pass offsets inside their own buffers); pageable source memory is copied
        // before the call returns, and callers passing page-locked memory hold it unchanged
        // until they synchronize the stream (`CudaModel::run`).
        unsafe { result::memcpy_htod_async(dst, data, stream.cu_stream()) }
            .ctx(|| "host to device copy".into())
    }

    /// Device → host copy on `stream`, synchronising it.
    pub fn read<T: Copy>(&self, stream: &CudaStream, src: u64, out: &mut [T]) -> Result<()> {
        // SAFETY: `src` holds at least `size_of_val(out)` bytes; the stream is synchronised
        // before `out` is used.
        unsafe { result::memcpy_dtoh_async(out, src, stream.cu_stream()) }
            .ctx(|| "device to host copy".into())?;
        stream.synchronize().ctx(|| "synchronising".into())
    }

    /// Uploads a re-tiled matrix with its rows padded (zeros) to a multiple of
    /// [`TILE_PAD_ROWS`], so that the decode GEMV copies whole tiles only.
    pub fn upload_packed(&self, p: &Packed, name: &str) -> Result<DevMat> {
        let padded = p.rows.div_ceil(TILE_PAD_ROWS) * TILE_PAD_ROWS;
        let put = |data: &[u8]| -> Result<DevBuf> {
            let buf = self.alloc(data.len() / p.rows.max(1) * padded, name)?;
            self.write(&self.stream, buf.ptr, data)?;
            Ok(buf)
        };
        let scale_bytes: Vec<u8> = p.scales.iter().flat_map(|s| s.to_le_bytes()).collect();
        let codes = put(&p.codes)?;
        let image = self.make_tile_image(p.format, p.rows, p.cols, codes.ptr)?;
        Ok(DevMat {
            format: p.format,
            rows: p.rows,
            cols: p.cols,
            codes,
            scales: put(&scale_bytes)?,
            image,
        })
    }

    /// Launches `name` with raw arguments.
    pub fn launch(
        &self,
        stream: &CudaStream,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        args: &[Arg],
    ) -> Result<()> {
        self.launch_smem(stream, name, grid, block, 0, args)
    }

    /// Kernel `name`'s registers a thread, local (spilled) bytes a thread, and the blocks of
    /// `block` threads with `smem` bytes of dynamic shared memory a multiprocessor holds (the
    /// driver's occupancy query): for the harness's reports. `None` for a kernel not loaded.
    #[doc(hidden)]
    pub fn kernel_resources(&self, name: &str, block: u32, smem: usize) -> Option<(i32, i32, u32)> {
        let f = self.funcs.get(name)?;
        Some((
            f.num_regs().ok()?,
            f.local_size_bytes().ok()?,
            f.occupancy_max_active_blocks_per_multiprocessor(block, smem, None)
                .ok()?,
        ))
    }

    /// Launches `name` with `smem` bytes of dynamic shared memory.
    pub fn launch_smem(
        &self,
        stream: &CudaStream,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        args: &[Arg],
    ) -> Result<()> {
        let f = self
            .funcs
            .get(name)
            .unwrap_or_else(|| panic!("kernel {name} is not in compile::KERNELS"));
        let mut vals: Vec<[u8; 8]> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) | Arg::U64(p) => p.to_ne_bytes(),
                Arg::Map(_) => [0u8; 8],
                Arg::I32(v) => {
                    let mut b = [0u8; 8];
                    b[..4].copy_from_slice(&v.to_ne_bytes());
                    b
                }
                Arg::F32(v) => {
                    let mut b = [0u8; 8];
                    b[..4].copy_from_slice(&v.to_ne_bytes());
                    b
                }
            })
            .collect();
        // A tensor map is read in place from `args`, which outlive the call (the driver copies
        // its 128 bytes).
        let mut params: Vec<*mut c_void> = args
            .iter()
            .zip(vals.iter_mut())
            .map(|(a, v)| match a {
                Arg::Map(m) => &m.0 as *const sys::CUtensorMap as *mut c_void,
                _ => v.as_mut_ptr() as *mut c_void,
            })
            .collect();
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: sys::CUlaunchAttributeValue {
                programmaticStreamSerializationAllowed: 1,
            },
        };
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block.0,
            blockDimY: block.1,
            blockDimZ: block.2,
            sharedMemBytes: smem,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(self.pdl() && !SERIAL.with(|c| c.get())),
        };
        // SAFETY: each parameter points at a value of the size and type of the kernel's
        // parameter at that position (the call sites mirror the kernel signatures in
        // kernels/*.cu); `vals`, `attr` and `config` outlive the call, which copies them. Every
        // kernel starts with `griddepcontrol.wait` before touching its predecessors' buffers,
        // which is what the programmatic-serialization attribute requires.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .ctx(|| format!("launching {name} grid {grid:?} block {block:?} smem {smem}"))
    }

    /// `ntok` rows of activations (`cols` wide, f32 at `x`) quantized to `xq`, `xs` (and
    /// written as f16 to `xh` when set).
    #[allow(clippy::too_many_arguments)]
    pub fn quantize(
        &self,
        stream: &CudaStream,
        x: u64,
        cols: usize,
        ntok: usize,
        xq: u64,
        xs: u64,
        xh: Option<u64>,
    ) -> Result<()> {
        self.quantize_rotated(stream, x, cols, ntok, xq, xs, xh, None, None)
    }

    /// [`Gpu::quantize`], each 1024 values Hadamard-rotated first with `signs` (a device vector
    /// of `cols` ±1; `cols` a multiple of [`plan::ROT_BLOCK`]).
    #[allow(clippy::too_many_arguments)]
    pub fn quantize_rotated(
        &self,
        stream: &CudaStream,
        x: u64,
        cols: usize,
        ntok: usize,
        xq: u64,
        xs: u64,
        xh: Option<u64>,
        signs: Option<u64>,
        xp: Option<u64>,
    ) -> Result<()> {
        // The kernel rotates whole blocks of 1024 values with every thread of a block.
        if signs.is_some() && !cols.is_multiple_of(plan::ROT_BLOCK) {
            return Err(CudaError::Unsupported(format!(
                "rotating {cols}-wide activations (a multiple of {} is needed)",
                plan::ROT_BLOCK
            )));
        }
        let (name, args) = planes_twin(
            "quant_plain",
            &[
                Arg::Ptr(x),
                Arg::I32(cols as i32),
                Arg::Ptr(xq),
                Arg::Ptr(xs),
                Arg::Ptr(xh.unwrap_or(0)),
                Arg::Ptr(signs.unwrap_or(0)),
            ],
            xp,
        );
        self.launch(
            stream,
            &name,
            (cols.div_ceil(1024) as u32, ntok as u32, 1),
            (256, 1, 1),
            &args,
        )
    }

    /// `out[t][r] (+)= W[r] · x[t]` for `io.ntok` tokens: the decode GEMV for one token, the
    /// tensor-core GEMM from [`plan::GEMM_MIN_TOKENS`] tokens on (the argmax is only in the
    /// dp4a kernels), else the dp4a kernels (several launches past 8 tokens).
    pub fn gemv(&self, stream: &CudaStream, m: &DevMat, io: &GemvIo) -> Result<()> {
        if self.gemv_decode(stream, m, io, None)? {
            return Ok(());
        }
        if io.rms_in.is_some() || io.fold.is_some() {
            return Err(CudaError::Unsupported(
                "a folded norm needs the sm_90 decode GEMVs".into(),
            ));
        }
        if io.ntok >= plan::GEMM_MIN_TOKENS && io.argmax.is_none() && self.mma() {
            return self.gemm(stream, m, io);
        }
        self.gemv_plain(stream, m, io)
    }

    /// The tensor-core GEMM for any number of tokens (no argmax), with the kernel set by
    /// [`Gpu::set_gemm_kernel`] or else the preferred one for the matrix (the int8 one where
    /// the f16 activations are missing or the rows are not whole f16-GEMM stages).
    pub fn gemm(&self, stream: &CudaStream, m: &DevMat, io: &GemvIo) -> Result<()> {
        let kernel = match self.gemm_kernel() {
            Some(k) => k,
            None => plan::GemmKernel::preferred(
                self.info.wgmma(),
                m.rows,
                m.cols,
                io.ntok,
                self.info.multiprocessors.max(1) as usize,
                io.split_scratch.map_or(0, |(_, cap)| cap),
            ),
        };
        let kernel = match kernel {
            plan::GemmKernel::F16 { .. } if io.xh.is_none() || !plan::hgemm_takes(m.cols) => {
                plan::GemmKernel::INT8
            }
            k => k,
        };
        self.gemm_with(stream, m, io, kernel)
    }

    /// The GEMM kernel set by [`Gpu::set_gemm_kernel`], if any.
    pub fn gemm_kernel(&self) -> Option<plan::GemmKernel> {
        *self.gemm_kernel.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether multi-token passes of `ntok` tokens want f16 activations beside the int8 ones.
    pub fn wants_f16_acts(&self, ntok: usize) -> bool {
        ntok >= plan::GEMM_MIN_TOKENS
            && self.mma()
            && match self.gemm_kernel() {
                Some(k) => matches!(k, plan::GemmKernel::F16 { .. }),
                None => self.info.wgmma(),
            }
    }

    /// The GEMM kernels this device runs.
    pub fn gemm_kernels(&self) -> Vec<plan::GemmKernel> {
        plan::GemmKernel::all(self.info.wgmma())
    }

    /// Fixes the GEMM kernel (one of [`Gpu::gemm_kernels`]) for every matrix, for measuring
    /// them; `None` goes back to each matrix's preferred one.
    pub fn set_gemm_kernel(&self, kernel: Option<plan::GemmKernel>) {
        if let Some(k) = kernel {
            assert!(
                self.gemm_kernels().contains(&k),
                "no GEMM kernel {k:?} on this device"
            );
        }
        *self.gemm_kernel.lock().unwrap_or_else(|e| e.into_inner()) = kernel;
    }

    /// A tensor-core GEMM kernel (the f16 one reads `io.xh`, which must be set).
    pub fn gemm_with(
        &self,
        stream: &CudaStream,
        m: &DevMat,
        io: &GemvIo,
        kernel: plan::GemmKernel,
    ) -> Result<()> {
        if io.argmax.is_some() || io.ntok == 0 {
            return Err(CudaError::Unsupported(
                "the tensor-core GEMM takes at least one token and keeps no argmax".into(),
            ));
        }
        if matches!(kernel, plan::GemmKernel::F16 { .. }) && !plan::hgemm_takes(m.cols) {
            return Err(CudaError::Unsupported(format!(
                "the f16 GEMM takes rows of whole {}-value stages, not {}",
                plan::HGEMM_STAGE_VALUES,
                m.cols
            )));
        }
        let (leading, acts) = match (kernel, io.xh) {
            (plan::GemmKernel::Int8 { .. }, _) => {
                (m.args().to_vec(), vec![Arg::Ptr(io.xq), Arg::Ptr(io.xs)])
            }
            (plan::GemmKernel::F16 { wg }, Some(xh)) => {
                let w = plan::hgemm_weight_tile(m.format, m.rows, m.cols, wg);
                let x = plan::hgemm_act_tile(io.ntok, m.cols);
                (
                    vec![
                        Arg::Map(Box::new(tma::encode(m.codes.ptr, &w)?)),
                        Arg::Ptr(m.scales.ptr),
                        Arg::I32(m.rows as i32),
                        Arg::I32(m.cols as i32),
                    ],
                    vec![Arg::Map(Box::new(tma::encode(xh, &x)?))],
                )
            }
            (plan::GemmKernel::F16 { .. }, None) => {
                return Err(CudaError::Unsupported(
                    "the f16 GEMM needs the f16 activations".into(),
                ))
            }
        };
        let (gx, gy) = plan::gemm_grid(m.rows, io.ntok, kernel);
        let sms = self.info.multiprocessors.max(1) as usize;
        let splits = io.split_scratch.map_or(1, |(_, cap)| {
            plan::gemm_splits(m.rows, m.cols, io.ntok, kernel, sms, cap)
        });
        // Split: partial sums [split][token][row] into the scratch, then added up in order.
        let zstride = (io.ntok * m.rows) as u64;
        let (out, out_stride, accumulate) = match io.split_scratch {
            Some((part, _)) if splits > 1 => (part, m.rows, false),
            _ => (io.out, io.out_stride, io.accumulate),
        };
        self.launch_smem(
            stream,
            &kernel.name(m.format),
            (gx as u32, gy as u32, splits as u32),
            (kernel.threads() as u32, 1, 1),
            kernel.smem_bytes() as u32,
            &[
                &leading[..],
                &acts,
                &[
                    Arg::I32(io.ntok as i32),
                    Arg::Ptr(out),
                    Arg::I32(out_stride as i32),
                    Arg::I32(i32::from(accumulate)),
                    Arg::U64(zstride),
                ],
            ]
            .concat(),
        )?;
        if splits == 1 {
            return Ok(());
        }
        self.launch(
            stream,
            "gemm_reduce",
            (m.rows.div_ceil(256) as u32, io.ntok as u32, 1),
            (256, 1, 1),
            &[
                Arg::Ptr(out),
                Arg::I32(splits as i32),
                Arg::U64(zstride),
                Arg::I32(m.rows as i32),
                Arg::Ptr(io.out),
                Arg::I32(io.out_stride as i32),
                Arg::I32(i32::from(io.accumulate)),
            ],
        )
    }

    /// The register-streaming GEMV (`gemv_<format>_t1` / `_t8`), for any device.
    pub fn gemv_plain(&self, stream: &CudaStream, m: &DevMat, io: &GemvIo) -> Result<()> {
        let GemvIo {
            xq,
            xs,
            ntok,
            out,
            out_stride,
            accumulate,
            argmax,
            ..
        } = *io;
        let width = if ntok == 1 { 1 } else { GEMV_TOKENS };
        let name = format!("gemv_{}_t{width}", m.format.kernel_name());
        let name = compile::KERNELS
            .iter()
            .find(|k| **k == name)
            .expect("gemv kernel");
        // 8 warps a block, each owning groups of GEMV_ROWS rows; a grid of a few blocks per SM
        // strides over the row groups.
        let groups = m.rows.div_ceil(GEMV_ROWS);
        let sms = self.info.multiprocessors.max(1) as usize;
        let grid = (groups.div_ceil(8).min(4 * sms) as u32, 1, 1);
        let mut t0 = 0;
        while t0 < ntok {
            let n = width.min(ntok - t0);
            self.launch(
                stream,
                name,
                grid,
                (256, 1, 1),
                &[
                    &m.args()[..],
                    &[
                        Arg::Ptr(xq + (t0 * m.cols) as u64),
                        Arg::Ptr(xs + (8 * t0 * m.cols / X_GROUP) as u64),
                        Arg::I32(n as i32),
                        Arg::Ptr(out + (4 * t0 * out_stride) as u64),
                        Arg::I32(out_stride as i32),
                        Arg::I32(i32::from(accumulate)),
                        Arg::Ptr(argmax.map_or(0, |a| a + 8 * t0 as u64)),
                    ],
                ]
                .concat(),
            )?;
            t0 += n;
        }
        Ok(())
    }

    /// Median seconds per call of `f` over `iters` calls timed with events on `stream`.
    pub fn time(
        &self,
        stream: &CudaStream,
        iters: usize,
        mut f: impl FnMut() -> Result<()>,
    ) -> Result<f64> {
        let mut times = Vec::with_capacity(iters);
        for _ in 0..iters {
            let a = self
                .ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .ctx(|| "event".into())?;
            let b = self
                .ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .ctx(|| "event".into())?;
            a.record(stream).ctx(|| "event record".into())?;
            f()?;
            b.record(stream).ctx(|| "event record".into())?;
            b.synchronize().ctx(|| "event sync".into())?;
            times.push(a.elapsed_ms(&b).ctx(|| "elapsed".into())? as f64 / 1e3);
        }
        times.sort_by(|x, y| x.total_cmp(y));
        Ok(times[times.len() / 2])
    }

    /// Blocks of `kernel` (of `threads` threads and `smem` bytes of dynamic shared memory) one
    /// multiprocessor holds at once.
    pub fn blocks_per_sm(&self, kernel: &str, threads: usize, smem: usize) -> Result<usize> {
        let f = self
            .funcs
            .get(kernel)
            .ok_or_else(|| CudaError::Unsupported(format!("no kernel named {kernel}")))?;
        occupancy(f, kernel, threads, smem)
    }
}

#[cfg(test)]
mod tests {
    use super::DeviceInfo;

    fn device(compute_capability: (i32, i32)) -> DeviceInfo {
        DeviceInfo {
            name: "test".into(),
            compute_capability,
            multiprocessors: 1,
            total_bytes: 0,
            free_bytes: 0,
            driver_version: 13000,
        }
    }

    #[test]
    fn the_architecture_names_its_target_and_its_paths() {
        let cases = [
            ((8, 0), "sm_80", false),
            ((8, 9), "sm_89", false),
            ((9, 0), "sm_90a", true),
            ((10, 0), "sm_100", true),
            ((12, 0), "sm_120", true),
        ];
        for (cc, arch, sm90) in cases {
            let d = device(cc);
            assert_eq!((d.arch().as_str(), d.sm90()), (arch, sm90), "{cc:?}");
        }
    }
}
