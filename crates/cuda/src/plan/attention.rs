//! Flash-decoding attention: split counts and lengths, and each split kernel's launch.

use super::*;

/// Partitions of the KV range in flash-decoding (one block per kv head and split).
pub const ATTN_SPLITS: usize = 128;
/// Warps of an attention-split block (the kernel's AWARPS).
pub const ATTN_WARPS: usize = 4;
/// Cache positions a warp of the attention split takes at a time: the kernel variants (4 and 8:
/// one FMA per value and head; 16: the tensor-core kernels, sm_80+). H200, 27B Q2_0 at 32k
/// depth, µs per layer, f16 / q8_0 cache: tiles of 4 60.9 / 63.2, of 8 57.3 / 59.2.
pub const ATTN_TILES: [usize; 3] = [4, 8, 16];
/// Contexts from which a decode step takes the tensor-core split by default (f16, q8_0 cache): below,
/// the SIMT kernel with tiles of 8 starts and ends sooner; above, the tensor cores' cheaper
/// arithmetic per position wins. H200, 27B Q2_0, decode tok/s (GPU argmax), SIMT against
/// tensor cores: f16 287.3 / 278.6 at 133 positions, 256.9 / 260.0 at 16,453, 240.8 / 244.1
/// at 32,837, 173.5 / 178.0 at 131,141; q8_0 289.5 / 279.5, 255.6 / 255.4, 238.5 / 247.4,
/// 167.0 / 202.8 (crossing near 12k and 16k). Measured again at 32,768 (thirty-seventh session,
/// `-p 0 -n 64 -r 3 -d 32768`, `NIWAKI_CUDA_ATTN_TILE=8` against the default): tensor cores
/// 257.41 / 261.18 tok/s against SIMT 253.48 / 254.21, though the harness had timed the f16
/// SIMT split alone faster than the tensor-core one (44.6 against 48.9 µs a layer). With the f16
/// split in blocks of three warps, its crossing moved down (fifty-fourth session, an H100, 27B
/// Q1_0, `-p 0 -n 64 -r 3 -d D`, two rounds, SIMT against tensor cores): 403.2 / 396.7 tok/s at
/// 1,024, 396.0 / 394.5 at 2,048, 391.8 / 388.8 at 2,560, 378.2 / 389.6 at 3,072, 369.6 / 386.3
/// at 4,096, 356.5 / 370.6 at 8,192 (Q2_0: 272.7 / 278.1 at 3,072, 271.7 / 276.9 at 4,096); the
/// q8_0 split's did not (375 / 365 at 4,096, 367 / 359 at 8,192, 361 / 351 at 12,288). The
/// H200's crossing, the figures above, was not measured again: 3,072 holds for every device.
pub const ATTN_MMA_FROM: [usize; 2] = [3_072, 16_384];

