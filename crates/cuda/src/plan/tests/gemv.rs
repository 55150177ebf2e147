//! The decode GEMVs' plans: kernels, tiles, stages, blocks a multiprocessor.

use super::super::*;
use super::dims;
use model::synth::Preset;

#[test]
fn decode_gemv_plans_fit_the_shared_memory_limit_for_every_27b_matrix() {
    let d = dims(Preset::B27);
    let shapes = [
        (d.gdn_in_rows(), d.hidden),
        (d.hidden, d.gdn_inner()),
        (d.attn_in_rows(), d.hidden),
        (d.ffn_in_rows(), d.hidden),
        (d.hidden, d.ffn),
        (d.vocab, d.hidden),
    ];
    for f in [GpuFormat::Q1, GpuFormat::Q2G64, GpuFormat::Q2G128] {
        for (rows, cols) in shapes {
            let t = Gemv1Tuning::for_shape(f, cols);
            // Only the GEMVs behind a norm (never ffn_down, behind SwiGLU) fold it in.
            let fused = cols != d.ffn;
            let l = gemv1_launch(f, rows, cols, t, 132, 227 << 10, fused).unwrap();
            assert!(l.smem_bytes <= t.smem_budget, "{f:?} {rows}×{cols}: {l:?}");
            assert!((2..=GEMV1_MAX_STAGES).contains(&l.stages), "{l:?}");
            assert!(l.grid <= 132 * t.blocks_per_sm && l.grid >= 1);
            assert_eq!(l.stage_bytes % 128, 0);
        }
    }
}

#[test]
fn one_bit_decode_gemvs_of_short_rows_run_four_blocks_per_multiprocessor() {
    let d = dims(Preset::B27);
    let blocks = |f, cols| Gemv1Tuning::for_shape(f, cols).blocks_per_sm;
    assert_eq!(blocks(GpuFormat::Q1, d.hidden), 4);
    assert_eq!(blocks(GpuFormat::Q1, d.gdn_inner()), 4);
    // ffn_down's 1-bit rows take one row per warp: three blocks.
    assert_eq!(blocks(GpuFormat::Q1, d.ffn), 3);
    assert_eq!(blocks(GpuFormat::Q2G64, d.hidden), 3);
    // ffn_down's 2-bit rows: two blocks with their lanes split, one with them shared.
    assert_eq!(
        Gemv1Tuning::split_lanes(GpuFormat::Q2G64, d.ffn).blocks_per_sm,
        2
    );
    assert_eq!(
        blocks(GpuFormat::Q2G64, d.ffn),
        if SHARED_WIDE_ROWS { 1 } else { 2 }
    );
}

#[test]
fn decode_gemv_tiles_copy_whole_16_byte_units() {
    // Bulk copies need 16-byte multiples: the scales of a tile (8·rw rows × scales per row
    // × 2 bytes) are, for any row width the GPU layouts accept.
    for f in [GpuFormat::Q1, GpuFormat::Q2G64, GpuFormat::Q2G128] {
        for cols in [64, 128, 256, 384, 5120, 17408] {
            if !f.fits(cols) {
                continue;
            }
            for rw in [1, 2] {
                let tr = GEMV1_WARPS * rw;
                assert_eq!(tr * (cols / f.scale_values()) * 2 % 16, 0);
                assert_eq!(TILE_PAD_ROWS % tr, 0);
            }
        }
    }
}

#[test]
fn a_row_too_wide_for_two_stages_falls_back_to_the_plain_kernel() {
    let t = Gemv1Tuning {
        rows_per_warp: 2,
        lanes: RowLanes::Split,
        smem_budget: 48 << 10,
        blocks_per_sm: 1,
    };
    assert!(gemv1_launch(GpuFormat::Q2G64, 5120, 17408, t, 132, 227 << 10, false).is_none());
    let small = gemv1_launch(GpuFormat::Q2G64, 3, 64, t, 132, 227 << 10, false).unwrap();
    assert_eq!((small.grid, small.stages), (1, 2));
}

