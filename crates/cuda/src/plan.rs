//! The CPU side of the backend: shape checks, memory sizing and the list of kernel launches for
//! a forward call. Nothing here touches the GPU, so all of it is tested without one.

use model::{Config, LayerKind};

use crate::error::{CudaError, Result};
use crate::repack::{GpuFormat, X_GROUP};

/// Partitions of the KV range in flash-decoding (one block per kv head and split).
pub const ATTN_SPLITS: usize = 128;
/// Bytes of the next matrix a one-token GEMV pulls into the L2 cache by default (0: none).
/// Measured on the H200 (tg128, Q2_0 / Q1_0): none 243.6 / 264.5, 8 MiB 249.6 / 273.7,
/// 16 MiB 245.7 / 271.2, 32 MiB 241.6 / 269.1 tok/s.
pub const DEFAULT_PREFETCH_BYTES: usize = 8 << 20;
/// Warps of an attention-split block (the kernel's AWARPS).
pub const ATTN_WARPS: usize = 4;
/// Cache positions a warp of the attention split takes at a time: the kernel variants (16: the
/// tensor-core kernel, for f16 caches on sm_80+; a q8_0 cache then takes tiles of 8). H200,
/// 27B Q2_0 at 32k depth, µs per layer, f16 / q8_0 cache: tiles of 4 60.9 / 63.2, of 8
/// 57.3 / 59.2.
pub const ATTN_TILES: [usize; 3] = [4, 8, 16];
/// Cache positions in flight per warp of the SIMT attention split (its ring holds this many
/// positions' keys and values: 4 tiles of 4 or 2 of 8), and the smaller ring for devices whose
/// blocks cannot have that much shared memory (64 KiB on sm_75: a 27B f16 ring of 16 needs
/// 64 KiB plus the kernel's static memory).
pub const ATTN_RING_POSITIONS: usize = 16;
pub const ATTN_RING_POSITIONS_SMALL: usize = 8;
/// Upper bound of the attention-split kernels' static shared memory (their per-warp scores and
/// weights: 4 × (8 × 8 + 8) floats at most).
pub const ATTN_STATIC_SMEM: usize = 1152;
/// Warps of a tensor-core attention-split block, positions per warp tile, tiles per ring (the
/// kernel's MW_WARPS, MW_TILE, MW_STAGES).
pub const ATTN_MMA_WARPS: usize = 2;
pub const ATTN_MMA_TILE: usize = 16;
pub const ATTN_MMA_STAGES: usize = 2;
/// Fewest cache positions per split: short contexts use few splits, and the merge reads few
/// partial rows (at 128 splits a 100-token context merged 128 partials of one position each).
pub const ATTN_MIN_SPLIT_LEN: usize = 32;
/// Tokens one GPU pass of a prefill handles (scratch buffers are sized for it): four of the
/// GEMM's token tiles, so that a 5120-row matrix still gives 80 blocks.
pub const MAX_CHUNK: usize = 256;
/// Tokens one GEMV launch multiplies against each weight row it reads.
pub const GEMV_TOKENS: usize = 8;

/// The tensor-core GEMM of multi-token passes (`gemm_*_m<mi>`, kernels/gemm.cu): warps of a
/// block (each owns `mi` 16-row mma tiles for all the block's tokens), tokens of a block's
/// output tile, values of every row per pipeline stage (one 1-bit chunk, two 2-bit chunks),
/// stages, and the shared-memory bytes of one weight row in a stage (16 more than its two 2-bit
/// chunks: the eight rows of a fragment load then fall in distinct banks).
pub const GEMM_WARPS: usize = 8;
pub const GEMM_TOKENS: usize = 64;
pub const GEMM_STAGE_VALUES: usize = 128;
pub const GEMM_STAGES: usize = 4;
pub const GEMM_ROW_STRIDE: usize = 48;
const _: () = assert!(GEMM_ROW_STRIDE >= 16 * GEMM_STAGE_VALUES / 64);
/// Passes of fewer tokens use the dp4a kernels: a GEMM tile of 64 tokens would mostly idle.
pub const GEMM_MIN_TOKENS: usize = 16;

/// The GEMM kernel variants: 16-row mma tiles per warp.
pub const GEMM_MI: [usize; 2] = [1, 2];
/// The variant multi-token passes use.
pub const GEMM_DEFAULT_MI: usize = 2;

/// The variant (tiles per warp) of a GEMM kernel's name, `None` for any other kernel.
pub fn gemm_variant(kernel: &str) -> Option<usize> {
    let rest = kernel.strip_prefix("gemm_")?;
    GpuFormat::ALL.iter().find_map(|f| {
        let mi: usize = rest
            .strip_prefix(f.kernel_name())?
            .strip_prefix("_m")?
            .parse()
            .ok()?;
        GEMM_MI.contains(&mi).then_some(mi)
    })
}

/// Rows of a GEMM block's output tile.
pub const fn gemm_rows(mi: usize) -> usize {
    GEMM_WARPS * 16 * mi
}

/// Dynamic shared memory of a GEMM block: per stage the weight chunks of the tile's rows, the
/// int8 activations of its tokens (rows padded by 16 bytes) and their (d, d·Σq) pairs.
pub fn gemm_smem_bytes(mi: usize) -> usize {
    let kc = GEMM_STAGE_VALUES;
    let stage =
        gemm_rows(mi) * GEMM_ROW_STRIDE + GEMM_TOKENS * (kc + 16) + kc / X_GROUP * GEMM_TOKENS * 8;
    GEMM_STAGES * stage
}

/// Most K splits of a GEMM: each split writes its partial sums to scratch, and `gemm_reduce`
/// adds them up in a fixed order (deterministic, unlike atomics).
pub const GEMM_MAX_SPLITS: usize = 4;

/// K splits for a GEMM of `rows × cols` over `ntok` tokens on `sms` multiprocessors (each
/// holding 3 − `mi` blocks, as an H100/H200 does), with room for `cap` partial floats. One, unless its tiles fill less than 90% of the block slots the
/// waves they take offer (5120 output rows at 256 tokens are 80 blocks for 132 slots, 61%:
/// three splits make it 240 of 264); then the fewest splits that reach 90%, or the best fill.
/// Every split keeps at least two pipeline stages.
pub fn gemm_splits(
    rows: usize,
    cols: usize,
    ntok: usize,
    mi: usize,
    sms: usize,
    cap: usize,
) -> usize {
    let (gx, gy) = gemm_grid(rows, ntok, mi);
    let blocks = gx * gy;
    let slots = (sms * (3 - mi)).max(1);
    let fill = |s: usize| {
        let b = blocks * s;
        b as f64 / (b.div_ceil(slots) * slots) as f64
    };
    if blocks >= slots || fill(1) >= 0.9 {
        return 1;
    }
    let stages = cols.div_ceil(GEMM_STAGE_VALUES);
    let fits = |s: &usize| s * ntok * rows <= cap && 2 * s <= stages;
    (2..=GEMM_MAX_SPLITS)
        .filter(fits)
        .find(|&s| fill(s) >= 0.9)
        .or_else(|| {
            (1..=GEMM_MAX_SPLITS)
                .filter(fits)
                .max_by(|a, b| fill(*a).total_cmp(&fill(*b)))
        })
        .unwrap_or(1)
}

