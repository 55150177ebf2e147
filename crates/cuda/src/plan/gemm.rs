//! The tensor-core prefill GEMM: tile shapes, shared memory, grids and splits along K.

use super::*;
use crate::tma::{Elem, Swizzle, Tile};

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
/// Passes of fewer tokens use the dp4a kernels, where [`short_passes`] has no figure for the
/// format: a GEMM tile of 64 tokens would mostly idle.
pub const GEMM_MIN_TOKENS: usize = 16;
/// Passes of 2 to this many tokens run token by token as one-token passes (their graphs, the
/// decode GEMVs), where no pass asks for every token's logits; 0: never. Where
/// [`short_passes`] has no figure for the format.
pub const STEP_TOKENS: usize = 0;
/// Passes of up to this many tokens launch with programmatic dependent launch; longer ones
/// plainly stream-ordered (`gpu::serial_launches`), where dependents resident early beside
/// long kernels (the 64-token recurrent step) measured 17% slower pp512. An H100, the 27B
/// synthetic files, ms a pass with PDL against without: the dp4a kernels' passes 2-4% faster
/// (Q2_0 3 / 4 / 5 tokens: 9.43 / 10.66 / 11.84 against 9.79 / 10.95 / 12.14) and the GEMM's
/// 5-7-token passes 2% (Q1_0: 11.19 / 11.30 / 11.39 against 11.43 / 11.61 / 11.65); level at
/// 8-16 tokens, slower from 32 (Q1_0 14.02 against 13.32).
pub const PDL_TOKENS: usize = 7;

/// How a model's passes of 2 to 15 tokens run: token by token as one-token passes (the same
/// bits as one call a token) up to `step` tokens, on the tensor cores from `gemm_from` tokens,
/// else on the dp4a kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShortPasses {
    pub step: usize,
    pub gemm_from: usize,
}

/// [`ShortPasses`] by the layers' format, each the fastest form measured at each length (an
/// H100, the 27B synthetic files, ms a pass; the f16 GEMM in its narrow tiles, two blocks a
/// multiprocessor up to [`F16_TWO_BLOCK_TOKENS`]):
/// - Q1_0: token by token 4.71 / 6.94-6.96 at 2 / 3 tokens against the GEMM's 7.67-7.75 /
///   7.77-7.78; the GEMM from 4 (8.49-8.51 against 9.20-9.21 token by token; 8.54-8.60 at 5;
///   its cost grows slowly from 4 to 16 tokens, where a token by token pass adds about 2.3 a
///   token). Earlier, before the GEMM's stage took fewer instructions: the dp4a kernels' 9.89
///   / 12.31 / 14.57 at 2 / 3 / 4 tokens. With the ring unrolled, level at 3 (6.92 GEMM
///   against 6.93 token by token; 6.88 against 4.70 at 2).
/// - Q2_0 g64: token by token at 2 (6.87 against 9.17-9.30 GEMM and, earlier, 8.63 dp4a); the
///   GEMM from 3: with its ring unrolled 8.57 at 3 against the dp4a kernels' 9.33 (before,
///   10.06-10.09 against 9.41-9.48 and, earlier, 10.59 token by token); 9.89-9.91 at 4
///   against 10.65-10.72 dp4a.
/// - The 128-value 2-bit layout (PQ2_0, PTQ1_0, legacy Q2_0), measured on PQ2_0 with the GEMM's
///   ring unrolled: token by token at 2 (6.60 against the dp4a kernels' 7.53 and the GEMM's
///   7.83); the GEMM from 3 (7.94 against 8.79 dp4a and 9.81 token by token; 8.71 against
///   10.07 at 4, 9.63 against 15.18 at 8).
///
/// Q1_0 and Q2_0 g64: the sixty-sixth session's side by side, two rounds on one machine, and
/// the sixty-seventh's with the ring unrolled (one round); PQ2_0: the sixty-seventh's.
/// `NIWAKI_CUDA_STEP_TOKENS` and `NIWAKI_CUDA_GEMM_MIN_TOKENS` set both for any format.
pub fn short_passes(format: GpuFormat) -> ShortPasses {
    match format {
        GpuFormat::Q1 => ShortPasses {
            step: 3,
            gemm_from: 4,
        },
        GpuFormat::Q2G64 => ShortPasses {
            step: 2,
            gemm_from: 3,
        },
        GpuFormat::Q2G128 => ShortPasses {
            step: 2,
            gemm_from: 3,
        },
    }
}

