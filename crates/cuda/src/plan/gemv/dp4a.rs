//! The dp4a decode GEMV (`kernels/gemv.cu`, `gemv1_*`): its warps' rows, stages, activations'
//! staging and grid.

use super::*;

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

/// Chunks a lane of the shared-lanes kernels takes at a time (`SHARE_UNROLL` in
/// `kernels/gemv.cu`; `NIWAKI_CUDA_SHARE_UNROLL` sets it): the block is alone on its
/// multiprocessor, two warps a scheduler, so a lane's shared-memory loads for its next chunk
/// are better issued before its current chunk's arithmetic. Its sums keep their order (the
/// same bits). On the H200 (`crates/cuda/ab-h200.sh … -p 0 -n 128 -r 3`, tok/s, two rounds
/// on Q2_0): Q2_0 343.59 / 343.74 against 339.47 / 339.45 with one, PQ2_0 351.10 against
/// 346.80, PTQ1_0 351.18 against 345.65; three or four chunks at a time slower than two.
pub const SHARE_UNROLL: usize = 2;

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