/// Grid of a GEMM launch: token tiles (x) by row tiles (y).
pub fn gemm_grid(rows: usize, ntok: usize, mi: usize) -> (usize, usize) {
    (ntok.div_ceil(GEMM_TOKENS), rows.div_ceil(gemm_rows(mi)))
}
/// Rows of a matrix one GEMV warp computes at a time (sharing each activation load).
pub const GEMV_ROWS: usize = 4;

/// Matrices are uploaded with their rows padded to a multiple of this, so that the decode GEMV
/// (`gemv1_*`) only ever copies whole tiles of 8 or 16 rows.
pub const TILE_PAD_ROWS: usize = 16;
/// Consumer warps of a decode-GEMV block (one more warp issues the copies); a tile is
/// `GEMV1_WARPS × rows_per_warp` rows.
pub const GEMV1_WARPS: usize = 8;
/// Shared memory the decode GEMV may declare statically (its barriers and reduction space: 256
/// bytes today), kept out of its dynamic budget.
pub const GEMV1_STATIC_SMEM: usize = 1024;
/// Shared-memory stages of the decode GEMV's copy ring (the kernel's barrier array).
pub const GEMV1_MAX_STAGES: usize = 8;

/// The knobs of the decode GEMV: rows per warp (1 or 2), the shared memory a block may use for
/// activations and its ring of tiles, and blocks per multiprocessor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemv1Tuning {
    pub rows_per_warp: usize,
    pub smem_budget: usize,
    pub blocks_per_sm: usize,
}

impl Gemv1Tuning {
    /// Default for a matrix: two rows per warp while a tile of 16 rows stays small (≤ ~26 KB),
    /// two blocks per multiprocessor of up to 100 KiB each, three of 72 KiB for 1-bit weights.
    /// Measured on the H200 over whole 27B decode steps: one block per SM (so that the next
    /// GEMV's block could fit beside it) was 17-27% slower, 64 or 160 KiB with one block slower
    /// still; three blocks of 72 KiB were 2.3% faster than two of 100 KiB on Q1_0 (on par with
    /// two of 112 KiB; its GEMV is bound by its instructions, so more warps help) and 10% slower
    /// on Q2_0 (fewer bytes in flight).
    pub fn for_shape(format: GpuFormat, cols: usize) -> Gemv1Tuning {
        let row_bytes = cols / format.chunk_values() * 16;
        let one_bit = format == GpuFormat::Q1;
        Gemv1Tuning {
            rows_per_warp: if row_bytes <= 1600 { 2 } else { 1 },
            smem_budget: if one_bit { 72 << 10 } else { 100 << 10 },
            blocks_per_sm: if one_bit { 3 } else { 2 },
        }
    }
}

/// A decode-GEMV launch: kernel variant, stages, grid and dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemv1Launch {
    pub rows_per_warp: usize,
    pub stages: usize,
    pub grid: usize,
    pub smem_bytes: usize,
    pub stage_bytes: usize,
}

fn round128(n: usize) -> usize {
    n.div_ceil(128) * 128
}

/// Plans a decode GEMV, or `None` when not even two stages fit (the caller then uses the plain
/// kernel). `smem_limit` is the per-block opt-in maximum of the device.
/// `fused_norm`: the block norms and quantizes its input itself (one more row of int8 staging).
pub fn gemv1_launch(
    format: GpuFormat,
    rows: usize,
    cols: usize,
    t: Gemv1Tuning,
    sms: usize,
    smem_limit: usize,
    fused_norm: bool,
) -> Option<Gemv1Launch> {
    if rows == 0 || !format.fits(cols) || !(1..=2).contains(&t.rows_per_warp) {
        return None;
    }
    let tr = GEMV1_WARPS * t.rows_per_warp;
    let chunks = cols / format.chunk_values();
    let scales = cols / format.scale_values();
    let stage_bytes = round128(tr * chunks * 16 + tr * scales * 2);
    let x_bytes = round128(cols + 8 * cols / X_GROUP) + if fused_norm { cols } else { 0 };
    // The kernel's static barriers come out of the same limit.
    let budget = t
        .smem_budget
        .min(smem_limit.saturating_sub(GEMV1_STATIC_SMEM));
    let tiles = rows.div_ceil(tr);
    let stages = (budget.saturating_sub(x_bytes) / stage_bytes)
        .min(GEMV1_MAX_STAGES)
        .min(tiles.max(2));
    if stages < 2 {
        return None;
    }
    // Every place filled, even where blocks then differ by a tile: giving every block the same
    // number of tiles (fewer blocks) measured no faster on the H200 (tg128 Q2_0 251.4 against
    // 254.6, Q1_0 276.2 against 277.2).
    Some(Gemv1Launch {
        rows_per_warp: t.rows_per_warp,
        stages,
        grid: tiles.min(sms.max(1) * t.blocks_per_sm.max(1)),
        smem_bytes: x_bytes + stages * stage_bytes,
        stage_bytes,
    })
}

/// The model's shapes as the kernels need them, checked against what the kernels support.
#[derive(Clone, Debug, PartialEq)]
pub struct Dims {
    pub hidden: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub rope_dims: usize,
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
    pub conv_kernel: usize,
    pub layers: Vec<LayerKind>,
    pub rms_eps: f32,
    pub rope_base: f32,
    pub context_length: usize,
}

impl Dims {
    pub fn from_config(c: &Config) -> Result<Dims> {
        let d = Dims {
            hidden: c.hidden,
            ffn: c.ffn,
            vocab: c.vocab,
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            rope_dims: c.rope_dims,
            key_heads: c.gdn_key_heads,
            value_heads: c.gdn_value_heads,
            key_dim: c.gdn_key_dim,
            value_dim: c.gdn_value_dim,
            conv_kernel: c.conv_kernel,
            layers: c.layers.clone(),
            rms_eps: c.rms_eps,
            rope_base: c.rope_base,
            context_length: c.context_length,
        };
        d.check()?;
        Ok(d)
    }

