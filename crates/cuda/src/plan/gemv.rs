//! The GEMVs: the multi-token kernel's shape, and the decode GEMV's tiles, stages and grid.

use super::*;

/// Tokens one GEMV launch multiplies against each weight row it reads.
pub const GEMV_TOKENS: usize = 8;

/// Rows of a matrix one GEMV warp computes at a time (sharing each activation load).
pub const GEMV_ROWS: usize = 4;

/// Matrices are uploaded with their rows padded to a multiple of this, so that the decode GEMV
/// (`gemv1_*`) only ever copies whole tiles of 8 or 16 rows.
pub const TILE_PAD_ROWS: usize = 16;
/// Consumer warps of a decode-GEMV block (one more warp issues the copies); a tile is
/// `GEMV1_WARPS × rows_per_warp` rows.
pub const GEMV1_WARPS: usize = 8;
/// Shared memory the decode GEMV may declare statically (its barriers and reduction space: 272
/// bytes today), kept out of its dynamic budget.
pub const GEMV1_STATIC_SMEM: usize = 1024;
/// Shared-memory stages of the decode GEMV's copy ring (the kernel's barrier array).
pub const GEMV1_MAX_STAGES: usize = 8;

/// How the lanes of a decode-GEMV warp share its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowLanes {
    /// 32 / rows-per-warp lanes to a row, each lane loading a chunk's activations for its row.
    Split,
    /// Every lane over its chunks of each of the warp's rows, a chunk's activations loaded once
    /// for all of them (the `r2s` kernels; with one row per warp the same as `Split`).
    Shared,
}

/// The knobs of the decode GEMV: rows per warp (1 or 2) and how its lanes take them, the shared
/// memory a block may use for activations and its ring of tiles, and blocks per multiprocessor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemv1Tuning {
    pub rows_per_warp: usize,
    pub lanes: RowLanes,
    pub smem_budget: usize,
    pub blocks_per_sm: usize,
}

/// Whether the wide 2-bit rows (ffn_down's) take tiles of two rows per warp with the lanes
/// shared ([`Gemv1Tuning::shared_wide`]) rather than one row per warp in two blocks a
/// multiprocessor (`NIWAKI_CUDA_GEMV1_SHARE=0`): yes, measured faster.
pub const SHARED_WIDE_ROWS: bool = true;

impl Gemv1Tuning {
    /// Default for a matrix: [`Gemv1Tuning::for_shape_with`] as [`SHARED_WIDE_ROWS`] says.
    pub fn for_shape(format: GpuFormat, cols: usize) -> Gemv1Tuning {
        Gemv1Tuning::for_shape_with(format, cols, SHARED_WIDE_ROWS)
    }

    /// [`Gemv1Tuning::split_lanes`], or for the rows it gives one row per warp that are not
    /// 1-bit (the wide 2-bit rows) with `shared_wide`, [`Gemv1Tuning::shared_wide`].
    pub fn for_shape_with(format: GpuFormat, cols: usize, shared_wide: bool) -> Gemv1Tuning {
        let t = Gemv1Tuning::split_lanes(format, cols);
        if shared_wide && t.rows_per_warp == 1 && format != GpuFormat::Q1 {
            Gemv1Tuning::shared_wide()
        } else {
            t
        }
    }

