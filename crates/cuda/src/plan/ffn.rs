//! The decode step's feed-forward block in one launch (`kernels/ffn.cu`): gate | up, SwiGLU
//! and down with grid-wide barriers between them, every block resident. Its grid, threads and
//! shared memory.

use super::*;

/// Groups of [`GEMV1_WARPS`] consumer warps in a block (the kernel's FFN_GROUPS): the consumer
/// warps a multiprocessor runs as three 2-bit decode-GEMV blocks. Four would make blocks of
/// 1056 threads, more than a block may have.
pub const FFN_GROUPS: usize = 3;
/// Tiles the block's ring can have in flight at most (its barrier pairs; FFN_SLOTS).
pub const FFN_SLOTS: usize = 24;
/// Shared memory the kernel declares statically (its barriers and their tiles' ends: 480
/// bytes), kept out of its dynamic budget.
pub const FFN_STATIC_SMEM: usize = 1024;
/// Rows per tile of gate | up (two per consumer warp, as the decode GEMV's two-row kernels) and
/// of down (one: the 27B's 5120 rows make 640 tiles rather than 320, so that multiprocessors
/// differ by at most one small tile).
pub const FFN_GATE_UP_TILE_ROWS: usize = 2 * GEMV1_WARPS;
pub const FFN_DOWN_TILE_ROWS: usize = GEMV1_WARPS;

/// The launch of `ffn_decode_<format>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FfnLaunch {
    pub kernel: &'static str,
    /// One block per multiprocessor: the grid-wide barriers need every block resident.
    pub grid: usize,
    pub threads: usize,
    pub smem_bytes: usize,
    /// Bytes of the tile ring (what the activations leave of the block's shared memory).
    pub ring_bytes: usize,
}

/// Bytes of one staged tile of `rows` rows of `cols` values (codes, then scales, 128-byte
/// aligned), as the kernel's `ffn_mat` lays it out.
pub fn ffn_stage_bytes(format: GpuFormat, rows: usize, cols: usize) -> usize {
    let codes = rows * cols / format.chunk_values() * 16;
    let scales = rows * cols / format.scale_values() * 2;
    (codes + scales).next_multiple_of(128)
}

/// The launch for a model of `hidden` and `ffn` widths on `sms` multiprocessors whose blocks may
/// have `smem_limit` bytes of shared memory, or `None` where the kernel does not take the
/// shapes (widths of whole 128-value pieces) or its ring would not hold two of its largest tiles.
pub fn ffn_decode_launch(
    format: GpuFormat,
    hidden: usize,
    ffn: usize,
    sms: usize,
    smem_limit: usize,
) -> Option<FfnLaunch> {
    if sms == 0
        || hidden == 0
        || ffn == 0
        || !hidden.is_multiple_of(128)
        || !ffn.is_multiple_of(128)
    {
        return None;
    }
    let wide = hidden.max(ffn);
    let x_bytes = wide.next_multiple_of(128) + (8 * wide / 64).next_multiple_of(128);
    let largest = ffn_stage_bytes(format, FFN_GATE_UP_TILE_ROWS, hidden).max(ffn_stage_bytes(
        format,
        FFN_DOWN_TILE_ROWS,
        ffn,
    ));
    let ring_bytes = smem_limit
        .saturating_sub(FFN_STATIC_SMEM)
        .saturating_sub(x_bytes)
        / 128
        * 128;
    if ring_bytes < 2 * largest {
        return None;
    }
    let kernel = match format {
        GpuFormat::Q1 => "ffn_decode_q1",
        GpuFormat::Q2G64 => "ffn_decode_q2g64",
        GpuFormat::Q2G128 => "ffn_decode_q2g128",
    };
    Some(FfnLaunch {
        kernel,
        grid: sms,
        threads: 32 * (FFN_GROUPS * GEMV1_WARPS + 1),
        smem_bytes: x_bytes + ring_bytes,
        ring_bytes,
    })
}
