//! The decode GEMV on the binary tensor cores (`kernels/gemv_b1.cu`): which kernel takes a
//! shape, its tiles, stages, blocks a multiprocessor, and the program's choices for it.

use super::*;

/// Static shared memory of the binary decode GEMV (`gemv_b1_*`): its barriers and each stage's
/// partial sums (4 KiB), kept out of its dynamic budget.
pub const GEMV_B1_STATIC_SMEM: usize = 5 << 10;

/// Shared memory of one sm_90 multiprocessor, and what the driver reserves of it per resident
/// block: the blocks per multiprocessor a plan asks for must fit in it with their static and
/// dynamic memory.
pub const SM90_SMEM_PER_SM: usize = 228 << 10;
pub const SMEM_RESERVED_PER_BLOCK: usize = 1 << 10;

/// A decode GEMV on the binary tensor cores (`kernels/gemv_b1.cu`): kernel (and its twin that
/// takes each tile from a tile image, where it has one), rows per tile, stages of tiles, grid
/// and dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemvB1Launch {
    pub kernel: &'static str,
    pub image_kernel: Option<&'static str>,
    pub tile_rows: usize,
    pub stages: usize,
    pub grid: usize,
    pub smem_bytes: usize,
    pub stage_bytes: usize,
    /// The blocks a multiprocessor its shared memory was sized for.
    pub blocks_per_sm: usize,
}

fn round1024(n: usize) -> usize {
    n.div_ceil(1024) * 1024
}

/// Shared memory of one stage of the binary decode GEMV: a tile's `tile_rows` rows of codes in
/// boxes of 128 bytes a row (the tensor map's swizzle needs them 1 KiB-aligned), then the rows'
/// scales.
pub fn gemv_b1_stage_bytes(format: GpuFormat, cols: usize, tile_rows: usize) -> usize {
    let row_bytes = cols / format.chunk_values() * 16;
    let scales = cols / format.scale_values();
    round1024(row_bytes.div_ceil(128) * 128 * tile_rows + tile_rows * scales * 2)
}

/// Shared memory before the binary decode GEMV's stages: the activation group pairs (the
/// kernels with the norm folded in keep their codes in registers too).
pub fn gemv_b1_x_bytes(cols: usize) -> usize {
    round1024(round128(8 * cols / X_GROUP))
}