impl ShortPasses {
    /// The rule of a model without layers to measure by.
    pub const UNMEASURED: ShortPasses = ShortPasses {
        step: STEP_TOKENS,
        gemm_from: GEMM_MIN_TOKENS,
    };
}

/// The GEMM kernel variants: 16-row mma tiles per warp.
pub const GEMM_MI: [usize; 2] = [1, 2];
/// The variant multi-token passes use.
pub const GEMM_DEFAULT_MI: usize = 2;

/// The f16 GEMM (`hgemm_*_w<wg>_n<tokens>`, kernels/hgemm.cu): warpgroups of a block (each
/// owns 64 rows for all the block's tokens; a variant per count), tokens of a block's output
/// tile (a variant per count: one wgmma multiplies a warpgroup's rows by all of them, so a
/// short pass in a wide tile pays for tokens it does not have), values of every row per stage,
/// pipeline stages. One block fills a multiprocessor's registers.
pub const HGEMM_WARPGROUPS: [usize; 2] = [3, 4];
pub const HGEMM_TOKENS: [usize; 4] = [16, 32, 64, 128];
/// The widest of [`HGEMM_TOKENS`]: long passes' tiles.
pub const HGEMM_WIDEST: usize = HGEMM_TOKENS[HGEMM_TOKENS.len() - 1];
pub const HGEMM_STAGE_VALUES: usize = 128;
pub const HGEMM_STAGES: usize = 5;
/// Shared-memory bytes of an f16-GEMM stage beyond its tokens' f16 activations: per warpgroup
/// two 16-byte chunk slots per row and 8 bytes a thread for the weight scales (its own four
/// where threads load their own; where they come in stage order, [`hgemm_stage_scales`], the
/// block's rows' few of them; kernels/hgemm.cu asserts the same).
pub const HGEMM_STAGE_PER_WG: usize = 64 * 32 + 128 * 8;

/// Shared-memory bytes of an f16-GEMM stage of `wg` warpgroups and `tokens` tokens.
pub const fn hgemm_stage_bytes(wg: usize, tokens: usize) -> usize {
    tokens * 2 * HGEMM_STAGE_VALUES + wg * HGEMM_STAGE_PER_WG
}

/// Whether passes take the f16 GEMM's narrower tiles ([`hgemm_tokens_for`]) or always the
/// widest (`NIWAKI_CUDA_HGEMM_NARROW` sets it). The harness's GEMM checks pass for every
/// tile and format (an H100), and 16-64-token passes were faster in them on both formats
/// measured (ms a pass, 27B Q1_0: 11.81 / 13.29 / 17.31 at 16 / 32 / 64 tokens against
/// 17.28 / 18.03 / 19.81 in 128-token tiles; Q2_0: 12.87 / 14.26 / 17.85 against 18.92 /
/// 19.46 / 20.19).
pub const HGEMM_NARROW: bool = true;

/// The tokens of the f16 GEMM's tile for a pass of `ntok`: the fewest that hold them all, else
/// the widest.
pub fn hgemm_tokens_for(ntok: usize) -> usize {
    HGEMM_TOKENS
        .iter()
        .copied()
        .find(|&t| t >= ntok)
        .unwrap_or(HGEMM_WIDEST)
}
/// Shared memory the f16 GEMM needs beyond its stages: 1 KiB to align them (the 128-byte
/// swizzle repeats every 1024 bytes of address) and a `full` and an `empty` barrier per stage.
pub const HGEMM_TMA_EXTRA: usize = 1024 + 16 * HGEMM_STAGES;
const _: () = {
    let mut i = 0;
    while i < HGEMM_TOKENS.len() {
        let t = HGEMM_TOKENS[i];
        assert!(t.is_multiple_of(16));
        assert!(hgemm_stage_bytes(3, t).is_multiple_of(1024));
        assert!(hgemm_stage_bytes(4, t).is_multiple_of(1024));
        i += 1;
    }
};