    fn check(&self) -> Result<()> {
        let bad = |s: String| Err(CudaError::Unsupported(s));
        if self.key_dim != 128 || self.value_dim != 128 {
            return bad(format!(
                "gated delta net head dims {}×{} (the kernels need 128×128)",
                self.key_dim, self.value_dim
            ));
        }
        if !self.head_dim.is_multiple_of(32) || self.head_dim > 256 {
            return bad(format!(
                "attention head dim {} (needs a multiple of 32, at most 256)",
                self.head_dim
            ));
        }
        let group = self.n_head / self.n_head_kv;
        if group > 8 {
            return bad(format!("{group} query heads per kv head (at most 8)"));
        }
        for (what, n) in [
            ("hidden", self.hidden),
            ("ffn", self.ffn),
            ("gdn inner", self.gdn_inner()),
            ("attention width", self.n_head * self.head_dim),
        ] {
            if n % 128 != 0 {
                return bad(format!("{what} width {n} is not a multiple of 128"));
            }
        }
        if self.conv_kernel < 2 || self.conv_kernel > 8 {
            return bad(format!("conv kernel {} (2..=8)", self.conv_kernel));
        }
        Ok(())
    }

    pub fn gdn_inner(&self) -> usize {
        self.value_heads * self.value_dim
    }
    pub fn conv_channels(&self) -> usize {
        2 * self.key_heads * self.key_dim + self.gdn_inner()
    }
    /// Rows of the stacked qkv | z | alpha | beta projection.
    pub fn gdn_in_rows(&self) -> usize {
        self.conv_channels() + self.gdn_inner() + 2 * self.value_heads
    }
    /// Rows of the stacked q+gate | k | v projection.
    pub fn attn_in_rows(&self) -> usize {
        2 * self.n_head * self.head_dim + 2 * self.n_head_kv * self.head_dim
    }
    pub fn ffn_in_rows(&self) -> usize {
        2 * self.ffn
    }
    pub fn proj_rows(&self) -> usize {
        self.gdn_in_rows()
            .max(self.attn_in_rows())
            .max(self.ffn_in_rows())
    }
    pub fn max_cols(&self) -> usize {
        self.hidden
            .max(self.ffn)
            .max(self.gdn_inner())
            .max(self.n_head * self.head_dim)
    }
    pub fn n_attention(&self) -> usize {
        self.layers
            .iter()
            .filter(|&&k| k == LayerKind::Attention)
            .count()
    }
    pub fn n_recurrent(&self) -> usize {
        self.layers.len() - self.n_attention()
    }
    /// Index of layer `il` among the layers of its kind.
    pub fn kind_index(&self, il: usize) -> usize {
        let kind = self.layers[il];
        self.layers[..il].iter().filter(|&&k| k == kind).count()
    }

    /// The `#define`s the kernels are compiled with, for the default attention ring.
    pub fn defines(&self) -> Vec<String> {
        self.defines_for(ATTN_RING_POSITIONS)
    }

    /// The `#define`s the kernels are compiled with, the attention ring holding `ring` cache
    /// positions per warp (see [`attn_ring_positions`]).
    pub fn defines_for(&self, ring: usize) -> Vec<String> {
        [
            ("HD", self.head_dim),
            ("NH", self.n_head),
            ("NKV", self.n_head_kv),
            ("ROPE", self.rope_dims),
            ("HK", self.key_heads),
            ("HV", self.value_heads),
            ("DK", self.key_dim),
            ("DV", self.value_dim),
            ("KERN", self.conv_kernel),
            ("NSPLIT", ATTN_SPLITS),
            ("AMINLEN", ATTN_MIN_SPLIT_LEN),
            ("ARING", ring),
            ("GEMV1_WARPS", GEMV1_WARPS),
            ("GEMV1_MAX_STAGES", GEMV1_MAX_STAGES),
            ("MM_WARPS", GEMM_WARPS),
            ("MM_BN", GEMM_TOKENS),
            ("MM_KC", GEMM_STAGE_VALUES),
            ("MM_STAGES", GEMM_STAGES),
            ("MM_WSTRIDE", GEMM_ROW_STRIDE),
        ]
        .iter()
        .map(|(k, v)| format!("-D{k}={v}"))
        .collect()
    }
}

/// How the attention layers cache keys and values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvCache {
    /// f16 values.
    #[default]
    F16,
    /// llama.cpp's q8_0: int8 values and one f16 scale per 32 (34 bytes per 32 values, 53% of
    /// f16), so a decode step at depth reads about half the cache bytes.
    Q8_0,
}

impl KvCache {
    /// Bytes of one cached value (scales apart).
    pub const fn value_bytes(self) -> usize {
        match self {
            KvCache::F16 => 2,
            KvCache::Q8_0 => 1,
        }
    }

    /// Bytes of the scales of a row of `head_dim` values.
    pub const fn scale_bytes(self, head_dim: usize) -> usize {
        match self {
            KvCache::F16 => 0,
            KvCache::Q8_0 => 2 * head_dim / 32,
        }
    }
}

/// Bytes of the per-sequence state for a context of `ctx` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateBytes {
    /// Conv state: `[recurrent layers][kernel − 1][channels]` f32.
    pub conv: usize,
    /// Recurrent state: `[recurrent layers][value heads][key dim][value dim]` f32.
    pub ssm: usize,
    /// K and V caches, from [`StateBytes::kv_offset`]: the values `[attention layers][ctx][kv
    /// heads][head dim]` of K then of V, then (q8_0) their scales `[layers][ctx][kv heads][head
    /// dim / 32]`, K then V.
    pub kv: usize,
    pub kv_cache: KvCache,
    /// Bytes of one layer's K (or V) values, and of its scales.
    pub kv_values: usize,
    pub kv_scales: usize,
}

impl StateBytes {
    pub fn new(d: &Dims, ctx: usize, kv_cache: KvCache) -> StateBytes {
        let g = d.n_recurrent();
        let rows = ctx * d.n_head_kv;
        let kv_values = rows * d.head_dim * kv_cache.value_bytes();
        let kv_scales = rows * kv_cache.scale_bytes(d.head_dim);
        StateBytes {
            conv: 4 * g * (d.conv_kernel - 1) * d.conv_channels(),
            ssm: 4 * g * d.value_heads * d.key_dim * d.value_dim,
            kv: 2 * d.n_attention() * (kv_values + kv_scales),
            kv_cache,
            kv_values,
            kv_scales,
        }
    }

    /// Where the caches start: after the recurrent states, 256-byte aligned (the attention
    /// kernels read 8- and 16-byte units).
    pub fn kv_offset(&self) -> usize {
        (self.conv + self.ssm).div_ceil(256) * 256
    }

    pub fn total(&self) -> usize {
        self.kv_offset() + self.kv
    }

    /// Offsets of attention layer `i`'s K values, V values, K scales and V scales (of `n`
    /// attention layers) from the start of the state.
    pub fn kv_layer(&self, i: usize, n: usize) -> [usize; 4] {
        let base = self.kv_offset();
        let scales = base + 2 * n * self.kv_values;
        [
            base + i * self.kv_values,
            base + (n + i) * self.kv_values,
            scales + i * self.kv_scales,
            scales + (n + i) * self.kv_scales,
        ]
    }
}

