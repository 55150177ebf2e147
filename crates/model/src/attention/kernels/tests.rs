use super::*;
use crate::attention::noise;
use crate::kv::{KvCache, KvFormat};

/// Every form this CPU runs, the plain one last.
fn forms() -> Vec<Kernels> {
    [Simd::Avx512, Simd::Avx2]
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
