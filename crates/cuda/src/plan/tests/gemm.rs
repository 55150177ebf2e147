//! The prefill GEMMs' kernels, stages and tensor-map boxes.

use super::super::*;
#[test]
fn every_gemm_variant_is_a_kernel_and_named_as_such() {
    for f in GpuFormat::ALL {
        for mi in GEMM_MI {
            let name = format!("gemm_{}_m{mi}", f.kernel_name());
            assert!(crate::compile::KERNELS.contains(&name.as_str()), "{name}");
            assert_eq!(gemm_variant(&name), Some(mi));
        }
    }
    let variants = crate::compile::KERNELS
        .iter()
        .filter(|k| gemm_variant(k).is_some())
        .count();
    assert_eq!(variants, GpuFormat::ALL.len() * GEMM_MI.len());
    assert_eq!(gemm_variant("gemm_reduce"), None);
    assert_eq!(gemm_variant("gemv_q1_t8"), None);
}

#[test]
fn gemm_stages_fit_and_fragment_loads_are_conflict_free() {
    for f in GpuFormat::ALL {
        assert!(GEMM_STAGE_VALUES.is_multiple_of(f.chunk_values()));
    }
    for mi in GEMM_MI {
        let smem = gemm_smem_bytes(mi);
        // Every sm_80+ part allows 99 KiB per block (sm_80 and sm_90 more), and the H200
        // fits 3 − mi blocks, as `gemm_splits` assumes.
        assert!(smem <= 99 << 10, "{mi}: {smem}");
        assert!((3 - mi) * (smem + 1024) <= 228 << 10, "{mi}: {smem}");
        // cp.async targets and ldmatrix rows are 16-byte aligned in every stage.
        assert_eq!(smem % (16 * GEMM_STAGES), 0);
        let kc = GEMM_STAGE_VALUES;
        assert_eq!((kc + 16) % 16, 0);
        // The 8 rows of a 16-byte ldmatrix phase land in 8 distinct groups of 4 banks.
        let banks: std::collections::HashSet<_> = (0..8).map(|r| r * (kc + 16) / 16 % 8).collect();
        assert_eq!(banks.len(), 8);
    }
    let banks: std::collections::HashSet<_> =
        (0..8).map(|r| r * GEMM_ROW_STRIDE / 16 % 8).collect();
    assert_eq!(banks.len(), 8);
    let (m1, m2) = (GemmKernel::Int8 { mi: 1 }, GemmKernel::Int8 { mi: 2 });
    assert_eq!(gemm_grid(5120, MAX_CHUNK, m2), (4, 20));
    assert_eq!(gemm_grid(1001, 17, m2), (1, 4));
    assert_eq!(gemm_grid(1001, 17, m1), (1, 8));
    let (w3, w4) = (
        GemmKernel::F16 { wg: 3, tokens: 128 },
        GemmKernel::F16 { wg: 4, tokens: 128 },
    );
    assert_eq!(gemm_grid(1001, 17, w4), (1, 4));
    assert_eq!(gemm_grid(34816, MAX_CHUNK, w4), (2, 136));
    assert_eq!(gemm_grid(34816, MAX_CHUNK, w3), (2, 182));
    let cap = GEMM_MAX_SPLITS * MAX_CHUNK * 5120;
    assert_eq!(gemm_splits(5120, 17408, MAX_CHUNK, m2, 132, cap, false), 3);
    assert_eq!(gemm_splits(5120, 6144, MAX_CHUNK, m1, 132, cap, false), 3);
    assert_eq!(gemm_splits(34816, 5120, MAX_CHUNK, m2, 132, cap, false), 1);
    // Short passes count 16-token tiles of three warpgroups two a multiprocessor: gate | up's
    // 182 blocks take four splits (728 of 792 slots) up to F16_TWO_BLOCK_TOKENS, none past it
    // (182 blocks for 132 slots).
    let n16 = GemmKernel::F16 { wg: 3, tokens: 16 };
    assert_eq!(block_slots(n16, F16_TWO_BLOCK_TOKENS, 132), 264);
    assert_eq!(block_slots(n16, F16_TWO_BLOCK_TOKENS + 1, 132), 132);
    assert_eq!(
        block_slots(GemmKernel::F16 { wg: 4, tokens: 16 }, 2, 132),
        132
    );
    assert_eq!(gemm_splits(34816, 5120, 8, n16, 132, cap, false), 4);
    assert_eq!(gemm_splits(34816, 5120, 16, n16, 132, cap, false), 1);
    // Passes launched with PDL split the f16 GEMM six ways where the splits fit; others, the
    // int8 GEMM, and splits without room for their partial sums or two stages each keep the
    // fill rule's.
    assert_eq!(gemm_splits(34816, 5120, 4, n16, 132, cap, false), 4);
    for ntok in 2..=PDL_TOKENS {
        assert_eq!(gemm_splits(34816, 5120, ntok, n16, 132, cap, true), 6);
        assert_eq!(gemm_splits(5120, 17408, ntok, n16, 132, cap, true), 6);
    }
    assert_eq!(
        gemm_splits(34816, 5120, 4, m2, 132, cap, true),
        gemm_splits(34816, 5120, 4, m2, 132, cap, false)
    );
    assert_eq!(
        gemm_splits(34816, 5120, 4, n16, 132, 5 * 4 * 34816, true),
        gemm_splits(34816, 5120, 4, n16, 132, 5 * 4 * 34816, false)
    );
    // 1024 columns are 8 stages: 4 splits keep two each, 6 would not.
    assert_eq!(
        gemm_splits(5120, 1024, 4, n16, 132, cap, true),
        gemm_splits(5120, 1024, 4, n16, 132, cap, false)
    );
    // 40 blocks of the f16 kernel for 132 slots: three splits fill 91%.
    assert_eq!(gemm_splits(5120, 17408, MAX_CHUNK, w4, 132, cap, false), 3);
    assert_eq!(gemm_splits(34816, 5120, MAX_CHUNK, w4, 132, cap, false), 1);
    // The f16 kernel's warpgroups by matrix on 132 multiprocessors: 34816 rows at 256 tokens
    // in 3 waves of 182×2 blocks of 192 rows rather than 3 waves (the last of 8 blocks) of
    // 136×2 of 256; 16480 rows in one wave of 130 blocks of 256 rather than two of 172 of 192;
    // 5120 rows split in three, one wave either way. The int8 kernel without wgmma.
    let pick = |rows, cols| GemmKernel::preferred(true, rows, cols, MAX_CHUNK, 132, cap);
    assert_eq!(pick(34816, 5120), w3);
    assert_eq!(pick(16480, 5120), w4);
    assert_eq!(pick(14336, 5120), w4);
    assert_eq!(pick(5120, 17408), w4);
    assert_eq!(pick(5120, 6144), w4);
    // Short passes take the narrowest tile that holds them; long ones the widest, several.
    let short = |ntok| GemmKernel::preferred(true, 5120, 17408, ntok, 132, cap);
    assert!(matches!(short(2), GemmKernel::F16 { tokens: 16, .. }));
    assert!(matches!(short(16), GemmKernel::F16 { tokens: 16, .. }));
    assert!(matches!(short(17), GemmKernel::F16 { tokens: 32, .. }));
    assert!(matches!(short(64), GemmKernel::F16 { tokens: 64, .. }));
    assert!(matches!(short(65), GemmKernel::F16 { tokens: 128, .. }));
    assert!(matches!(
        short(MAX_CHUNK),
        GemmKernel::F16 { tokens: 128, .. }
    ));
    let n16 = GemmKernel::F16 { wg: 4, tokens: 16 };
    assert_eq!(gemm_grid(5120, 2, n16), (1, 20));
    assert_eq!(gemm_grid(5120, 40, n16), (3, 20));
    // Rows that are not whole 128-value stages go to the int8 kernel.
    assert_eq!(
        GemmKernel::preferred(true, 5120, 5120 + 64, MAX_CHUNK, 132, cap),
        GemmKernel::Int8 {
            mi: GEMM_DEFAULT_MI
        }
    );
    assert_eq!(
        GemmKernel::preferred(false, 34816, 5120, MAX_CHUNK, 132, cap),
        GemmKernel::Int8 {
            mi: GEMM_DEFAULT_MI
        }
    );
    // No room for the partial sums, or too few stages to share: no split.
    assert_eq!(
        gemm_splits(5120, 17408, MAX_CHUNK, m2, 132, cap / 4, false),
        1
    );
    assert_eq!(gemm_splits(5120, 256, MAX_CHUNK, m2, 132, cap, false), 1);
}

