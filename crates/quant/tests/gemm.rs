//! The int8 kernels: every ISA against the scalar twin, the twin against the f32 decoder, the
//! multi-token path against one token at a time, and the activation quantization.

mod common;

use proptest::prelude::*;
use quant::{act_group, Format, Isa, QuantizedActs};
use rand::rngs::StdRng;
use rand::Rng;

const BLOCK_FORMATS: [Format; 7] = [
    Format::Q1_0,
    Format::Q2_0,
    Format::Q2_0G128,
    Format::PQ2_0,
    Format::PTQ1_0,
    Format::Q8_0,
    Format::Q4_1,
];

const FLOAT_FORMATS: [Format; 3] = [Format::F32, Format::F16, Format::BF16];

/// Activation groups (scales) of `n` values.
fn groups(n: usize) -> usize {
    n.div_ceil(128) * 128 / quant::ACT_GROUP
}

fn simd_isas() -> Vec<Isa> {
    Isa::available()
        .into_iter()
        .filter(|&i| i != Isa::Scalar)
        .collect()
}

fn gemm(isa: Isa, format: Format, w: &[u8], rows: usize, acts: &[QuantizedActs]) -> Vec<f32> {
    let row_bytes = w.len() / rows;
    let mut out = vec![0.0f32; rows * acts.len()];
    quant::gemm_rows_with(isa, format, w, row_bytes, 0..rows, acts, &mut out);
    out
}

/// Writes `scale` into every scale field of `block`.
fn set_scales(format: Format, block: &mut [u8], scales: &[f32]) {
    for (&at, &s) in common::scale_offsets(format).iter().zip(scales) {
        block[at..at + 2].copy_from_slice(&half::f16::from_f32(s).to_bits().to_le_bytes());
    }
}

/// A pick from `set`.
fn pick(rng: &mut StdRng, set: &[f32]) -> f32 {
    set[rng.gen_range(0..set.len())]
}

/// Random code bytes; some blocks all-zero bytes, some all-ones (every 2-bit code 3), the
/// rest random (every code pattern, non-canonical PTQ1_0 bytes included).
fn random_codes(format: Format, bytes: usize, rng: &mut StdRng) -> Vec<u8> {
    let mut w: Vec<u8> = (0..bytes).map(|_| rng.gen()).collect();
    for block in w.chunks_exact_mut(format.block_bytes()) {
        match rng.gen_range(0..8) {
            0 => block.fill(0),
            1 => block.fill(0xff),
            _ => {}
        }
    }
    w
}

/// Activation codes: mostly uniform in −127..=127, some blocks all ±127 or zero.
fn random_act_codes(n: usize, rng: &mut StdRng) -> Vec<i8> {
    let mut q: Vec<i8> = (0..n).map(|_| rng.gen_range(-127..=127)).collect();
    for b in q.chunks_mut(32) {
        match rng.gen_range(0..8) {
            0 => b.fill(127),
            1 => b.fill(-127),
            2 => b.fill(0),
            _ => {}
        }
    }
    q
}

/// Scale sets whose products are exact and whose sums stay below 2²⁴ units for the shapes
/// used: every path must then return the same f32.
fn exact_scale_sets(format: Format) -> (&'static [f32], &'static [f32]) {
    match format {
        Format::Q8_0 | Format::Q4_1 => (&[1.0, -1.0, 0.0], &[1.0, 0.0]),
        _ => (&[0.5, 1.0, 2.0, -1.0, 0.0], &[0.5, 1.0, 2.0, 0.0]),
    }
}

fn exact_case(format: Format, blocks: usize, rows: usize, tokens: usize, seed: u64) {
    let mut rng = common::rng(seed);
    let n = blocks * format.block_len();
    let row_bytes = format.row_bytes(n).unwrap();
    let (wset, aset) = exact_scale_sets(format);
    let mut w = random_codes(format, row_bytes * rows, &mut rng);
    for block in w.chunks_exact_mut(format.block_bytes()) {
        let s = [pick(&mut rng, wset), pick(&mut rng, wset)];
        set_scales(format, block, &s);
    }
    let acts: Vec<QuantizedActs> = (0..tokens)
        .map(|_| {
            let q = random_act_codes(n, &mut rng);
            let d: Vec<f32> = (0..groups(n)).map(|_| pick(&mut rng, aset)).collect();
            QuantizedActs::from_codes(&q, &d)
        })
        .collect();
    let twin = gemm(Isa::Scalar, format, &w, rows, &acts);
    for isa in simd_isas() {
        let fast = gemm(isa, format, &w, rows, &acts);
        assert_eq!(
            fast.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            twin.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{format} on {isa:?}: {rows} rows × {n} values × {tokens} tokens\n{fast:?}\n{twin:?}"
        );
    }
}

