//! The tensor-core prefill GEMM: tile shapes, shared memory, grids and splits along K.

use super::*;

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