/// Plans a binary decode GEMV of a `rows × cols` matrix, or `None` where the kernel does not
/// take the shape: `cols` a multiple of 1024 (rows of whole 128-byte boxes and of whole slabs of
/// eight chunks a warp, for either width of codes) and at most 17 chunks per warp (17408
/// columns) of 1-bit rows, 12 (6144 columns) of 2-bit rows, whose kernels take tiles of 16 rows
/// and no norm ([`gemv_b2_kernel`]). Up to 6144 columns: three blocks per multiprocessor of
/// up to 72 KiB (the kernels that keep five or six plane words per lane); beyond, two of up to
/// 100 KiB; each as many stages as fit beside the blocks' static memory. `fused_norm`: the
/// kernel norms and quantizes its input itself, taken up to 6144 columns.
/// `knobs`: blocks per multiprocessor and shared-memory budget in place of the defaults (0:
/// default), for measuring them. `tile_rows`: 32 asks for tiles of two row groups, taken where
/// the rows are a multiple of 32 and the width is one of the exact kernels' (5120 or 6144
/// columns), 16 elsewhere.
#[allow(clippy::too_many_arguments)]
pub fn gemv_b1_launch(
    format: GpuFormat,
    rows: usize,
    cols: usize,
    sms: usize,
    smem_limit: usize,
    fused_norm: bool,
    knobs: (usize, usize),
    tile_rows: usize,
) -> Option<GemvB1Launch> {
    if rows == 0 || cols == 0 || !cols.is_multiple_of(1024) {
        return None;
    }
    let per_warp = (cols / format.chunk_values()).div_ceil(GEMV1_WARPS);
    let wide_tiles = tile_rows == 32 && rows.is_multiple_of(32);
    // Every warp takes exactly `per_warp` chunks (`cols` is a multiple of 8 chunks): the
    // kernels made for a count run it unguarded. Tiles of 32 rows take at most half the stages
    // (their partial sums' static memory); budgets are caps, lowered below where the blocks
    // would not fit a multiprocessor.
    // The norm is folded in up to six chunks a warp (the `_n` kernels hold the row's values in
    // registers); wider rows run it apart.
    let ((kernel, tile_rows, blocks_per_sm, budget), image_kernel) = match (format, fused_norm) {
        (GpuFormat::Q1, _) => (q1_kernel(per_warp, fused_norm, wide_tiles)?, None),
        (_, true) => return None,
        (f, false) => {
            let (k, image) = gemv_b2_kernel(f, per_warp)?;
            ((k, 16, 3, 72 << 10), Some(image))
        }
    };
    let blocks_per_sm = if knobs.0 > 0 { knobs.0 } else { blocks_per_sm };
    let budget = if knobs.1 > 0 { knobs.1 } else { budget };
    // No more than `blocks_per_sm` blocks can hold: three of 72 KiB with their static memory
    // do not fit a multiprocessor, and the 6144-wide kernel's five stages of that budget then
    // ran two blocks a multiprocessor (Nsight Compute on the H200: 73.7 KB each, "block limit
    // shared mem 2", 320 blocks in 1.21 waves).
    let fit = (SM90_SMEM_PER_SM / blocks_per_sm.max(1))
        .saturating_sub(GEMV_B1_STATIC_SMEM + SMEM_RESERVED_PER_BLOCK);
    // Less the 1 KiB the kernel may skip to align its boxes.
    let budget = budget
        .min(fit)
        .min(smem_limit.saturating_sub(GEMV_B1_STATIC_SMEM))
        .saturating_sub(1024);
    let stage_bytes = gemv_b1_stage_bytes(format, cols, tile_rows);
    let x_bytes = gemv_b1_x_bytes(cols);
    let tiles = rows.div_ceil(tile_rows);
    let grid = tiles.min(sms.max(1) * blocks_per_sm);
    // A block with one tile needs no second stage: where two do not fit (more blocks a
    // multiprocessor than the default, `NIWAKI_CUDA_B1_BLOCKS`), one.
    let least = if tiles <= grid { 1 } else { 2 };
    let stages = ring_stages(budget, x_bytes, stage_bytes, tiles, least)?
        .min(GEMV1_MAX_STAGES * 16 / tile_rows);
    Some(GemvB1Launch {
        kernel,
        image_kernel,
        tile_rows,
        stages,
        grid,
        smem_bytes: 1024 + x_bytes + stages * stage_bytes,
        stage_bytes,
        blocks_per_sm,
    })
}

/// Whether the widest 1-bit rows' binary decode GEMV stages its activations in shared memory by
/// bulk copies by default ([`x_staged`]; `NIWAKI_CUDA_B1_X_STAGE=0` turns it off). On the
/// 27B that is ffn_down's: measured on the H200 (`niwaki bench --device cuda -p 0 -n 128 -r
/// 3`, Q1_0, alternated, two rounds, medians with min-max) 399.51 (399.41-399.51) and 401.58
/// (401.18-401.63) tok/s against 394.21 (394.17-394.57) and 394.28 (394.25-394.65) with each
/// warp loading its chunks from L2: +1.6%, the same bits.
pub const B1_X_STAGE: bool = true;

/// Whether one-token passes of models with 1-bit matrices write their activations' plane
/// words too, and the 1-bit binary GEMVs that take the norm apart read them
/// ([`planes_kernel`]; `NIWAKI_CUDA_B1_PLANES=0` turns it off). Measured on the H200
/// (`niwaki bench --device cuda -p 0 -n 128 -r 3`, 27B synthetic Q1_0, two rounds alternated
/// in one call, medians with min-max): 418.32 (417.94-418.38) and 418.35 (417.82-418.48) tok/s
/// against 403.99 (403.00-404.07) and 403.17 (403.10-403.64) with the GEMVs forming the words
/// from the codes: +3.6%, the same bits.
pub const B1_PLANES: bool = true;