#[test]
fn the_wide_two_bit_rows_take_shared_lanes_in_one_block_of_two_stages_when_asked() {
    let d = dims(Preset::B27);
    for f in [GpuFormat::Q2G64, GpuFormat::Q2G128] {
        let t = Gemv1Tuning::for_shape_with(f, d.ffn, true);
        assert_eq!(t, Gemv1Tuning::shared_wide());
        let l = gemv1_launch(f, d.hidden, d.ffn, t, 132, 227 << 10, false).unwrap();
        assert!(l.shared_lanes && l.rows_per_warp == 2, "{l:?}");
        assert_eq!((l.stages, l.grid), (2, 132));
        // One block's memory with its static part fits a multiprocessor; two would not.
        let block = l.smem_bytes + GEMV1_STATIC_SMEM + SMEM_RESERVED_PER_BLOCK;
        assert!(block <= SM90_SMEM_PER_SM && 2 * block > SM90_SMEM_PER_SM);
        // Not asked, or rows of two per warp already: the lanes split.
        assert_eq!(
            Gemv1Tuning::for_shape_with(f, d.ffn, false),
            Gemv1Tuning::split_lanes(f, d.ffn)
        );
        assert_eq!(
            Gemv1Tuning::for_shape_with(f, d.hidden, true),
            Gemv1Tuning::split_lanes(f, d.hidden)
        );
    }
    // 1-bit rows keep theirs (their wide GEMV runs on the binary kernel).
    assert_eq!(
        Gemv1Tuning::for_shape_with(GpuFormat::Q1, d.ffn, true),
        Gemv1Tuning::split_lanes(GpuFormat::Q1, d.ffn)
    );
    // Split lanes never name the shared kernel.
    let split = Gemv1Tuning {
        lanes: RowLanes::Split,
        ..Gemv1Tuning::shared_wide()
    };
    let l = gemv1_launch(
        GpuFormat::Q2G64,
        d.hidden,
        d.ffn,
        split,
        132,
        227 << 10,
        false,
    );
    assert!(!l.unwrap().shared_lanes);
}

/// Whether `blocks` blocks of a binary decode GEMV launch fit one sm_90 multiprocessor with their
/// static memory and the driver's reserved kilobyte.
fn fits_a_multiprocessor(l: &GemvB1Launch, blocks: usize) -> bool {
    blocks * (l.smem_bytes + GEMV_B1_STATIC_SMEM + SMEM_RESERVED_PER_BLOCK) <= SM90_SMEM_PER_SM
}