/// Named regions of one state's scratch memory, 256-byte aligned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scratch {
    pub regions: Vec<(&'static str, usize, usize)>,
    pub bytes: usize,
}

impl Scratch {
    pub fn new(d: &Dims, tokens: usize) -> Scratch {
        let t = tokens;
        let sizes = [
            ("x", 4 * t * d.hidden),
            ("xq", t * d.max_cols()),
            ("xs", 8 * t * d.max_cols() / 64),
            ("proj", 4 * t * d.proj_rows()),
            ("conv", 4 * t * d.conv_channels()),
            ("gdn", 4 * t * d.gdn_inner()),
            ("gdn_qk", 4 * t * 2 * d.key_heads * d.key_dim),
            ("gdn_gb", 8 * t * d.value_heads),
            ("q", 4 * t * d.n_head * d.head_dim),
            ("attn", 4 * t * d.n_head * d.head_dim),
            ("part", 4 * t * d.n_head * ATTN_SPLITS * (d.head_dim + 2)),
            ("logits", 4 * t * d.vocab),
            ("argmax", 8 * t),
            ("gemm_part", 4 * GEMM_MAX_SPLITS * t * d.hidden),
            ("pos", 8),
        ];
        let mut regions = Vec::new();
        let mut at = 0;
        for (name, n) in sizes {
            regions.push((name, at, n));
            at += n.div_ceil(256) * 256;
        }
        Scratch { regions, bytes: at }
    }

    fn region(&self, name: &str) -> &(&'static str, usize, usize) {
        self.regions
            .iter()
            .find(|r| r.0 == name)
            .unwrap_or_else(|| panic!("no scratch region {name}"))
    }

    /// Bytes of a region.
    pub fn size(&self, name: &str) -> usize {
        self.region(name).2
    }

    /// Byte offset of a region.
    pub fn offset(&self, name: &str) -> usize {
        self.region(name).1
    }
}

/// Fails with the numbers when `need` bytes do not fit in `free`.
pub fn check_fits(what: &str, parts: &[(&str, usize)], free: usize) -> Result<()> {
    let need: usize = parts.iter().map(|p| p.1).sum();
    if need <= free {
        return Ok(());
    }
    let mib = |b: usize| (b as u64).div_ceil(1 << 20);
    let breakdown = parts
        .iter()
        .map(|(n, b)| format!("{n} {} MiB", mib(*b)))
        .collect::<Vec<_>>()
        .join(", ");
    Err(CudaError::OutOfMemory {
        what: what.into(),
        need_mib: mib(need),
        free_mib: mib(free),
        breakdown,
    })
}

/// A packed matrix of the model, by role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mat {
    /// qkv | z | alpha | beta of a recurrent layer.
    GdnIn(usize),
    GdnOut(usize),
    /// q+gate | k | v of an attention layer.
    AttnIn(usize),
    AttnOut(usize),
    /// gate | up.
    FfnIn(usize),
    FfnDown(usize),
    Output,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Norm {
    Attn(usize),
    Post(usize),
    Output,
}

/// Where a GEMV writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Out {
    /// The projection buffer (overwritten).
    Proj,
    /// Added into the residual stream.
    Residual,
    /// The logits buffer (overwritten), with the per-token argmax when asked.
    Logits { argmax: bool },
}

/// One step of a forward call over `ntok` tokens (layer indices are model layer indices).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// RMS-norm tokens `tok0..tok0+ntok` of the residual and quantize them to int8.
    NormQuant {
        norm: Norm,
        tok0: usize,
        ntok: usize,
    },
    Gemv {
        mat: Mat,
        ntok: usize,
        out: Out,
    },
    /// One token: RMS norm + quantize inside the GEMV's own blocks (NormQuant then Gemv when
    /// the device has no fused kernel for the matrix).
    NormGemv {
        norm: Norm,
        tok0: usize,
        mat: Mat,
        out: Out,
    },
    Conv {
        layer: usize,
        ntok: usize,
    },
    /// Normalized q, k and the gates of every token of a multi-token pass, ahead of the step.
    GdnPrep {
        layer: usize,
        ntok: usize,
    },
    GdnStep {
        layer: usize,
        ntok: usize,
    },
    /// Per-head RMS norm · ssm_norm · silu(z), quantized.
    GatedQuant {
        layer: usize,
        ntok: usize,
    },
    /// q/k norms, RoPE, appending k and v to the cache.
    AttnPrep {
        layer: usize,
        ntok: usize,
    },
    AttnSplit {
        layer: usize,
        ntok: usize,
    },
    /// Merges the splits and applies the output gate.
    AttnCombine {
        layer: usize,
        ntok: usize,
    },
    /// Quantizes the attention output for its projection.
    PlainQuant {
        ntok: usize,
    },
    /// silu(gate) · up, quantized.
    SwigluQuant {
        ntok: usize,
    },
    ResetArgmax {
        ntok: usize,
    },
}

/// Which tokens of a call produce logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head {
    None,
    Last,
    All,
}

/// The launches of one forward pass over `ntok` tokens (at most [`MAX_CHUNK`]). With
/// `fuse_norm`, a one-token pass folds each norm into the GEMV that reads it.
pub fn forward_ops(d: &Dims, ntok: usize, head: Head, argmax: bool, fuse_norm: bool) -> Vec<Op> {
    assert!((1..=MAX_CHUNK).contains(&ntok));
    let mut ops = Vec::new();
    let fuse = fuse_norm && ntok == 1;
    for (il, kind) in d.layers.iter().enumerate() {
        ops.push(Op::NormQuant {
            norm: Norm::Attn(il),
            tok0: 0,
            ntok,
        });
        match kind {
            LayerKind::Recurrent => {
                ops.push(Op::Gemv {
                    mat: Mat::GdnIn(il),
                    ntok,
                    out: Out::Proj,
                });
                ops.push(Op::Conv { layer: il, ntok });
                if gdn_prepped(ntok) {
                    ops.push(Op::GdnPrep { layer: il, ntok });
                }
                ops.push(Op::GdnStep { layer: il, ntok });
                ops.push(Op::GatedQuant { layer: il, ntok });
                ops.push(Op::Gemv {
                    mat: Mat::GdnOut(il),
                    ntok,
                    out: Out::Residual,
                });
            }
            LayerKind::Attention => {
                ops.push(Op::Gemv {
                    mat: Mat::AttnIn(il),
                    ntok,
                    out: Out::Proj,
                });
                ops.push(Op::AttnPrep { layer: il, ntok });
                ops.push(Op::AttnSplit { layer: il, ntok });
                ops.push(Op::AttnCombine { layer: il, ntok });
                ops.push(Op::PlainQuant { ntok });
                ops.push(Op::Gemv {
                    mat: Mat::AttnOut(il),
                    ntok,
                    out: Out::Residual,
                });
            }
        }
        ops.push(Op::NormQuant {
            norm: Norm::Post(il),
            tok0: 0,
            ntok,
        });
        ops.push(Op::Gemv {
            mat: Mat::FfnIn(il),
            ntok,
            out: Out::Proj,
        });
        ops.push(Op::SwigluQuant { ntok });
        ops.push(Op::Gemv {
            mat: Mat::FfnDown(il),
            ntok,
            out: Out::Residual,
        });
    }
    let (tok0, n) = match head {
        Head::None => return ops,
        Head::Last => (ntok - 1, 1),
        Head::All => (0, ntok),
    };
    if argmax {
        ops.push(Op::ResetArgmax { ntok: n });
    }
    ops.push(Op::NormQuant {
        norm: Norm::Output,
        tok0,
        ntok: n,
    });
    ops.push(Op::Gemv {
        mat: Mat::Output,
        ntok: n,
        out: Out::Logits { argmax },
    });
    if fuse {
        fuse_norms(&mut ops);
    }
    ops
}