/// Rows per tile the binary decode GEMV asks for by default ([`gemv_b1_launch`] takes 32 for
/// 1-bit rows of the exact kernels' widths, 16 elsewhere; `NIWAKI_CUDA_B1_TILE_ROWS` sets it).
/// With the consumers forming their plane words, 32-row tiles were no faster (27B Q1_0 on the
/// H200, the tenth session: decode 333.3 → 330.2 tok/s in the harness, `niwaki bench`
/// 318.4-322.2 → 317.6-319.7, though gate | up 12.20 → 11.19 µs and the LM head 56.9 → 53.8).
/// Reading the words the quantizations wrote ([`B1_PLANES`]), they are (`niwaki bench --device
/// cuda -p 0 -n 128 -r 3`, two rounds alternated in one call, medians with min-max): 422.39
/// (422.21-422.50) and 422.55 (422.49-423.51) tok/s against 415.80 (415.50-415.89) and 415.62
/// (415.55-415.83) with 16-row tiles, +1.6%, the same bits.
pub const B1_TILE_ROWS: usize = 32;

/// The twin of the 1-bit binary decode GEMV `kernel` that reads its activations' plane words
/// rather than their codes (`kernels/gemv_b1.cu`, XP), where it has one: every 1-bit kernel
/// that takes the norm apart.
pub fn planes_kernel(kernel: &str) -> Option<&'static str> {
    Some(match kernel {
        "gemv_b1_j5x" => "gemv_b1_j5x_p",
        "gemv_b1_j6x" => "gemv_b1_j6x_p",
        "gemv_b1_j6" => "gemv_b1_j6_p",
        "gemv_b1_j17x" => "gemv_b1_j17x_p",
        "gemv_b1_j17" => "gemv_b1_j17_p",
        "gemv_b1_j17x_xs" => "gemv_b1_j17x_xs_p",
        "gemv_b1_j17_xs" => "gemv_b1_j17_xs_p",
        "gemv_b1_j5x_r32" => "gemv_b1_j5x_r32_p",
        "gemv_b1_j6x_r32" => "gemv_b1_j6x_r32_p",
        "gemv_b1_j6x_c" => "gemv_b1_j6x_c_p",
        "gemv_b1_j6_c" => "gemv_b1_j6_c_p",
        _ => return None,
    })
}

/// The binary decode GEMV `l` of `cols` columns with its activations' codes and group pairs
/// brought into shared memory by two bulk copies rather than loaded by each consumer warp from
/// L2 (`kernels/gemv_b1.cu`, XSM): its `_xs` kernel, with the row's codes (`cols` bytes, in
/// whole KiB) between the pairs and the ring, and as many of `l`'s stages as then fit the
/// blocks a multiprocessor of its plan: two for the 1-bit rows of 9 to 17 chunks a warp
/// (ffn_down's among them). `None` for other kernels, or where two stages would not fit. The
/// 2-bit rows' kernels have no such form: staged, they measured level (the forty-fourth
/// session, Q2_0 338.6 against 339.6 tok/s on the H200). Whether a launch takes it is the
/// backend's setting ([`B1_X_STAGE`]).
pub fn x_staged(l: GemvB1Launch, cols: usize) -> Option<GemvB1Launch> {
    let kernel = match l.kernel {
        "gemv_b1_j17x" => "gemv_b1_j17x_xs",
        "gemv_b1_j17" => "gemv_b1_j17_xs",
        _ => return None,
    };
    let l = GemvB1Launch {
        kernel,
        image_kernel: None,
        ..l
    };
    refit(l, gemv_b1_x_bytes(cols) + round1024(cols), 2)
}

