//! Behaviour of the GGUF reader on good, broken and mutated files.

use gguf::{Gguf, GgufError, GgufWriter, Value, ValueType};
use proptest::prelude::*;
use quant::Format;

fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("qwen35".into()))
        .set("qwen35.block_count", Value::U32(4))
        .set("qwen35.rope.freq_base", Value::F32(1e7))
        .set("flag", Value::Bool(true))
        .set("signed", Value::I64(-5))
        .set("wide", Value::F64(0.25))
        .set("small", Value::I8(-3))
        .set("u8", Value::U8(200))
        .set("u16", Value::U16(60000))
        .set("i16", Value::I16(-30000))
        .set("u64", Value::U64(1 << 40))
        .set("i32", Value::I32(-7))
        .set("tokens", Value::strings(["a", "b", "ü"]))
        .set(
            "nested",
            Value::Array {
                elem: ValueType::Array,
                items: vec![Value::i32s([1, 2]), Value::i32s([3])],
            },
        );
    let f: Vec<u8> = (0..64u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
    w.add_tensor("a.weight", &[32, 2], Format::F32, f).unwrap();
    w.add_tensor("b.weight", &[128, 2], Format::Q1_0, vec![0x3c; 36])
        .unwrap();
    w.add_tensor("c.weight", &[64], Format::Q2_0, vec![0x55; 18])
        .unwrap();
    w
}

#[test]
fn written_files_read_back_with_every_value_type() {
    let w = sample_writer();
    let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(g.version(), 3);
    for (k, v) in w.metadata().iter() {
        assert_eq!(g.metadata().get(k), Some(v), "key {k}");
    }
    assert_eq!(g.metadata().architecture().unwrap(), "qwen35");
    assert_eq!(g.metadata().get_u32("qwen35.block_count").unwrap(), Some(4));
    assert_eq!(
        g.metadata().get_strings("tokens").unwrap().unwrap(),
        vec!["a", "b", "ü"]
    );
    let a = g.tensor("a.weight").unwrap();
    assert_eq!(a.dims(), &[32, 2]);
    assert_eq!(a.to_f32().unwrap()[63], 63.0);
    assert_eq!(g.tensor("b.weight").unwrap().format(), Format::Q1_0);
    assert_eq!(g.tensor("b.weight").unwrap().data.len(), 36);
}

#[test]
fn version_2_files_read_like_version_3() {
    let mut b = sample_writer().to_bytes().unwrap();
    b[4] = 2;
    let g = Gguf::from_bytes(b).unwrap();
    assert_eq!(g.version(), 2);
    assert_eq!(g.tensors().len(), 3);
}

#[test]
fn tensor_data_is_aligned() {
    let g = Gguf::from_bytes(sample_writer().to_bytes().unwrap()).unwrap();
    for t in g.tensors() {
        assert_eq!(
            (t.offset - g.data_offset()) % g.alignment(),
            0,
            "{}",
            t.name
        );
    }
}

#[test]
fn custom_alignment_is_honoured() {
    let mut w = sample_writer();
    w.set("general.alignment", Value::U32(64));
    let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(g.alignment(), 64);
    assert!(g.tensors().iter().all(|t| t.offset % 64 == 0));
}

#[test]
fn bad_alignment_is_refused() {
    let mut w = sample_writer();
    w.set("general.alignment", Value::U32(48));
    let err = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap_err();
    assert!(err.to_string().contains("general.alignment"), "{err}");
}

#[test]
fn type_42_g64_and_legacy_g128_are_told_apart_by_size() {
    let mut w = GgufWriter::new();
    w.add_tensor("g64", &[1024, 4], Format::Q2_0, vec![0x55; 16 * 4 * 18])
        .unwrap();
    let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(g.tensor("g64").unwrap().format(), Format::Q2_0);

    let mut w = GgufWriter::new();
    w.add_tensor("g128", &[1024, 4], Format::Q2_0G128, vec![0x55; 8 * 4 * 34])
        .unwrap();
    let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(g.tensor("g128").unwrap().format(), Format::Q2_0G128);
    assert_eq!(g.tensor("g128").unwrap().data.len(), 8 * 4 * 34);
}

#[test]
fn wrong_magic_and_version_are_named() {
    let mut b = sample_writer().to_bytes().unwrap();
    b[0] = b'X';
    assert!(matches!(
        Gguf::from_bytes(b).unwrap_err(),
        GgufError::BadMagic { .. }
    ));
    let mut b = sample_writer().to_bytes().unwrap();
    b[4] = 1;
    assert!(matches!(
        Gguf::from_bytes(b).unwrap_err(),
        GgufError::UnsupportedVersion(1)
    ));
}