/// Replaces each one-token NormQuant directly followed by a GEMV with a NormGemv.
fn fuse_norms(ops: &mut Vec<Op>) {
    let mut out = Vec::with_capacity(ops.len());
    let mut i = 0;
    while i < ops.len() {
        match (ops[i], ops.get(i + 1)) {
            (
                Op::NormQuant {
                    norm,
                    tok0,
                    ntok: 1,
                },
                Some(&Op::Gemv {
                    mat,
                    ntok: 1,
                    out: o,
                }),
            ) => {
                out.push(Op::NormGemv {
                    norm,
                    tok0,
                    mat,
                    out: o,
                });
                i += 2;
            }
            (op, _) => {
                out.push(op);
                i += 1;
            }
        }
    }
    *ops = out;
}

/// Kernel launches an op list makes with the dp4a kernels (a GEMV over more than
/// [`GEMV_TOKENS`] tokens is several; the tensor-core GEMM makes one, or two when split).
pub fn launches(ops: &[Op]) -> usize {
    ops.iter()
        .map(|op| match op {
            Op::Gemv { ntok, .. } => ntok.div_ceil(GEMV_TOKENS),
            _ => 1,
        })
        .sum()
}

/// Whether a pass of `ntok` tokens prepares the recurrence's state-independent parts in a
/// kernel of their own (a one-token step computes them inline: one launch fewer).
pub const fn gdn_prepped(ntok: usize) -> bool {
    ntok > 1
}

/// For each matrix a forward pass multiplies by, the one multiplied next (the last one's is the
/// first: a decode step's next token starts again at the first layer).
pub fn next_matrices(ops: &[Op]) -> Vec<(Mat, Mat)> {
    let mats: Vec<Mat> = ops
        .iter()
        .filter_map(|op| match *op {
            Op::Gemv { mat, .. } | Op::NormGemv { mat, .. } => Some(mat),
            _ => None,
        })
        .collect();
    mats.iter()
        .enumerate()
        .map(|(i, &m)| (m, mats[(i + 1) % mats.len()]))
        .collect()
}

/// Splits a call of `n` tokens into GPU passes of at most [`MAX_CHUNK`].
pub fn chunks(n: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n)
        .step_by(MAX_CHUNK)
        .map(move |s| (s, MAX_CHUNK.min(n - s)))
}

/// Cache positions per split that a multi-token pass aims for (a one-token pass uses the
/// device's [`attn_decode_splits`]: its graph is replayed at every context length).
pub const ATTN_PASS_SPLIT_LEN: usize = 256;

/// Splits of the attention kernel for a pass of `ntok` tokens ending at context `n_ctx`
/// (`decode`: the one-token figure from [`attn_decode_splits`]). Each split of each token
/// writes a partial row of `head_dim + 2` floats per head: at 128 splits a 256-token prefill
/// pass wrote (and merged) 0.8 GB per layer for contexts of a few hundred.
pub fn attn_splits(n_ctx: usize, ntok: usize, decode: usize) -> usize {
    if ntok == 1 {
        decode.clamp(1, ATTN_SPLITS)
    } else {
        n_ctx.div_ceil(ATTN_PASS_SPLIT_LEN).clamp(1, ATTN_SPLITS)
    }
}

/// Splits per kv head of a one-token pass: as many blocks as the device holds at once
/// (`blocks_per_sm` of the split kernel on each of `sms` multiprocessors), so that a long
/// context is one wave. At 128 splits (512 blocks for 4 kv heads against 396 places on an H200)
/// the last 116 blocks ran as a second wave, nearly doubling the kernel's time.
pub fn attn_decode_splits(blocks_per_sm: usize, sms: usize, n_head_kv: usize) -> usize {
    (blocks_per_sm * sms / n_head_kv.max(1)).clamp(1, ATTN_SPLITS)
}

/// Cache positions per split of a context of `n_ctx` split `nsplit` ways (the kernels'
/// `attn_split_len`): splits from `n_ctx.div_ceil(len)` on are empty and never merged.
pub fn attn_split_len(n_ctx: usize, nsplit: usize) -> usize {
    n_ctx.div_ceil(nsplit).max(ATTN_MIN_SPLIT_LEN)
}

/// An attention-split launch: kernel, threads per block, dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnLaunch {
    pub kernel: &'static str,
    pub threads: usize,
    pub smem_bytes: usize,
}

/// The attention ring a device can hold: [`ATTN_RING_POSITIONS`] when an f16 block of the SIMT
/// split fits the per-block shared-memory limit `smem_limit`, else the small one.
pub fn attn_ring_positions(d: &Dims, smem_limit: usize) -> usize {
    let f16 = attn_split_launch(d, KvCache::F16, 8, ATTN_RING_POSITIONS);
    if f16.smem_bytes + ATTN_STATIC_SMEM <= smem_limit {
        ATTN_RING_POSITIONS
    } else {
        ATTN_RING_POSITIONS_SMALL
    }
}