/// `l` with `x_bytes` before its ring in place of its own: as many of its stages as then fit
/// the blocks a multiprocessor of its plan, `None` where fewer than `least`.
fn refit(l: GemvB1Launch, x_bytes: usize, least: usize) -> Option<GemvB1Launch> {
    let fit = (SM90_SMEM_PER_SM / l.blocks_per_sm.max(1))
        .saturating_sub(GEMV_B1_STATIC_SMEM + SMEM_RESERVED_PER_BLOCK)
        .saturating_sub(1024 + x_bytes);
    let stages = l.stages.min(fit / l.stage_bytes);
    (stages >= least).then_some(GemvB1Launch {
        stages,
        smem_bytes: 1024 + x_bytes + stages * l.stage_bytes,
        ..l
    })
}

/// The 1-bit kernel for `per_warp` chunks a warp, the norm folded in or not, tiles of 32 rows
/// where asked for and allowed: name, rows per tile, blocks per multiprocessor, budget.
fn q1_kernel(
    per_warp: usize,
    fused_norm: bool,
    wide_tiles: bool,
) -> Option<(&'static str, usize, usize, usize)> {
    Some(match (per_warp, fused_norm) {
        (5, false) if wide_tiles => ("gemv_b1_j5x_r32", 32, 3, 66 << 10),
        (6, false) if wide_tiles => ("gemv_b1_j6x_r32", 32, 3, 66 << 10),
        (5, true) if wide_tiles => ("gemv_b1_j5x_r32_n", 32, 3, 66 << 10),
        (6, true) if wide_tiles => ("gemv_b1_j6x_r32_n", 32, 3, 66 << 10),
        (5, false) => ("gemv_b1_j5x", 16, 3, 72 << 10),
        (6, false) => ("gemv_b1_j6x", 16, 3, 72 << 10),
        (0..=6, false) => ("gemv_b1_j6", 16, 3, 72 << 10),
        (5, true) => ("gemv_b1_j5x_n", 16, 3, 72 << 10),
        (6, true) => ("gemv_b1_j6x_n", 16, 3, 72 << 10),
        (0..=6, true) => ("gemv_b1_j6_n", 16, 3, 72 << 10),
        (17, false) => ("gemv_b1_j17x", 16, 2, 100 << 10),
        (7..=17, false) => ("gemv_b1_j17", 16, 2, 100 << 10),
        _ => return None,
    })
}

/// The 2-bit binary kernel (`gemv_b2*`) for `per_warp` chunks of 64 values a warp: the exact
/// kernels for the 27B's 5120 and 6144 columns, the guarded one below; `None` beyond 12 (the
/// 17408-wide ffn_down: a 16-row tile of its 2-bit rows is 78 KB, more than a block's share
/// when three share a multiprocessor, and its plane words would crowd the registers). With
/// it, its `_i` twin, which takes each tile from a tile image.
pub fn gemv_b2_kernel(format: GpuFormat, per_warp: usize) -> Option<(&'static str, &'static str)> {
    Some(match (format, per_warp) {
        (GpuFormat::Q2G64, 10) => ("gemv_b2g64_j10x", "gemv_b2g64_j10x_i"),
        (GpuFormat::Q2G64, 12) => ("gemv_b2g64_j12x", "gemv_b2g64_j12x_i"),
        (GpuFormat::Q2G64, 0..=12) => ("gemv_b2g64_j12", "gemv_b2g64_j12_i"),
        (GpuFormat::Q2G128, 10) => ("gemv_b2g128_j10x", "gemv_b2g128_j10x_i"),
        (GpuFormat::Q2G128, 12) => ("gemv_b2g128_j12x", "gemv_b2g128_j12x_i"),
        (GpuFormat::Q2G128, 0..=12) => ("gemv_b2g128_j12", "gemv_b2g128_j12_i"),
        _ => return None,
    })
}