#[test]
fn the_binary_decode_gemv_takes_whole_boxes_and_fits_its_budget() {
    let limit = 227 << 10;
    // The 27B's 1-bit shapes, each on the kernel made for its chunks per warp; other widths on
    // the guarded kernels.
    for (rows, cols, kernel) in [
        (34816, 5120, "gemv_b1_j5x"),
        (5120, 6144, "gemv_b1_j6x"),
        (5120, 17408, "gemv_b1_j17x"),
        (248_320, 5120, "gemv_b1_j5x"),
        (40, 4096, "gemv_b1_j6"),
        (40, 9216, "gemv_b1_j17"),
    ] {
        let wide = kernel.starts_with("gemv_b1_j17");
        for fused in [false, true] {
            let Some(l) = gemv_b1_launch(GpuFormat::Q1, rows, cols, 132, limit, fused, (0, 0), 16)
            else {
                // The norm is folded in up to six chunks a warp only.
                assert!(fused && wide, "{rows}×{cols} fused {fused}");
                continue;
            };
            assert!(!(fused && wide), "{rows}×{cols}: {l:?}");
            let name = if fused {
                format!("{kernel}_n")
            } else {
                kernel.to_string()
            };
            assert_eq!(l.kernel, name);
            assert!(l.stages >= 2 && l.stages <= GEMV1_MAX_STAGES);
            let budget = if wide { 100 << 10 } else { 72 << 10 };
            assert!(l.smem_bytes <= budget, "{rows}×{cols}: {l:?}");
            // The blocks a multiprocessor is to run fit in it with their static memory.
            assert!(
                fits_a_multiprocessor(&l, if wide { 2 } else { 3 }),
                "{rows}×{cols}: {l:?}"
            );
            assert_eq!(
                l.smem_bytes,
                1024 + gemv_b1_x_bytes(cols) + l.stages * l.stage_bytes
            );
            assert!(l.stage_bytes.is_multiple_of(1024));
            // 16-row tiles: the codes in 2 KiB boxes, then a scale per row and chunk.
            assert!(l.stage_bytes >= (cols / 1024) * 2048 + 16 * (cols / 128) * 2);
            assert_eq!(l.stage_bytes, gemv_b1_stage_bytes(GpuFormat::Q1, cols, 16));
            assert_eq!(
                l.grid,
                rows.div_ceil(16).min(132 * if wide { 2 } else { 3 })
            );
        }
    }
    // Rows not of whole 128-byte boxes, past 17 chunks a warp, or no rows: not taken.
    for (rows, cols) in [(20, 256), (20, 5000), (20, 18432), (0, 5120)] {
        assert!(
            gemv_b1_launch(GpuFormat::Q1, rows, cols, 132, limit, false, (0, 0), 16).is_none(),
            "{rows}×{cols}"
        );
    }
    // Knobs replace the defaults; a budget under two stages is refused where a block has more
    // than one tile, and gives one stage where none has.
    let knobbed = |rows, cols| {
        gemv_b1_launch(
            GpuFormat::Q1,
            rows,
            cols,
            132,
            limit,
            false,
            (4, 56 << 10),
            16,
        )
    };
    let l = knobbed(5120, 5120).unwrap();
    assert_eq!(l.grid, 320);
    assert!(l.smem_bytes <= 56 << 10);
    assert!(knobbed(34816, 17408).is_none());
    let one = knobbed(5120, 17408).unwrap();
    assert_eq!((one.grid, one.stages), (320, 1));
    assert!(one.smem_bytes <= 56 << 10);
    // A device limit below the default budget is what counts.
    let small =
        gemv_b1_launch(GpuFormat::Q1, 5120, 5120, 132, 48 << 10, false, (0, 0), 16).unwrap();
    assert!(small.smem_bytes + GEMV_B1_STATIC_SMEM <= 48 << 10);
}

#[test]
fn the_binary_decode_gemv_of_2_bit_rows_takes_up_to_12_chunks_a_warp_in_16_row_tiles() {
    let limit = 227 << 10;
    // The 27B's 2-bit shapes up to 6144 columns, on the kernel made for their chunks per warp;
    // other widths to 6144 on the guarded one.
    for (format, tag) in [(GpuFormat::Q2G64, "g64"), (GpuFormat::Q2G128, "g128")] {
        for (rows, cols, j) in [
            (34816, 5120, "j10x"),
            (5120, 6144, "j12x"),
            (248_320, 5120, "j10x"),
            (40, 4096, "j12"),
            (40, 1024, "j12"),
        ] {
            // Tiles of 32 rows asked for: 16 all the same.
            for tile_rows in [16, 32] {
                let l = gemv_b1_launch(format, rows, cols, 132, limit, false, (0, 0), tile_rows)
                    .unwrap();
                assert_eq!(l.kernel, format!("gemv_b2{tag}_{j}"), "{rows}×{cols}");
                assert_eq!(l.tile_rows, 16);
                assert!(l.stages >= 2 && l.stages <= GEMV1_MAX_STAGES);
                assert!(l.smem_bytes <= 72 << 10, "{rows}×{cols}: {l:?}");
                assert!(fits_a_multiprocessor(&l, 3), "{rows}×{cols}: {l:?}");
                // 16 rows of cols / 4 code bytes in 2 KiB boxes, then a scale per row and
                // 64 (g64) or 128 values.
                let per_scale = format.scale_values();
                assert_eq!(
                    l.stage_bytes,
                    (16 * cols / 4 + 16 * (cols / per_scale) * 2).div_ceil(1024) * 1024
                );
                assert_eq!(l.stage_bytes, gemv_b1_stage_bytes(format, cols, 16));
                assert_eq!(
                    l.smem_bytes,
                    1024 + gemv_b1_x_bytes(cols) + l.stages * l.stage_bytes
                );
                assert_eq!(l.grid, rows.div_ceil(16).min(3 * 132));
            }
            // The norm stays apart.
            assert!(gemv_b1_launch(format, rows, cols, 132, limit, true, (0, 0), 16).is_none());
        }
        // ffn_down's 17408 columns (34 chunks a warp), 8192 (16), widths not of whole 1024, no
        // rows: not taken.
        for (rows, cols) in [(5120, 17408), (20, 8192), (20, 256), (0, 5120)] {
            assert!(
                gemv_b1_launch(format, rows, cols, 132, limit, false, (0, 0), 16).is_none(),
                "{rows}×{cols}"
            );
        }
    }
    // A 1-bit row's kernel never goes to a 2-bit layout, nor the reverse.
    assert!(gemv_b2_kernel(GpuFormat::Q1, 10).is_none());
    let q1 = gemv_b1_launch(GpuFormat::Q1, 5120, 5120, 132, limit, false, (0, 0), 16).unwrap();
    assert!(q1.kernel.starts_with("gemv_b1_"));
    // Only the 2-bit kernels have image twins, each its kernel's name and `_i`, both compiled.
    assert_eq!(q1.image_kernel, None);
    for format in [GpuFormat::Q2G64, GpuFormat::Q2G128] {
        for per_warp in [4, 10, 12] {
            let (k, i) = gemv_b2_kernel(format, per_warp).unwrap();
            assert_eq!(i, format!("{k}_i"));
            assert!(crate::compile::KERNELS.contains(&k) && crate::compile::KERNELS.contains(&i));
        }
    }
}

