//! The persistent-step probe's tiles (`kernels/gemv_chain.cu`).

use super::*;

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