    /// A matrix's tuning with each row's chunks split between lanes: two rows per warp while a
    /// tile of 16 rows stays small (≤ ~26 KB), and then three blocks per multiprocessor of up to
    /// 72 KiB each; wide 2-bit rows (one row per warp: ffn_down, 39 KB tiles) two of 100 KiB,
    /// where three would not hold two stages.
    /// Measured on the H200 over whole 27B decode steps: one block per SM (so that the next
    /// GEMV's block could fit beside it) was 17-27% slower, 64 or 160 KiB with one block slower
    /// still. Three blocks of 72 KiB were 2.3% faster than two of 100 KiB on Q1_0 (its GEMVs
    /// are bound by their instructions: more warps help); on Q2_0 they once measured 10% slower
    /// (fewer bytes in flight), and since the decode GEMVs' arithmetic was trimmed 2.6% faster
    /// (273.3 against 266.4 tok/s, 8cf69a5): the harness's cut-down decode graph shows a Q2_0
    /// token's GEMVs taking 2.85 ms, 2.14 ms when their consumers do not multiply, so the
    /// arithmetic, not the copies, is what more warps hide.
    ///
    /// 1-bit rows of two rows per warp go to four blocks of 54 KiB where two stages fit beside
    /// the activations, a norm folded in or not (their kernel fits 56 registers): +2.6% decode
    /// on Q1_0 (`niwaki bench`, host logits, four runs each on the H200: 280.4-289.5 against
    /// 275.0-285.0 tok/s). Four blocks of the 2-bit kernels measured 2-4% slower on Q2_0, and one
    /// block of 100 KiB for ffn_down's split lanes another 2% slower still (its shared lanes take
    /// one block of two 78 KB stages: [`Gemv1Tuning::shared_wide`]).
    pub fn split_lanes(format: GpuFormat, cols: usize) -> Gemv1Tuning {
        let row_bytes = cols / format.chunk_values() * 16;
        let rows_per_warp = if row_bytes <= 1600 { 2 } else { 1 };
        let (blocks_per_sm, smem_budget) = if format == GpuFormat::Q1
            && rows_per_warp == 2
            && x_bytes(cols, true) + 2 * stage_bytes(format, cols, rows_per_warp) <= 54 << 10
        {
            (4, 54 << 10)
        } else if format == GpuFormat::Q1 || rows_per_warp == 2 {
            (3, 72 << 10)
        } else {
            (2, 100 << 10)
        };
        Gemv1Tuning {
            rows_per_warp,
            lanes: RowLanes::Split,
            smem_budget,
            blocks_per_sm,
        }
    }

    /// Wide rows in tiles of two rows per warp whose lanes share each chunk's activations: a
    /// 2-bit chunk's four 16-byte loads of activations serve two rows (six loads for two rows'
    /// chunks where there were ten; the 2-bit tile loop 100 instructions for two rows' chunks
    /// where one row's took about 55). Its 16-row tiles of a 17408-wide 2-bit row are 78 KB,
    /// so two stages take one block a multiprocessor (as many bytes in flight as two blocks of
    /// two 39 KB stages, the activations staged once per multiprocessor rather than twice).
    /// H200, 27B decode (`niwaki bench --device cuda -p 0 -n 128 -r 3`, settings alternated in
    /// one call), against one row per warp in two blocks: Q2_0 322.67 / 321.90 tok/s against
    /// 318.87 / 318.69 (+1.1%), PQ2_0 332.05 against 326.82 (+1.6%), PTQ1_0 331.47 against
    /// 326.56 (+1.5%).
    pub fn shared_wide() -> Gemv1Tuning {
        Gemv1Tuning {
            rows_per_warp: 2,
            lanes: RowLanes::Shared,
            smem_budget: 224 << 10,
            blocks_per_sm: 1,
        }
    }
}

/// A decode-GEMV launch: kernel variant, stages, grid and dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemv1Launch {
    pub rows_per_warp: usize,
    /// [`RowLanes::Shared`] with two rows per warp (the `r2s` kernels).
    pub shared_lanes: bool,
    pub stages: usize,
    pub grid: usize,
    pub smem_bytes: usize,
    pub stage_bytes: usize,
}

fn round128(n: usize) -> usize {
    n.div_ceil(128) * 128
}

/// Shared memory of one stage of the decode GEMV's ring: a tile's codes and scales.
fn stage_bytes(format: GpuFormat, cols: usize, rows_per_warp: usize) -> usize {
    let tr = GEMV1_WARPS * rows_per_warp;
    round128(tr * (cols / format.chunk_values()) * 16 + tr * (cols / format.scale_values()) * 2)
}