#[test]
fn every_gemm_kernel_is_a_kernel_and_fits_its_blocks() {
    assert_eq!(
        GemmKernel::all(false).len() + HGEMM_WARPGROUPS.len() * HGEMM_TOKENS.len(),
        GemmKernel::all(true).len()
    );
    for k in GemmKernel::all(true) {
        for f in GpuFormat::ALL {
            let name = k.name(f);
            assert!(crate::compile::KERNELS.contains(&name.as_str()), "{name}");
            assert_eq!(GemmKernel::of_name(&name), Some(k));
        }
        let smem = k.smem_bytes();
        assert!(
            smem <= 99 << 10 || matches!(k, GemmKernel::F16 { .. }),
            "{k:?}: {smem}"
        );
        // An H200 multiprocessor (228 KiB, 1 KiB reserved per block) holds the blocks
        // `gemm_splits` counts on.
        assert!(
            k.blocks_per_sm() * (smem + 1024) <= 228 << 10,
            "{k:?}: {smem}"
        );
        assert_eq!(smem % 16, 0);
    }
    assert_eq!(GemmKernel::of_name("hgemm_q5"), None);
    assert_eq!(GemmKernel::of_name("hgemm_q1_w4"), None);
    assert_eq!(GemmKernel::of_name("hgemm_q1_w4_n24"), None);
    assert_eq!(GemmKernel::of_name("gemm_reduce"), None);
    // The f16 kernel's code loads of 64-value block i: 2-bit, lane (g, t) reads word t of its
    // chunk slot (i XOR bit 2 of g) in row g's 32 bytes: a warp's 8 rows × 4 words hit 32
    // distinct banks. 1-bit, word 2i + t / 2 of row g's 16 bytes (two lanes to a word): 16
    // distinct banks, one word each.
    for i in 0..2 {
        let q2: std::collections::HashSet<_> = (0..32)
            .map(|lane| {
                let (g, t) = (lane / 4, lane % 4);
                (8 * g + 4 * ((i ^ (g >> 2)) & 1) + t) % 32
            })
            .collect();
        assert_eq!(q2.len(), 32);
        let q1: std::collections::HashSet<_> = (0..32)
            .map(|lane| (4 * (lane / 4) + 2 * i + lane % 4 / 2) % 32)
            .collect();
        assert_eq!(q1.len(), 16);
    }
}

