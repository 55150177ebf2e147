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

/// Pipeline stages of the f16 GEMM (`hgemm_*`, kernels/hgemm.cu).
pub const HGEMM_STAGES: usize = 4;
/// Shared-memory bytes of one weight row in an f16-GEMM stage: two 16-byte chunk slots.
pub const HGEMM_ROW_STRIDE: usize = 32;

/// A multi-token GEMM kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmKernel {
    /// int8 tensor cores on the int8 activations, `mi` 16-row tiles per warp
    /// (`gemm_<format>_m<mi>`).
    Int8 { mi: usize },
    /// f16 tensor cores on f16 activations, two 16-row tiles per warp (`hgemm_<format>`).
    F16,
}

impl GemmKernel {
    /// The kernel multi-token passes use: the f16 one measured no faster on the H200 (412 vs
    /// 384 µs for 34816×5120 at 256 tokens), its mma.sync rate for f16 half the int8 one.
    pub const DEFAULT: GemmKernel = GemmKernel::Int8 {
        mi: GEMM_DEFAULT_MI,
    };

    /// Every kernel, for measuring them side by side.
    pub fn all() -> Vec<GemmKernel> {
        GEMM_MI
            .iter()
            .map(|&mi| GemmKernel::Int8 { mi })
            .chain([GemmKernel::F16])
            .collect()
    }

    pub fn name(self, f: GpuFormat) -> String {
        match self {
            GemmKernel::Int8 { mi } => format!("gemm_{}_m{mi}", f.kernel_name()),
            GemmKernel::F16 => format!("hgemm_{}", f.kernel_name()),
        }
    }

    /// Rows of a block's output tile.
    pub const fn rows(self) -> usize {
        match self {
            GemmKernel::Int8 { mi } => gemm_rows(mi),
            GemmKernel::F16 => gemm_rows(2),
        }
    }

    /// Blocks one multiprocessor of an H100/H200 holds (registers and shared memory).
    pub const fn blocks_per_sm(self) -> usize {
        match self {
            GemmKernel::Int8 { mi } => 3 - mi,
            GemmKernel::F16 => 2,
        }
    }

    /// Dynamic shared memory of a block.
    pub fn smem_bytes(self) -> usize {
        match self {
            GemmKernel::Int8 { mi } => gemm_smem_bytes(mi),
            GemmKernel::F16 => {
                let kc = GEMM_STAGE_VALUES;
                HGEMM_STAGES * (self.rows() * HGEMM_ROW_STRIDE + GEMM_TOKENS * (2 * kc + 16))
            }
        }
    }

    /// The kernel of a name, `None` for any other kernel.
    pub fn of_name(kernel: &str) -> Option<GemmKernel> {
        if let Some(mi) = gemm_variant(kernel) {
            return Some(GemmKernel::Int8 { mi });
        }
        let rest = kernel.strip_prefix("hgemm_")?;
        GpuFormat::ALL
            .iter()
            .any(|f| f.kernel_name() == rest)
            .then_some(GemmKernel::F16)
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

/// Most K splits of a GEMM: each split writes its partial sums to scratch, and `gemm_reduce`
/// adds them up in a fixed order (deterministic, unlike atomics).
pub const GEMM_MAX_SPLITS: usize = 4;

/// K splits for a GEMM of `rows × cols` over `ntok` tokens with `kernel` on `sms`
/// multiprocessors, with room for `cap` partial floats. One, unless its tiles fill less than
/// 90% of the block slots the waves they take offer (5120 output rows at 256 tokens are 80
/// blocks for 132 slots, 61%: three splits make it 240 of 264); then the fewest splits that
/// reach 90%, or the best fill. Every split keeps at least two pipeline stages.
pub fn gemm_splits(
    rows: usize,
    cols: usize,
    ntok: usize,
    kernel: GemmKernel,
    sms: usize,
    cap: usize,
) -> usize {
    let (gx, gy) = gemm_grid(rows, ntok, kernel);
    let blocks = gx * gy;
    let slots = (sms * kernel.blocks_per_sm()).max(1);
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
pub fn gemm_grid(rows: usize, ntok: usize, kernel: GemmKernel) -> (usize, usize) {
    (ntok.div_ceil(GEMM_TOKENS), rows.div_ceil(kernel.rows()))
}