/// Shared memory of the decode GEMV's activations (int8 codes and group pairs), with one more
/// row of int8 staging where the block norms and quantizes its input itself, and the slack that
/// lets the kernel start them at a 1 KiB boundary (their swizzle counts from one).
pub(crate) fn x_bytes(cols: usize, fused_norm: bool) -> usize {
    let row = round128(cols);
    1024 + row + round128(8 * cols / X_GROUP) + if fused_norm { row } else { 0 }
}

/// Rows per multiprocessor under which a decode GEMV stages its activations by one tensor-map
/// copy into the swizzled layout (the `gemv1_*_x` kernels) rather than by every thread: none
/// now. The copy saves the staging's latency where a block has few tiles, and costs one more
/// instruction per 16 bytes of its reads. With a bound of 64 (the 27B's 5120-row matrices on
/// the H200's 132 multiprocessors: ffn_down, the attention and recurrent outputs) it measured
/// Q1_0 4% faster and Q2_0 within ±1.3% when it came (the 1-bit matrices have since gone to
/// the binary kernel, [`B1_MIN_TILES_PER_SM`], so only the 2-bit formats take it). Since the
/// norms were folded into those GEMVs and the picks stayed on the device, the same bound costs
/// Q2_0 2.3%: `niwaki bench --device cuda -p 0 -n 128 -r 3`, two rounds alternated in one call,
/// 292.51 / 292.94 tok/s with it against 299.63 / 299.53 without (`NIWAKI_CUDA_X_COPY=0`), Q1_0
/// level (395.77 / 396.21 against 395.85 / 395.67). `NIWAKI_CUDA_X_COPY=all` still takes it
/// wherever the row allows, and the harness checks those kernels against the others.
pub const X_COPY_MAX_ROWS_PER_SM: usize = 0;

/// Rows of 128 bytes in which the decode GEMV's activations of `cols` values arrive by one
/// tensor-map copy: `None` where the row is not whole 128-byte rows, or more than a box holds
/// (256 rows).
pub fn x_copy_rows(cols: usize) -> Option<usize> {
    (cols.is_multiple_of(128) && (1..=256).contains(&(cols / 128))).then_some(cols / 128)
}

/// The tensor map's view of a decode GEMV's activation row of `rows` 128-byte rows
/// ([`x_copy_rows`]): one box of all of them, landing with the 128-byte swizzle that the `_x`
/// kernels read.
pub fn x_copy_tile(rows: usize) -> crate::tma::Tile {
    use crate::tma::{Elem, Swizzle, Tile};
    Tile {
        elem: Elem::U8,
        cols: 128,
        rows,
        row_bytes: 128,
        box_cols: 128,
        box_rows: rows,
        swizzle: Swizzle::B128,
    }
}

/// Whether a decode GEMV of `rows` × `cols` stages its activations by the tensor-map copy on
/// `sms` multiprocessors (`always`: wherever the row allows, for checking the kernels).
pub fn prefers_x_copy(rows: usize, cols: usize, sms: usize, always: bool) -> bool {
    x_copy_rows(cols).is_some() && (always || rows < X_COPY_MAX_ROWS_PER_SM * sms.max(1))
}