/// The TMA box of a weight matrix for the f16 GEMM with `wg` warpgroups: the codes of a
/// stage (16 bytes a row for 1-bit, 32 for 2-bit, with the 32-byte swizzle that keeps a warp's
/// code loads on distinct banks) for a block's 64·`wg` rows.
pub fn hgemm_weight_tile(format: GpuFormat, rows: usize, cols: usize, wg: usize) -> Tile {
    let row_bytes = cols / format.chunk_values() * 16;
    let stage_bytes = HGEMM_STAGE_VALUES / format.chunk_values() * 16;
    Tile {
        elem: Elem::U8,
        cols: row_bytes,
        rows,
        row_bytes,
        box_cols: stage_bytes,
        box_rows: 64 * wg,
        swizzle: if stage_bytes == 32 {
            Swizzle::B32
        } else {
            Swizzle::None
        },
    }
}

/// The TMA box of the f16 activations (`ntok` rows of `cols`) for the f16 GEMM with `tokens`
/// a block: half a stage (64 values) of a block's tokens, in the 128-byte swizzle wgmma reads.
pub fn hgemm_act_tile(ntok: usize, cols: usize, tokens: usize) -> Tile {
    Tile {
        elem: Elem::F16,
        cols,
        rows: ntok,
        row_bytes: 2 * cols,
        box_cols: HGEMM_STAGE_VALUES / 2,
        box_rows: tokens,
        swizzle: Swizzle::B128,
    }
}

/// Whether the f16 GEMM takes rows of `cols` values (whole stages).
pub const fn hgemm_takes(cols: usize) -> bool {
    cols.is_multiple_of(HGEMM_STAGE_VALUES)
}

/// Whether the f16 GEMM reads `format`'s weight scales from a copy in stage order
/// ([`hgemm_stage_scale_bytes`], made at upload: `stage_scales.rs`), whose stage for a block's
/// rows one bulk copy brings, as it does for 64-value blocks, two a stage. (Copied by the TMA
/// from the scales' own rows, a box of 16 bytes a row for the 4 read, they had cost Q2_0's
/// short passes 7-8% (an H100, ms a pass without any scale: 8.28-8.38 / 9.90-10.07 at 4 / 16
/// tokens against 8.98-9.20 / 10.47-10.94); each thread loading its own had been slower
/// still.) Not for 128-value blocks, one a stage, whose threads load their own: without any
/// scale Q1_0's passes were no faster (8.06-8.10 / 9.51-9.75 against 7.64-7.85 / 9.39-9.48).
pub const fn hgemm_stage_scales(format: GpuFormat) -> bool {
    format.scale_values() == 64
}

/// Rows of a stage-ordered scale copy ([`hgemm_stage_scales`]): the matrix's, padded (zeros)
/// to the end of the last block of any of [`HGEMM_WARPGROUPS`], so that every block's bulk
/// copy stays inside its stage.
pub const fn hgemm_stage_scale_rows(rows: usize) -> usize {
    let mut most = rows;
    let mut i = 0;
    while i < HGEMM_WARPGROUPS.len() {
        let block = 64 * HGEMM_WARPGROUPS[i];
        let end = rows.div_ceil(block) * block;
        if end > most {
            most = end;
        }
        i += 1;
    }
    most
}

/// Scales a row and stage of the f16 GEMM for `format`.
pub const fn hgemm_scales_per_stage(format: GpuFormat) -> usize {
    HGEMM_STAGE_VALUES / format.scale_values()
}

/// Bytes of a `rows × cols` matrix's stage-ordered scale copy, where it gets one (0
/// otherwise): for every stage, every padded row's scales of the stage.
pub const fn hgemm_stage_scale_bytes(format: GpuFormat, rows: usize, cols: usize) -> usize {
    if !hgemm_stage_scales(format) || !hgemm_takes(cols) {
        return 0;
    }
    cols / HGEMM_STAGE_VALUES * hgemm_stage_scale_rows(rows) * hgemm_scales_per_stage(format) * 2
}

/// A multi-token GEMM kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmKernel {
    /// int8 tensor cores on the int8 activations, `mi` 16-row tiles per warp
    /// (`gemm_<format>_m<mi>`).
    Int8 { mi: usize },
    /// f16 tensor cores (warpgroup MMA, sm_90a) on f16 activations, `wg` warpgroups of 64
    /// rows and `tokens` tokens a block (`hgemm_<format>_w<wg>_n<tokens>`), stages copied by
    /// the tensor memory accelerator.
    F16 { wg: usize, tokens: usize },
}

