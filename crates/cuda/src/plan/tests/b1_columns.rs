//! The 1-bit binary decode GEMV's tile arithmetic (`kernels/gemv_b1.cu`) emulated lane by lane
//! on the PTX ISA's fragments of `mma.m16n8k128.b1.and.popc`, in both arrangements of B's
//! columns (`B1_GROUP_COLS` off and on): the lanes' integer counts, weighted as the kernel
//! weights them, must give every row's Σ q under its ones for each activation group exactly,
//! and the scaled sums the packed dot's twin to f32 rounding. A GPU checks the kernels
//! themselves (the harness's `gemv-b1` section); this checks the index and weight algebra
//! where no GPU is.

use quant::Format;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::repack::{dot_row, plane_words, quantize_x, repack, Packed};

/// One MMA: lane (g, t) holds A's rows g and g + 8 and B's column g over k = 32t … 32t + 31,
/// and gets C's rows g, g + 8 at columns 2t, 2t + 1 (`[C[g][2t], C[g][2t+1], C[g+8][2t],
/// C[g+8][2t+1]]`). `a[i][t]`: row i's word t.
fn mma(a: &[[u32; 4]; 16], b: &[u32; 32]) -> [[i32; 4]; 32] {
    let c = |i: usize, j: usize| -> i32 {
        (0..4)
            .map(|t| (a[i][t] & b[4 * j + t]).count_ones() as i32)
            .sum()
    };
    std::array::from_fn(|lane| {
        let (g, t) = (lane / 4, lane % 4);
        [
            c(g, 2 * t),
            c(g, 2 * t + 1),
            c(g + 8, 2 * t),
            c(g + 8, 2 * t + 1),
        ]
    })
}

/// The two MMAs' B words of every lane from `b` (lane g, t: plane g of values 32t …), as
/// `b1_mma_words` forms them; `group_cols` the shuffled arrangement.
fn mma_words(b: &[u32; 32], group_cols: bool) -> ([u32; 32], [u32; 32]) {
    let mut lo = [0u32; 32];
    let mut hi = [0u32; 32];
    for lane in 0..32 {
        let (g, t) = (lane / 4, lane % 4);
        if group_cols {
            let src = 4 * (g & 3) + t;
            if (t < 2) == (g < 4) {
                lo[lane] = b[src];
                hi[lane] = b[src + 16];
            }
        } else if t < 2 {
            lo[lane] = b[lane];
        } else {
            hi[lane] = b[lane];
        }
    }
    (lo, hi)
}

/// Row r's (of rows 0-15 of `p`) word t of chunk c.
fn code_word(p: &Packed, r: usize, c: usize, t: usize) -> u32 {
    let at = (r * p.chunks_per_row() + c) * 16 + 4 * t;
    u32::from_le_bytes(p.codes[at..at + 4].try_into().expect("four bytes"))
}

/// Chunk c's two MMAs over rows 0-15 of `p`: every lane's C fragment of each.
fn chunk_mmas(
    p: &Packed,
    planes: &[u32],
    c: usize,
    group_cols: bool,
) -> ([[i32; 4]; 32], [[i32; 4]; 32]) {
    let a: [[u32; 4]; 16] = std::array::from_fn(|r| std::array::from_fn(|t| code_word(p, r, c, t)));
    let b: [u32; 32] = planes[32 * c..32 * c + 32].try_into().expect("32 words");
    let (lo_b, hi_b) = mma_words(&b, group_cols);
    (mma(&a, &lo_b), mma(&a, &hi_b))
}