/// Stages of a decode GEMV's ring: as many as the budget holds beside the activations, at most
/// [`GEMV1_MAX_STAGES`] and no more than the tiles (but two); `None` where fewer than `least`
/// fit (two, or one where no block has a second tile to stream behind its first).
fn ring_stages(
    budget: usize,
    x_bytes: usize,
    stage_bytes: usize,
    tiles: usize,
    least: usize,
) -> Option<usize> {
    let stages = (budget.saturating_sub(x_bytes) / stage_bytes)
        .min(GEMV1_MAX_STAGES)
        .min(tiles.max(2));
    (stages >= least).then_some(stages)
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
    let stage_bytes = stage_bytes(format, cols, t.rows_per_warp);
    let x_bytes = x_bytes(cols, fused_norm);
    // The kernel's static barriers come out of the same limit.
    let budget = t
        .smem_budget
        .min(smem_limit.saturating_sub(GEMV1_STATIC_SMEM));
    let tiles = rows.div_ceil(tr);
    let stages = ring_stages(budget, x_bytes, stage_bytes, tiles, 2)?;
    // Every place filled, even where blocks then differ by a tile: giving every block the same
    // number of tiles (fewer blocks) measured no faster on the H200 (tg128 Q2_0 251.4 against
    // 254.6, Q1_0 276.2 against 277.2).
    Some(Gemv1Launch {
        rows_per_warp: t.rows_per_warp,
        shared_lanes: t.lanes == RowLanes::Shared && t.rows_per_warp == 2,
        stages,
        grid: tiles.min(sms.max(1) * t.blocks_per_sm.max(1)),
        smem_bytes: x_bytes + stages * stage_bytes,
        stage_bytes,
    })
}

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

/// Whether the 2-bit rows' binary decode GEMVs stage their activations in shared memory by
/// bulk copies issued before the ring's other tiles ([`x_staged`]; `NIWAKI_CUDA_B2_X_STAGE=1`
/// turns it on): their consumers' own loads queue behind the ring's copies (the thirty-ninth
/// session's marks put the activations in their registers ~2 µs after the wait), as ffn_down's
/// 1-bit loads did before [`B1_X_STAGE`]. The same codes and pairs, so the same bits.
pub const B2_X_STAGE: bool = false;

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
/// L2 (`kernels/gemv_b1.cu`, XSM): its `_xs` kernel (and its image twin's, 2-bit rows), with
/// the row's codes (`cols` bytes, in whole KiB) between the pairs and the ring, and as many of
/// `l`'s stages as then fit the blocks a multiprocessor of its plan: two for the 1-bit rows of
/// 9 to 17 chunks a warp (ffn_down's among them), three for the 2-bit rows by default. `None`
/// for other kernels, or where two stages would not fit. Whether a launch takes it is the
/// backend's setting, per kind of row ([`B1_X_STAGE`], [`B2_X_STAGE`]).
pub fn x_staged(l: GemvB1Launch, cols: usize) -> Option<GemvB1Launch> {
    let b2 = |k: &'static str, i: &'static str| (k, Some(i));
    let (kernel, image_kernel) = match l.kernel {
        "gemv_b1_j17x" => ("gemv_b1_j17x_xs", None),
        "gemv_b1_j17" => ("gemv_b1_j17_xs", None),
        "gemv_b2g64_j10x" => b2("gemv_b2g64_j10x_xs", "gemv_b2g64_j10x_i_xs"),
        "gemv_b2g64_j12x" => b2("gemv_b2g64_j12x_xs", "gemv_b2g64_j12x_i_xs"),
        "gemv_b2g64_j12" => b2("gemv_b2g64_j12_xs", "gemv_b2g64_j12_i_xs"),
        "gemv_b2g128_j10x" => b2("gemv_b2g128_j10x_xs", "gemv_b2g128_j10x_i_xs"),
        "gemv_b2g128_j12x" => b2("gemv_b2g128_j12x_xs", "gemv_b2g128_j12x_i_xs"),
        "gemv_b2g128_j12" => b2("gemv_b2g128_j12_xs", "gemv_b2g128_j12_i_xs"),
        _ => return None,
    };
    let x_bytes = gemv_b1_x_bytes(cols) + round1024(cols);
    let fit = (SM90_SMEM_PER_SM / l.blocks_per_sm.max(1))
        .saturating_sub(GEMV_B1_STATIC_SMEM + SMEM_RESERVED_PER_BLOCK)
        .saturating_sub(1024 + x_bytes);
    let stages = l.stages.min(fit / l.stage_bytes);
    (stages >= 2).then_some(GemvB1Launch {
        kernel,
        image_kernel,
        stages,
        smem_bytes: 1024 + x_bytes + stages * l.stage_bytes,
        ..l
    })
}