#[test]
fn the_binary_decode_gemv_takes_every_1bit_matrix_by_default() {
    // The 27B's 1-bit matrices on the H200's 132 multiprocessors, the 5120-row ones included.
    for rows in [34816, 16480, 14336, 248_320, 5120] {
        assert!(prefers_b1(rows, 132, B1_MIN_TILES_PER_SM), "{rows}");
    }
    // A bound set by NIWAKI_CUDA_B1_MIN_TILES scales with the device: 4 tiles of 16 rows per
    // multiprocessor leaves the 5120-row matrices to dp4a.
    assert!(!prefers_b1(5120, 132, 4));
    assert!(prefers_b1(64 * 10, 10, 4) && !prefers_b1(64 * 10 - 16, 10, 4));
    // The GEMV before a binary one pulls none of its weights into L2; before a dp4a one, the
    // default (none since 869f2d1's measurement).
    assert_eq!(default_prefetch_bytes(true), 0);
    assert_eq!(default_prefetch_bytes(false), DEFAULT_PREFETCH_BYTES);
}

#[test]
fn decode_gemvs_copy_their_activations_by_the_tensor_map_only_where_asked() {
    let d = dims(Preset::B27);
    // No 27B matrix takes the copy by default on the H200's 132 multiprocessors; every one
    // whose row allows it does when asked (`NIWAKI_CUDA_X_COPY=all`).
    for cols in [d.gdn_inner(), d.ffn, d.hidden] {
        assert!(!prefers_x_copy(d.hidden, cols, 132, false), "{cols}");
        assert!(prefers_x_copy(d.hidden, cols, 132, true), "{cols}");
        assert_eq!(x_copy_rows(cols), Some(cols / 128));
    }
    for rows in [
        d.gdn_in_rows(),
        d.attn_in_rows(),
        d.ffn_in_rows(),
        d.vocab,
        1,
    ] {
        assert!(!prefers_x_copy(rows, d.hidden, 132, false), "{rows}");
        assert!(prefers_x_copy(rows, d.hidden, 132, true), "{rows}");
    }
    // One box of at most 256 rows of 128 bytes, and only whole ones, even where asked; the
    // map of every row it takes keeps the driver's rules and brings the whole row.
    assert_eq!(x_copy_rows(256 * 128), Some(256));
    for cols in [128, d.hidden, d.gdn_inner(), d.ffn, 256 * 128] {
        let tile = x_copy_tile(x_copy_rows(cols).unwrap());
        assert_eq!(tile.check(), Ok(()), "{cols}");
        assert_eq!(tile.box_bytes(), cols);
    }
    for cols in [4160, 257 * 128, 0] {
        assert_eq!(x_copy_rows(cols), None, "{cols}");
        assert!(!prefers_x_copy(16, cols, 132, true), "{cols}");
    }
    // The activations' shared memory leaves the slack that aligns them to 1 KiB, and whole
    // 128-byte rows for the int8 codes and their pairs, a fused norm's staging row too.
    assert_eq!(x_bytes(5120, false), 1024 + 5120 + 640);
    assert_eq!(x_bytes(4160, true), 1024 + 2 * 4224 + 640);
}

