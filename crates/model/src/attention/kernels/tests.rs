use super::*;
use crate::attention::noise;
use crate::kv::{KvCache, KvFormat};

/// Every form this CPU runs, the plain one last.
fn forms() -> Vec<Kernels> {
    [Simd::Avx512, Simd::Avx2, Simd::Neon]
        .into_iter()
        .filter(|s| s.supported())
        .map(|s| Kernels { simd: Some(s) })
        .chain([Kernels::PLAIN])
        .collect()
}

/// A one-head cache of `n` positions of `hd` random keys and values.
fn cache(n: usize, hd: usize, format: KvFormat, seed: u64) -> (KvCache, Vec<f32>, Vec<f32>) {
    let (k, v) = (noise(n * hd, seed), noise(n * hd, seed + 1));
    let mut c = KvCache::with_format(1, hd, format);
    c.append(&k, &v);
    // The values as the cache holds them.
    let held = |x: &[f32]| -> Vec<f32> {
        match format {
            KvFormat::F32 => x.to_vec(),
            KvFormat::F16 => x.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect(),
        }
    };
    let (k, v) = (held(&k), held(&v));
    (c, k, v)
}

fn differing(a: &[f32], b: &[f32]) -> usize {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count()
}

#[test]
fn this_cpu_runs_its_fastest_form() {
    assert_eq!(Kernels::detect(), forms()[0]);
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") {
        assert_eq!(forms().len(), 3, "AVX-512, AVX2 and the plain form");
    }
}

#[test]
fn the_score_kernels_give_the_plain_forms_bits_and_the_exact_sums_within_rounding() {
    for (i, &(hd, heads, n, first)) in [
        (256, 6, 77, 1),
        (256, 8, 33, 0),
        (64, 3, 16, 0),
        (40, 11, 50, 2),
        (16, 1, 5, 0),
        (8, 2, 160, 7),
        (128, 7, 64, 1),
    ]
    .iter()
    .enumerate()
    {
        for format in [KvFormat::F32, KvFormat::F16] {
            let seed = 100 * i as u64;
            let (c, k, _) = cache(n, hd, format, seed);
            let q = noise(heads * hd, seed + 7);
            let tiles = first..n.div_ceil(KEY_TILE);
            let stride = tiles.len() * KEY_TILE + 3;
            let scale = 0.0625;
            let mut want = vec![f32::NAN; heads * stride];
            let got = want.clone();
            let op = Scores {
                q: &q,
                hd,
                keys: c.k(0),
                tiles: tiles.clone(),
                scale,
            };
            Kernels::PLAIN.scores(&op, &mut want, stride);
            for k in forms() {
                let mut got = got.clone();
                k.scores(&op, &mut got, stride);
                assert_eq!(differing(&want, &got), 0, "case {i} {format:?} {k:?}");
            }
            // Against the exact sums (f64) of the cached keys.
            for g in 0..heads {
                for p in tiles.start * KEY_TILE..n {
                    let exact: f64 = (0..hd)
                        .map(|d| q[g * hd + d] as f64 * k[p * hd + d] as f64)
                        .sum::<f64>()
                        * scale as f64;
                    let bound: f64 = (0..hd)
                        .map(|d| (q[g * hd + d] as f64 * k[p * hd + d] as f64).abs())
                        .sum::<f64>()
                        * scale as f64
                        * 1e-6;
                    let s = want[g * stride + p - tiles.start * KEY_TILE] as f64;
                    assert!((s - exact).abs() <= bound, "case {i}: {s} against {exact}");
                }
                // The last tile's unused positions score zero.
                for p in n..tiles.end * KEY_TILE {
                    assert_eq!(want[g * stride + p - tiles.start * KEY_TILE], 0.0);
                }
                // Past the tiles, nothing is written.
                assert!(want[g * stride + tiles.len() * KEY_TILE].is_nan());
            }
        }
    }
}