/// Whether the 2-bit binary decode GEMVs count a chunk by one MMA of k = 256 (its code words
/// twice, the activations' plane word masked to the 2s in the first half and whole in the
/// second) rather than two chained MMAs of k = 128: a compile-time choice of the program
/// (`B2_K256`; `NIWAKI_CUDA_B2_K256=0` compiles the two). The same counts by the PTX ISA's
/// fragment layouts (k = 256's are k = 128's two halves), and the same bits on the GPU: the
/// harness's binary GEMV checks pass with it (every 2-bit format against the integer twin, and
/// the 27B-wide Q2_0 model against the CPU), and the picked tokens of a 128-token decode are
/// the same. One H200 call (2026-12-04, `crates/cuda/ab-h200.sh`, two rounds alternated): Q2_0
/// 332.25 / 332.18 tok/s against 327.38 / 327.18 (+1.5%), Q1_0 level (its kernels unchanged).
/// The tile loop of the 5120-wide image kernel: 267 SASS instructions against 275.
pub const B2_K256: bool = true;

/// Whether the 2-bit binary decode GEMVs keep each lane's own scale pair of every chunk in
/// shared memory, (4^t·s, s·Σq for lane t = 0, else 0), formed once a launch, rather than the
/// chunk's (s, s·Σq) from which every tile's pass forms them again: two multiplications a
/// chunk and tile fewer, for four times the pairs' shared memory ([`lane_paired`]). A
/// compile-time choice of the program (`LANE_PAIRS`; `NIWAKI_CUDA_LANE_PAIRS=1` compiles it).
/// The same products of the same operands, so the same bits. Off until a GPU has run it.
pub const LANE_PAIRS: bool = false;

/// Bytes of a 2-bit decode GEMV's lane pairs ([`LANE_PAIRS`]) for rows of `cols` values:
/// four pairs of 8 bytes a 64-value chunk, in whole KiB as [`gemv_b1_x_bytes`].
pub fn lane_pair_bytes(cols: usize) -> usize {
    round1024(round128(32 * cols / X_GROUP))
}

/// The 2-bit binary decode GEMV `l` of a `rows × cols` matrix with its lane pairs in place of
/// the group pairs ([`LANE_PAIRS`]): as many of `l`'s stages as fit beside them, at least two
/// where a block has more than one tile. `None` for a 1-bit kernel, or where they do not fit.
/// On the 27B's shapes every 2-bit kernel keeps its stages (two, three for the 5120-wide
/// 128-value rows, whose ring then fills the multiprocessor's memory exactly).
pub fn lane_paired(l: GemvB1Launch, rows: usize, cols: usize) -> Option<GemvB1Launch> {
    if !l.kernel.starts_with("gemv_b2") {
        return None;
    }
    let least = if rows.div_ceil(l.tile_rows) <= l.grid {
        1
    } else {
        2
    };
    refit(l, lane_pair_bytes(cols), least)
}

/// Whether the 1-bit binary decode GEMVs give each of a chunk's two MMAs four planes of both
/// activation groups (B's columns 0-3 the first group's, 4-7 the second's; planes 0-3 in the
/// first MMA, 4-7 in the second) rather than the eight planes of one group: a compile-time
/// choice of the program (`B1_GROUP_COLS`; `NIWAKI_CUDA_B1_GROUP_COLS=1` compiles it). A
/// lane's four counts of a row then belong to one group, so it adds them as integers and
/// converts and scales once a row and chunk where the groups apart take twice the
/// conversions (a quarter-rate instruction) and float operations. The same integer counts;
/// the float sums of a row run in another order, so not the same bits. Off until a GPU has
/// run it: its arithmetic is checked lane by lane on the CPU (`plan::tests::b1_columns`), and
/// its device code read without a GPU (`crates/cuda/sass.sh`, NVRTC 13.0.88 for sm_90a, the
/// 27B Q1_0 program) issues fewer instructions a tile in every 1-bit kernel the decode takes:
/// 303 against 340 (`gemv_b1_j5x_r32_p`), 284 against 328 (`_j5x_r32_n`), 206 against 228
/// (`_j6x_c_p`), 458 against 524 (`_j17x_xs_p`), half the conversions, no spills, registers
/// 70 / 64 / 56 / 92 against 71 / 69 / 56 / 95.
pub const B1_GROUP_COLS: bool = false;

