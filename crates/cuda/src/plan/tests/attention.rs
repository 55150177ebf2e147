//! The attention kernels' launches and shared memory.

use super::super::*;
use super::dims;
use model::synth::Preset;

#[test]
fn the_attention_split_memory_holds_the_rings_and_the_merge() {
    let d = dims(Preset::B27);
    let l = |kv, tile| attn_split_launch(&d, kv, tile, AttnRing::simt(ATTN_RING_POSITIONS));
    assert_eq!(l(KvCache::F16, 8).smem_bytes, 4 * 16 * 2 * 512);
    assert_eq!(l(KvCache::Q8_0, 4).smem_bytes, 4 * 16 * 2 * (256 + 16));
    assert_eq!(l(KvCache::Q8_0, 8).kernel, "attn_split_q8_t8");
    let mma = l(KvCache::F16, 16);
    assert_eq!((mma.kernel, mma.threads), ("attn_split_mma", 128));
    // Four warps' rings of three f16 tiles (16 rows of keys, 16 of values, 528 bytes each),
    // the queries (hi, lo), the weights (hi, lo).
    assert_eq!(
        mma.smem_bytes,
        4 * 3 * 2 * 16 * 528 + 2 * 8 * 264 * 2 + 4 * 2 * 8 * 24 * 2
    );
    // The q8_0 one: rings of two tiles as cached (16 key rows of 288 bytes, 16 value rows of
    // 272, 16 bytes of scales a row each), the queries, the f32 weights.
    let q8 = l(KvCache::Q8_0, 16);
    assert_eq!((q8.kernel, q8.threads), ("attn_split_q8_mma", 64));
    assert_eq!(
        q8.smem_bytes,
        2 * 2 * 16 * (288 + 272 + 2 * 16) + 2 * 8 * 264 * 2 + 2 * 8 * 20 * 4
    );
    // One f16 block, four q8_0 ones fit an H200 multiprocessor (228 KiB, 1 KiB reserved a
    // block).
    for (a, blocks) in [(mma, 1), (q8, 4)] {
        assert!(
            blocks * (a.smem_bytes + 1024) <= 228 << 10,
            "{}",
            a.smem_bytes
        );
    }
    // Decode steps over short contexts take the SIMT kernel, over long ones the tensor cores,
    // each cache from its own length; multi-token passes keep the SIMT kernel.
    for (kv, from) in [
        (KvCache::F16, ATTN_MMA_FROM[0]),
        (KvCache::Q8_0, ATTN_MMA_FROM[1]),
    ] {
        assert_eq!(default_attn_tile(kv, 1, 1), 8);
        assert_eq!(default_attn_tile(kv, from - 1, 1), 8);
        assert_eq!(default_attn_tile(kv, from, 1), 16);
        assert_eq!(default_attn_tile(kv, 262_144, 1), 16);
        assert_eq!(default_attn_tile(kv, 262_144, 512), 8);
    }
    for p in [Preset::Tiny, Preset::Small, Preset::B27] {
        let d = dims(p);
        let gqa = d.n_head / d.n_head_kv;
        for kv in [KvCache::F16, KvCache::Q8_0] {
            for tile in ATTN_TILES {
                let a = attn_split_launch(&d, kv, tile, AttnRing::simt(ATTN_RING_POSITIONS_SMALL));
                let warps = a.threads / 32;
                assert!(
                    a.smem_bytes >= 4 * warps * gqa * (d.head_dim + 2),
                    "{p:?} {kv:?} {tile}"
                );
            }
        }
    }
}

#[test]
fn a_device_with_64_kib_per_block_gets_the_small_attention_ring() {
    let d = dims(Preset::B27);
    assert_eq!(attn_ring_positions(&d, 227 << 10), ATTN_RING_POSITIONS);
    assert_eq!(attn_ring_positions(&d, 64 << 10), ATTN_RING_POSITIONS_SMALL);
    let small = attn_split_launch(
        &d,
        KvCache::F16,
        8,
        AttnRing::simt(ATTN_RING_POSITIONS_SMALL),
    );
    assert!(small.smem_bytes + ATTN_STATIC_SMEM <= 48 << 10);
    // Smaller models keep the full ring within the 48 KiB every device has.
    assert_eq!(
        attn_ring_positions(&dims(Preset::Small), 48 << 10),
        ATTN_RING_POSITIONS
    );
}