/// Blocks of a cluster that gathers a folded norm's piece (`kernels/gemv_b1.cu`,
/// `fold_cluster`): a 128-row piece in tiles of 16 rows.
pub const FOLD_CLUSTER: usize = 8;

/// Which residual GEMVs gather their folded norms' pieces in clusters ([`cluster_fold`]) rather
/// than by arrival counters: none, those of Q2_0 g64 rows (the default), or every format's
/// (`NIWAKI_CUDA_FOLD_CLUSTER=0` and `=1`). Measured on the H200 (`niwaki bench --device cuda
/// -p 0 -n 128 -r 3`, medians, the setting alternated in one call, the thirty-sixth session):
/// Q2_0 319.13 and 319.80 tok/s in clusters against 314.81 and 314.87 by counters (+1.5%; the
/// harness's single runs in another call 322.1 against 318.0); PQ2_0 (g128 rows) 325.56 against
/// 327.27 (−0.5%); Q1_0 438.9 against 444.3 in the harness (its `_c` kernels take tiles of 16
/// rows where 32 are its default; alternated in an earlier call 392.2 and 391.1 against 396.3
/// and 397.7, −1.2%). The bits are the counters' either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterFold {
    Off,
    Q2G64,
    All,
}

impl ClusterFold {
    /// From `NIWAKI_CUDA_FOLD_CLUSTER` (`0` or `1`), where set.
    pub fn from_setting(on: Option<bool>) -> ClusterFold {
        match on {
            None => ClusterFold::Q2G64,
            Some(true) => ClusterFold::All,
            Some(false) => ClusterFold::Off,
        }
    }

    /// Whether the residual GEMVs of `format`'s rows take the clusters.
    pub fn takes(self, format: GpuFormat) -> bool {
        match self {
            ClusterFold::Off => false,
            ClusterFold::Q2G64 => format == GpuFormat::Q2G64,
            ClusterFold::All => true,
        }
    }

    pub(crate) fn code(self) -> u8 {
        self as u8
    }

    pub(crate) fn from_code(c: u8) -> ClusterFold {
        match c {
            0 => ClusterFold::Off,
            1 => ClusterFold::Q2G64,
            _ => ClusterFold::All,
        }
    }
}