/// Per row of a 16-row tile and chunk c, the two groups' integer counts as the kernel's lanes
/// weight and add them (the quad of lanes g, 0 … 3 of rows g and g + 8).
fn counts(p: &Packed, planes: &[u32], c: usize, group_cols: bool) -> [[i64; 2]; 16] {
    let (lo, hi) = chunk_mmas(p, planes, c, group_cols);
    let mut n = [[0i64; 2]; 16];
    for lane in 0..32 {
        let (g, t) = (lane / 4, lane % 4);
        for (half, row) in [(0, g), (2, g + 8)] {
            let (l0, l1, h0, h1) = (
                lo[lane][half] as i64,
                lo[lane][half + 1] as i64,
                hi[lane][half] as i64,
                hi[lane][half + 1] as i64,
            );
            if group_cols {
                let m16 = if t & 1 == 1 { -32 } else { 32 };
                let v = l0 + 2 * l1 + 16 * h0 + m16 * h1;
                n[row][t >> 1] += (1 << (2 * (t & 1))) * v;
            } else {
                let sgn = if t == 3 { -2 } else { 2 };
                n[row][0] += (1 << (2 * t)) * (l0 + sgn * l1);
                n[row][1] += (1 << (2 * t)) * (h0 + sgn * h1);
            }
        }
    }
    n
}

fn tile() -> (Packed, Vec<i8>, Vec<f32>) {
    let cols = 512;
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let w: Vec<f32> = (0..16 * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let data = quant::quantize(Format::Q1_0, &w).expect("quantize");
    let p = repack("m", Format::Q1_0, &data, 16, cols).expect("repack");
    // Values of both signs and the extremes, so that every plane (the sign plane too) counts.
    let x: Vec<f32> = (0..cols)
        .map(|i| match i % 97 {
            0 => 1.0,
            1 => -1.0,
            _ => rng.gen_range(-1.0..1.0),
        })
        .collect();
    let q = quantize_x(&x).q;
    (p, q, x)
}

#[test]
fn both_column_arrangements_count_each_groups_sum_under_a_rows_ones() {
    let (p, q, _) = tile();
    let planes = plane_words(&q);
    for c in 0..p.chunks_per_row() {
        for group_cols in [false, true] {
            let n = counts(&p, &planes, c, group_cols);
            for (r, row) in n.iter().enumerate() {
                for (h, &got) in row.iter().enumerate() {
                    let want: i64 = (0..64)
                        .map(|v| c * 128 + h * 64 + v)
                        .filter(|&col| p.value(r, col) > 0.0)
                        .map(|col| i64::from(q[col]))
                        .sum();
                    assert_eq!(
                        got, want,
                        "chunk {c}, row {r}, group {h}, group_cols {group_cols}"
                    );
                }
            }
        }
    }
}

#[test]
fn group_columns_scaled_as_the_kernel_scales_them_give_the_packed_dot() {
    // Lane t's term of a row and chunk: d·(2·4^(t mod 2)·s·v − y), s and y (= s·Σq) those of
    // its group t / 2, y taken by lanes 0 and 2 alone.
    let (p, _, x) = tile();
    let xq = quantize_x(&x);
    let planes = plane_words(&xq.q);
    let mut acc = [0f32; 16];
    for c in 0..p.chunks_per_row() {
        let (lo, hi) = chunk_mmas(&p, &planes, c, true);
        for lane in 0..32 {
            let (g, t) = (lane / 4, lane % 4);
            let [s, sy] = xq.groups[2 * c + (t >> 1)];
            let ks = (2 << (2 * (t & 1))) as f32 * s;
            let y = if t & 1 == 0 { sy } else { 0.0 };
            let m16 = if t & 1 == 1 { -32 } else { 32 };
            for (half, row) in [(0, g), (2, g + 8)] {
                let v = lo[lane][half]
                    + 2 * lo[lane][half + 1]
                    + 16 * hi[lane][half]
                    + m16 * hi[lane][half + 1];
                let d = half::f16::from_bits(p.scales[row * p.chunks_per_row() + c]).to_f32();
                acc[row] += d * (ks * v as f32 - y);
            }
        }
    }
    for (r, &got) in acc.iter().enumerate() {
        let want = dot_row(&p, r, &xq);
        let scale: f32 = (0..p.cols).map(|i| (p.value(r, i) * x[i]).abs()).sum();
        assert!(
            (got - want).abs() <= 1e-5 * scale,
            "row {r}: {got} against {want} (Σ|w·x| {scale})"
        );
    }
}