impl GemmKernel {
    /// The int8 kernel multi-token passes fall back to (and use without warpgroup MMA).
    pub const INT8: GemmKernel = GemmKernel::Int8 {
        mi: GEMM_DEFAULT_MI,
    };

    /// Every kernel (the f16 ones only with `wgmma`), for measuring them side by side.
    pub fn all(wgmma: bool) -> Vec<GemmKernel> {
        let f16 = HGEMM_WARPGROUPS.iter().flat_map(|&wg| {
            HGEMM_TOKENS
                .iter()
                .map(move |&tokens| GemmKernel::F16 { wg, tokens })
        });
        GEMM_MI
            .iter()
            .map(|&mi| GemmKernel::Int8 { mi })
            .chain(f16.filter(|_| wgmma))
            .collect()
    }

    /// The kernel for a `rows × cols` matrix over `ntok` tokens on `sms` multiprocessors (room
    /// for `cap` partial sums): on a device with warpgroup MMA, for rows of whole 128-value
    /// stages, the f16 one, with the tokens of [`hgemm_tokens_for`] and the number of
    /// warpgroups whose grid (and splits along K) leaves the fewest idle block slots in its
    /// last wave (34816 rows at 256 tokens: 272 blocks of 256 rows take 3 waves of 132, 364
    /// blocks of 192 rows as many waves of blocks a quarter shorter), else the int8 one.
    pub fn preferred(
        wgmma: bool,
        rows: usize,
        cols: usize,
        ntok: usize,
        sms: usize,
        cap: usize,
    ) -> GemmKernel {
        if !wgmma || !hgemm_takes(cols) {
            return GemmKernel::INT8;
        }
        let tokens = hgemm_tokens_for(ntok);
        let cost = |wg: usize| {
            let k = GemmKernel::F16 { wg, tokens };
            let (gx, gy) = gemm_grid(rows, ntok, k);
            let splits = gemm_splits(rows, cols, ntok, k, sms, cap, false);
            let slots = block_slots(k, ntok, sms);
            // Waves of blocks, each as long as its rows and its share of K.
            (gx * gy * splits).div_ceil(slots) as f64 * wg as f64 / splits as f64
        };
        let wg = HGEMM_WARPGROUPS
            .iter()
            .rev()
            .copied()
            .min_by(|a, b| cost(*a).total_cmp(&cost(*b)))
            .unwrap_or(4);
        GemmKernel::F16 { wg, tokens }
    }

    pub fn name(self, f: GpuFormat) -> String {
        match self {
            GemmKernel::Int8 { mi } => format!("gemm_{}_m{mi}", f.kernel_name()),
            GemmKernel::F16 { wg, tokens } => {
                format!("hgemm_{}_w{wg}_n{tokens}", f.kernel_name())
            }
        }
    }

    /// The same kernel in the widest f16 tiles (the int8 one as it is).
    pub fn widest(self) -> GemmKernel {
        match self {
            GemmKernel::F16 { wg, .. } => GemmKernel::F16 {
                wg,
                tokens: HGEMM_WIDEST,
            },
            k => k,
        }
    }

    /// Rows of a block's output tile.
    pub const fn rows(self) -> usize {
        match self {
            GemmKernel::Int8 { mi } => gemm_rows(mi),
            GemmKernel::F16 { wg, .. } => wg * 64,
        }
    }

    /// Tokens of a block's output tile.
    pub const fn tokens(self) -> usize {
        match self {
            GemmKernel::Int8 { .. } => GEMM_TOKENS,
            GemmKernel::F16 { tokens, .. } => tokens,
        }
    }

    /// Threads of a block.
    pub const fn threads(self) -> usize {
        match self {
            GemmKernel::Int8 { .. } => GEMM_WARPS * 32,
            GemmKernel::F16 { wg, .. } => wg * 128,
        }
    }

    /// Values of every row a pipeline stage holds.
    pub const fn stage_values(self) -> usize {
        match self {
            GemmKernel::Int8 { .. } => GEMM_STAGE_VALUES,
            GemmKernel::F16 { .. } => HGEMM_STAGE_VALUES,
        }
    }

    /// Blocks one multiprocessor of an H100/H200 holds (registers and shared memory): 16-token
    /// f16 tiles of three warpgroups take at most 80 registers a thread and 69 KiB, so two
    /// (the harness's GEMM checks hold the driver's occupancy to this).
    pub const fn blocks_per_sm(self) -> usize {
        match self {
            GemmKernel::Int8 { mi } => 3 - mi,
            GemmKernel::F16 { wg: 3, tokens: 16 } => 2,
            GemmKernel::F16 { .. } => 1,
        }
    }

