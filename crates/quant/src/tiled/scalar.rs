//! The scalar twin of the tiled kernels: decodes each panel block's codes and forms the same
//! integer sums and fused float steps, row by row.

use std::ops::Range;

use super::layout::{self, HALF, PANEL};
use super::TiledMatrix;
use crate::acts::GROUPS_PER_HALF;
use crate::{act_group, Format, QuantizedActs};

pub(super) fn gemm(m: &TiledMatrix, panels: Range<usize>, acts: &[QuantizedActs], out: &mut [f32]) {
    let rows = m.row_range(&panels);
    let nt = acts.len();
    let f = m.layout;
    let hb = layout::half_bytes(f);
    let mut codes = [[0u8; HALF]; PANEL];
    // The weight is `code − 1`, but Q1_0's codes 0 and 2 are summed as they are, to
    // `2·Σ_{bit set} q`: its −Σq joins once per block, below.
    let offset = i32::from(f != Format::Q1_0);
    for p in panels {
        let mut total = vec![[0f32; PANEL]; nt];
        for b in 0..m.blocks() {
            let pb = m.panel_block(p, b);
            let mut blk = vec![[0f32; PANEL]; nt];
            for h in 0..layout::halves(f) {
                let at = layout::SCALES + h * hb;
                layout::decode_half(f, m.q1, &pb[at..at + hb], &mut codes);
                let base = b * f.block_len() + h * HALF;
                for (t, a) in acts.iter().enumerate() {
                    let q = a.codes();
                    for k in 0..GROUPS_PER_HALF {
                        let g = act_group(base + 4 * k);
                        for (l, row) in codes.iter().enumerate() {
                            let s: i32 = (0..HALF)
                                .filter(|v| (v / 4) % GROUPS_PER_HALF == k)
                                .map(|v| (i32::from(row[v]) - offset) * i32::from(q[base + v]))
                                .sum();
                            blk[t][l] = (s as f32).mul_add(a.scales()[g], blk[t][l]);
                        }
                    }
                }
            }
            if f == Format::Q1_0 {
                for (t, a) in acts.iter().enumerate() {
                    let n = a.neg_span_terms()[b];
                    blk[t].iter_mut().for_each(|v| *v += n);
                }
            }
            for (l, bits) in pb[..layout::SCALES].chunks_exact(2).enumerate() {
                let d = half::f16::from_bits(u16::from_le_bytes([bits[0], bits[1]])).to_f32();
                for t in 0..nt {
                    total[t][l] = blk[t][l].mul_add(d, total[t][l]);
                }
            }
        }
        for r in (p * PANEL).max(rows.start)..((p + 1) * PANEL).min(rows.end) {
            for t in 0..nt {
                out[(r - rows.start) * nt + t] = total[t][r % PANEL];
            }
        }
    }
}