/// The attention-split tile a pass of `ntok` tokens over a context of `n_ctx` positions takes
/// by default (a device that cannot run it falls back to the SIMT kernel with tiles of 8).
/// Multi-token passes keep the SIMT kernel: the tensor-core ones were measured on decode steps
/// only.
pub fn default_attn_tile(kv: KvCache, n_ctx: usize, ntok: usize) -> usize {
    let from = match kv {
        KvCache::F16 => ATTN_MMA_FROM[0],
        KvCache::Q8_0 => ATTN_MMA_FROM[1],
    };
    if ntok == 1 && n_ctx >= from {
        16
    } else {
        8
    }
}
/// Cache positions in flight per warp of the SIMT attention split (its ring holds this many
/// positions' keys and values: 4 tiles of 4 or 2 of 8), and the smaller ring for devices whose
/// blocks cannot have that much shared memory (64 KiB on sm_75: a 27B f16 ring of 16 needs
/// 64 KiB plus the kernel's static memory).
pub const ATTN_RING_POSITIONS: usize = 16;
pub const ATTN_RING_POSITIONS_SMALL: usize = 8;
/// Upper bound of the attention-split kernels' static shared memory (their per-warp scores and
/// weights: 4 × (8 × 8 + 8) floats at most).
pub const ATTN_STATIC_SMEM: usize = 1152;
/// Warps of a tensor-core attention-split block, f16 and q8_0 (the kernels' AM_WARPS and
/// MW_WARPS), positions per warp tile, tiles per ring of the f16 kernel and of the q8_0 one
/// (MW_TILE, AM_STAGES, AQ_STAGES). The f16 blocks' rings bound them to two a multiprocessor,
/// so three warps a block give a multiprocessor six warps where two gave four: waiting on its
/// loads with one warp a scheduler, the split read the cache at 2.1 TB/s (Nsight Compute, H100,
/// 27B at 32k positions), and decode there went 302.3 → 306.2 tok/s (Q1_0, f16 cache, one
/// round; two rounds at 8k-64k: +0.8-1.8%). The q8_0 ring holds tiles as cached (codes and
/// scales): two stages keep four blocks of two warps on an H200 multiprocessor (three stages,
/// three blocks: its arithmetic, not the bytes in flight, bounded it); its 255 registers leave
/// no room for more warps (five blocks, the queries kept in a ring stage: 168 registers with
/// spills, 6.9% slower at 32k on an H100). One block of four f16 warps with three-tile rings
/// (the same 12 tiles in flight a multiprocessor, half the splits) was faster at every depth:
/// +0.3-1.0% at 4k-32k over two rounds, +1.4% at 32k over three (H100, Q1_0, the harness
/// passing under it). It needs ~210 KB of shared memory a block, which an H100's or H200's
/// blocks have and smaller devices' do not: there [`attn_ring`] takes
/// [`ATTN_MMA_SMALL_SHAPE`].
pub const ATTN_MMA_WARPS: usize = 4;
pub const ATTN_Q8_MMA_WARPS: usize = 2;
pub const ATTN_MMA_TILE: usize = 16;
pub const ATTN_MMA_STAGES: usize = 3;
/// The f16 tensor-core split's warps a block and tiles a warp's ring on devices whose blocks
/// cannot hold [`ATTN_MMA_WARPS`] × [`ATTN_MMA_STAGES`]: three warps of two-tile rings (~112 KB
/// for the 27B's heads), two blocks a multiprocessor where they fit.
pub const ATTN_MMA_SMALL_SHAPE: (usize, usize) = (3, 2);
pub const ATTN_Q8_MMA_STAGES: usize = 2;
/// Tiles ahead of its ring whose rows the f16 tensor-core split asks the L2 cache for (the
/// kernel's AM_PREFETCH; 0: none). A measurement's choice (`NIWAKI_CUDA_ATTN_MMA_PREFETCH`):
/// at 32k positions the split's loads, not its arithmetic, hold it (its arithmetic taken out:
/// +0.5%; its copies: +22%, H100, Q1_0), but asking L2 for rows ahead only competes with the
/// loads already in flight: 1, 2 and 4 tiles ahead were −0.4%, −5.6% and −9.9% at 32k.
pub const ATTN_MMA_PREFETCH: usize = 0;
/// The f16 tensor-core split's warps a block and tiles a warp's ring that a measurement may
/// set (`NIWAKI_CUDA_ATTN_MMA_WARPS`, `NIWAKI_CUDA_ATTN_MMA_STAGES`), and its prefetch
/// distances (`NIWAKI_CUDA_ATTN_MMA_PREFETCH`).
pub const ATTN_MMA_WARPS_CHOICES: [usize; 4] = [1, 2, 3, 4];
pub const ATTN_MMA_STAGES_CHOICES: [usize; 3] = [2, 3, 4];
pub const ATTN_MMA_PREFETCH_CHOICES: [usize; 4] = [0, 1, 2, 4];

/// The split kernels' staging: cache positions a warp of the SIMT split holds (the kernels'
/// ARING, [`attn_ring_positions`]), and the f16 tensor-core split's warps a block, tiles a
/// warp's ring and tiles prefetched ahead of it (AM_WARPS, AM_STAGES, AM_PREFETCH).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnRing {
    pub simt: usize,
    pub mma_warps: usize,
    pub mma_stages: usize,
    pub mma_prefetch: usize,
}