#[test]
fn truncated_file_says_where_it_ends() {
    let b = sample_writer().to_bytes().unwrap();
    // The last 14 bytes are padding after c.weight's 18 bytes: cutting them is harmless.
    for cut in [3, 10, 40, b.len() / 2, b.len() - 15] {
        let err = Gguf::from_bytes(b[..cut].to_vec()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("ends early")
                || msg.contains("does not fit")
                || msg.contains("past the end"),
            "cut at {cut}: {msg}"
        );
    }
}

/// Finds the byte offset of a tensor's type id in the header (just after its dims).
fn type_id_offset(bytes: &[u8], name: &str, n_dims: usize) -> usize {
    let pat = [&(name.len() as u64).to_le_bytes()[..], name.as_bytes()].concat();
    let at = bytes
        .windows(pat.len())
        .position(|w| w == pat.as_slice())
        .unwrap();
    at + pat.len() + 4 + 8 * n_dims
}

#[test]
fn unknown_type_id_names_tensor_and_id() {
    let mut b = sample_writer().to_bytes().unwrap();
    let at = type_id_offset(&b, "b.weight", 2);
    b[at..at + 4].copy_from_slice(&2u32.to_le_bytes()); // Q4_0: not a Bonsai format
    let msg = Gguf::from_bytes(b).unwrap_err().to_string();
    assert!(
        msg.contains("b.weight") && msg.contains("type id 2"),
        "{msg}"
    );
}

#[test]
fn shape_that_does_not_fit_the_block_is_refused() {
    let mut b = sample_writer().to_bytes().unwrap();
    let at = type_id_offset(&b, "b.weight", 2);
    // Make the first dim 100: not a multiple of Q1_0's 128.
    let dim0 = at - 16;
    b[dim0..dim0 + 8].copy_from_slice(&100u64.to_le_bytes());
    let msg = Gguf::from_bytes(b).unwrap_err().to_string();
    assert!(
        msg.contains("b.weight") && msg.contains("multiple"),
        "{msg}"
    );
}

#[test]
fn overlapping_tensors_are_refused() {
    let mut b = sample_writer().to_bytes().unwrap();
    let at = type_id_offset(&b, "c.weight", 1);
    // Point c.weight at b.weight's data.
    let b_off_at = type_id_offset(&b, "b.weight", 2) + 4;
    let b_off = u64::from_le_bytes(b[b_off_at..b_off_at + 8].try_into().unwrap());
    b[at + 4..at + 12].copy_from_slice(&b_off.to_le_bytes());
    assert!(Gguf::from_bytes(b).is_err());
}

#[test]
fn duplicate_tensor_names_are_refused_by_the_writer() {
    let mut w = GgufWriter::new();
    w.add_tensor("x", &[32], Format::F32, vec![0; 128]).unwrap();
    assert!(w.add_tensor("x", &[32], Format::F32, vec![0; 128]).is_err());
    assert!(w.add_tensor("y", &[32], Format::F32, vec![0; 100]).is_err());
}

#[test]
fn huge_counts_do_not_allocate() {
    let mut b = sample_writer().to_bytes().unwrap();
    b[16..24].copy_from_slice(&u64::MAX.to_le_bytes()); // metadata count
    assert!(matches!(
        Gguf::from_bytes(b).unwrap_err(),
        GgufError::Truncated { .. }
    ));
    let mut b = sample_writer().to_bytes().unwrap();
    b[8..16].copy_from_slice(&(1u64 << 60).to_le_bytes()); // tensor count
    assert!(Gguf::from_bytes(b).is_err());
}

#[test]
fn opening_a_missing_file_names_the_path() {
    let msg = Gguf::open("no/such/model.gguf").unwrap_err().to_string();
    assert!(msg.contains("no/such/model.gguf"), "{msg}");
}

#[test]
fn files_open_through_the_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    sample_writer().write_file(&path).unwrap();
    let g = Gguf::open(&path).unwrap();
    assert_eq!(g.tensors().len(), 3);
    assert_eq!(g.file_len(), std::fs::metadata(&path).unwrap().len());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Any corruption gives a value or an error, never a panic or an out-of-bounds read.
    #[test]
    fn mutated_files_never_panic(flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
                                 cut in any::<prop::sample::Index>(), truncate in any::<bool>()) {
        let mut b = sample_writer().to_bytes().unwrap();
        for (i, v) in flips {
            let i = i.index(b.len());
            b[i] = v;
        }
        if truncate {
            b.truncate(cut.index(b.len()));
        }
        if let Ok(g) = Gguf::from_bytes(b) {
            for t in g.tensors() {
                let v = g.view(t);
                prop_assert_eq!(v.data.len() as u64, t.size);
                let _ = v.to_f32();
            }
        }
    }

    /// Mutations confined to the header exercise the parser more densely.
    #[test]
    fn mutated_headers_never_panic(flips in prop::collection::vec((0usize..400, any::<u8>()), 1..4)) {
        let mut b = sample_writer().to_bytes().unwrap();
        for (i, v) in flips {
            let i = i % b.len();
            b[i] = v;
        }
        let _ = Gguf::from_bytes(b);
    }
}