/// The binary decode GEMV `l` of `rows` rows with the next norm's fold gathered in clusters of
/// [`FOLD_CLUSTER`] blocks rather than by arrival counters: its `_c` kernel, one block per
/// tile. `None` where that does not apply: tiles of other than 16 rows, rows not whole pieces
/// of 128, more tiles than blocks resident at once (a cluster's blocks gather once, after their
/// only tile, and a second round of clusters would trail the first), or a kernel with no `_c`
/// form (those the residual GEMVs of the 27B and the harness's smaller models take).
pub fn cluster_fold(l: GemvB1Launch, rows: usize) -> Option<GemvB1Launch> {
    let kernel = match l.kernel {
        "gemv_b1_j6x" => "gemv_b1_j6x_c",
        "gemv_b1_j6" => "gemv_b1_j6_c",
        "gemv_b2g64_j12x" => "gemv_b2g64_j12x_c",
        "gemv_b2g64_j12" => "gemv_b2g64_j12_c",
        "gemv_b2g128_j12x" => "gemv_b2g128_j12x_c",
        "gemv_b2g128_j12" => "gemv_b2g128_j12_c",
        _ => return None,
    };
    // One block per tile: the plan's grid already holds every tile where they fit at once.
    let one_wave = l.grid == rows / 16;
    (l.tile_rows == 16 && rows > 0 && rows.is_multiple_of(16 * FOLD_CLUSTER) && one_wave).then_some(
        GemvB1Launch {
            kernel,
            image_kernel: None,
            ..l
        },
    )
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

/// How many of its ring's first tiles a decode GEMV requests before waiting for the previous
/// kernel (the rest once that has ended). Requesting all of them (up to five stages of three
/// blocks a multiprocessor, ~24 MB for gate | up) made the small kernel in between, whose
/// blocks share the multiprocessors and the memory system with those copies, run longer:
/// the kernels' own timestamps inside the 27B Q1_0 decode graph on the H200 put a norm at 3.91
/// µs from its wait ending to its last block's end with every tile early and 2.30 with one
/// (the GEMVs' own runs 0.2–1 µs longer). `niwaki bench --device cuda -p 8 -n 128 -r 3`, two
/// rounds interleaved (medians, tok/s): Q1_0 348.0 / 360.2 with all, 363.1 / 376.2 with one,
/// 374.8 / 371.2 with two, 344.4 / 353.4 with none; Q2_0 272.9 / 273.1 with all, 273.9 /
/// 273.5 with one, 271.8 / 271.8 with two, 238.9 / 246.4 with none. Again with b97be45's
/// kernels (2026-12-04, `-p 0 -n 128 -r 3`, two rounds): Q2_0 329.0 / 330.2 with one, 308.3 /
/// 309.5 with two, 308.4 / 309.5 with three; the timeline's marks put a 2-bit GEMV's
/// activations in its consumers' registers 3.9 µs after its wait with none, 2.05 with one and
/// 1.46 with two (the loads queue behind the copies requested after the wait). The tile
/// requested early is there before the wait ends (a watching warp, `NIWAKI_CUDA_ABLATE=watch`:
/// a GdnIn block requests it 2.9 µs before ffn_down's last block ends and holds it 1.2 µs
/// later), so the consumers take it as soon as they hold their activations; with three early
/// tiles those are there 1 µs sooner, but the previous kernel's fold runs about 2 µs longer
/// under the next one's copies (ffn_down's last rows to its end 5.1 µs against 3.2).
pub const EARLY_TILES: usize = 1;

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

/// Whether the binary decode GEMVs that fold nothing hand out their tiles past each block's
/// first fill from a counter, a tile a refill, rather than each block taking tiles b + i·grid
/// (kernels/gemv_b1.cu, `TilePool`): a compile-time choice of the program (`DYN_TILES`;
/// `NIWAKI_CUDA_DYN_TILES=1` compiles it). Each tile's rows are the same arithmetic wherever it
/// runs, so the same bits.
pub const DYN_TILES: bool = false;

/// Which 2-bit binary decode GEMVs run four blocks a multiprocessor rather than three
/// (`NIWAKI_CUDA_B2_FOUR`: none by default, `wide` those of the kernels of up to 12 chunks a
/// warp, every width but the exact 5120 — on the 27B the 6144-wide residual GEMVs after the
/// recurrence and the attention —, `all` every one): their kernels compiled with registers
/// bounded for four (kernels/gemv_b1.cu, `B2_MINB_WIDE`, `B2_MINB`: 56 registers where three
/// leave 72, no spills either way in ptxas for sm_90a) and their plans taking four (a plan
/// that then fits fewer than two stages for blocks of several tiles is refused, and the matrix
/// goes to the dp4a kernel: none of the 27B's). The forty-first session found the GEMV after
/// the recurrence unable to place its blocks on the 48 multiprocessors the recurrence holds,
/// and three a multiprocessor on the other 84 hold 252 of its 320.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum B2Four {
    #[default]
    Off,
    Wide,
    All,
}

impl B2Four {
    /// From the knob's word (`wide`, `all`; anything else: off).
    pub fn from_setting(word: Option<&str>) -> B2Four {
        match word {
            Some("wide") => B2Four::Wide,
            Some("all") => B2Four::All,
            _ => B2Four::Off,
        }
    }