/// Whether the exact 5120-wide 32-row 1-bit binary decode GEMVs (`gemv_b1_j5x_r32*`: the
/// gate | up, attention and recurrent inputs and the LM head of the 27B) take their width as
/// the compile-time 40 chunks rather than from `cols` (`B1_CONST_CHUNKS`;
/// `NIWAKI_CUDA_B1_CONST_CHUNKS=1` compiles it): the same arithmetic and bits, their tile
/// loop's row-scale addresses folded into immediates. Read without a GPU (the device code of
/// the 27B Q1_0 program, NVRTC 13.0.88, sm_90a): `gemv_b1_j5x_r32_p`'s loop 324 instructions a
/// pass against 340 (277 against 302 with [`B1_GROUP_COLS`]), `_r32_n`'s 324 against 328 (280
/// against 284). The same for every exact kernel made other loops longer (`_j6x_r32_p` 391 →
/// 404, `_j6x_c_p` 228 → 250, `_j17x_xs_p` 524 → 554, `gemv_b2g64_j10x_i` 267 → 276), hence
/// these alone. Off until a GPU has run it.
pub const B1_CONST_CHUNKS: bool = false;

/// Whether the 1-bit binary decode GEMVs request the rest of their ring (after the tiles
/// requested before the wait, [`EARLY_TILES`]) once their first consumer warp holds its plane
/// words rather than as soon as the previous kernel has ended, so that the activations' loads
/// do not queue behind the ring's copies: a compile-time choice of the program
/// (`RING_LATE_Q1`; `NIWAKI_CUDA_RING_LATE=0` turns it off). On the H200, with the choice made
/// at run time for every decode GEMV (`niwaki bench --device cuda -p 0 -n 128 -r 3`, one round,
/// tok/s): Q1_0 466.25 against 445.57 with the rest requested at once; Q2_0 326.09 against
/// 327.84 and PQ2_0 334.70 against 335.27, so the 2-bit and dp4a kernels keep requesting it at
/// once (and the run-time test itself cost every format 1.2-1.4% against the build without it,
/// hence a compile-time one).
pub const RING_LATE_Q1: bool = true;

/// Tiles of 16 rows per multiprocessor from which a 1-bit decode GEMV goes to the binary tensor
/// cores rather than dp4a: every matrix. Measured first per op inside the 27B Q1_0 decode graph
/// on the H200 (µs, dp4a against binary): 34816 rows (ffn gate | up) 16.24 against 12.60, the
/// 248,320-row LM head 76.1 against 58.5, 16480 rows 8.96 against 7.59, 14336 rows 7.69
/// against 6.85; but then not the 5120-row matrices (2.4 tiles per multiprocessor): 5.12
/// against 5.23 (6144 columns) and 10.04 against 10.58 (17408), so the bound was 4 tiles. Those
/// kernels then still waited for each of a warp's chunks of activations in turn before their
/// first tile (17 round trips to L2 for ffn_down's rows, now 3); with the loads issued together,
/// decode with every 1-bit matrix on the binary kernel measured 344.0-348.6 tok/s against
/// 327.8-339.9 with the bound of 4 (`niwaki bench --device cuda -p 8 -n 128 -r 3`, two rounds interleaved,
/// same binary). `NIWAKI_CUDA_B1_MIN_TILES=4` restores the bound for measuring.
pub const B1_MIN_TILES_PER_SM: usize = 0;

/// Whether a one-token GEMV of a 1-bit `rows`-row matrix on `sms` multiprocessors goes to the
/// binary tensor cores (where [`gemv_b1_launch`] takes its shape), from `min_tiles` tiles of 16
/// rows per multiprocessor ([`B1_MIN_TILES_PER_SM`] by default).
pub fn prefers_b1(rows: usize, sms: usize, min_tiles: usize) -> bool {
    rows.div_ceil(16) >= min_tiles * sms
}

/// 128-byte boxes a binary decode GEMV's tile spans across a row of `units` 16-byte units (the
/// tensor map's copies per tile; the last box zero-filled past the row).
pub fn b1_slabs(units: usize) -> usize {
    units.div_ceil(8)
}