impl AttnRing {
    /// The plan's shape with a SIMT ring of `simt` positions a warp.
    pub const fn simt(simt: usize) -> AttnRing {
        AttnRing {
            simt,
            mma_warps: ATTN_MMA_WARPS,
            mma_stages: ATTN_MMA_STAGES,
            mma_prefetch: ATTN_MMA_PREFETCH,
        }
    }
}
/// Floats per head row of a q8_0 tensor-core warp's weights (the kernel's MQ_PROW).
const ATTN_Q8_MMA_PROW: usize = 20;
/// Fewest cache positions per split: short contexts use few splits, and the merge reads few
/// partial rows (at 128 splits a 100-token context merged 128 partials of one position each).
pub const ATTN_MIN_SPLIT_LEN: usize = 32;
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

/// Whether a split kernel's grid runs its tokens before its splits: (kv heads, tokens, splits)
/// rather than (kv heads, splits, tokens), `NIWAKI_CUDA_ATTN_TOKEN_MAJOR` (the kernels'
/// ATTN_TOKEN_MAJOR). Each block does the same work either way, so the results are the same
/// bits, and a one-token pass's blocks run in the same order; a multi-token pass's blocks then
/// come a split at a time, its tokens reading the same cache rows together (from the L2 cache,
/// once the first has read them), where a token at a time reads the whole cache per token: at
/// 16k positions an attention layer's cache is 67 MB (f16), more than the L2's 50 MB, and a
/// 256-token pass reads 17 GB of it that way. Not yet measured, so off.
pub const ATTN_TOKEN_MAJOR: bool = false;

