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
fn the_split_grid_orders_tokens_before_splits_only_where_asked() {
    assert_eq!(attn_split_grid(4, 99, 256, false), (4, 99, 256));
    assert_eq!(attn_split_grid(4, 99, 256, true), (4, 256, 99));
    // The blocks in the order a launch numbers them (x fastest, then y, then z), as (kv head,
    // split, token) by the kernels' reading of the grid (attn_block_split, attn_block_token).
    let order = |nsplit: usize, ntok: usize, token_major: bool| {
        let (gx, gy, gz) = attn_split_grid(4, nsplit, ntok, token_major);
        let mut blocks = Vec::new();
        for z in 0..gz {
            for y in 0..gy {
                for x in 0..gx {
                    let (sp, t) = if token_major { (z, y) } else { (y, z) };
                    blocks.push((x, sp, t));
                }
            }
        }
        blocks
    };
    // One token: the same blocks in the same order either way.
    assert_eq!(order(99, 1, false), order(99, 1, true));
    // Several: the same blocks, a split's tokens together in the second order.
    let (mut a, mut b) = (order(5, 3, false), order(5, 3, true));
    assert_eq!(b[..12].iter().map(|&(_, sp, _)| sp).max(), Some(0));
    assert_eq!(a[..12].iter().map(|&(_, _, t)| t).max(), Some(0));
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, b);
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