    /// Dynamic shared memory of a block.
    pub fn smem_bytes(self) -> usize {
        match self {
            GemmKernel::Int8 { mi } => gemm_smem_bytes(mi),
            GemmKernel::F16 { wg, tokens } => {
                HGEMM_STAGES * hgemm_stage_bytes(wg, tokens) + HGEMM_TMA_EXTRA
            }
        }
    }

    /// The kernel of a name, `None` for any other kernel.
    pub fn of_name(kernel: &str) -> Option<GemmKernel> {
        if let Some(mi) = gemm_variant(kernel) {
            return Some(GemmKernel::Int8 { mi });
        }
        let rest = kernel.strip_prefix("hgemm_")?;
        GpuFormat::ALL.iter().find_map(|f| {
            let (wg, tokens) = rest
                .strip_prefix(f.kernel_name())?
                .strip_prefix("_w")?
                .split_once("_n")?;
            let (wg, tokens): (usize, usize) = (wg.parse().ok()?, tokens.parse().ok()?);
            (HGEMM_WARPGROUPS.contains(&wg) && HGEMM_TOKENS.contains(&tokens))
                .then_some(GemmKernel::F16 { wg, tokens })
        })
    }
}

/// The position of value `v` of a 64-value block in the f16 activations the f16 GEMM reads
/// (the host's copy of `hgemm_slot` in kernels/quant.cu).
pub const fn hgemm_slot(v: usize) -> usize {
    let (t, j, r) = ((v >> 4) & 3, (v >> 2) & 3, v & 3);
    16 * j + 8 * (r & 1) + 2 * t + (r >> 1)
}

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

/// Most K splits [`gemm_splits`] takes (short passes take [`SHORT_PASS_SPLITS`]): each split
/// writes its partial sums to scratch, and `gemm_reduce` adds them up in a fixed order
/// (deterministic, unlike atomics).
pub const GEMM_MAX_SPLITS: usize = 4;

/// Passes of up to this many tokens count 16-token f16 tiles of three warpgroups as two blocks
/// a multiprocessor, as many as fit ([`GemmKernel::blocks_per_sm`]); longer ones count one.
/// So a grid short of two blocks a multiprocessor splits along K: gate | up's
/// 182 blocks at 5-12 tokens into four splits. An H100, the 27B synthetic files, ms a pass
/// against one block a multiprocessor (two runs each): Q1_0 8.66 / 8.80 against 9.63 / 9.73 at
/// 5 tokens, 9.74 / 9.72 against 9.98 / 10.06 at 8, 10.12 / 9.94 against 10.24 / 10.27 at 12;
/// Q2_0 10.18 / 10.27 against 10.95 / 10.74 at 5, 11.07 / 11.16 against 11.20 / 11.27 at 8,
/// level at 12; at 16 tokens Q2_0 was slower (12.02 / 11.74 against 11.62 / 11.58).
pub const F16_TWO_BLOCK_TOKENS: usize = 12;

/// Block slots of `sms` multiprocessors for `kernel` in a pass of `ntok` tokens: the blocks a
/// multiprocessor holds, but one f16 block past [`F16_TWO_BLOCK_TOKENS`].
pub fn block_slots(kernel: GemmKernel, ntok: usize, sms: usize) -> usize {
    let per_sm = match kernel {
        GemmKernel::F16 { .. } if ntok > F16_TWO_BLOCK_TOKENS => 1,
        k => k.blocks_per_sm(),
    };
    (sms * per_sm).max(1)
}

