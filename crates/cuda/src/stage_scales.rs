//! The f16 GEMM's copy of a matrix's weight scales in stage order (kernels/hgemm.cu): a stage's
//! scales of a block's rows lie together, so one bulk copy brings them, where the scales' own
//! rows would take a TMA box of a few bytes a row ([`plan::hgemm_stage_scales`]).

use crate::plan;
use crate::repack::Packed;

/// `p`'s scales in stage order where the f16 GEMM reads them so ([`plan::hgemm_stage_scales`]),
/// else `None`: for stage `s` (128 values of every row) and row `r` of
/// [`plan::hgemm_stage_scale_rows`] (zeros past the matrix's rows), the row's scales of the
/// stage at `(s · padded rows + r) · per stage`.
pub fn by_stage(p: &Packed) -> Option<Vec<u16>> {
    let bytes = plan::hgemm_stage_scale_bytes(p.format, p.rows, p.cols);
    if bytes == 0 {
        return None;
    }
    let sps = plan::hgemm_scales_per_stage(p.format);
    let spr = p.cols / p.format.scale_values();
    let padded = plan::hgemm_stage_scale_rows(p.rows);
    let mut out = vec![0u16; bytes / 2];
    // Rows a band at a time, stages inside: the band's scales stay in cache while each stage's
    // run of the band's rows is written out whole.
    const BAND: usize = 64;
    for (b, band) in p.scales.chunks(BAND * spr).enumerate() {
        let r0 = b * BAND;
        for (s, run) in out.chunks_exact_mut(padded * sps).enumerate() {
            for (i, row) in band.chunks_exact(spr).enumerate() {
                let at = (r0 + i) * sps;
                run[at..at + sps].copy_from_slice(&row[s * sps..(s + 1) * sps]);
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repack::GpuFormat;

    fn packed(format: GpuFormat, rows: usize, cols: usize) -> Packed {
        let spr = cols / format.scale_values();
        Packed {
            format,
            rows,
            cols,
            codes: vec![0; rows * cols / format.chunk_values() * 16],
            // Every scale its own number: row · 1000 + index in the row.
            scales: (0..rows * spr)
                .map(|i| ((i / spr) * 1000 + i % spr) as u16)
                .collect(),
        }
    }

    #[test]
    fn every_scale_lands_at_its_stage_and_row_and_the_padding_is_zero() {
        let (rows, cols) = (300, 640);
        let p = packed(GpuFormat::Q2G64, rows, cols);
        let out = by_stage(&p).expect("64-value blocks are copied by stage");
        let padded = plan::hgemm_stage_scale_rows(rows);
        // Past the last block of three warpgroups (384) and of four (512).
        assert_eq!(padded, 512);
        assert_eq!(plan::hgemm_stage_scale_rows(5120), 5184);
        assert_eq!(plan::hgemm_stage_scale_rows(768), 768);
        assert_eq!(out.len(), cols / 128 * padded * 2);
        for s in 0..cols / 128 {
            for r in 0..padded {
                for j in 0..2 {
                    let got = out[(s * padded + r) * 2 + j];
                    let want = if r < rows {
                        (r * 1000 + 2 * s + j) as u16
                    } else {
                        0
                    };
                    assert_eq!(got, want, "stage {s} row {r} scale {j}");
                }
            }
        }
    }

    #[test]
    fn only_the_64_value_formats_get_a_copy() {
        for f in GpuFormat::ALL {
            let copied = by_stage(&packed(f, 70, 1024)).is_some();
            assert_eq!(copied, f.scale_values() == 64, "{f:?}");
        }
        // Rows that are not whole stages get none (the f16 GEMM does not take them).
        assert!(by_stage(&packed(GpuFormat::Q2G64, 70, 1024 + 64)).is_none());
    }
}