    /// The blocks a multiprocessor the plan takes for a binary GEMV of `format`'s rows and
    /// `cols` columns where this setting changes it: those whose kernel it bounds for four.
    pub fn blocks(self, format: GpuFormat, cols: usize) -> Option<usize> {
        let two_bit = format != GpuFormat::Q1;
        // The exact kernel of 10 chunks a warp is the one `wide` leaves (gemv_b2_kernel).
        let wide = cols / format.chunk_values() != 10 * GEMV1_WARPS;
        match self {
            B2Four::All if two_bit => Some(4),
            B2Four::Wide if two_bit && wide => Some(4),
            _ => None,
        }
    }

    /// The setting a program's options compiled (its [`B2Four::defines`]).
    pub fn from_defines(defines: &[String]) -> B2Four {
        let has = |d: &str| defines.iter().any(|x| x == d);
        match (has("-DB2_MINB=4"), has("-DB2_MINB_WIDE=4")) {
            (true, _) => B2Four::All,
            (false, true) => B2Four::Wide,
            _ => B2Four::Off,
        }
    }

    /// The program's options for it.
    pub fn defines(self) -> Vec<String> {
        match self {
            B2Four::Off => vec![],
            B2Four::Wide => vec!["-DB2_MINB_WIDE=4".into()],
            B2Four::All => vec!["-DB2_MINB=4".into(), "-DB2_MINB_WIDE=4".into()],
        }
    }
}

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

/// The shape of a tile image (`kernels/tile_image.cu`): a matrix's rows padded to
/// [`TILE_PAD_ROWS`], its 16-byte units a row, and the rows of the tiles it is laid out in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileImageShape {
    pub rows: usize,
    pub units: usize,
    pub tile_rows: usize,
}

impl TileImageShape {
    /// The image of a `rows` × `cols` matrix of `format` in tiles of `tile_rows` rows (shapes
    /// [`gemv_b1_launch`] takes: whole 128-byte boxes a row, tiles of 16 or 32 rows).
    pub fn new(format: GpuFormat, rows: usize, cols: usize, tile_rows: usize) -> Self {
        debug_assert!(cols >= format.chunk_values() && tile_rows > 0);
        TileImageShape {
            rows: rows.div_ceil(TILE_PAD_ROWS) * TILE_PAD_ROWS,
            units: cols / format.chunk_values(),
            tile_rows,
        }
    }

    /// 16-byte units of a tile.
    fn tile_units(&self) -> usize {
        b1_slabs(self.units) * 8 * self.tile_rows
    }

    /// 16-byte units of the image.
    pub fn units_total(&self) -> usize {
        self.rows.div_ceil(self.tile_rows) * self.tile_units()
    }

    /// Device bytes of the image.
    pub fn bytes(&self) -> usize {
        16 * self.units_total()
    }

    /// Where unit `q` of the image comes from: the row-major upload's unit `row · units + u`,
    /// or `None` for a zero unit. Unit p of row r of a tile's box b holds the row's unit
    /// 8b + (p ^ (r & 7)), the tensor map's 128-byte swizzle (the scalar twin of the kernel).
    pub fn source(&self, q: usize) -> Option<usize> {
        let tr = self.tile_rows;
        let (tile, rem) = (q / self.tile_units(), q % self.tile_units());
        let (b, r, p) = (rem / (8 * tr), (rem / 8) % tr, rem % 8);
        let u = 8 * b + (p ^ (r & 7));
        let row = tile * tr + r;
        (row < self.rows && u < self.units).then_some(row * self.units + u)
    }
}

/// Consumer warps of the persistent-step probe (`kernels/gemv_chain.cu`: one row each, so a
/// tile is this many rows; one more warp issues the copies) and the tiles its ring holds at most.
pub const CHAIN_WARPS: usize = 16;
pub const CHAIN_SLOTS: usize = 8;
/// Counters a block of the probe leaves where it is asked where its warps waited.
pub const CHAIN_STATS: usize = 8;
const _: () = assert!(
    TILE_PAD_ROWS.is_multiple_of(CHAIN_WARPS),
    "the probe copies whole tiles of the padded upload"
);

