//! Length checks and the validation scans.

mod common;

use quant::{Format, QuantError};

#[test]
fn dequantize_refuses_a_partial_block() {
    let mut out = vec![0.0; 100];
    assert!(matches!(
        quant::dequantize(Format::Q1_0, &[0u8; 18], &mut out),
        Err(QuantError::PartialBlock { block: 128, .. })
    ));
}

#[test]
fn dequantize_refuses_the_wrong_byte_count() {
    let mut out = vec![0.0; 128];
    assert_eq!(
        quant::dequantize(Format::PTQ1_0, &[0u8; 27], &mut out),
        Err(QuantError::ByteLength {
            format: Format::PTQ1_0,
            values: 128,
            expected: 28,
            got: 27
        })
    );
}

#[test]
fn quantize_refuses_a_partial_block() {
    assert!(matches!(
        quant::quantize(Format::Q2_0, &[0.0; 65]),
        Err(QuantError::PartialBlock { block: 64, .. })
    ));
}

#[test]
fn quantized_sizes_follow_the_format_table() {
    for format in Format::ALL {
        let n = 3 * format.block_len();
        let bytes = quant::quantize(format, &vec![0.5; n]).expect("whole blocks");
        assert_eq!(bytes.len(), 3 * format.block_bytes(), "{format}");
    }
}

#[test]
fn code3_is_counted_only_in_the_2bit_containers() {
    for format in [Format::Q2_0, Format::Q2_0G128, Format::PQ2_0] {
        let mut row = vec![0u8; 2 * format.block_bytes()];
        row[2] = 0b11_01_11_10; // two codes equal to 3
        let last = row.len() - 1;
        row[last] = 0xff; // four more
        assert_eq!(quant::count_code3(format, &row), 6, "{format}");
    }
    assert_eq!(quant::count_code3(Format::PTQ1_0, &[0xff; 28]), 0);
    assert_eq!(quant::count_code3(Format::Q1_0, &[0xff; 18]), 0);
}

#[test]
fn a_ternary_quantizer_never_writes_code3() {
    let mut rng = common::rng(3);
    let x = common::values(&mut rng, 64 * 128, 5.0);
    for format in [Format::Q2_0, Format::Q2_0G128, Format::PQ2_0] {
        let q = quant::quantize(format, &x).expect("whole blocks");
        assert_eq!(quant::count_code3(format, &q), 0, "{format}");
    }
}

#[test]
fn non_finite_scales_are_counted() {
    let inf = half::f16::INFINITY.to_bits().to_le_bytes();
    let nan = half::f16::NAN.to_bits().to_le_bytes();
    for format in Format::ALL {
        if common::scale_offsets(format).is_empty() {
            continue;
        }
        let mut row = quant::quantize(format, &vec![1.0; 3 * format.block_len()]).expect("whole");
        assert_eq!(quant::count_non_finite_scales(format, &row), 0, "{format}");
        let bb = format.block_bytes();
        let at = common::scale_offsets(format)[0];
        row[at..at + 2].copy_from_slice(&inf);
        row[2 * bb + at..2 * bb + at + 2].copy_from_slice(&nan);
        assert_eq!(quant::count_non_finite_scales(format, &row), 2, "{format}");
    }
    // Q4_1 counts its min field too.
    let mut row = quant::quantize(Format::Q4_1, &[1.0; 32]).expect("whole");
    row[2..4].copy_from_slice(&nan);
    assert_eq!(quant::count_non_finite_scales(Format::Q4_1, &row), 1);
}

#[test]
fn non_finite_float_values_are_counted() {
    let x = [
        1.0,
        f32::NAN,
        f32::INFINITY,
        -f32::INFINITY,
        0.0,
        65504.0,
        65520.0,
    ];
    let q32 = quant::quantize(Format::F32, &x).expect("whole");
    assert_eq!(quant::count_non_finite_scales(Format::F32, &q32), 3);
    let q16 = quant::quantize(Format::F16, &x).expect("whole");
    assert_eq!(quant::count_non_finite_scales(Format::F16, &q16), 4); // 65520 rounds to inf
    let qb = quant::quantize(Format::BF16, &x).expect("whole");
    assert_eq!(quant::count_non_finite_scales(Format::BF16, &qb), 3);
}

#[test]
fn reference_ptq1_0_output_is_canonical_and_random_bytes_are_not() {
    let mut rng = common::rng(11);
    let x = common::values(&mut rng, 16 * 128, 1.0);
    let q = quant::quantize(Format::PTQ1_0, &x).expect("whole");
    assert_eq!(quant::count_noncanonical(Format::PTQ1_0, &q), 0);
    let mut block = [0u8; 28];
    block[0] = 255; // all trits 2: ceil(242·256/243) = 255, canonical
    block[1] = 1; // ceil(256·v/243) jumps from 0 (v = 0) to 2 (v = 1): 1 is never written
    block[24] = 1; // a qh byte holds 3·v: its encodings are 0, 4, 7, ...
    assert_eq!(quant::count_noncanonical(Format::PTQ1_0, &block), 2);
}
