//! The model shapes the backend takes, and those it refuses.

use super::super::*;
use super::dims;
use model::synth::Preset;

#[test]
fn the_27b_shapes_are_supported_and_stack_as_expected() {
    let d = dims(Preset::B27);
    assert_eq!((d.n_recurrent(), d.n_attention()), (48, 16));
    assert_eq!(d.conv_channels(), 10240);
    assert_eq!(d.gdn_in_rows(), 10240 + 6144 + 96);
    assert_eq!(d.attn_in_rows(), 2 * 24 * 256 + 2 * 4 * 256);
    assert_eq!(d.proj_rows(), 2 * 17408);
    assert_eq!(d.kind_index(3), 0);
    assert_eq!(d.kind_index(4), 3);
    assert_eq!(d.kind_index(63), 15);
}

#[test]
fn unsupported_shapes_are_refused_by_name() {
    let mut d = dims(Preset::Tiny);
    d.value_dim = 64;
    assert!(d.check().unwrap_err().to_string().contains("128×128") || d.check().is_err());
    let mut d = dims(Preset::Tiny);
    d.head_dim = 48;
    assert!(d.check().unwrap_err().to_string().contains("head dim 48"));
}

#[test]
fn calls_are_cut_into_chunks() {
    let c: Vec<_> = chunks(2 * MAX_CHUNK + 22).collect();
    assert_eq!(
        c,
        vec![(0, MAX_CHUNK), (MAX_CHUNK, MAX_CHUNK), (2 * MAX_CHUNK, 22)]
    );
    assert_eq!(attn_split_len(1, ATTN_SPLITS), ATTN_MIN_SPLIT_LEN);
    assert_eq!(attn_splits(5, 1, 99), 99);
    assert_eq!(attn_splits(5, 1, 1000), ATTN_SPLITS);
    assert_eq!(attn_splits(300, 256, 99), 2);
    assert_eq!(attn_splits(1 << 20, 256, 99), ATTN_SPLITS);
    assert_eq!(attn_splits(17, 17, 99), 1);
    // One wave: 3 blocks on each of 132 multiprocessors, 4 kv heads.
    assert_eq!(attn_decode_splits(3, 132, 4), 99);
    assert_eq!(attn_decode_splits(0, 132, 4), 1);
    assert_eq!(attn_decode_splits(16, 132, 4), ATTN_SPLITS);
    // Short contexts: one split; long ones: every split, each a share of the context.
    assert_eq!(attn_split_len(100, ATTN_SPLITS), ATTN_MIN_SPLIT_LEN);
    assert_eq!(attn_split_len(32768, ATTN_SPLITS), 256);
    assert_eq!(
        32768usize.div_ceil(attn_split_len(32768, ATTN_SPLITS)),
        ATTN_SPLITS
    );
    assert_eq!(attn_split_len(ATTN_SPLITS * 40 + 1, ATTN_SPLITS), 41);
}

#[test]
fn the_27b_shapes_come_from_metadata_alone() {
    // As the harness builds them for its attention checks on the 27B kernels.
    let mut w = gguf::GgufWriter::new();
    Preset::B27.shape(248_320).write_metadata(&mut w, "shapes");
    let f = gguf::Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
    let c = Config::from_metadata(f.metadata(), 248_320).unwrap();
    assert_eq!(Dims::from_config(&c).unwrap(), dims(Preset::B27));
}