#[test]
fn the_binary_decode_gemv_takes_tiles_of_32_rows_where_asked_and_possible() {
    let limit = 227 << 10;
    // The 27B's gate | up, recurrent and attention inputs and LM head: 32-row tiles, at most
    // half the stages, and three blocks that fit a multiprocessor's 228 KiB with their static
    // memory and the reserved kilobyte.
    for (rows, cols, kernel) in [
        (34816, 5120, "gemv_b1_j5x_r32"),
        (16480, 5120, "gemv_b1_j5x_r32"),
        (14336, 5120, "gemv_b1_j5x_r32"),
        (248_320, 5120, "gemv_b1_j5x_r32"),
        (992, 6144, "gemv_b1_j6x_r32"),
    ] {
        let l = gemv_b1_launch(GpuFormat::Q1, rows, cols, 132, limit, false, (0, 0), 32).unwrap();
        assert_eq!((l.kernel, l.tile_rows), (kernel, 32), "{rows}×{cols}");
        assert!(l.stages >= 2 && l.stages <= GEMV1_MAX_STAGES / 2);
        assert_eq!(l.stage_bytes, gemv_b1_stage_bytes(GpuFormat::Q1, cols, 32));
        assert!(fits_a_multiprocessor(&l, 3), "{rows}×{cols}: {l:?}");
        assert_eq!(l.grid, (rows / 32).min(3 * 132));
    }
    // A budget for eight stages still gets at most four: the kernel keeps the partial sums of
    // half its stages for 32-row tiles.
    let big = gemv_b1_launch(
        GpuFormat::Q1,
        34816,
        5120,
        132,
        limit,
        false,
        (1, 200 << 10),
        32,
    )
    .unwrap();
    assert_eq!((big.tile_rows, big.stages), (32, GEMV1_MAX_STAGES / 2));
    // Rows not a multiple of 32, or widths without an exact kernel: 16-row tiles.
    for (rows, cols) in [(1001, 5120), (5120, 17408), (64, 4096)] {
        let l = gemv_b1_launch(GpuFormat::Q1, rows, cols, 132, limit, false, (0, 0), 32).unwrap();
        assert_eq!(l.tile_rows, 16, "{rows}×{cols}");
        assert!(!l.kernel.ends_with("_r32"));
    }
}

#[test]
fn the_weights_l2_policy_follows_its_setting() {
    assert!(weights_evict_first(Some("first")));
    assert!(!weights_evict_first(Some("normal")));
    assert_eq!(weights_evict_first(None), WEIGHTS_EVICT_FIRST);
    assert_eq!(weights_evict_first(Some("bogus")), WEIGHTS_EVICT_FIRST);
}

