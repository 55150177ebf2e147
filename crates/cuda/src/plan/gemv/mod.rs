//! The GEMVs: the multi-token kernel's shape and what every decode GEMV shares (its ring's
//! stages, the tiles requested before its wait, the weights' L2 policy and prefetch); each
//! decode kernel family's plan in a file of its own.

use super::*;

mod binary;
mod chain;
mod cluster;
mod dp4a;
mod image;

pub use binary::*;
pub use chain::*;
pub use cluster::*;
pub use dp4a::*;
pub use image::*;

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

pub(super) fn round128(n: usize) -> usize {
    n.div_ceil(128) * 128
}

/// Stages of a decode GEMV's ring: as many as the budget holds beside the activations, at most
/// [`GEMV1_MAX_STAGES`] and no more than the tiles (but two); `None` where fewer than `least`
/// fit (two, or one where no block has a second tile to stream behind its first).
pub(super) fn ring_stages(
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