#[test]
fn the_f16_gemm_order_puts_each_threads_fragment_pairs_where_its_masks_find_them() {
    // A permutation of the 64 values of a block.
    let slots: std::collections::HashSet<_> = (0..64).map(hgemm_slot).collect();
    assert_eq!(slots.len(), 64);
    // Thread t of a quad at mma step j holds k = 2t, 2t+1 (first pair) and 2t+8, 2t+9 (second
    // pair) of the step's 16; its first pair must be bytes 0 and 2 of field j of 2-bit word t
    // (values 16t + 4j + {0, 2}), its second bytes 1 and 3 (values 16t + 4j + {1, 3}).
    for t in 0..4 {
        for j in 0..4 {
            for e in 0..2 {
                assert_eq!(hgemm_slot(16 * t + 4 * j + 2 * e), 16 * j + 2 * t + e);
                assert_eq!(
                    hgemm_slot(16 * t + 4 * j + 2 * e + 1),
                    16 * j + 8 + 2 * t + e
                );
            }
        }
    }
}

#[test]
fn the_f16_gemm_takes_rows_of_whole_stages() {
    // The 27B's and the small preset's columns: hidden, ffn, attention and recurrent widths.
    for cols in [5120, 17408, 6144, 1024, 3072] {
        assert!(hgemm_takes(cols), "{cols}");
    }
    // Whole stages, however few; a part stage.
    assert!(hgemm_takes(384));
    assert!(!hgemm_takes(5120 + 64));
}