#[test]
fn a_cluster_fold_takes_one_block_per_tile_of_whole_pieces() {
    let sms = 132;
    let smem = 227 << 10;
    // The 27B's residual GEMVs: 5120 rows of 6144 1-bit and 2-bit columns (ffn_down's 17408
    // 1-bit columns: two blocks a multiprocessor, 264 of its 320 tiles' blocks at once: none).
    let l = gemv_b1_launch(GpuFormat::Q1, 5120, 17408, sms, smem, false, (0, 0), 16).unwrap();
    assert_eq!(l.grid, 264);
    assert!(cluster_fold(l, 5120).is_none());
    for (format, cols, kernel) in [
        (GpuFormat::Q1, 6144, "gemv_b1_j6x_c"),
        (GpuFormat::Q2G64, 6144, "gemv_b2g64_j12x_c"),
        (GpuFormat::Q2G128, 6144, "gemv_b2g128_j12x_c"),
    ] {
        let l = gemv_b1_launch(format, 5120, cols, sms, smem, false, (0, 0), 16).unwrap();
        let c = cluster_fold(l, 5120).unwrap();
        assert_eq!(c.kernel, kernel);
        // The clustered kernels take their tiles by the tensor map alone.
        assert_eq!(c.image_kernel, None);
        assert_eq!(c.grid, 320);
        assert_eq!(c.grid % FOLD_CLUSTER, 0);
        assert_eq!(
            (c.stages, c.smem_bytes, c.tile_rows),
            (l.stages, l.smem_bytes, 16)
        );
    }
    // The small model's: 1024 rows, the guarded kernels.
    let l = gemv_b1_launch(GpuFormat::Q1, 1024, 3072, sms, smem, false, (0, 0), 16).unwrap();
    assert_eq!(cluster_fold(l, 1024).unwrap().kernel, "gemv_b1_j6_c");
    // Rows that are not whole pieces, 32-row tiles, kernels with no cluster form: none.
    let l = gemv_b1_launch(GpuFormat::Q1, 5120 - 16, 6144, sms, smem, false, (0, 0), 16).unwrap();
    assert!(cluster_fold(l, 5120 - 16).is_none());
    let l = gemv_b1_launch(GpuFormat::Q1, 5120, 6144, sms, smem, false, (0, 0), 32).unwrap();
    assert_eq!(l.tile_rows, 32);
    assert!(cluster_fold(l, 5120).is_none());
    let l = gemv_b1_launch(GpuFormat::Q1, 34816, 5120, sms, smem, false, (0, 0), 16).unwrap();
    assert!(cluster_fold(l, 34816).is_none());
}

#[test]
fn a_tile_image_holds_every_unit_once_where_the_binary_consumers_read_it() {
    // 40 rows padded to 48, 13 units a row (two boxes, the second zero past unit 12).
    for tr in [16, 32] {
        let im = TileImageShape::new(GpuFormat::Q2G64, 40, 13 * 64, tr);
        let (rows, units) = (48, 13);
        assert_eq!((im.rows, im.units), (rows, units));
        let total = im.units_total();
        assert_eq!(total, rows.div_ceil(tr) * 2 * 8 * tr);
        assert_eq!(im.bytes(), 16 * total);
        let mut seen = vec![0usize; rows * units];
        for q in 0..total {
            if let Some(src) = im.source(q) {
                seen[src] += 1;
            }
        }
        assert!(seen.iter().all(|&n| n == 1), "tiles of {tr}");
        // The consumers (kernels/gemv_b1.cu) read row r's chunk c of a tile at byte
        // 2048·RG·(c / 8) + 128·r + 16·((c % 8) ^ (r & 7)) of the stage.
        let per_tile = 2 * 8 * tr;
        for (tile, r, c) in [
            (0, 3, 9),
            (1, 15, 12),
            (0, tr - 1, 7),
            (rows / tr - 1, 5, 0),
        ] {
            let q = tile * per_tile + (c / 8) * 8 * tr + r * 8 + ((c % 8) ^ (r & 7));
            assert_eq!(im.source(q), Some((tile * tr + r) * units + c));
        }
    }
    // Rows past the padded upload are zero: 48 padded rows in 32-row tiles leave the second
    // tile's last 16 rows past the upload.
    let im = TileImageShape::new(GpuFormat::Q1, 40, 8 * 128, 32);
    assert_eq!(im.rows, 48);
    assert_eq!(im.source(im.units_total() - 1), None);
}