#[test]
fn the_value_kernels_give_the_plain_forms_bits_and_the_exact_sums_within_rounding() {
    // (head_dim, heads, positions, values d, positions taken): slices of whole chunks, heads
    // whose last chunk is narrower, position ranges within and across value tiles.
    for (i, (hd, heads, n, d, pos)) in [
        (256, 6, 300, 0..256, 0..300),
        (256, 8, 70, 64..128, 3..70),
        (256, 9, 130, 224..256, 64..129),
        (40, 3, 20, 0..40, 0..20),
        (48, 2, 90, 32..48, 1..89),
        (96, 5, 17, 32..96, 0..17),
        (8, 1, 5, 0..8, 0..5),
        (64, 7, 200, 0..64, 130..131),
    ]
    .into_iter()
    .enumerate()
    {
        for format in [KvFormat::F32, KvFormat::F16] {
            let seed = 1000 + 100 * i as u64;
            let (c, _, v) = cache(n, hd, format, seed);
            let wstride = n + 5;
            let wts = noise(heads * wstride, seed + 9);
            let w = d.len();
            let start = noise(heads * w, seed + 11);
            let mut want = start.clone();
            let op = Values {
                wts: &wts,
                wstride,
                rows: c.v(0),
                hd,
                d: d.clone(),
                pos: pos.clone(),
            };
            Kernels::PLAIN.values(&op, &mut want);
            for k in forms() {
                let mut got = start.clone();
                k.values(&op, &mut got);
                assert_eq!(differing(&want, &got), 0, "case {i} {format:?} {k:?}");
            }
            for g in 0..heads {
                for j in 0..w {
                    let terms = pos
                        .clone()
                        .map(|p| wts[g * wstride + p] as f64 * v[p * hd + d.start + j] as f64);
                    let exact = start[g * w + j] as f64 + terms.clone().sum::<f64>();
                    let bound =
                        (start[g * w + j].abs() as f64 + terms.map(f64::abs).sum::<f64>()) * 1e-6;
                    let s = want[g * w + j] as f64;
                    assert!((s - exact).abs() <= bound, "case {i}: {s} against {exact}");
                }
            }
        }
    }
}

#[test]
fn the_softmax_exp_is_within_four_ulp_of_the_exact_value() {
    let mut worst = 0f64;
    let mut check = |x: f32| {
        let got = softmax::exp_plain(x) as f64;
        let want = (x as f64).exp();
        let ulp = (want as f32).abs() * f32::EPSILON;
        let err = (got - want).abs() / ulp as f64;
        worst = worst.max(err);
        assert!(err <= 4.0, "exp({x}) = {got}, exactly {want}: {err} ulp");
    };
    for i in 0..=200_000 {
        check(-87.0 * i as f32 / 200_000.0);
    }
    for x in [
        0.0,
        -0.0,
        -1e-30,
        -1e-7,
        -0.346_573_6,
        -0.346_573_6 - 1e-7,
        -std::f32::consts::LN_2,
        -1.0,
        -86.9,
    ] {
        check(x);
    }
    assert!(
        worst > 0.0,
        "an exp that is exact everywhere is not this one"
    );
    // Past the range: the smallest normal, not zero or a subnormal.
    assert_eq!(softmax::exp_plain(-1000.0), softmax::exp_plain(-87.336_54));
    assert!(softmax::exp_plain(-1000.0) >= f32::MIN_POSITIVE);
}

#[test]
fn every_softmax_form_gives_the_plain_forms_bits_and_the_exact_weights_within_rounding() {
    for (i, n) in [1usize, 2, 15, 16, 17, 33, 300, 1001]
        .into_iter()
        .enumerate()
    {
        // Scores from -40 to 40, with repeats.
        let mut row: Vec<f32> = noise(n, 50 + i as u64).iter().map(|x| x * 20.0).collect();
        if n > 3 {
            row[3] = row[0];
        }
        let mut want = row.clone();
        Kernels::PLAIN.softmax(&mut want);
        for k in forms() {
            let mut got = row.clone();
            k.softmax(&mut got);
            assert_eq!(differing(&want, &got), 0, "{n} scores, {k:?}");
        }
        // exp of each score less the max, that difference rounded to f32 as the kernels take it.
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f64> = row.iter().map(|&s| ((s - max) as f64).exp()).collect();
        let sum: f64 = exps.iter().sum();
        for (p, (&w, e)) in want.iter().zip(&exps).enumerate() {
            let exact = e / sum;
            assert!(
                (w as f64 - exact).abs() <= 2e-6 * exact + 1e-30,
                "{n} scores, position {p}: {w} against {exact}"
            );
        }
        let total: f64 = want.iter().map(|&w| w as f64).sum();
        assert!(
            (total - 1.0).abs() < 1e-5,
            "{n} scores: weights sum to {total}"
        );
    }
}
