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
    let scratch = Scratch::new(&d, MAX_CHUNK, true).bytes;
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
    let s = Scratch::new(&d, MAX_CHUNK, true);
    let mut end = 0;
    for &(name, at, n) in &s.regions {
        assert_eq!(at % 256, 0, "{name}");
        assert!(at >= end, "{name} overlaps");
        end = at + n;
    }
    assert!(s.bytes >= end);
    assert_eq!(s.offset("x"), 0);
    // Without plane words the same regions, the words' two empty at the end.
    let bare = Scratch::new(&d, MAX_CHUNK, false);
    for &(name, at, n) in &bare.regions {
        if name == "xp" || name == "fold_xp" {
            assert_eq!((at, n), (bare.bytes, 0), "{name}");
        } else {
            assert_eq!((at, n), (s.offset(name), s.size(name)), "{name}");
        }
    }
    assert_eq!(bare.bytes, s.offset("xp"));
}