#[test]
fn staged_activations_take_the_widest_1_bit_kernels_two_blocks_a_multiprocessor() {
    let (sms, smem) = (132, 227 << 10);
    // ffn_down's 1-bit rows: the row's 17408 codes beside the pairs and two stages of 39 KiB.
    let l = gemv_b1_launch(GpuFormat::Q1, 5120, 17408, sms, smem, false, (0, 0), 16).unwrap();
    assert_eq!(l.kernel, "gemv_b1_j17x");
    let x = x_staged(l, 17408).unwrap();
    assert_eq!(x.kernel, "gemv_b1_j17x_xs");
    assert!(crate::compile::KERNELS.contains(&x.kernel));
    assert_eq!(
        (x.grid, x.tile_rows, x.stage_bytes),
        (l.grid, 16, l.stage_bytes)
    );
    assert_eq!(x.stages, 2);
    assert_eq!(
        x.smem_bytes,
        1024 + gemv_b1_x_bytes(17408) + 17408 + 2 * l.stage_bytes
    );
    // Two such blocks, each with its static memory and the driver's share, fit a
    // multiprocessor.
    assert!(2 * (x.smem_bytes + GEMV_B1_STATIC_SMEM + SMEM_RESERVED_PER_BLOCK) <= SM90_SMEM_PER_SM);
    // The guarded kernel (9216 columns: nine chunks a warp).
    let g = gemv_b1_launch(GpuFormat::Q1, 77, 9216, sms, smem, false, (0, 0), 16).unwrap();
    let xg = x_staged(g, 9216).unwrap();
    assert_eq!(xg.kernel, "gemv_b1_j17_xs");
    assert!(crate::compile::KERNELS.contains(&xg.kernel));
    // Not the narrower 1-bit kernels, nor the 2-bit ones.
    for (format, cols) in [
        (GpuFormat::Q1, 5120),
        (GpuFormat::Q1, 6144),
        (GpuFormat::Q2G64, 5120),
        (GpuFormat::Q2G64, 6144),
        (GpuFormat::Q2G128, 4096),
    ] {
        let l = gemv_b1_launch(format, 5120, cols, sms, smem, false, (0, 0), 16).unwrap();
        assert!(x_staged(l, cols).is_none(), "{}", l.kernel);
    }
}

#[test]
fn the_27b_decode_gemv_shapes_are_its_published_matrices() {
    // Bonsai 27B: hidden 5120, feed-forward 17408, 16 key heads and 48 value heads of 128 in
    // the recurrent layers (conv channels 10240), 24 query heads of 256 with gates and 4 kv
    // heads in the attention layers; 248,320 tokens. Both output projections read 6144 values.
    assert_eq!(
        dims(Preset::B27).decode_gemv_shapes(),
        [
            (34816, 5120),
            (16480, 5120),
            (14336, 5120),
            (5120, 6144),
            (5120, 17408),
            (248_320, 5120),
        ]
    );
}

#[test]
fn every_1_bit_binary_kernel_without_the_norm_has_a_planes_twin_and_no_other_does() {
    let mut twins = 0;
    for &k in crate::compile::KERNELS.iter() {
        let twin = planes_kernel(k);
        let one_bit = k.starts_with("gemv_b1_j") && !k.ends_with("_n") && !k.ends_with("_p");
        if one_bit {
            let name = format!("{k}_p");
            assert_eq!(twin, Some(name.as_str()), "{k}");
            assert!(crate::compile::KERNELS.contains(&name.as_str()), "{name}");
            twins += 1;
        } else {
            assert_eq!(twin, None, "{k}");
        }
    }
    assert_eq!(twins, 11);
}

#[test]
fn clustered_folds_by_default_for_q2_g64_rows_alone() {
    let d = ClusterFold::from_setting(None);
    assert_eq!(d, ClusterFold::Q2G64);
    assert!(d.takes(GpuFormat::Q2G64));
    assert!(!d.takes(GpuFormat::Q2G128));
    assert!(!d.takes(GpuFormat::Q1));
    let all = ClusterFold::from_setting(Some(true));
    assert!(GpuFormat::ALL.iter().all(|&f| all.takes(f)));
    let off = ClusterFold::from_setting(Some(false));
    assert!(GpuFormat::ALL.iter().all(|&f| !off.takes(f)));
    for c in [ClusterFold::Off, ClusterFold::Q2G64, ClusterFold::All] {
        assert_eq!(ClusterFold::from_code(c.code()), c);
    }
}

