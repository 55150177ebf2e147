//! Device memory sized from the context: what fits, and the errors where it does not.

use super::super::*;
use super::dims;
use model::synth::Preset;

#[test]
fn a_full_262k_context_fits_beside_the_27b_weights_on_an_h200() {
    let d = dims(Preset::B27);
    let s = StateBytes::new(&d, 262_144, KvCache::F16);
    // 16 layers × 262144 × 4 kv heads × 256 × 2 (K, V) × 2 bytes = 16 GiB.
    assert_eq!(s.kv, 16 << 30);
    // q8_0: 256 bytes of values and 16 of scales per row instead of 512.
    let q = StateBytes::new(&d, 262_144, KvCache::Q8_0);
    assert_eq!(q.kv, (16 << 30) / 512 * 272);
    let [k, v, ks, vs] = q.kv_layer(15, 16);
    assert_eq!(k % 256, 0);
    assert_eq!(v + q.kv_values, 2 * 16 * q.kv_values + q.kv_offset());
    assert_eq!(ks, v + q.kv_values + 15 * q.kv_scales);
    assert_eq!(vs + q.kv_scales, q.total());
    // Two buffers of 48 heads of 128×128 f32 for each of 48 layers.
    assert_eq!(s.ssm, 2 * 48 * 48 * 128 * 128 * 4);
    // The split kernels' partial rows (the larger room: no query-tiled attention).
    let rows = attn_part_rows(&d, MAX_CHUNK, None, ATTN_PREFILL_SPLIT_RULE);
    let scratch = Scratch::new(&d, MAX_CHUNK, rows, true).bytes;
    let weights = 7_600_000_000usize;
    let h200_free = 139usize << 30;
    check_fits(
        "27B",
        &[
            ("weights", weights),
            ("state", s.total()),
            ("scratch", scratch),
        ],
        h200_free,
    )
    .unwrap();
}

#[test]
fn an_allocation_that_does_not_fit_is_an_error_with_numbers() {
    let err = check_fits("state", &[("kv", 3 << 30), ("ssm", 1 << 20)], 2 << 30).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("3073 MiB") && msg.contains("2048 MiB free"),
        "{msg}"
    );
    assert!(msg.contains("kv 3072 MiB"), "{msg}");
}

#[test]
fn scratch_regions_are_aligned_and_disjoint() {
    let d = dims(Preset::B27);
    let tiled = attn_prefill_launch(&d, KvCache::F16).map(|k| (k, 132));
    let rows = attn_part_rows(&d, MAX_CHUNK, tiled, ATTN_PREFILL_SPLIT_RULE);
    let s = Scratch::new(&d, MAX_CHUNK, rows, true);
    let mut end = 0;
    for &(name, at, n) in &s.regions {
        assert_eq!(at % 256, 0, "{name}");
        assert!(at >= end, "{name} overlaps");
        end = at + n;
    }
    assert!(s.bytes >= end);
    assert_eq!(s.offset("x"), 0);
    // Without plane words the same regions, the words' two empty at the end.
    let bare = Scratch::new(&d, MAX_CHUNK, rows, false);
    for &(name, at, n) in &bare.regions {
        if name == "xp" || name == "fold_xp" {
            assert_eq!((at, n), (bare.bytes, 0), "{name}");
        } else {
            assert_eq!((at, n), (s.offset(name), s.size(name)), "{name}");
        }
    }
    assert_eq!(bare.bytes, s.offset("xp"));
}

#[test]
fn the_partial_rows_are_sized_for_the_attention_kernels_a_pass_takes() {
    let d = dims(Preset::B27);
    let per_row = 4 * d.n_head * (d.head_dim + 2);
    // The split kernels a token at a time: every token of a chunk up to 128 splits (811 MB of
    // the 27B's scratch).
    let split = attn_part_rows(&d, MAX_CHUNK, None, SplitRule::OneWave);
    assert_eq!(split, MAX_CHUNK * ATTN_SPLITS);
    // The query-tiled attention on 132 places, one wave: a 16-token pass takes 33 splits (528
    // rows), a 256-token one 2; one-token passes keep the split kernels' 128.
    let (one, least) = (SplitRule::OneWave, SplitRule::LeastTime);
    let mma = attn_prefill_launch(&d, KvCache::F16).expect("f16");
    let tiled = attn_part_rows(&d, MAX_CHUNK, Some((mma, 132)), one);
    assert_eq!(tiled, 528);
    assert_eq!(attn_part_rows(&d, 1, Some((mma, 132)), one), ATTN_SPLITS);
    // The warpgroup form, 128 rows a block: its most is 64 tokens (384 rows, three row tiles,
    // 12 blocks a split) in 11 splits.
    let wg = attn_prefill_wg_launch(&d, WgEntry::Plain).expect("wg");
    assert_eq!(attn_part_rows(&d, MAX_CHUNK, Some((wg, 132)), one), 64 * 11);
    // By least time a 256-token pass may fill 16 waves whole with 33 splits of 64 blocks
    // (8,448 rows: 209 MB, a quarter of the split kernels' room); the warpgroup form's most is
    // 213 tokens (1,278 rows, ten row tiles, 40 blocks a split) in 33.
    assert_eq!(
        attn_part_rows(&d, MAX_CHUNK, Some((mma, 132)), least),
        256 * 33
    );
    assert_eq!(
        attn_part_rows(&d, MAX_CHUNK, Some((wg, 132)), least),
        213 * 33
    );
    let (big, small) = (
        Scratch::new(&d, MAX_CHUNK, split, true),
        Scratch::new(&d, MAX_CHUNK, tiled, true),
    );
    assert_eq!(big.size("part"), split * per_row);
    assert_eq!(big.bytes - small.bytes, (split - tiled) * per_row);
    // Every pass the split rule can make fits its room, over both kernels, contexts and device
    // sizes (the second wave's switch doubles the places).
    for k in [mma, wg] {
        for places in [1, 7, 132, 264, 1 << 12] {
            let room = |rule| attn_part_rows(&d, MAX_CHUNK, Some((k, places)), rule);
            for ntok in (2..=MAX_CHUNK)
                .step_by(7)
                .chain([16, 17, 21, 22, MAX_CHUNK])
            {
                for ctx in [ntok, 300, 4_097, 16_384 + ntok, 262_144] {
                    for rule in [SplitRule::OneWave, SplitRule::LeastTime] {
                        let (n, _) = attn_prefill_splits(ctx, k.blocks(&d, ntok), places, rule);
                        assert!(
                            ntok * n <= room(rule),
                            "{} on {places} places, {ntok} tokens, {ctx}: {n} splits",
                            k.launch.kernel
                        );
                    }
                }
            }
        }
    }
}