#[test]
fn the_short_attention_launch_fits_its_rings_and_refuses_what_it_cannot_hold() {
    let d = dims(Preset::B27);
    let h200 = 227 << 10;
    let f16 = attn_short_launch(&d, KvCache::F16, h200).unwrap();
    // Eight warps of two tiles of 8 positions of 256 f16 keys and values, and the step's tile.
    assert_eq!(f16.kernel, "attn_short");
    assert_eq!(f16.threads, 256);
    assert_eq!(
        f16.smem_bytes,
        (8 * ATTN_SHORT_STAGES + 1) * 2 * ATTN_SHORT_TILE * 512
    );
    let q8 = attn_short_launch(&d, KvCache::Q8_0, h200).unwrap();
    assert_eq!(q8.kernel, "attn_short_q8");
    assert_eq!(
        q8.smem_bytes,
        (8 * ATTN_SHORT_STAGES + 1) * 2 * ATTN_SHORT_TILE * (256 + 16)
    );
    // The merge's accumulators fit where the rings were.
    assert!(f16.smem_bytes >= 4 * 8 * 256 && q8.smem_bytes >= 4 * 8 * 256);
    // A device of 99 KiB a block holds the q8_0 rings, not the f16 ones.
    assert!(attn_short_launch(&d, KvCache::F16, 99 << 10).is_none());
    assert!(attn_short_launch(&d, KvCache::Q8_0, 99 << 10).is_some());
    // Heads of 64 values: never.
    let tiny = dims(Preset::Tiny);
    assert!(attn_short_launch(&tiny, KvCache::F16, h200).is_none());
    // The short path's tiles are the split kernels' (their copy and row readers).
    assert!(ATTN_TILES.contains(&ATTN_SHORT_TILE));
}

#[test]
fn the_query_tiled_attention_holds_its_queries_and_stages_and_one_block_fits_a_hopper_sm() {
    let d = dims(Preset::B27);
    let k = attn_prefill_launch(&d, KvCache::F16).expect("f16");
    // A block: 16 tokens × the 6 query heads of its kv head.
    assert_eq!(k.rows, 16 * 6);
    let a = k.launch;
    // A warp per query head of a kv head.
    assert_eq!((a.kernel, a.threads), ("attn_prefill_mma", 6 * 32));
    // 16 tokens × 6 heads of queries as f16 pairs, three stages of 32 key and 32 value rows,
    // rows of 264 f16.
    assert_eq!(a.smem_bytes, 2 * 6 * 16 * 528 + 3 * 2 * 32 * 528);
    // q8_0: the queries, one f16 tile, its 2 × 32 × 8 scales, 8 factors and 6 × 8 floats of
    // their reduction (2,272 bytes, a multiple of 16), then three stages as cached (32 rows of
    // 256 key codes, of value codes, and their 16 bytes of scales each).
    let q8 = attn_prefill_launch(&d, KvCache::Q8_0).expect("q8_0").launch;
    assert_eq!((q8.kernel, q8.threads), ("attn_prefill_q8_mma", 6 * 32));
    assert_eq!(
        q8.smem_bytes,
        2 * 6 * 16 * 528 + 2 * 32 * 528 + 2_272 + 3 * 2 * 32 * (256 + 16)
    );
    for a in [a, q8] {
        assert!(a.smem_bytes + ATTN_STATIC_SMEM <= 227 << 10);
        assert!(2 * a.smem_bytes > 228 << 10);
    }
    // Heads that are not whole 128-value pieces have no q8_0 kernel.
    let mut narrow = d.clone();
    narrow.head_dim = 64;
    assert!(attn_prefill_launch(&narrow, KvCache::Q8_0).is_none());
    assert!(attn_prefill_launch(&narrow, KvCache::F16).is_some());
}

#[test]
fn the_query_tiled_splits_fill_the_device_once_and_cover_the_context_in_whole_stages() {
    // A 256-token chunk after 16k positions on 132 places: 64 blocks a split, so two splits.
    let d = dims(Preset::B27);
    let k = attn_prefill_launch(&d, KvCache::F16).expect("f16");
    assert_eq!(k.blocks(&d, 256), 64);
    let (n, len) = attn_prefill_splits(16_384 + 256, k.blocks(&d, 256), 132, SplitRule::OneWave);
    assert_eq!(n, 2);
    assert_eq!(len % ATTN_PREFILL_TILE, 0);
    assert!(n * len >= 16_640 && (n - 1) * len < 16_640);
    // Its grid: token tiles of 16 (a partial last one), kv heads, splits.
    assert_eq!(k.grid(&d, 256, n), (16, 4, 2));
    assert_eq!(k.grid(&d, 17, 1), (2, 4, 1));
    // A 512-token chunk fills them with one.
    assert_eq!(
        attn_prefill_splits(16_384 + 512, k.blocks(&d, 512), 132, SplitRule::OneWave),
        (1, 16_896)
    );
    // Short contexts: no split under the shortest length, however many places.
    assert_eq!(
        attn_prefill_splits(40, k.blocks(&d, 40), 4096, SplitRule::OneWave).0,
        1
    );
    let (n, len) = attn_prefill_splits(5020, k.blocks(&d, 20), 4096, SplitRule::OneWave);
    assert_eq!(n, 5020usize.div_ceil(ATTN_PREFILL_MIN_SPLIT));
    assert!(len >= ATTN_PREFILL_MIN_SPLIT && n * len >= 5020 && (n - 1) * len < 5020);
    // Never more splits than the partial rows hold, and none empty.
    for (ctx, ntok, places) in [
        (262_144, 2, 1 << 20),
        (1, 1, 132),
        (300, 17, 7),
        (70_000, 256, 264),
    ] {
        for rule in [SplitRule::OneWave, SplitRule::LeastTime] {
            let (n, len) = attn_prefill_splits(ctx, k.blocks(&d, ntok), places, rule);
            assert!((1..=ATTN_SPLITS).contains(&n), "{ctx} {ntok} {places}: {n}");
            assert!(
                n * len >= ctx && (n - 1) * len < ctx.max(1),
                "{ctx} {ntok} {places}: {n} × {len}"
            );
        }
    }
}