/// Σ over the row of |d_a·q|·(|w_int·d| + |m|): bounds every partial sum of either path.
fn magnitude(format: Format, row: &[u8], a: &QuantizedActs) -> f64 {
    let n = a.len();
    let mut x = vec![0.0f32; n];
    a.dequantize(&mut x);
    let mut w = vec![0.0f32; n];
    quant::dequantize(format, row, &mut w).unwrap();
    if format == Format::Q4_1 {
        // Weights d·q + m: bound by |d·q| + |m| per value.
        let mut m = 0.0;
        for (b, block) in row.chunks_exact(20).enumerate() {
            let d = f64::from(half::f16::from_le_bytes([block[0], block[1]]).to_f32());
            let mm = f64::from(half::f16::from_le_bytes([block[2], block[3]]).to_f32());
            for j in 0..32 {
                let q = block[4 + j % 16] >> (4 * (j / 16)) & 15;
                m += (d.abs() * f64::from(q) + mm.abs()) * f64::from(x[32 * b + j]).abs();
            }
        }
        return m;
    }
    w.iter()
        .zip(&x)
        .map(|(&w, &x)| (f64::from(w) * f64::from(x)).abs())
        .sum()
}

fn tolerance(format: Format, n: usize, mag: f64) -> f64 {
    let blocks = n / format.block_len().max(1);
    2.0 * (blocks as f64 + n as f64 / 64.0 + 8.0) * f64::from(f32::EPSILON) * mag + 1e-30
}