/// Shared memory of one tile of the persistent-step probe: [`CHAIN_WARPS`] rows' codes and
/// scales (1-bit and 2-bit g64 rows: a scale per chunk), rounded as the kernel rounds it.
pub fn chain_tile_bytes(format: GpuFormat, cols: usize) -> usize {
    round128(CHAIN_WARPS * (cols / format.chunk_values() * 16 + cols / format.scale_values() * 2))
}

/// Bytes of the next matrix a one-token GEMV pulls into the L2 cache by default (0: none;
/// `NIWAKI_CUDA_PREFETCH_MB` sets it for every matrix). It paid when it came (H200, tg128,
/// Q2_0 / Q1_0: none 243.6 / 264.5, 8 MiB 249.6 / 273.7, 16 MiB 245.7 / 271.2, 32 MiB
/// 241.6 / 269.1 tok/s), no longer once the norms were folded into the GEMVs and the picks
/// stayed on the device: at 869f2d1, none against 8 MiB, three rounds interleaved, `niwaki
/// bench -p 0 -n 128 -r 3` medians, Q2_0 292.6-293.1 against 288.5-288.7, PTQ1_0 302.8-303.6
/// against 298.7-299.6 tok/s. Matrices on the binary kernel ([`default_prefetch_bytes`]) take
/// none whatever this is.
pub const DEFAULT_PREFETCH_BYTES: usize = 0;

/// Whether the decode GEMVs' weight copies carry the L2 cache's evict-first policy by default
/// (`kernels/common.cuh`, `weights_policy`). Measured on the H200 at fe38db7's code plus the
/// policy (`niwaki bench --device cuda -p 0 -n 128 -r 3`, the policy and the cache's default
/// alternated, two rounds, medians with min-max): Q2_0 301.09 (300.90-301.50) and 301.50
/// (301.44-301.86) tok/s against 298.83 (298.70-298.98) and 298.86 (297.92-298.87); Q1_0 397.49
/// (396.84-397.62) and 397.79 (397.70-398.33) against 394.56 (393.46-394.95) and 394.68
/// (394.41-395.05): +0.8% on both, every run with it above every run without. Again on
/// 2026-12-04 (two rounds): Q2_0 329.96 / 329.62 against 328.74 / 329.18.
pub const WEIGHTS_EVICT_FIRST: bool = true;

/// The weights' L2 policy from `NIWAKI_CUDA_WEIGHTS_L2` (`first`: evict first; `normal`: the
/// cache's default; anything else or unset: [`WEIGHTS_EVICT_FIRST`]).
pub fn weights_evict_first(setting: Option<&str>) -> bool {
    match setting {
        Some("first") => true,
        Some("normal") => false,
        _ => WEIGHTS_EVICT_FIRST,
    }
}

/// The L2 prefetch a matrix gets by default from the GEMV before it: none where its own GEMV
/// runs on the binary tensor cores. Since those kernels wait for one round trip to L2 per six
/// chunks of a warp before their first tile (rather than one per chunk), the prefetch slows them: same binary, `NIWAKI_CUDA_PREFETCH_MB=0` against 8 on the H200, two
/// rounds interleaved, tg128 Q1_0 354.5-356.5 against 341.2-348.3 tok/s, Q2_0 (dp4a) 269.4-275.8
/// against 269.6-275.9. Again at b97be45's kernels (2026-12-04, one round, Q1_0, whose
/// kernels read the codes the prefetch names): 449.9 tok/s with none, 444.0 with 4 MiB, 440.5
/// with 8, 431.0 with 16. (The 2-bit kernels that take tile images read other bytes than the
/// codes this prefetches.)
pub fn default_prefetch_bytes(binary: bool) -> usize {
    if binary {
        0
    } else {
        DEFAULT_PREFETCH_BYTES
    }
}