/// The grid of a split kernel's launch over `n_head_kv` kv heads, `nsplit` splits and `ntok`
/// tokens, in the order [`ATTN_TOKEN_MAJOR`] says (`token_major`).
pub fn attn_split_grid(
    n_head_kv: usize,
    nsplit: usize,
    ntok: usize,
    token_major: bool,
) -> (u32, u32, u32) {
    let (y, z) = if token_major {
        (ntok, nsplit)
    } else {
        (nsplit, ntok)
    };
    (n_head_kv as u32, y as u32, z as u32)
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

/// The split attention's staging a device with `smem_limit` bytes of shared memory a block
/// holds: the SIMT ring of [`attn_ring_positions`], and the plan's tensor-core shape where its
/// block fits, else [`ATTN_MMA_SMALL_SHAPE`] (which, where it does not fit either, leaves the
/// device the SIMT split).
pub fn attn_ring(d: &Dims, smem_limit: usize) -> AttnRing {
    let ring = AttnRing::simt(attn_ring_positions(d, smem_limit));
    let fits = |r: AttnRing| {
        attn_split_launch(d, KvCache::F16, ATTN_MMA_TILE, r).smem_bytes + ATTN_STATIC_SMEM
            <= smem_limit
    };
    if fits(ring) {
        return ring;
    }
    let (mma_warps, mma_stages) = ATTN_MMA_SMALL_SHAPE;
    AttnRing {
        mma_warps,
        mma_stages,
        ..ring
    }
}

/// The attention ring a device can hold: [`ATTN_RING_POSITIONS`] when an f16 block of the SIMT
/// split fits the per-block shared-memory limit `smem_limit`, else the small one.
pub fn attn_ring_positions(d: &Dims, smem_limit: usize) -> usize {
    let f16 = attn_split_launch(d, KvCache::F16, 8, AttnRing::simt(ATTN_RING_POSITIONS));
    if f16.smem_bytes + ATTN_STATIC_SMEM <= smem_limit {
        ATTN_RING_POSITIONS
    } else {
        ATTN_RING_POSITIONS_SMALL
    }
}

/// The attention-split kernel for a cache type and tile size (one of [`ATTN_TILES`]) and what
/// it needs, its staging as `ring` says: each warp's ring of staged keys and values (and q8_0
/// scales), reused for the merge of the warps' accumulators; the tensor-core kernel (its own
/// ring) also stages the queries and its weights.
pub fn attn_split_launch(d: &Dims, kv: KvCache, tile: usize, ring: AttnRing) -> AttnLaunch {
    let gqa = d.n_head / d.n_head_kv;
    let merge = |warps: usize| 4 * warps * gqa * (d.head_dim + 2);
    let row = d.head_dim * kv.value_bytes() + kv.scale_bytes(d.head_dim);
    let simt = |kernel| AttnLaunch {
        kernel,
        threads: 32 * ATTN_WARPS,
        smem_bytes: (ATTN_WARPS * ring.simt * 2 * row).max(merge(ATTN_WARPS)),
    };
    // The tensor-core kernels' queries (hi, lo).
    let queries = 2 * 8 * (d.head_dim + 8) * 2;
    match (kv, tile) {
        (KvCache::F16, 16) => {
            let w = ring.mma_warps;
            // f16 tiles of keys and values, rows padded by 16 bytes.
            let rings = w * ring.mma_stages * 2 * ATTN_MMA_TILE * (2 * d.head_dim + 16);
            let weights = w * 2 * 8 * 24 * 2;
            AttnLaunch {
                kernel: "attn_split_mma",
                threads: 32 * w,
                smem_bytes: rings.max(merge(w)) + queries + weights,
            }
        }
        (KvCache::Q8_0, 16) => {
            let w = ATTN_Q8_MMA_WARPS;
            // Key rows padded by 32 bytes, value rows by 16 (the kernel's MQ_KROW, MQ_VROW),
            // then both rows' scales.
            let hd = d.head_dim;
            let stage = ATTN_MMA_TILE * ((hd + 32) + (hd + 16) + 2 * kv.scale_bytes(hd));
            let rings = w * ATTN_Q8_MMA_STAGES * stage;
            let weights = w * 8 * ATTN_Q8_MMA_PROW * 4;
            AttnLaunch {
                kernel: "attn_split_q8_mma",
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

/// Cache positions a warp of the one-kernel short attention (`attn_short`, kernels/attention.cu)
/// takes at a time, and the tiles of its ring (the kernel's AS_TILE, AS_STAGES): with heads of
/// 256 values, eight warps have 128 positions in flight, requested before the wait.
pub const ATTN_SHORT_TILE: usize = 8;
pub const ATTN_SHORT_STAGES: usize = 2;
/// The longest context whose one-token passes take the short attention by default
/// (`NIWAKI_CUDA_ATTN_SHORT` sets it; 0: never). H200, 27B Q1_0, decode tok/s against the
/// split path: 440.4 against 418.3 over contexts 1-128 (`-p 0 -n 128`), 416.4 against 411.6
/// over 257-320, 401.8 against 410.5 over 513-576, 373.0 against 410.4 over 1025-1088: a
/// block a head streams the whole context, and past a few hundred positions the split's many
/// blocks win.
pub const ATTN_SHORT_MAX: usize = 320;

/// The one-kernel short attention's launch for a cache type: a block of `head_dim` threads per
/// query head, a ring of [`ATTN_SHORT_STAGES`] tiles a warp and one tile more for the step's own
/// row; `None` where it does not apply (heads not whole 128-value pieces of the quantization, or
/// of more than 1024 values), or where a block's shared memory, its static arrays included,
/// would pass `smem_limit`.
pub fn attn_short_launch(d: &Dims, kv: KvCache, smem_limit: usize) -> Option<AttnLaunch> {
    let hd = d.head_dim;
    if !hd.is_multiple_of(128) || hd > 1024 {
        return None;
    }
    let row = hd * kv.value_bytes() + kv.scale_bytes(hd);
    let tile = 2 * ATTN_SHORT_TILE * row;
    let warps = hd / 32;
    // The kernel's static arrays: the head's rotation buffer and query, a block sum's, and per
    // warp a tile's weights with its correction and the running max and sum.
    let fixed = 4 * (2 * hd + 32 + warps * (ATTN_SHORT_TILE + 1) + warps * 2);
    let launch = AttnLaunch {
        kernel: match kv {
            KvCache::F16 => "attn_short",
            KvCache::Q8_0 => "attn_short_q8",
        },
        threads: hd,
        // The rings end as the warps' accumulators for the merge: warps · hd floats.
        smem_bytes: (warps * ATTN_SHORT_STAGES * tile + tile).max(4 * warps * hd),
    };
    (launch.smem_bytes + fixed <= smem_limit).then_some(launch)
}