fn random_case(
    format: Format,
    blocks: usize,
    rows: usize,
    tokens: usize,
    seed: u64,
    ws: f32,
    xs: f32,
) {
    let mut rng = common::rng(seed);
    let n = blocks * format.block_len();
    let mut w = Vec::new();
    for _ in 0..rows {
        w.extend(common::random_row(format, n, ws, &mut rng));
    }
    let acts: Vec<QuantizedActs> = (0..tokens)
        .map(|_| QuantizedActs::new(&common::values(&mut rng, n, xs)))
        .collect();
    let twin = gemm(Isa::Scalar, format, &w, rows, &acts);
    let row_bytes = w.len() / rows;
    for isa in simd_isas() {
        let fast = gemm(isa, format, &w, rows, &acts);
        for r in 0..rows {
            for (t, a) in acts.iter().enumerate() {
                let i = r * tokens + t;
                let mag = magnitude(format, &w[r * row_bytes..(r + 1) * row_bytes], a);
                let bound = tolerance(format, n, mag);
                let diff = (f64::from(fast[i]) - f64::from(twin[i])).abs();
                assert!(
                    diff <= bound,
                    "{format} on {isa:?}: row {r} token {t}: {} vs twin {} (bound {bound})",
                    fast[i],
                    twin[i]
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn simd_kernels_equal_the_twin_bit_for_bit_when_float_steps_are_exact(
        blocks in 1usize..6,
        rows in 1usize..10,
        tokens in 1usize..7,
        seed in any::<u64>(),
    ) {
        for format in BLOCK_FORMATS {
            exact_case(format, blocks, rows, tokens, seed);
        }
    }

    #[test]
    fn simd_kernels_match_the_twin_within_rounding(
        blocks in 1usize..6,
        rows in 1usize..7,
        tokens in 1usize..6,
        seed in any::<u64>(),
        ws in prop_oneof![Just(1e-4f32), Just(1.0f32), Just(6e4f32), 1e-3f32..100.0],
        xs in prop_oneof![Just(1e-6f32), Just(1.0f32), Just(1e4f32), 1e-3f32..100.0],
    ) {
        for format in BLOCK_FORMATS {
            random_case(format, blocks, rows, tokens, seed, ws, xs);
        }
    }

    #[test]
    fn float_rows_match_the_scalar_dot(
        n in 1usize..300,
        rows in 1usize..5,
        tokens in 1usize..4,
        seed in any::<u64>(),
    ) {
        let mut rng = common::rng(seed);
        for format in FLOAT_FORMATS {
            let mut w = Vec::new();
            for _ in 0..rows {
                w.extend(common::random_row(format, n, 10.0, &mut rng));
            }
            let acts: Vec<QuantizedActs> = (0..tokens)
                .map(|_| QuantizedActs::new(&common::values(&mut rng, n, 10.0)))
                .collect();
            let rb = w.len() / rows;
            for isa in Isa::available() {
                let out = gemm(isa, format, &w, rows, &acts);
                for r in 0..rows {
                    for t in 0..tokens {
                        let row = &w[r * rb..(r + 1) * rb];
                        let x = acts[t].values();
                        let want = quant::dot_scalar(format, row, x);
                        let bound = 2.0 * (n as f64 + 4.0) * f64::from(f32::EPSILON)
                            * common::abs_dot(format, row, x) + 1e-30;
                        let got = out[r * tokens + t];
                        prop_assert!((f64::from(got) - f64::from(want)).abs() <= bound,
                            "{} on {:?}: {} vs {}", format, isa, got, want);
                    }
                }
            }
        }
    }

    #[test]
    fn many_tokens_equal_one_token_at_a_time(
        blocks in 1usize..4,
        rows in 1usize..10,
        tokens in 2usize..10,
        seed in any::<u64>(),
    ) {
        let mut rng = common::rng(seed);
        for format in BLOCK_FORMATS.into_iter().chain(FLOAT_FORMATS) {
            let n = blocks * format.block_len().max(32);
            let mut w = Vec::new();
            for _ in 0..rows {
                w.extend(common::random_row(format, n, 2.0, &mut rng));
            }
            let acts: Vec<QuantizedActs> = (0..tokens)
                .map(|_| QuantizedActs::new(&common::values(&mut rng, n, 3.0)))
                .collect();
            for isa in Isa::available() {
                let all = gemm(isa, format, &w, rows, &acts);
                for (t, a) in acts.iter().enumerate() {
                    let one = gemm(isa, format, &w, rows, std::slice::from_ref(a));
                    for r in 0..rows {
                        prop_assert_eq!(all[r * tokens + t].to_bits(), one[r].to_bits(),
                            "{} on {:?} row {} token {}", format, isa, r, t);
                    }
                }
            }
        }
    }

    #[test]
    fn activation_codes_round_trip_within_half_a_step(
        n in 1usize..200,
        seed in any::<u64>(),
        scale in prop_oneof![Just(1e-30f32), Just(1.0f32), Just(1e30f32), 1e-3f32..1e3],
    ) {
        if let Err(why) = round_trip(n, seed, scale) {
            prop_assert!(false, "{}", why);
        }
    }
}

#[test]
fn the_twin_agrees_with_the_f32_decoder_on_dequantized_activations() {
    let mut rng = common::rng(7);
    for format in BLOCK_FORMATS {
        for _ in 0..20 {
            let n = 4 * format.block_len();
            let row = common::random_row(format, n, 2.0, &mut rng);
            let a = QuantizedActs::new(&common::values(&mut rng, n, 3.0));
            let mut x = vec![0.0f32; n];
            a.dequantize(&mut x);
            let mut out = [0.0f32];
            quant::gemm_rows_scalar(
                format,
                &row,
                row.len(),
                0..1,
                std::slice::from_ref(&a),
                &mut out,
            );
            let want = quant::dot_scalar(format, &row, &x);
            let bound =
                4.0 * (n as f64 + 8.0) * f64::from(f32::EPSILON) * magnitude(format, &row, &a);
            assert!(
                (f64::from(out[0]) - f64::from(want)).abs() <= bound,
                "{format}: twin {} vs f32 decoder {want}",
                out[0]
            );
        }
    }
}

#[test]
fn code_3_is_plus_two_in_every_kernel() {
    for format in [Format::Q2_0, Format::Q2_0G128, Format::PQ2_0] {
        let n = format.block_len();
        let mut block = vec![0xffu8; format.block_bytes()];
        set_scales(format, &mut block, &[1.0]);
        let a = QuantizedActs::from_codes(&vec![1i8; n], &vec![1.0; groups(n)]);
        for isa in Isa::available() {
            let out = gemm(isa, format, &block, 1, std::slice::from_ref(&a));
            assert_eq!(out[0], 2.0 * n as f32, "{format} on {isa:?}");
        }
    }
}

#[test]
fn a_row_range_selects_rows_of_the_matrix() {
    let mut rng = common::rng(3);
    let format = Format::Q1_0;
    let n = 256;
    let rows = 9;
    let mut w = Vec::new();
    for _ in 0..rows {
        w.extend(common::random_row(format, n, 1.0, &mut rng));
    }
    let a = QuantizedActs::new(&common::values(&mut rng, n, 1.0));
    let rb = w.len() / rows;
    let all = gemm(Isa::best(), format, &w, rows, std::slice::from_ref(&a));
    let mut part = vec![0.0f32; 4];
    quant::gemv_rows(format, &w, rb, 3..7, &a, &mut part);
    assert_eq!(part, all[3..7]);
}

#[test]
#[should_panic(expected = "do not hold")]
fn a_row_size_that_does_not_match_the_activations_panics() {
    let a = QuantizedActs::new(&[0.0; 128]);
    let w = vec![0u8; 18 * 4];
    let mut out = [0.0f32; 2];
    quant::gemm_rows(Format::Q1_0, &w, 36, 0..2, &[a], &mut out);
}

/// Relative error of `w · x` with `x` rounded by our activation quantizer and by Q8_0 (fp16
/// scale), against the exact f64 dot, on Gaussian data. Ours must not be worse.
#[test]
fn act_quant_accuracy_is_at_least_q8_0s() {
    let mut rng = common::rng(11);
    let gauss = |rng: &mut StdRng| -> f32 {
        // Box–Muller.
        let (u, v): (f64, f64) = (rng.gen_range(1e-12..1.0), rng.gen());
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    };
    let n = 4096;
    let (mut ours, mut q8) = (0.0f64, 0.0f64);
    for _ in 0..200 {
        let x: Vec<f32> = (0..n).map(|_| gauss(&mut rng)).collect();
        let w: Vec<f32> = (0..n).map(|_| gauss(&mut rng)).collect();
        let exact: f64 = w
            .iter()
            .zip(&x)
            .map(|(&a, &b)| f64::from(a) * f64::from(b))
            .sum();
        let norm: f64 = w
            .iter()
            .zip(&x)
            .map(|(&a, &b)| (f64::from(a) * f64::from(b)).powi(2))
            .sum::<f64>()
            .sqrt();
        let a = QuantizedActs::new(&x);
        let mut xa = vec![0.0f32; n];
        a.dequantize(&mut xa);
        let mut xq = vec![0.0f32; n];
        quant::dequantize(
            Format::Q8_0,
            &quant::quantize(Format::Q8_0, &x).unwrap(),
            &mut xq,
        )
        .unwrap();
        let dot = |v: &[f32]| -> f64 {
            w.iter()
                .zip(v)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum()
        };
        ours += ((dot(&xa) - exact) / norm).powi(2);
        q8 += ((dot(&xq) - exact) / norm).powi(2);
    }
    let (ours, q8) = ((ours / 200.0).sqrt(), (q8 / 200.0).sqrt());
    println!("rms relative dot error: ours {ours:.4e}, Q8_0 (f16 scale) {q8:.4e}");
    assert!(ours <= q8, "ours {ours} vs Q8_0 {q8}");
}

/// `n` random values of `scale` (from `seed`) quantized and back: every group's step is its
/// largest magnitude / 127, every code within ±127, and every value back within half a step
/// (with the f32 rounding of the code's quotient and of the product).
fn round_trip(n: usize, seed: u64, scale: f32) -> Result<(), String> {
    let mut rng = common::rng(seed);
    let x = common::values(&mut rng, n, scale);
    let a = QuantizedActs::new(&x);
    let mut back = vec![0.0f32; n];
    a.dequantize(&mut back);
    for (i, (&v, &b)) in x.iter().zip(&back).enumerate() {
        let g = act_group(i);
        let amax = (0..n)
            .filter(|&j| act_group(j) == g)
            .fold(0.0f32, |m, j| m.max(x[j].abs()));
        let d = a.scales()[g];
        if d != amax / 127.0 {
            return Err(format!("group {g}: step {d}, expected {}", amax / 127.0));
        }
        // A code is round(v / d) with the quotient in f32: at a midpoint its rounding (half an
        // ulp of up to 127, 2^-18 of a step) can take the other side, and b = q·d rounds once
        // more; a relative 1e-5 of half a step did not cover it (the case below).
        let bound = 0.5 * f64::from(d) + f64::from(v.abs()) * 2f64.powi(-22);
        if (f64::from(v) - f64::from(b)).abs() > bound {
            return Err(format!("value {v} came back as {b} (step {d})"));
        }
        if a.codes()[i].unsigned_abs() > 127 {
            return Err(format!("code {} out of range", a.codes()[i]));
        }
    }
    Ok(())
}

#[test]
fn a_value_at_a_midpoint_of_a_huge_step_comes_back_within_half_a_step() {
    // The proptest case that landed 0.50001 steps away under the earlier bound.
    assert_eq!(round_trip(84, 3411752022038884430, 1e30), Ok(()));
}