#[test]
fn the_warpgroup_query_tiled_attention_takes_128_rows_and_fits_one_block_a_hopper_sm() {
    let d = dims(Preset::B27);
    let k = attn_prefill_wg_launch(&d, WgEntry::Plain).expect("heads of 256");
    assert_eq!(
        (k.launch.kernel, k.launch.threads, k.rows),
        ("attn_prefill_wg", 256, 128)
    );
    // 128 rows of 256 values as f16 pairs, three stages of 32 key and 32 value rows, 1 KiB to
    // align them: within the 227 KiB a block may take.
    assert_eq!(
        k.launch.smem_bytes,
        2 * 128 * 256 * 2 + 3 * 2 * 32 * 256 * 2 + 1024
    );
    // With the static bound the device start adds, or it would quietly not run it.
    assert!(k.launch.smem_bytes + ATTN_STATIC_SMEM <= 227 << 10);
    // The other entries: the same block (the wide one's ring three halves of 64 positions, keys
    // or values), each its own kernel, each named by its knob's word.
    assert_eq!(3 * 64 * 256 * 2, ATTN_PREFILL_WG_STAGES * 2 * 32 * 256 * 2);
    let mut kernels = Vec::new();
    for (e, word) in WgEntry::ALL.into_iter().zip(["plain", "wide"]) {
        let l = attn_prefill_wg_launch(&d, e).expect("heads of 256");
        assert_eq!(
            (l.launch.threads, l.launch.smem_bytes, l.rows),
            (k.launch.threads, k.launch.smem_bytes, k.rows)
        );
        assert_eq!(WgEntry::named(word), Some(e));
        // The device's entries are indexed by the variant: its place in `ALL`.
        assert_eq!(WgEntry::ALL[e as usize], e);
        assert!(crate::compile::KERNELS.contains(&l.launch.kernel));
        kernels.push(l.launch.kernel);
    }
    kernels.sort_unstable();
    kernels.dedup();
    assert_eq!(kernels.len(), 2);
    assert_eq!(WgEntry::named("narrow"), None);
    for (r, word) in SplitRule::ALL.into_iter().zip(["wave", "time"]) {
        assert_eq!(SplitRule::named(word), Some(r));
    }
    assert_eq!(SplitRule::named("waves"), None);
    // Rows are (token, head) pairs: 256 tokens × 6 heads in 12 tiles, a 2-token pass in one.
    assert_eq!(k.grid(&d, 256, 3), (12, 4, 3));
    assert_eq!(k.blocks(&d, 2), 4);
    assert_eq!(k.blocks(&d, 22), 8);
    // Heads of 128 run it (its O by 128 columns), heads of 64 not.
    let tiny = dims(Preset::Tiny);
    assert_eq!(
        attn_prefill_wg_launch(&tiny, WgEntry::Plain).is_some(),
        tiny.head_dim.is_multiple_of(128)
    );
    let mut narrow = d.clone();
    narrow.head_dim = 64;
    for e in WgEntry::ALL {
        assert!(attn_prefill_wg_launch(&narrow, e).is_none());
    }
    // Its splits: 48 blocks a split of a 256-token chunk, so one wave's two fill 96 of 132
    // places; by least time eleven fill four waves whole. Whole stages of both kernels.
    let ctx = 16_384 + 256;
    let (n, len) = attn_prefill_splits(ctx, k.blocks(&d, 256), 132, SplitRule::OneWave);
    assert_eq!((n, len % ATTN_PREFILL_WG_TILE), (2, 0));
    let (n, len) = attn_prefill_splits(ctx, k.blocks(&d, 256), 132, SplitRule::LeastTime);
    assert_eq!((n, len % ATTN_PREFILL_WG_TILE), (11, 0));
    assert_eq!(attn_prefill_most_splits(48, 132, SplitRule::LeastTime), 11);
}

