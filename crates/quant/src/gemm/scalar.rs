//! The scalar twin: integer block sums formed value by value, combined in f32 in block order.

use crate::acts::{act_group, GROUPS_PER_HALF};
use crate::codec::{Codec, MAX_BLOCK_LEN};
use crate::num::read_f16;
use crate::{float, ptq1_0, Format, QuantizedActs};

/// The integer weights of one block (`w_int`, see the module docs of `gemm`) and its scales
/// `(d, m)` (`m` is 0 except for Q4_1).
pub(crate) fn block_ints(format: Format, block: &[u8], w: &mut [i8; MAX_BLOCK_LEN]) -> (f32, f32) {
    match format {
        Format::Q1_0 => {
            for (j, o) in w.iter_mut().enumerate() {
                *o = if (block[2 + j / 8] >> (j % 8)) & 1 != 0 {
                    1
                } else {
                    -1
                };
            }
            (read_f16(block, 0), 0.0)
        }
        Format::Q2_0 | Format::Q2_0G128 | Format::PQ2_0 => {
            for (j, o) in w[..format.block_len()].iter_mut().enumerate() {
                *o = ((block[2 + j / 4] >> (2 * (j % 4))) & 3) as i8 - 1;
            }
            (read_f16(block, 0), 0.0)
        }
        Format::PTQ1_0 => {
            for (byte, &b) in block[..26].iter().enumerate() {
                for n in 0..if byte < 24 { 5 } else { 4 } {
                    w[ptq1_0::element(byte, n)] = ptq1_0::trit(b, n) as i8 - 1;
                }
            }
            (read_f16(block, 26), 0.0)
        }
        Format::Q8_0 => {
            for (o, &q) in w.iter_mut().zip(&block[2..34]) {
                *o = q as i8;
            }
            (read_f16(block, 0), 0.0)
        }
        Format::Q4_1 => {
            for (j, &q) in block[4..20].iter().enumerate() {
                w[j] = (q & 15) as i8;
                w[j + 16] = (q >> 4) as i8;
            }
            (read_f16(block, 0), read_f16(block, 2))
        }
        Format::F32 | Format::F16 | Format::BF16 => unreachable!("float formats have no codes"),
    }
}

/// One row against one token. Per weight block, the exact integer sum `S_g = Σ w_int·q` over the
/// block's values in each activation group `g` it touches (groups in index order), then
/// `Σ_blocks d_w · Σ_g d_g·S_g` in f32 with fused multiply-adds in block and group order
/// (Q4_1: `Σ_blocks Σ_g d_g·(d·S_g + m·Σq)`, unfused).
pub(crate) fn dot_row(format: Format, row: &[u8], a: &QuantizedActs) -> f32 {
    let len = format.block_len();
    let (q, scales) = (a.codes(), a.scales());
    let mut w = [0i8; MAX_BLOCK_LEN];
    let mut total = 0.0f32;
    for (b, block) in row.chunks_exact(format.block_bytes()).enumerate() {
        let (d, m) = block_ints(format, block, &mut w);
        // A block lies inside one 128-value span, so it touches at most the span's groups.
        let per_span = 2 * GROUPS_PER_HALF;
        let first = act_group(b * len) / per_span * per_span;
        let (mut s, mut qsum) = ([0i32; 16], [0i32; 16]);
        let mut touched = [false; 16];
        for (j, &wj) in w[..len].iter().enumerate() {
            let i = b * len + j;
            let g = act_group(i) - first;
            s[g] += i32::from(wj) * i32::from(q[i]);
            qsum[g] += i32::from(q[i]);
            touched[g] = true;
        }
        let mut f = 0.0f32;
        for g in (0..per_span).filter(|&g| touched[g]) {
            let dg = scales[first + g];
            if format == Format::Q4_1 {
                f += dg * (d * s[g] as f32 + m * qsum[g] as f32);
            } else if format == Format::Q1_0 {
                // `2·Σ_{bit set} q`: the −Σq half joins once per block, below.
                f = ((s[g] + qsum[g]) as f32).mul_add(dg, f);
            } else {
                // Fused, in this order: what the tiled kernels compute lane by lane.
                f = (s[g] as f32).mul_add(dg, f);
            }
        }
        if format == Format::Q1_0 {
            // A Q1_0 block is one whole span.
            f += a.neg_span_terms()[first / per_span];
        }
        if format == Format::Q4_1 {
            total += f;
        } else {
            total = f.mul_add(d, total);
        }
    }
    total
}

/// Row-major `rows × tokens` results for the rows in `weights`.
pub(crate) fn gemm(
    format: Format,
    weights: &[u8],
    row_bytes: usize,
    acts: &[QuantizedActs],
    out: &mut [f32],
) {
    if row_bytes == 0 {
        out.fill(0.0);
        return;
    }
    for (row, o) in weights
        .chunks_exact(row_bytes)
        .zip(out.chunks_exact_mut(acts.len()))
    {
        for (a, o) in acts.iter().zip(o) {
            *o = match format {
                Format::F32 => float::F32::dot_row(row, a.values()),
                Format::F16 => float::F16::dot_row(row, a.values()),
                Format::BF16 => float::BF16::dot_row(row, a.values()),
                _ => dot_row(format, row, a),
            };
        }
    }
}
