//! The tiled layout and kernels: re-tiling loses nothing, the tiled twin equals the native twin
//! bit for bit, and the AVX-512 and AVX2 kernels equal the tiled twin bit for bit, on random shapes
//! (rows not a multiple of the panel, partial panel ranges, 1–9 tokens) and random bytes (code
//! 3, non-canonical PTQ1_0 bytes, zero and negative scales).

mod common;

use proptest::prelude::*;
use quant::{Format, Q1Bits, QuantizedActs, Ternary, TileError, TiledMatrix, PANEL};
use rand::Rng;

const TILED: [Format; 5] = [
    Format::Q1_0,
    Format::Q2_0,
    Format::Q2_0G128,
    Format::PQ2_0,
    Format::PTQ1_0,
];

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Random bytes with random finite scales.
fn random_matrix(format: Format, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut rng = common::rng(seed);
    let bytes = rows * format.row_bytes(cols).unwrap();
    let mut w: Vec<u8> = (0..bytes).map(|_| rng.gen()).collect();
    for block in w.chunks_exact_mut(format.block_bytes()) {
        if rng.gen_range(0..8) == 0 {
            block.fill(0xff);
        }
        let s: f32 = match rng.gen_range(0..10) {
            0 => 0.0,
            _ => rng.gen_range(-2.0f32..2.0),
        };
        for &at in common::scale_offsets(format) {
            block[at..at + 2].copy_from_slice(&half::f16::from_f32(s).to_bits().to_le_bytes());
        }
    }
    w
}

fn random_acts(cols: usize, tokens: usize, seed: u64) -> Vec<QuantizedActs> {
    let mut rng = common::rng(seed ^ 0x5eed);
    (0..tokens)
        .map(|_| QuantizedActs::new(&common::values(&mut rng, cols, 3.0)))
        .collect()
}

fn case(
    format: Format,
    ternary: Ternary,
    q1: Q1Bits,
    rows: usize,
    blocks: usize,
    tokens: usize,
    seed: u64,
) {
    let cols = blocks * format.block_len();
    let native = random_matrix(format, rows, cols, seed);
    let acts = random_acts(cols, tokens, seed);
    let m = TiledMatrix::with_layout(format, &native, rows, cols, ternary, q1).unwrap();
    let q1_held = if format == Format::Q1_0 {
        q1
    } else {
        Q1Bits::Nibbles
    };
    assert_eq!(m.q1_bits(), q1_held);
    // Packed, as large as the file's rows; widened PTQ1_0, as large as Q2_0 g128 rows.
    let held = match (format, ternary) {
        (Format::PTQ1_0, Ternary::Wide) => Format::Q2_0G128,
        _ => format,
    };
    assert_eq!(
        m.ternary(),
        if held == format {
            Ternary::Packed
        } else {
            Ternary::Wide
        }
    );
    assert_eq!(
        m.bytes(),
        rows.div_ceil(PANEL) * PANEL * held.row_bytes(cols).unwrap()
    );

    // Nothing lost: the native bytes decode to the same values.
    let back = m.to_native();
    let (mut a, mut b) = (vec![0f32; rows * cols], vec![0f32; rows * cols]);
    quant::dequantize(format, &native, &mut a).unwrap();
    quant::dequantize(format, &back, &mut b).unwrap();
    assert_eq!(bits(&a), bits(&b), "{format}: re-tiling changed values");

    let row_bytes = format.row_bytes(cols).unwrap();
    let mut want = vec![0f32; rows * tokens];
    quant::gemm_rows_scalar(format, &native, row_bytes, 0..rows, &acts, &mut want);
    let mut twin = vec![0f32; rows * tokens];
    quant::gemm_tiled_scalar(&m, 0..m.panels(), &acts, &mut twin);
    assert_eq!(
        bits(&twin),
        bits(&want),
        "{format}: tiled twin vs native twin"
    );
    let mut fast = vec![0f32; rows * tokens];
    quant::gemm_tiled(&m, 0..m.panels(), &acts, &mut fast);
    assert_eq!(bits(&fast), bits(&want), "{format}: tiled kernel vs twin");
    // The AVX2 kernels too where the CPU has AVX2, even beside AVX-512.
    let mut avx2 = vec![0f32; rows * tokens];
    if quant::gemm_tiled_avx2(&m, 0..m.panels(), &acts, &mut avx2) {
        assert_eq!(
            bits(&avx2),
            bits(&want),
            "{format}: AVX2 tiled kernel vs twin"
        );
    }

    // A later range of panels writes just its rows.
    let p0 = m.panels() / 2;
    let r0 = p0 * PANEL;
    let mut part = vec![0f32; (rows - r0) * tokens];
    quant::gemm_tiled(&m, p0..m.panels(), &acts, &mut part);
    assert_eq!(
        bits(&part),
        bits(&want[r0 * tokens..]),
        "{format}: panels {p0}.."
    );

    // One token at a time gives the same bits as all together.
    for (t, a) in acts.iter().enumerate() {
        let mut one = vec![0f32; rows];
        quant::gemm_tiled(&m, 0..m.panels(), std::slice::from_ref(a), &mut one);
        let col: Vec<f32> = (0..rows).map(|r| want[r * tokens + t]).collect();
        assert_eq!(bits(&one), bits(&col), "{format}: token {t} alone");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn tiled_kernels_equal_the_native_twin_bit_for_bit(
        rows in 1usize..70,
        blocks in 1usize..5,
        tokens in 1usize..10,
        seed in any::<u64>(),
    ) {
        for format in TILED {
            case(format, Ternary::Packed, Q1Bits::preferred(), rows, blocks, tokens, seed);
        }
        case(Format::PTQ1_0, Ternary::Wide, Q1Bits::Nibbles, rows, blocks, tokens, seed);
        // Q1_0 in both bit orders, whichever this CPU prefers.
        for q1 in [Q1Bits::Nibbles, Q1Bits::Spread] {
            case(Format::Q1_0, Ternary::Packed, q1, rows, blocks, tokens, seed);
        }
    }
}

/// One-token passes take several panels at once, each from its own part of the range (four for
/// Q1_0): panel counts that split evenly and unevenly into those parts, and ranges that start
/// past the first panel (`case` also runs its second half alone), still give the twin's bits.
#[test]
fn one_token_passes_over_many_panels_equal_the_twin() {
    for (i, rows) in [64usize, 65, 112, 181, 250, 263].into_iter().enumerate() {
        let seed = 7 + i as u64;
        for format in TILED {
            case(
                format,
                Ternary::Packed,
                Q1Bits::preferred(),
                rows,
                2,
                1,
                seed,
            );
        }
        for q1 in [Q1Bits::Nibbles, Q1Bits::Spread] {
            case(Format::Q1_0, Ternary::Packed, q1, rows, 3, 1, seed);
        }
    }
}

#[test]
fn formats_without_a_panel_layout_are_refused() {
    for format in [Format::F32, Format::Q8_0, Format::Q4_1] {
        let bytes = format.row_bytes(128).unwrap();
        assert_eq!(
            TiledMatrix::new(format, &vec![0; bytes], 1, 128).unwrap_err(),
            TileError::Unsupported(format)
        );
    }
}

#[test]
fn a_wrong_byte_count_is_an_error() {
    let err = TiledMatrix::new(Format::Q1_0, &[0; 35], 2, 128).unwrap_err();
    assert!(err.to_string().contains("36"), "{err}");
    assert!(TiledMatrix::new(Format::Q1_0, &[0; 18], 1, 100).is_err());
}