#[test]
fn the_least_time_rule_keeps_one_wave_where_it_fills_the_places_and_short_contexts_whole() {
    let d = dims(Preset::B27);
    let mma = attn_prefill_launch(&d, KvCache::F16).expect("f16");
    // 64 blocks on 132 places: one wave of two splits at 16k and 32k (97% of the places), as
    // the one-wave rule; 33 splits (16 waves, all places) only over long contexts.
    for ctx in [16_640, 33_024] {
        assert_eq!(
            attn_prefill_splits(ctx, mma.blocks(&d, 256), 132, SplitRule::LeastTime),
            attn_prefill_splits(ctx, mma.blocks(&d, 256), 132, SplitRule::OneWave),
        );
    }
    assert_eq!(attn_prefill_most_splits(64, 132, SplitRule::LeastTime), 33);
    assert_eq!(
        attn_prefill_splits(262_144, 64, 132, SplitRule::LeastTime).0,
        33
    );
    // Short contexts: never under the shortest split, so one split below it.
    assert_eq!(attn_prefill_splits(300, 48, 132, SplitRule::LeastTime).0, 2);
    assert_eq!(attn_prefill_splits(200, 48, 132, SplitRule::LeastTime).0, 1);
    // Each count it takes costs no more than any other it could take (a brute check of the
    // minimum over the whole range, with the same cost).
    for (ctx, blocks, places) in [(16_640, 48, 132), (33_024, 40, 132), (5_000, 12, 7)] {
        let (n, _) = attn_prefill_splits(ctx, blocks, places, SplitRule::LeastTime);
        let time =
            |s: usize| (blocks * s).div_ceil(places) * (ctx.div_ceil(s) + ATTN_PREFILL_SPLIT_COST);
        let most = ctx.div_ceil(ATTN_PREFILL_MIN_SPLIT).min(ATTN_SPLITS);
        assert!(
            (1..=most).all(|s| time(n) <= time(s)),
            "{ctx} {blocks} {places}: {n}"
        );
    }
}

#[test]
fn the_tensor_core_split_sizes_its_rings_from_its_shape() {
    let d = dims(Preset::B27);
    let shaped = |mma_warps, mma_stages| {
        let ring = AttnRing {
            mma_warps,
            mma_stages,
            ..AttnRing::simt(ATTN_RING_POSITIONS)
        };
        attn_split_launch(&d, KvCache::F16, 16, ring)
    };
    let base = shaped(ATTN_MMA_WARPS, ATTN_MMA_STAGES);
    assert_eq!(
        base,
        attn_split_launch(&d, KvCache::F16, 16, AttnRing::simt(ATTN_RING_POSITIONS))
    );
    // A stage of a warp: 16 key rows and 16 value rows of 528 bytes; a warp's weights (hi, lo).
    let (stage, weights) = (2 * 16 * 528, 2 * 8 * 24 * 2);
    let w2s3 = shaped(2, 3);
    assert_eq!(w2s3.threads, 64);
    assert_eq!(
        w2s3.smem_bytes,
        base.smem_bytes - 4 * 3 * stage + 2 * 3 * stage - 2 * weights
    );
    // Four warps of three stages fit an H100's or H200's block; of four stages they do not.
    assert!(shaped(4, 3).smem_bytes + ATTN_STATIC_SMEM <= 227 << 10);
    assert!(shaped(4, 4).smem_bytes > 227 << 10);
    // A device takes the plan's shape where its blocks hold it (an H100's or H200's 227 KiB),
    // else the small one (an A100's 163 KiB).
    let shape = |smem| {
        let r = attn_ring(&d, smem);
        (r.mma_warps, r.mma_stages)
    };
    assert_eq!(shape(227 << 10), (ATTN_MMA_WARPS, ATTN_MMA_STAGES));
    assert_eq!(shape(163 << 10), ATTN_MMA_SMALL_SHAPE);
    let (w, st) = ATTN_MMA_SMALL_SHAPE;
    assert!(shaped(w, st).smem_bytes + ATTN_STATIC_SMEM <= 163 << 10);
    assert!(shaped(ATTN_MMA_WARPS, ATTN_MMA_STAGES).smem_bytes > 163 << 10);
    assert_eq!(attn_ring(&d, 227 << 10).simt, ATTN_RING_POSITIONS);
    // The choices a measurement may take include the plan's.
    assert!(ATTN_MMA_WARPS_CHOICES.contains(&ATTN_MMA_WARPS));
    assert!(ATTN_MMA_STAGES_CHOICES.contains(&ATTN_MMA_STAGES));
    assert!(ATTN_MMA_PREFETCH_CHOICES.contains(&ATTN_MMA_PREFETCH));
}