/// The attention-split kernel for a cache type and tile size (one of [`ATTN_TILES`]) and what
/// it needs, with a ring of `ring` positions per warp: each warp's ring of staged keys and values
/// (and q8_0 scales), reused for the merge of the warps' accumulators; the tensor-core kernel
/// (its own ring) also stages the queries and its weights.
pub fn attn_split_launch(d: &Dims, kv: KvCache, tile: usize, ring: usize) -> AttnLaunch {
    let gqa = d.n_head / d.n_head_kv;
    let merge = |warps: usize| 4 * warps * gqa * (d.head_dim + 2);
    let row = d.head_dim * kv.value_bytes() + kv.scale_bytes(d.head_dim);
    let simt = |kernel| AttnLaunch {
        kernel,
        threads: 32 * ATTN_WARPS,
        smem_bytes: (ATTN_WARPS * ring * 2 * row).max(merge(ATTN_WARPS)),
    };
    match (kv, tile) {
        (KvCache::F16, 16) => {
            let w = ATTN_MMA_WARPS;
            let rings = w * ATTN_MMA_STAGES * 2 * ATTN_MMA_TILE * (2 * d.head_dim + 16);
            let queries = 2 * 8 * (d.head_dim + 8) * 2;
            let weights = w * 2 * 8 * 24 * 2;
            AttnLaunch {
                kernel: "attn_split_mma",
                threads: 32 * w,
                smem_bytes: rings.max(merge(w)) + queries + weights,
            }
        }
        (KvCache::F16, 4) => simt("attn_split_t4"),
        (KvCache::Q8_0, 4) => simt("attn_split_q8_t4"),
        (KvCache::F16, _) => simt("attn_split_t8"),
        (KvCache::Q8_0, _) => simt("attn_split_q8_t8"),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use model::synth::Preset;

    pub(crate) fn dims(p: Preset) -> Dims {
        let s = p.shape(248_320);
        let layers = (0..s.n_layers)
            .map(|il| {
                if (il + 1) % s.full_attention_interval == 0 {
                    LayerKind::Attention
                } else {
                    LayerKind::Recurrent
                }
            })
            .collect();
        Dims::from_config(&Config {
            n_layers: s.n_layers,
            hidden: s.hidden,
            ffn: s.ffn,
            vocab: s.vocab,
            context_length: s.context_length,
            rms_eps: 1e-6,
            n_head: s.n_head,
            n_head_kv: s.n_head_kv,
            head_dim: s.head_dim,
            rope_base: 1e7,
            rope_dims: s.rope_dims,
            conv_kernel: s.conv_kernel,
            gdn_key_heads: s.gdn_key_heads,
            gdn_key_dim: s.gdn_key_dim,
            gdn_value_heads: s.gdn_value_heads,
            gdn_value_dim: s.gdn_value_dim,
            layers,
        })
        .unwrap()
    }

    #[test]
    fn the_27b_shapes_are_supported_and_stack_as_expected() {
        let d = dims(Preset::B27);
        assert_eq!((d.n_recurrent(), d.n_attention()), (48, 16));
        assert_eq!(d.conv_channels(), 10240);
        assert_eq!(d.gdn_in_rows(), 10240 + 6144 + 96);
        assert_eq!(d.attn_in_rows(), 2 * 24 * 256 + 2 * 4 * 256);
        assert_eq!(d.proj_rows(), 2 * 17408);
        assert_eq!(d.kind_index(3), 0);
        assert_eq!(d.kind_index(4), 3);
        assert_eq!(d.kind_index(63), 15);
    }

    #[test]
    fn a_full_262k_context_fits_beside_the_27b_weights_on_an_h200() {
        let d = dims(Preset::B27);
        let s = StateBytes::new(&d, 262_144, KvCache::F16);
        // 16 layers × 262144 × 4 kv heads × 256 × 2 (K, V) × 2 bytes = 16 GiB.
        assert_eq!(s.kv, 16 << 30);
        // q8_0: 256 bytes of values and 16 of scales per row instead of 512.
        let q = StateBytes::new(&d, 262_144, KvCache::Q8_0);
        assert_eq!(q.kv, (16 << 30) / 512 * 272);
        let [k, v, ks, vs] = q.kv_layer(15, 16);
        assert_eq!(k % 256, 0);
        assert_eq!(v + q.kv_values, 2 * 16 * q.kv_values + q.kv_offset());
        assert_eq!(ks, v + q.kv_values + 15 * q.kv_scales);
        assert_eq!(vs + q.kv_scales, q.total());
        assert_eq!(s.ssm, 48 * 48 * 128 * 128 * 4);
        let scratch = Scratch::new(&d, MAX_CHUNK).bytes;
        let weights = 7_600_000_000usize;
        let h200_free = 139usize << 30;
        check_fits(
            "27B",
            &[
                ("weights", weights),
                ("state", s.total()),
                ("scratch", scratch),
            ],
            h200_free,
        )
        .unwrap();
    }

    #[test]
    fn an_allocation_that_does_not_fit_is_an_error_with_numbers() {
        let err = check_fits("state", &[("kv", 3 << 30), ("ssm", 1 << 20)], 2 << 30).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("3073 MiB") && msg.contains("2048 MiB free"),
            "{msg}"
        );
        assert!(msg.contains("kv 3072 MiB"), "{msg}");
    }

    #[test]
    fn unsupported_shapes_are_refused_by_name() {
        let mut d = dims(Preset::Tiny);
        d.value_dim = 64;
        assert!(d.check().unwrap_err().to_string().contains("128×128") || d.check().is_err());
        let mut d = dims(Preset::Tiny);
        d.head_dim = 48;
        assert!(d.check().unwrap_err().to_string().contains("head dim 48"));
    }

    #[test]
    fn a_decode_token_is_a_few_hundred_launches() {
        let d = dims(Preset::B27);
        let ops = forward_ops(&d, 1, Head::Last, true, false);
        // 10 per recurrent layer, 11 per attention layer, then reset + norm + LM head.
        assert_eq!(ops.len(), 48 * 10 + 16 * 11 + 3);
        assert_eq!(launches(&ops), ops.len());
        assert!(matches!(
            ops.last(),
            Some(Op::Gemv {
                mat: Mat::Output,
                ntok: 1,
                out: Out::Logits { argmax: true }
            })
        ));
    }

    #[test]
    fn fusing_the_norms_removes_one_launch_per_norm_and_keeps_the_order() {
        let d = dims(Preset::B27);
        let plain = forward_ops(&d, 1, Head::Last, true, false);
        let fused = forward_ops(&d, 1, Head::Last, true, true);
        // Two norms per layer and the output norm.
        assert_eq!(plain.len() - fused.len(), 2 * 64 + 1);
        assert!(!fused.iter().any(|o| matches!(o, Op::NormQuant { .. })));
        let unfused: Vec<Op> = fused
            .iter()
            .flat_map(|op| match *op {
                Op::NormGemv {
                    norm,
                    tok0,
                    mat,
                    out,
                } => vec![
                    Op::NormQuant {
                        norm,
                        tok0,
                        ntok: 1,
                    },
                    Op::Gemv { mat, ntok: 1, out },
                ],
                op => vec![op],
            })
            .collect();
        assert_eq!(unfused, plain);
        // Prefill passes keep their separate norms.
        let prefill = forward_ops(&d, 8, Head::Last, false, true);
        assert!(!prefill.iter().any(|o| matches!(o, Op::NormGemv { .. })));
    }

    #[test]
    fn prefill_norms_only_the_tokens_that_need_logits() {
        let d = dims(Preset::Small);
        let ops = forward_ops(&d, 20, Head::Last, false, true);
        assert!(ops.contains(&Op::NormQuant {
            norm: Norm::Output,
            tok0: 19,
            ntok: 1
        }));
        assert!(!ops.iter().any(|o| matches!(o, Op::ResetArgmax { .. })));
        let none = forward_ops(&d, 20, Head::None, false, true);
        assert!(!none.iter().any(|o| matches!(
            o,
            Op::Gemv {
                mat: Mat::Output,
                ..
            }
        )));
        // A 20-token GEMV is three launches of up to 8 tokens.
        assert_eq!(
            launches(&[Op::Gemv {
                mat: Mat::Output,
                ntok: 20,
                out: Out::Proj
            }]),
            3
        );
    }

    #[test]
    fn every_layer_reads_what_an_earlier_op_wrote() {
        let d = dims(Preset::Tiny);
        let ops = forward_ops(&d, 3, Head::All, false, true);
        let mut proj_writer = None;
        for op in &ops {
            match *op {
                Op::Gemv {
                    mat,
                    out: Out::Proj,
                    ..
                } => proj_writer = Some(mat),
                Op::Conv { layer, .. } => assert_eq!(proj_writer, Some(Mat::GdnIn(layer))),
                Op::GdnPrep { layer, .. } => assert_eq!(proj_writer, Some(Mat::GdnIn(layer))),
                Op::AttnPrep { layer, .. } => assert_eq!(proj_writer, Some(Mat::AttnIn(layer))),
                Op::SwigluQuant { .. } => assert!(matches!(proj_writer, Some(Mat::FfnIn(_)))),
                _ => {}
            }
        }
    }

    #[test]
    fn scratch_regions_are_aligned_and_disjoint() {
        let d = dims(Preset::B27);
        let s = Scratch::new(&d, MAX_CHUNK);
        let mut end = 0;
        for &(name, at, n) in &s.regions {
            assert_eq!(at % 256, 0, "{name}");
            assert!(at >= end, "{name} overlaps");
            end = at + n;
        }
        assert!(s.bytes >= end);
        assert_eq!(s.offset("x"), 0);
    }

    #[test]
    fn decode_gemv_plans_fit_the_shared_memory_limit_for_every_27b_matrix() {
        let d = dims(Preset::B27);
        let shapes = [
            (d.gdn_in_rows(), d.hidden),
            (d.hidden, d.gdn_inner()),
            (d.attn_in_rows(), d.hidden),
            (d.ffn_in_rows(), d.hidden),
            (d.hidden, d.ffn),
            (d.vocab, d.hidden),
        ];
        for f in [GpuFormat::Q1, GpuFormat::Q2G64, GpuFormat::Q2G128] {
            for (rows, cols) in shapes {
                let t = Gemv1Tuning::for_shape(f, cols);
                // Only the GEMVs behind a norm (never ffn_down, behind SwiGLU) fold it in.
                let fused = cols != d.ffn;
                let l = gemv1_launch(f, rows, cols, t, 132, 227 << 10, fused).unwrap();
                assert!(l.smem_bytes <= t.smem_budget, "{f:?} {rows}×{cols}: {l:?}");
                assert!((2..=GEMV1_MAX_STAGES).contains(&l.stages), "{l:?}");
                assert!(l.grid <= 132 * t.blocks_per_sm && l.grid >= 1);
                assert_eq!(l.stage_bytes % 128, 0);
            }
        }
    }

    #[test]
    fn decode_gemv_tiles_copy_whole_16_byte_units() {
        // Bulk copies need 16-byte multiples: the scales of a tile (8·rw rows × scales per row
        // × 2 bytes) are, for any row width the GPU layouts accept.
        for f in [GpuFormat::Q1, GpuFormat::Q2G64, GpuFormat::Q2G128] {
            for cols in [64, 128, 256, 384, 5120, 17408] {
                if !f.fits(cols) {
                    continue;
                }
                for rw in [1, 2] {
                    let tr = GEMV1_WARPS * rw;
                    assert_eq!(tr * (cols / f.scale_values()) * 2 % 16, 0);
                    assert_eq!(TILE_PAD_ROWS % tr, 0);
                }
            }
        }
    }

    #[test]
    fn a_prefill_pass_prepares_each_recurrence_and_a_decode_step_does_not() {
        let d = dims(Preset::Tiny);
        for ntok in [1, 3] {
            let ops = forward_ops(&d, ntok, Head::Last, false, false);
            let steps: Vec<usize> = ops
                .iter()
                .enumerate()
                .filter(|(_, op)| matches!(op, Op::GdnStep { .. }))
                .map(|(i, _)| i)
                .collect();
            assert_eq!(steps.len(), d.n_recurrent());
            for i in steps {
                let (Op::GdnStep { layer, .. }, prev) = (ops[i], ops[i - 1]) else {
                    unreachable!()
                };
                assert_eq!(prev == Op::GdnPrep { layer, ntok }, gdn_prepped(ntok));
            }
            let preps = ops
                .iter()
                .filter(|op| matches!(op, Op::GdnPrep { .. }))
                .count();
            assert_eq!(preps, if ntok == 1 { 0 } else { d.n_recurrent() });
        }
    }

    #[test]
    fn every_gemm_variant_is_a_kernel_and_named_as_such() {
        for f in GpuFormat::ALL {
            for mi in GEMM_MI {
                let name = format!("gemm_{}_m{mi}", f.kernel_name());
                assert!(crate::compile::KERNELS.contains(&name.as_str()), "{name}");
                assert_eq!(gemm_variant(&name), Some(mi));
            }
        }
        let variants = crate::compile::KERNELS
            .iter()
            .filter(|k| gemm_variant(k).is_some())
            .count();
        assert_eq!(variants, GpuFormat::ALL.len() * GEMM_MI.len());
        assert_eq!(gemm_variant("gemm_reduce"), None);
        assert_eq!(gemm_variant("gemv_q1_t8"), None);
    }

    #[test]
    fn gemm_stages_fit_and_fragment_loads_are_conflict_free() {
        for f in GpuFormat::ALL {
            assert!(GEMM_STAGE_VALUES.is_multiple_of(f.chunk_values()));
        }
        for mi in GEMM_MI {
            let smem = gemm_smem_bytes(mi);
            // Every sm_80+ part allows 99 KiB per block (sm_80 and sm_90 more), and the H200
            // fits 3 − mi blocks, as `gemm_splits` assumes.
            assert!(smem <= 99 << 10, "{mi}: {smem}");
            assert!((3 - mi) * (smem + 1024) <= 228 << 10, "{mi}: {smem}");
            // cp.async targets and ldmatrix rows are 16-byte aligned in every stage.
            assert_eq!(smem % (16 * GEMM_STAGES), 0);
            let kc = GEMM_STAGE_VALUES;
            assert_eq!((kc + 16) % 16, 0);
            // The 8 rows of a 16-byte ldmatrix phase land in 8 distinct groups of 4 banks.
            let banks: std::collections::HashSet<_> =
                (0..8).map(|r| r * (kc + 16) / 16 % 8).collect();
            assert_eq!(banks.len(), 8);
        }
        let banks: std::collections::HashSet<_> =
            (0..8).map(|r| r * GEMM_ROW_STRIDE / 16 % 8).collect();
        assert_eq!(banks.len(), 8);
        assert_eq!(gemm_grid(5120, MAX_CHUNK, 2), (4, 20));
        assert_eq!(gemm_grid(1001, 17, 2), (1, 4));
        assert_eq!(gemm_grid(1001, 17, 1), (1, 8));
        let cap = GEMM_MAX_SPLITS * MAX_CHUNK * 5120;
        assert_eq!(gemm_splits(5120, 17408, MAX_CHUNK, 2, 132, cap), 3);
        assert_eq!(gemm_splits(5120, 6144, MAX_CHUNK, 1, 132, cap), 3);
        assert_eq!(gemm_splits(34816, 5120, MAX_CHUNK, 2, 132, cap), 1);
        // No room for the partial sums, or too few stages to share: no split.
        assert_eq!(gemm_splits(5120, 17408, MAX_CHUNK, 2, 132, cap / 4), 1);
        assert_eq!(gemm_splits(5120, 256, MAX_CHUNK, 2, 132, cap), 1);
    }

    #[test]
    fn a_row_too_wide_for_two_stages_falls_back_to_the_plain_kernel() {
        let t = Gemv1Tuning {
            rows_per_warp: 2,
            smem_budget: 48 << 10,
            blocks_per_sm: 1,
        };
        assert!(gemv1_launch(GpuFormat::Q2G64, 5120, 17408, t, 132, 227 << 10, false).is_none());
        let small = gemv1_launch(GpuFormat::Q2G64, 3, 64, t, 132, 227 << 10, false).unwrap();
        assert_eq!((small.grid, small.stages), (1, 2));
    }

    #[test]
    fn the_attention_split_memory_holds_the_rings_and_the_merge() {
        let d = dims(Preset::B27);
        let l = |kv, tile| attn_split_launch(&d, kv, tile, ATTN_RING_POSITIONS);
        assert_eq!(l(KvCache::F16, 8).smem_bytes, 4 * 16 * 2 * 512);
        assert_eq!(l(KvCache::Q8_0, 4).smem_bytes, 4 * 16 * 2 * (256 + 16));
        assert_eq!(l(KvCache::Q8_0, 8).kernel, "attn_split_q8_t8");
        // The tensor-core kernel reads f16 caches only: q8_0 takes the SIMT kernel.
        assert_eq!(l(KvCache::Q8_0, 16).kernel, "attn_split_q8_t8");
        let mma = l(KvCache::F16, 16);
        assert_eq!((mma.kernel, mma.threads), ("attn_split_mma", 64));
        assert_eq!(
            mma.smem_bytes,
            2 * 2 * 2 * 16 * 528 + 2 * 8 * 264 * 2 + 2 * 2 * 8 * 24 * 2
        );
        for p in [Preset::Tiny, Preset::Small, Preset::B27] {
            let d = dims(p);
            let gqa = d.n_head / d.n_head_kv;
            for kv in [KvCache::F16, KvCache::Q8_0] {
                for tile in ATTN_TILES {
                    let a = attn_split_launch(&d, kv, tile, ATTN_RING_POSITIONS_SMALL);
                    let warps = a.threads / 32;
                    assert!(
                        a.smem_bytes >= 4 * warps * gqa * (d.head_dim + 2),
                        "{p:?} {kv:?} {tile}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_device_with_64_kib_per_block_gets_the_small_attention_ring() {
        let d = dims(Preset::B27);
        assert_eq!(attn_ring_positions(&d, 227 << 10), ATTN_RING_POSITIONS);
        assert_eq!(attn_ring_positions(&d, 64 << 10), ATTN_RING_POSITIONS_SMALL);
        let small = attn_split_launch(&d, KvCache::F16, 8, ATTN_RING_POSITIONS_SMALL);
        assert!(small.smem_bytes + ATTN_STATIC_SMEM <= 48 << 10);
        // Smaller models keep the full ring within the 48 KiB every device has.
        assert_eq!(
            attn_ring_positions(&dims(Preset::Small), 48 << 10),
            ATTN_RING_POSITIONS
        );
    }

    #[test]
    fn each_matrix_is_followed_by_the_next_one_multiplied() {
        let d = dims(Preset::Tiny);
        let next = next_matrices(&forward_ops(&d, 1, Head::Last, true, false));
        let first = d
            .layers
            .iter()
            .position(|k| *k == LayerKind::Attention)
            .unwrap();
        assert_eq!(next[0].1, next[1].0);
        assert!(next.contains(&(Mat::FfnIn(0), Mat::FfnDown(0))));
        assert!(next.contains(&(Mat::AttnIn(first), Mat::AttnOut(first))));
        let last = d.layers.len() - 1;
        assert!(next.contains(&(Mat::FfnDown(last), Mat::Output)));
        // The next token starts again at the first layer's input projection.
        assert_eq!(next.last().unwrap(), &(Mat::Output, next[0].0));
        assert_eq!(next.len(), 4 * d.layers.len() + 1);
    }

    #[test]
    fn calls_are_cut_into_chunks() {
        let c: Vec<_> = chunks(2 * MAX_CHUNK + 22).collect();
        assert_eq!(
            c,
            vec![(0, MAX_CHUNK), (MAX_CHUNK, MAX_CHUNK), (2 * MAX_CHUNK, 22)]
        );
        assert_eq!(attn_split_len(1, ATTN_SPLITS), ATTN_MIN_SPLIT_LEN);
        assert_eq!(attn_splits(5, 1, 99), 99);
        assert_eq!(attn_splits(5, 1, 1000), ATTN_SPLITS);
        assert_eq!(attn_splits(300, 256, 99), 2);
        assert_eq!(attn_splits(1 << 20, 256, 99), ATTN_SPLITS);
        assert_eq!(attn_splits(17, 17, 99), 1);
        // One wave: 3 blocks on each of 132 multiprocessors, 4 kv heads.
        assert_eq!(attn_decode_splits(3, 132, 4), 99);
        assert_eq!(attn_decode_splits(0, 132, 4), 1);
        assert_eq!(attn_decode_splits(16, 132, 4), ATTN_SPLITS);
        // Short contexts: one split; long ones: every split, each a share of the context.
        assert_eq!(attn_split_len(100, ATTN_SPLITS), ATTN_MIN_SPLIT_LEN);
        assert_eq!(attn_split_len(32768, ATTN_SPLITS), 256);
        assert_eq!(
            32768usize.div_ceil(attn_split_len(32768, ATTN_SPLITS)),
            ATTN_SPLITS
        );
        assert_eq!(attn_split_len(ATTN_SPLITS * 40 + 1, ATTN_SPLITS), 41);
    }
}