#[test]
fn four_2_bit_blocks_a_multiprocessor_keep_every_6144_wide_tile_in_one_wave() {
    let (sms, smem) = (132, 227 << 10);
    for format in [GpuFormat::Q2G64, GpuFormat::Q2G128] {
        // The default: three blocks a multiprocessor, two stages each.
        let three = gemv_b1_launch(format, 5120, 6144, sms, smem, false, (0, 0), 16).unwrap();
        assert_eq!((three.grid, three.stages), (320, 2));
        // Four (`NIWAKI_CUDA_B1_BLOCKS=4`): a 6144-wide stage does not fit twice, and a block
        // with one tile takes one stage; every tile still has its block, so the clusters' fold
        // takes the launch, and four blocks with their static memory fit a multiprocessor.
        let four = gemv_b1_launch(format, 5120, 6144, sms, smem, false, (4, 0), 16).unwrap();
        assert_eq!((four.grid, four.stages), (320, 1));
        assert!(
            4 * (four.smem_bytes + GEMV_B1_STATIC_SMEM + SMEM_RESERVED_PER_BLOCK)
                <= SM90_SMEM_PER_SM
        );
        if format == GpuFormat::Q2G64 {
            assert!(cluster_fold(four, 5120).is_some());
        }
        // Blocks of several tiles keep two stages: gate | up on 528 blocks.
        let gu = gemv_b1_launch(format, 34816, 5120, sms, smem, false, (4, 0), 16).unwrap();
        assert_eq!((gu.grid, gu.stages), (4 * sms, 2));
    }
}

#[test]
fn lane_pairs_keep_the_27b_stages_and_fit_beside_them() {
    let limit = 227 << 10;
    for format in [GpuFormat::Q2G64, GpuFormat::Q2G128] {
        for (rows, cols) in [(34816, 5120), (5120, 6144), (248_320, 5120), (40, 4096)] {
            let l = gemv_b1_launch(format, rows, cols, 132, limit, false, (0, 0), 16).unwrap();
            let p = lane_paired(l, rows, cols).unwrap();
            // Four 8-byte pairs a 64-value chunk, where the group pairs take one.
            assert_eq!(
                lane_pair_bytes(cols),
                (32 * cols / 64).div_ceil(1024) * 1024
            );
            assert_eq!(
                p.smem_bytes,
                1024 + lane_pair_bytes(cols) + p.stages * p.stage_bytes
            );
            assert!(
                fits_a_multiprocessor(&p, l.blocks_per_sm),
                "{rows}×{cols}: {p:?}"
            );
            assert_eq!(
                (p.kernel, p.grid, p.stage_bytes),
                (l.kernel, l.grid, l.stage_bytes)
            );
            if cols != 4096 {
                assert_eq!(p.stages, l.stages, "{format:?} {rows}×{cols}");
            }
        }
    }
    // A budget with room for one stage beside the lane pairs: refused where blocks have a
    // second tile to stream, kept where each has one.
    let l = gemv_b1_launch(GpuFormat::Q2G64, 34816, 5120, 132, limit, false, (0, 0), 16).unwrap();
    let tight = GemvB1Launch {
        blocks_per_sm: SM90_SMEM_PER_SM
            / (GEMV_B1_STATIC_SMEM + 1024 + 1024 + 3072 + l.stage_bytes + 1024),
        ..l
    };
    assert!(lane_paired(tight, 34816, 5120).is_none());
    let one_tile = GemvB1Launch {
        grid: 34816 / 16,
        ..tight
    };
    assert_eq!(
        lane_paired(one_tile, 34816, 5120).map(|p| p.stages),
        Some(1)
    );
    // 1-bit kernels keep their group pairs.
    let q1 = gemv_b1_launch(GpuFormat::Q1, 34816, 5120, 132, limit, false, (0, 0), 16).unwrap();
    assert!(lane_paired(q1, 34816, 5120).is_none());
}