/// K splits for a GEMM of `rows × cols` over `ntok` tokens with `kernel` on `sms`
/// multiprocessors, with room for `cap` partial floats. For the f16 GEMM in a `pdl_pass` (one
/// launched with programmatic dependent launch, where [`SHORT_PASS_SPLITS_ON`] or
/// `NIWAKI_CUDA_SHORT_PASS_SPLITS=1`; never for [`GemmKernel::preferred`]'s weighing of the
/// warpgroups, which were measured as it picks them), [`SHORT_PASS_SPLITS`] where they fit.
/// Otherwise one, unless its tiles fill less than 90% of the block slots the waves they take
/// offer (5120 output rows at 256 tokens are 80 blocks for 132 slots, 61%: three splits make it
/// 240 of 264); then the fewest splits that reach 90%, or the best fill. Every split keeps at
/// least two pipeline stages.
pub fn gemm_splits(
    rows: usize,
    cols: usize,
    ntok: usize,
    kernel: GemmKernel,
    sms: usize,
    cap: usize,
    pdl_pass: bool,
) -> usize {
    let short = pdl_pass && matches!(kernel, GemmKernel::F16 { .. });
    if short && gemm_split_fits(rows, cols, ntok, kernel, SHORT_PASS_SPLITS, cap) {
        return SHORT_PASS_SPLITS;
    }
    let (gx, gy) = gemm_grid(rows, ntok, kernel);
    let blocks = gx * gy;
    let slots = block_slots(kernel, ntok, sms);
    let fill = |s: usize| {
        let b = blocks * s;
        b as f64 / (b.div_ceil(slots) * slots) as f64
    };
    if blocks >= slots || fill(1) >= 0.9 {
        return 1;
    }
    let fits = |s: &usize| gemm_split_fits(rows, cols, ntok, kernel, *s, cap);
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

/// Whether `splits` K splits of a GEMM of `rows × cols` over `ntok` tokens with `kernel` fit:
/// their partial sums in `cap` floats, and two pipeline stages or more a split.
pub fn gemm_split_fits(
    rows: usize,
    cols: usize,
    ntok: usize,
    kernel: GemmKernel,
    splits: usize,
    cap: usize,
) -> bool {
    splits * ntok * rows <= cap && 2 * splits <= cols.div_ceil(kernel.stage_values())
}

/// K splits of the f16 GEMM in passes launched with programmatic dependent launch (up to
/// [`PDL_TOKENS`] tokens by default), wherever they fit ([`gemm_split_fits`]), in place of the
/// fill rule's ([`gemm_splits`]). An H100, the 27B synthetic files, ms a
/// pass with every GEMM so split (`NIWAKI_CUDA_GEMM_SPLITS=6`) against the fill rule's (four for
/// gate | up), two runs each: Q1_0 7.16-7.19 / 7.29-7.32 / 7.36-7.42 against 7.58-7.73 /
/// 7.58-7.67 / 7.77-7.97 at 4 / 5 / 6 tokens; Q2_0 7.82-7.84 / 7.88-7.92 / 7.98-7.99 against
/// 8.48-8.51 / 8.44-8.53 / 8.48-8.49; one run at 7 (Q1_0 7.50 against 7.91, Q2_0 8.34 against
/// 8.82) and at 3 (level). At 8 tokens, launched without PDL, it was slower (Q1_0 9.29 against
/// 8.81-8.96, Q2_0 10.02-10.04 against 9.36-9.74), as were 6 and 8 splits at 8 and 12 tokens in
/// an earlier call: the splits' gain goes with PDL, each split's blocks asking for their first
/// stages of weights before they wait for the kernel before them. Taken only where
/// [`SHORT_PASS_SPLITS_ON`] or `NIWAKI_CUDA_SHORT_PASS_SPLITS=1`.
pub const SHORT_PASS_SPLITS: usize = 6;
/// Whether short passes take [`SHORT_PASS_SPLITS`] (`NIWAKI_CUDA_SHORT_PASS_SPLITS` sets it at
/// start). On: the harness's GEMM checks (every kernel six ways split too) and its steps check
/// with every GEMM six ways split passed on an H100, where `niwaki bench -p N -n 0 -r 3` on the
/// 27B synthetic files, two rounds, gave tok/s with the rule against without: Q1_0 557 / 692 /
/// 817-820 against 520-527 / 660-667 / 776-782 at 4 / 5 / 6 tokens, Q2_0 502-507 / 626-630 /
/// 747 against 457-465 / 582-583 / 693-699; level at 2 and 3 tokens and past [`PDL_TOKENS`].
pub const SHORT_PASS_SPLITS_ON: bool = true;

/// Grid of a GEMM launch: token tiles (x) by row tiles (y).
pub fn gemm_grid(rows: usize, ntok: usize, kernel: GemmKernel) -> (usize, usize) {
    (ntok.div_ceil(kernel.tokens()), rows.div_ceil(kernel.rows()))
}