#[test]
fn the_tma_boxes_of_the_f16_gemm_are_legal_and_fill_its_stages() {
    for f in GpuFormat::ALL {
        for (rows, cols) in [
            (34816, 5120),
            (5120, 17408),
            (5120, 6144),
            (300, 1024),
            (300, 384),
        ] {
            for wg in HGEMM_WARPGROUPS {
                let w = hgemm_weight_tile(f, rows, cols, wg);
                assert_eq!(w.check(), Ok(()), "{f:?} {rows}×{cols}");
                // A stage's codes of the block's rows fit the two 16-byte slots per row the
                // stage keeps for them.
                assert_eq!(w.box_rows, GemmKernel::F16 { wg, tokens: 16 }.rows());
                assert!(w.box_cols <= 32);
                assert_eq!(w.box_cols, HGEMM_STAGE_VALUES / f.chunk_values() * 16);
                // A stage's scales of the block's rows, where they come in stage order, fit the
                // bytes the stage keeps for its threads' scale slots; the bulk copy's bytes and
                // its source offsets are whole 16 bytes, and its last block's stays inside the
                // padded rows.
                let staged = w.box_rows * hgemm_scales_per_stage(f) * 2;
                assert!(w.box_rows * 32 + staged <= wg * HGEMM_STAGE_PER_WG);
                assert!(staged.is_multiple_of(16));
                let padded = hgemm_stage_scale_rows(rows);
                assert!(rows.div_ceil(w.box_rows) * w.box_rows <= padded);
                assert!((padded * hgemm_scales_per_stage(f) * 2).is_multiple_of(16));
            }
            for ntok in [2, 16, 100, 256] {
                for tokens in HGEMM_TOKENS {
                    let x = hgemm_act_tile(ntok, cols, tokens);
                    assert_eq!(x.check(), Ok(()));
                    // Two boxes make a stage's activations.
                    assert_eq!(2 * x.box_bytes(), tokens * HGEMM_STAGE_VALUES * 2);
                    for wg in HGEMM_WARPGROUPS {
                        assert_eq!(
                            hgemm_stage_bytes(wg, tokens),
                            2 * x.box_bytes() + wg * HGEMM_STAGE_PER_WG
                        );
                    }
                }
            }
        }
    }
    // The 32-byte swizzle swaps the two 16-byte units of row r when bit 2 of r is set (address
    // bit 4 XOR bit 7, rows 32 bytes apart): the slots hg_stage_mmas reads rows g from.
    for r in 0..16usize {
        for q in 0..2usize {
            let offset = 32 * r + 16 * q;
            let swizzled = offset ^ ((offset >> 3) & 0x10);
            assert_eq!(swizzled, 32 * r + 16 * (q ^ ((r >> 2) & 1)));
        }
    }
}

#[test]
fn each_format_steps_its_shortest_passes_then_leaves_the_rest_to_one_kernel_rule() {
    for f in GpuFormat::ALL {
        let s = short_passes(f);
        // Stepping ends below the GEMM's start, which one-token passes never reach.
        assert!(s.step < s.gemm_from && s.gemm_from >= 2, "{f:?}: {s:?}");
        assert!(s.gemm_from <= GEMM_MIN_TOKENS, "{f:?}: {s:?}");
    }
    // Every format's rule was measured, and each left the former one.
    for f in GpuFormat::ALL {
        assert_ne!(short_passes(f), ShortPasses::UNMEASURED, "{f:?}");
    }
}
