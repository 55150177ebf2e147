//! The plan's unit tests (no GPU needed).

use super::*;
use model::synth::Preset;

pub(crate) fn dims(p: Preset) -> Dims {
    let s = p.shape(248_320);
    let layers = (0..s.n_layers)
        .map(|il| {
            if (il + 1) % s.full_attention_interval == 0 {
                LayerKind::Attention
            } else {
                LayerKind::Recurrent
            }
        })
        .collect();
    Dims::from_config(&Config {
        n_layers: s.n_layers,
        hidden: s.hidden,
        ffn: s.ffn,
        vocab: s.vocab,
        context_length: s.context_length,
        rms_eps: 1e-6,
        n_head: s.n_head,
        n_head_kv: s.n_head_kv,
        head_dim: s.head_dim,
        rope_base: 1e7,
        rope_dims: s.rope_dims,
        conv_kernel: s.conv_kernel,
        gdn_key_heads: s.gdn_key_heads,
        gdn_key_dim: s.gdn_key_dim,
        gdn_value_heads: s.gdn_value_heads,
        gdn_value_dim: s.gdn_value_dim,
        layers,
    })
    .unwrap()
}

#[test]
fn the_27b_shapes_are_supported_and_stack_as_expected() {
    let d = dims(Preset::B27);
    assert_eq!((d.n_recurrent(), d.n_attention()), (48, 16));
    assert_eq!(d.conv_channels(), 10240);
    assert_eq!(d.gdn_in_rows(), 10240 + 6144 + 96);
    assert_eq!(d.attn_in_rows(), 2 * 24 * 256 + 2 * 4 * 256);
    assert_eq!(d.proj_rows(), 2 * 17408);
    assert_eq!(d.kind_index(3), 0);
    assert_eq!(d.kind_index(4), 3);
    assert_eq!(d.kind_index(63), 15);
}

#[test]
fn a_full_262k_context_fits_beside_the_27b_weights_on_an_h200() {
    let d = dims(Preset::B27);
    let s = StateBytes::new(&d, 262_144, KvCache::F16);
    // 16 layers × 262144 × 4 kv heads × 256 × 2 (K, V) × 2 bytes = 16 GiB.
    assert_eq!(s.kv, 16 << 30);
    // q8_0: 256 bytes of values and 16 of scales per row instead of 512.
    let q = StateBytes::new(&d, 262_144, KvCache::Q8_0);
    assert_eq!(q.kv, (16 << 30) / 512 * 272);
    let [k, v, ks, vs] = q.kv_layer(15, 16);
    assert_eq!(k % 256, 0);
    assert_eq!(v + q.kv_values, 2 * 16 * q.kv_values + q.kv_offset());
    assert_eq!(ks, v + q.kv_values + 15 * q.kv_scales);
    assert_eq!(vs + q.kv_scales, q.total());
    // Two buffers of 48 heads of 128×128 f32 for each of 48 layers.
    assert_eq!(s.ssm, 2 * 48 * 48 * 128 * 128 * 4);
    let scratch = Scratch::new(&d, MAX_CHUNK, true).bytes;
    let weights = 7_600_000_000usize;
    let h200_free = 139usize << 30;
    check_fits(
        "27B",
        &[
            ("weights", weights),
            ("state", s.total()),
            ("scratch", scratch),
        ],
        h200_free,
    )
    .unwrap();
}

#[test]
fn an_allocation_that_does_not_fit_is_an_error_with_numbers() {
    let err = check_fits("state", &[("kv", 3 << 30), ("ssm", 1 << 20)], 2 << 30).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("3073 MiB") && msg.contains("2048 MiB free"),
        "{msg}"
    );
    assert!(msg.contains("kv 3072 MiB"), "{msg}");
}

#[test]
fn unsupported_shapes_are_refused_by_name() {
    let mut d = dims(Preset::Tiny);
    d.value_dim = 64;
    assert!(d.check().unwrap_err().to_string().contains("128×128") || d.check().is_err());
    let mut d = dims(Preset::Tiny);
    d.head_dim = 48;
    assert!(d.check().unwrap_err().to_string().contains("head dim 48"));
}

#[test]
fn a_decode_token_is_a_few_hundred_launches() {
    let d = dims(Preset::B27);
    let ops = forward_ops(&d, 1, Head::Last, true, Fusion::default());
    // 10 per recurrent layer, 11 per attention layer, then reset + norm + LM head.
    assert_eq!(ops.len(), 48 * 10 + 16 * 11 + 3);
    assert_eq!(launches(&ops), ops.len());
    assert!(matches!(
        ops.last(),
        Some(Op::Gemv {
            mat: Mat::Output,
            ntok: 1,
            out: Out::Logits { argmax: true }
        })
    ));
}

#[test]
fn fusing_the_norms_removes_one_launch_per_norm_and_keeps_the_order() {
    let d = dims(Preset::B27);
    let plain = forward_ops(&d, 1, Head::Last, true, Fusion::default());
    let fused = forward_ops(&d, 1, Head::Last, true, NORM_ONLY);
    // Two norms per layer and the output norm.
    assert_eq!(plain.len() - fused.len(), 2 * 64 + 1);
    assert!(!fused.iter().any(|o| matches!(o, Op::NormQuant { .. })));
    let unfused: Vec<Op> = fused
        .iter()
        .flat_map(|op| match *op {
            Op::NormGemv {
                norm,
                tok0,
                mat,
                out,
            } => vec![
                Op::NormQuant {
                    norm,
                    tok0,
                    ntok: 1,
                    rot: false,
                },
                Op::Gemv { mat, ntok: 1, out },
            ],
            op => vec![op],
        })
        .collect();
    assert_eq!(unfused, plain);
    // Prefill passes keep their separate norms.
    let prefill = forward_ops(&d, 8, Head::Last, false, ALL);
    assert!(!prefill.iter().any(|o| matches!(o, Op::NormGemv { .. })));
}

const NORM_ONLY: Fusion = Fusion {
    norm: true,
    gdn: false,
    attn: false,
    fold: false,
    swiglu: false,
    attn_short: false,
};
const ALL: Fusion = Fusion {
    norm: true,
    gdn: true,
    attn: true,
    fold: true,
    swiglu: true,
    attn_short: true,
};

#[test]
fn folding_the_norms_leaves_only_the_first_and_keeps_every_gemv_in_order() {
    let d = dims(Preset::B27);
    let fold = Fusion {
        fold: true,
        ..Fusion::default()
    };
    let plain = forward_ops(&d, 1, Head::Last, true, Fusion::default());
    let folded = forward_ops(&d, 1, Head::Last, true, fold);
    // Every norm but the first layer's input norm goes, into the residual GEMV before it.
    assert_eq!(plain.len() - folded.len(), 2 * 64);
    let norms: Vec<&Op> = folded
        .iter()
        .filter(|o| matches!(o, Op::NormQuant { .. }))
        .collect();
    assert_eq!(norms.len(), 1);
    assert!(matches!(
        folded[0],
        Op::NormQuant {
            norm: Norm::Attn(0),
            ..
        }
    ));
    // Each fold is followed by the GEMV reading it (an argmax reset may stand between), and
    // its counters' slot is its own.
    let mut slots = Vec::new();
    for (i, op) in folded.iter().enumerate() {
        if let Op::GemvFold { mat, .. } = *op {
            let next = folded[i + 1..]
                .iter()
                .find(|o| !matches!(o, Op::ResetArgmax { .. }));
            let Some(&Op::GemvScaled { norm: read, .. }) = next else {
                panic!("no scaled GEMV after op {i}");
            };
            assert!(matches!(*op, Op::GemvFold { norm, .. } if norm == read));
            slots.push(fold_slot(mat).unwrap());
        }
    }
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), 2 * 64);
    assert!(slots.iter().all(|&s| s < 2 * d.layers.len()));
    // Undone, the same list.
    let mut norms = plain.iter().filter_map(|o| match *o {
        Op::NormQuant { norm, .. } => Some(norm),
        _ => None,
    });
    norms.next();
    let unfolded: Vec<Op> = folded
        .iter()
        .flat_map(|op| match *op {
            Op::GemvFold { mat, norm } => {
                assert_eq!(Some(norm), norms.next());
                vec![
                    Op::Gemv {
                        mat,
                        ntok: 1,
                        out: Out::Residual,
                    },
                    Op::NormQuant {
                        norm,
                        tok0: 0,
                        ntok: 1,
                        rot: false,
                    },
                ]
            }
            Op::GemvScaled { mat, out, .. } => vec![Op::Gemv { mat, ntok: 1, out }],
            op => vec![op],
        })
        .collect();
    // The argmax reset moves before the output norm's place: the same ops otherwise.
    let without_reset = |ops: &[Op]| -> Vec<Op> {
        ops.iter()
            .copied()
            .filter(|o| !matches!(o, Op::ResetArgmax { .. }))
            .collect()
    };
    assert_eq!(without_reset(&unfolded), without_reset(&plain));
    // Prefill passes and rotated models keep their norms.
    for ntok in [2, 64] {
        assert_eq!(
            forward_ops(&d, ntok, Head::Last, false, fold),
            forward_ops(&d, ntok, Head::Last, false, Fusion::default())
        );
    }
}

#[test]
fn folding_the_swiglus_takes_each_into_its_gate_up_gemv_where_the_norms_fold() {
    let d = dims(Preset::B27);
    let fold = Fusion {
        fold: true,
        ..Fusion::default()
    };
    let both = Fusion {
        swiglu: true,
        ..fold
    };
    let folded = forward_ops(&d, 1, Head::Last, true, fold);
    let swiglu = forward_ops(&d, 1, Head::Last, true, both);
    // One launch fewer a layer, no SwiGLU left, each fold a layer's gate | up.
    assert_eq!(folded.len() - swiglu.len(), 64);
    assert!(!swiglu.iter().any(|o| matches!(o, Op::SwigluQuant { .. })));
    let layers: Vec<usize> = swiglu
        .iter()
        .filter_map(|o| match *o {
            Op::GemvSwiglu {
                mat: Mat::FfnIn(l),
                norm: Norm::Post(n),
            } => {
                assert_eq!(l, n);
                Some(l)
            }
            Op::GemvSwiglu { .. } => panic!("a SwiGLU folded into another matrix: {o:?}"),
            _ => None,
        })
        .collect();
    assert_eq!(layers, (0..64).collect::<Vec<_>>());
    // Each is followed by its layer's down GEMV, and undone gives the norms-only fold's list.
    for (i, op) in swiglu.iter().enumerate() {
        if let Op::GemvSwiglu {
            mat: Mat::FfnIn(l), ..
        } = *op
        {
            assert!(matches!(
                swiglu[i + 1],
                Op::GemvFold { mat: Mat::FfnDown(m), .. } if m == l
            ));
        }
    }
    let undone: Vec<Op> = swiglu
        .iter()
        .flat_map(|op| match *op {
            Op::GemvSwiglu { mat, norm } => vec![
                Op::GemvScaled {
                    mat,
                    norm,
                    out: Out::Proj,
                },
                Op::SwigluQuant { ntok: 1 },
            ],
            op => vec![op],
        })
        .collect();
    assert_eq!(undone, folded);
    // Without the norms folded, prefill passes, or widths not of whole pieces: nothing.
    let alone = Fusion {
        swiglu: true,
        ..Fusion::default()
    };
    assert_eq!(
        forward_ops(&d, 1, Head::Last, true, alone),
        forward_ops(&d, 1, Head::Last, true, Fusion::default())
    );
    assert_eq!(
        forward_ops(&d, 8, Head::Last, false, both),
        forward_ops(&d, 8, Head::Last, false, Fusion::default())
    );
    let mut odd = d.clone();
    odd.ffn = 17408 + 64;
    assert_eq!(
        forward_ops(&odd, 1, Head::Last, true, both),
        forward_ops(&odd, 1, Head::Last, true, fold)
    );
}

#[test]
fn the_fused_recurrence_takes_the_place_of_conv_step_and_gated_norm_in_decode_only() {
    let d = dims(Preset::B27);
    let gdn = Fusion {
        gdn: true,
        ..Fusion::default()
    };
    let plain = forward_ops(&d, 1, Head::Last, true, Fusion::default());
    let fused = forward_ops(&d, 1, Head::Last, true, gdn);
    assert_eq!(plain.len() - fused.len(), 2 * d.n_recurrent());
    let expanded: Vec<Op> = fused
        .iter()
        .flat_map(|op| match *op {
            Op::GdnDecode { layer } => vec![
                Op::Conv { layer, ntok: 1 },
                Op::GdnStep { layer, ntok: 1 },
                Op::GatedQuant { layer, ntok: 1 },
            ],
            op => vec![op],
        })
        .collect();
    assert_eq!(expanded, plain);
    for ntok in [2, 256] {
        assert_eq!(
            forward_ops(&d, ntok, Head::Last, false, gdn),
            forward_ops(&d, ntok, Head::Last, false, Fusion::default())
        );
    }
}

#[test]
fn prefill_norms_only_the_tokens_that_need_logits() {
    let d = dims(Preset::Small);
    let ops = forward_ops(&d, 20, Head::Last, false, ALL);
    assert!(ops.contains(&Op::NormQuant {
        norm: Norm::Output,
        tok0: 19,
        ntok: 1,
        rot: false,
    }));
    assert!(!ops.iter().any(|o| matches!(o, Op::ResetArgmax { .. })));
    let none = forward_ops(&d, 20, Head::None, false, ALL);
    assert!(!none.iter().any(|o| matches!(
        o,
        Op::Gemv {
            mat: Mat::Output,
            ..
        }
    )));
    // A 20-token GEMV is three launches of up to 8 tokens.
    assert_eq!(
        launches(&[Op::Gemv {
            mat: Mat::Output,
            ntok: 20,
            out: Out::Proj
        }]),
        3
    );
}

#[test]
fn every_layer_reads_what_an_earlier_op_wrote() {
    let d = dims(Preset::Tiny);
    let ops = forward_ops(&d, 3, Head::All, false, ALL);
    let mut proj_writer = None;
    for op in &ops {
        match *op {
            Op::Gemv {
                mat,
                out: Out::Proj,
                ..
            } => proj_writer = Some(mat),
            Op::Conv { layer, .. } => assert_eq!(proj_writer, Some(Mat::GdnIn(layer))),
            Op::GdnPrep { layer, .. } => assert_eq!(proj_writer, Some(Mat::GdnIn(layer))),
            Op::AttnPrep { layer, .. } => assert_eq!(proj_writer, Some(Mat::AttnIn(layer))),
            Op::SwigluQuant { .. } => assert!(matches!(proj_writer, Some(Mat::FfnIn(_)))),
            _ => {}
        }
    }
}

#[test]
fn scratch_regions_are_aligned_and_disjoint() {
    let d = dims(Preset::B27);
    let s = Scratch::new(&d, MAX_CHUNK, true);
    let mut end = 0;
    for &(name, at, n) in &s.regions {
        assert_eq!(at % 256, 0, "{name}");
        assert!(at >= end, "{name} overlaps");
        end = at + n;
    }
    assert!(s.bytes >= end);
    assert_eq!(s.offset("x"), 0);
    // Without plane words the same regions, the words' two empty at the end.
    let bare = Scratch::new(&d, MAX_CHUNK, false);
    for &(name, at, n) in &bare.regions {
        if name == "xp" || name == "fold_xp" {
            assert_eq!((at, n), (bare.bytes, 0), "{name}");
        } else {
            assert_eq!((at, n), (s.offset(name), s.size(name)), "{name}");
        }
    }
    assert_eq!(bare.bytes, s.offset("xp"));
}

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
fn a_prefill_pass_prepares_each_recurrence_and_a_decode_step_does_not() {
    let d = dims(Preset::Tiny);
    for ntok in [1, 3] {
        let ops = forward_ops(&d, ntok, Head::Last, false, Fusion::default());
        let steps: Vec<usize> = ops
            .iter()
            .enumerate()
            .filter(|(_, op)| matches!(op, Op::GdnStep { .. }))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(steps.len(), d.n_recurrent());
        for i in steps {
            let (Op::GdnStep { layer, .. }, prev) = (ops[i], ops[i - 1]) else {
                unreachable!()
            };
            assert_eq!(prev == Op::GdnPrep { layer, ntok }, gdn_prepped(ntok));
        }
        let preps = ops
            .iter()
            .filter(|op| matches!(op, Op::GdnPrep { .. }))
            .count();
        assert_eq!(preps, if ntok == 1 { 0 } else { d.n_recurrent() });
    }
}

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
    let (w3, w4) = (GemmKernel::F16 { wg: 3 }, GemmKernel::F16 { wg: 4 });
    assert_eq!(gemm_grid(1001, 17, w4), (1, 4));
    assert_eq!(gemm_grid(34816, MAX_CHUNK, w4), (2, 136));
    assert_eq!(gemm_grid(34816, MAX_CHUNK, w3), (2, 182));
    let cap = GEMM_MAX_SPLITS * MAX_CHUNK * 5120;
    assert_eq!(gemm_splits(5120, 17408, MAX_CHUNK, m2, 132, cap), 3);
    assert_eq!(gemm_splits(5120, 6144, MAX_CHUNK, m1, 132, cap), 3);
    assert_eq!(gemm_splits(34816, 5120, MAX_CHUNK, m2, 132, cap), 1);
    // 40 blocks of the f16 kernel for 132 slots: three splits fill 91%.
    assert_eq!(gemm_splits(5120, 17408, MAX_CHUNK, w4, 132, cap), 3);
    assert_eq!(gemm_splits(34816, 5120, MAX_CHUNK, w4, 132, cap), 1);
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
    assert_eq!(gemm_splits(5120, 17408, MAX_CHUNK, m2, 132, cap / 4), 1);
    assert_eq!(gemm_splits(5120, 256, MAX_CHUNK, m2, 132, cap), 1);
}

#[test]
fn every_gemm_kernel_is_a_kernel_and_fits_its_blocks() {
    assert_eq!(
        GemmKernel::all(false).len() + HGEMM_WARPGROUPS.len(),
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
fn the_attention_split_memory_holds_the_rings_and_the_merge() {
    let d = dims(Preset::B27);
    let l = |kv, tile| attn_split_launch(&d, kv, tile, ATTN_RING_POSITIONS);
    assert_eq!(l(KvCache::F16, 8).smem_bytes, 4 * 16 * 2 * 512);
    assert_eq!(l(KvCache::Q8_0, 4).smem_bytes, 4 * 16 * 2 * (256 + 16));
    assert_eq!(l(KvCache::Q8_0, 8).kernel, "attn_split_q8_t8");
    let mma = l(KvCache::F16, 16);
    assert_eq!((mma.kernel, mma.threads), ("attn_split_mma", 64));
    // Two warps' rings of two f16 tiles (16 rows of keys, 16 of values, 528 bytes each), the
    // queries (hi, lo), the weights (hi, lo).
    assert_eq!(
        mma.smem_bytes,
        2 * 2 * 2 * 16 * 528 + 2 * 8 * 264 * 2 + 2 * 2 * 8 * 24 * 2
    );
    // The q8_0 one: rings of two tiles as cached (16 key rows of 288 bytes, 16 value rows of
    // 272, 16 bytes of scales a row each), the queries, the f32 weights.
    let q8 = l(KvCache::Q8_0, 16);
    assert_eq!((q8.kernel, q8.threads), ("attn_split_q8_mma", 64));
    assert_eq!(
        q8.smem_bytes,
        2 * 2 * 16 * (288 + 272 + 2 * 16) + 2 * 8 * 264 * 2 + 2 * 8 * 20 * 4
    );
    // Two f16 blocks, four q8_0 ones fit an H200 multiprocessor (228 KiB, 1 KiB reserved a
    // block).
    for (a, blocks) in [(mma, 2), (q8, 4)] {
        assert!(
            blocks * (a.smem_bytes + 1024) <= 228 << 10,
            "{}",
            a.smem_bytes
        );
    }
    // Decode steps over short contexts take the SIMT kernel, over long ones the tensor cores,
    // each cache from its own length; multi-token passes keep the SIMT kernel.
    for (kv, from) in [
        (KvCache::F16, ATTN_MMA_FROM[0]),
        (KvCache::Q8_0, ATTN_MMA_FROM[1]),
    ] {
        assert_eq!(default_attn_tile(kv, 1, 1), 8);
        assert_eq!(default_attn_tile(kv, from - 1, 1), 8);
        assert_eq!(default_attn_tile(kv, from, 1), 16);
        assert_eq!(default_attn_tile(kv, 262_144, 1), 16);
        assert_eq!(default_attn_tile(kv, 262_144, 512), 8);
    }
    for p in [Preset::Tiny, Preset::Small, Preset::B27] {
        let d = dims(p);
        let gqa = d.n_head / d.n_head_kv;
        for kv in [KvCache::F16, KvCache::Q8_0] {
            for tile in ATTN_TILES {
                let a = attn_split_launch(&d, kv, tile, ATTN_RING_POSITIONS_SMALL);
                let warps = a.threads / 32;
                assert!(
                    a.smem_bytes >= 4 * warps * gqa * (d.head_dim + 2),
                    "{p:?} {kv:?} {tile}"
                );
            }
        }
    }
}

#[test]
fn a_device_with_64_kib_per_block_gets_the_small_attention_ring() {
    let d = dims(Preset::B27);
    assert_eq!(attn_ring_positions(&d, 227 << 10), ATTN_RING_POSITIONS);
    assert_eq!(attn_ring_positions(&d, 64 << 10), ATTN_RING_POSITIONS_SMALL);
    let small = attn_split_launch(&d, KvCache::F16, 8, ATTN_RING_POSITIONS_SMALL);
    assert!(small.smem_bytes + ATTN_STATIC_SMEM <= 48 << 10);
    // Smaller models keep the full ring within the 48 KiB every device has.
    assert_eq!(
        attn_ring_positions(&dims(Preset::Small), 48 << 10),
        ATTN_RING_POSITIONS
    );
}

#[test]
fn each_matrix_is_followed_by_the_next_one_multiplied() {
    let d = dims(Preset::Tiny);
    let next = next_matrices(&forward_ops(&d, 1, Head::Last, true, Fusion::default()));
    let first = d
        .layers
        .iter()
        .position(|k| *k == LayerKind::Attention)
        .unwrap();
    assert_eq!(next[0].1, next[1].0);
    assert!(next.contains(&(Mat::FfnIn(0), Mat::FfnDown(0))));
    assert!(next.contains(&(Mat::AttnIn(first), Mat::AttnOut(first))));
    let last = d.layers.len() - 1;
    assert!(next.contains(&(Mat::FfnDown(last), Mat::Output)));
    // The next token starts again at the first layer's input projection.
    assert_eq!(next.last().unwrap(), &(Mat::Output, next[0].0));
    assert_eq!(next.len(), 4 * d.layers.len() + 1);
}

#[test]
fn every_gemv_op_names_its_matrix_whatever_the_fusion() {
    let d = dims(Preset::Tiny);
    let layer_mats = |l: usize| match d.layers[l] {
        LayerKind::Attention => [
            Mat::AttnIn(l),
            Mat::AttnOut(l),
            Mat::FfnIn(l),
            Mat::FfnDown(l),
        ],
        _ => [
            Mat::GdnIn(l),
            Mat::GdnOut(l),
            Mat::FfnIn(l),
            Mat::FfnDown(l),
        ],
    };
    let want: Vec<Mat> = (0..d.layers.len())
        .flat_map(layer_mats)
        .chain([Mat::Output])
        .collect();
    for fusion in [
        Fusion::default(),
        Fusion {
            norm: true,
            ..Fusion::default()
        },
        Fusion {
            fold: true,
            swiglu: true,
            ..Fusion::default()
        },
    ] {
        let ops = forward_ops(&d, 1, Head::Last, true, fusion);
        let mats: Vec<Mat> = ops.iter().filter_map(Op::matrix).collect();
        assert_eq!(mats, want, "{fusion:?}");
        // The other ops multiply by none.
        assert!(ops
            .iter()
            .filter(|op| op.matrix().is_none())
            .all(|op| !format!("{op:?}").starts_with("Gemv")
                && !format!("{op:?}").starts_with("NormGemv")));
    }
}

#[test]
fn calls_are_cut_into_chunks() {
    let c: Vec<_> = chunks(2 * MAX_CHUNK + 22).collect();
    assert_eq!(
        c,
        vec![(0, MAX_CHUNK), (MAX_CHUNK, MAX_CHUNK), (2 * MAX_CHUNK, 22)]
    );
    assert_eq!(attn_split_len(1, ATTN_SPLITS), ATTN_MIN_SPLIT_LEN);
    assert_eq!(attn_splits(5, 1, 99), 99);
    assert_eq!(attn_splits(5, 1, 1000), ATTN_SPLITS);
    assert_eq!(attn_splits(300, 256, 99), 2);
    assert_eq!(attn_splits(1 << 20, 256, 99), ATTN_SPLITS);
    assert_eq!(attn_splits(17, 17, 99), 1);
    // One wave: 3 blocks on each of 132 multiprocessors, 4 kv heads.
    assert_eq!(attn_decode_splits(3, 132, 4), 99);
    assert_eq!(attn_decode_splits(0, 132, 4), 1);
    assert_eq!(attn_decode_splits(16, 132, 4), ATTN_SPLITS);
    // Short contexts: one split; long ones: every split, each a share of the context.
    assert_eq!(attn_split_len(100, ATTN_SPLITS), ATTN_MIN_SPLIT_LEN);
    assert_eq!(attn_split_len(32768, ATTN_SPLITS), 256);
    assert_eq!(
        32768usize.div_ceil(attn_split_len(32768, ATTN_SPLITS)),
        ATTN_SPLITS
    );
    assert_eq!(attn_split_len(ATTN_SPLITS * 40 + 1, ATTN_SPLITS), 41);
}

#[test]
fn the_27b_shapes_come_from_metadata_alone() {
    // As the harness builds them for its attention checks on the 27B kernels.
    let mut w = gguf::GgufWriter::new();
    Preset::B27.shape(248_320).write_metadata(&mut w, "shapes");
    let f = gguf::Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
    let c = Config::from_metadata(f.metadata(), 248_320).unwrap();
    assert_eq!(Dims::from_config(&c).unwrap(), dims(Preset::B27));
}

#[test]
fn the_tma_boxes_of_the_f16_gemm_are_legal_and_fill_its_stages() {
    for f in GpuFormat::ALL {
        for (rows, cols) in [(34816, 5120), (5120, 17408), (5120, 6144), (300, 384)] {
            for wg in HGEMM_WARPGROUPS {
                let w = hgemm_weight_tile(f, rows, cols, wg);
                assert_eq!(w.check(), Ok(()), "{f:?} {rows}×{cols}");
                // A stage's codes of the block's rows fit the two 16-byte slots per row the
                // stage keeps for them.
                assert_eq!(w.box_rows, GemmKernel::F16 { wg }.rows());
                assert!(w.box_cols <= 32);
                assert_eq!(w.box_cols, HGEMM_STAGE_VALUES / f.chunk_values() * 16);
            }
            for ntok in [16, 100, 256] {
                let x = hgemm_act_tile(ntok, cols);
                assert_eq!(x.check(), Ok(()));
                // Two boxes make a stage's activations.
                assert_eq!(2 * x.box_bytes(), HGEMM_TOKENS * HGEMM_STAGE_VALUES * 2);
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
fn every_recurrent_step_variant_is_a_kernel_covering_every_value_column() {
    let d = dims(Preset::B27);
    for rows in GDN_STEP_ROWS {
        assert!(crate::compile::KERNELS.contains(&gdn_step_kernel(rows)));
        let (heads, blocks, _) = gdn_step_grid(&d, rows);
        // 4 warps of 32 lanes, key_dim / rows lanes to a column.
        let cols_per_block = 4 * 32 / (d.key_dim / rows);
        assert_eq!(heads as usize, d.value_heads);
        assert_eq!(blocks as usize * cols_per_block, d.value_dim);
    }
    assert!(
        GDN_STEP_ROWS.contains(&GDN_STEP_DEFAULT_ROWS)
            && GDN_STEP_ROWS.contains(&GDN_STEP_DECODE_ROWS)
    );
    assert_eq!(gdn_step_grid(&d, 32), (48, 4, 1));
    assert_eq!(gdn_step_grid(&d, 8), (48, 16, 1));
}

/// A small random model marked Hadamard-folded as Ternary-Bonsai-2 stores it, with `edit` applied
/// to its metadata; the rotation the GPU derives from it.
fn rotated_small(edit: impl FnOnce(&mut gguf::GgufWriter)) -> Result<(Dims, Rotation)> {
    let shape = Preset::Small.shape(512);
    let mut w = model::synth::random_packed(&shape, quant::Format::Q2_0, 3, "r").unwrap();
    let signs = model::synth::hadamard::signs(&shape, 4).unwrap();
    model::synth::hadamard::write_metadata(&mut w, &shape, &signs);
    edit(&mut w);
    let file = gguf::Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
    let m = model::Model::from_gguf(std::sync::Arc::new(file)).unwrap();
    let mut d = Dims::from_config(&m.config)?;
    d.rotation = Rotation::from_hadamard(m.hadamard().unwrap(), &d)?;
    let r = d.rotation;
    Ok((d, r))
}

#[test]
fn a_rotated_model_quantizes_rotated_inputs_and_gives_alpha_beta_their_own_gemv() {
    let (d, r) = rotated_small(|_| {}).unwrap();
    assert_eq!(
        r,
        Rotation {
            attn_in: true,
            gdn_in: true,
            gdn_ab: false,
            gdn_out: true,
            attn_out: true,
            ffn_in: true,
            ffn_down: true,
            output: true,
            gdn_v_grouped: true,
        }
    );
    for ntok in [1, 20] {
        // Fusion asked for, and refused: the fused kernels do not rotate.
        let ops = forward_ops(&d, ntok, Head::Last, ntok == 1, ALL);
        assert!(!ops
            .iter()
            .any(|o| matches!(o, Op::NormGemv { .. } | Op::GdnDecode { .. })));
        let norm = |il, rot| Op::NormQuant {
            norm: Norm::Attn(il),
            tok0: 0,
            ntok,
            rot,
        };
        for (il, kind) in d.layers.iter().enumerate() {
            let at = |op: Op| ops.iter().position(|o| *o == op);
            let gdn_in = Op::Gemv {
                mat: Mat::GdnIn(il),
                ntok,
                out: Out::Proj,
            };
            match kind {
                LayerKind::Recurrent => {
                    let ab = at(Op::Gemv {
                        mat: Mat::GdnAb(il),
                        ntok,
                        out: Out::Proj,
                    })
                    .expect("alpha | beta apart");
                    assert_eq!(ops[ab - 1], norm(il, false));
                    assert_eq!(ops[ab + 1], norm(il, true));
                    assert_eq!(ops[ab + 2], gdn_in);
                }
                LayerKind::Attention => {
                    assert!(at(norm(il, true)).is_some());
                    assert!(at(norm(il, false)).is_none());
                }
            }
        }
        assert!(ops.iter().all(|o| match o {
            Op::NormQuant {
                norm: Norm::Post(_) | Norm::Output,
                rot,
                ..
            } => *rot,
            _ => true,
        }));
    }
    // Without a rotation nothing changes: no second GEMV, nothing rotated.
    let plain = forward_ops(&dims(Preset::Small), 1, Head::Last, true, Fusion::default());
    assert!(!plain.iter().any(|o| matches!(
        o,
        Op::Gemv {
            mat: Mat::GdnAb(_),
            ..
        } | Op::NormQuant { rot: true, .. }
    )));
}

#[test]
fn rotations_the_gpu_cannot_apply_are_refused_with_the_reason() {
    let err = |edit: fn(&mut gguf::GgufWriter)| rotated_small(edit).unwrap_err().to_string();
    // qkv folded but its stacked neighbour z not: they read one quantized input.
    let e = err(|w| {
        w.set(
            "prism.hadamard.weight_names",
            gguf::Value::strings(["blk.0.attn_qkv.weight"]),
        );
    });
    assert!(
        e.contains("blk.0.attn_qkv.weight") && e.contains("attn_gate"),
        "{e}"
    );
    // The same role folded in one layer only.
    let e = err(|w| {
        w.set(
            "prism.hadamard.weight_names",
            gguf::Value::strings(["blk.0.ffn_down.weight"]),
        );
    });
    assert!(e.contains("some layers and not in others"), "{e}");
    let e = err(|w| {
        w.set("prism.hadamard.block_size", gguf::Value::U32(512));
    });
    assert!(e.contains("512"), "{e}");
    // Another block size is fine when no matrix is folded (the embedding is un-rotated on the
    // host at any size).
    let (_, r) = rotated_small(|w| {
        w.set("prism.hadamard.block_size", gguf::Value::U32(512));
        w.set(
            "prism.hadamard.weight_names",
            gguf::Value::strings(Vec::<String>::new()),
        );
    })
    .unwrap();
    assert_eq!(r, Rotation::default());
}

#[test]
fn the_cpu_twin_refuses_rotated_files_rather_than_ignoring_the_rotation() {
    let shape = Preset::Small.shape(512);
    let mut w = model::synth::random_packed(&shape, quant::Format::Q2_0, 3, "r").unwrap();
    let signs = model::synth::hadamard::signs(&shape, 4).unwrap();
    model::synth::hadamard::write_metadata(&mut w, &shape, &signs);
    let file = gguf::Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
    let m = model::Model::from_gguf(std::sync::Arc::new(file)).unwrap();
    let e = crate::twin::Twin::new(&m)
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("Hadamard"), "{e}");
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
fn norm_fusion_is_apart_unless_asked_and_binary_folds_only_into_binary_gemvs() {
    assert_eq!(NormFusion::from_setting(None), NormFusion::Apart);
    assert_eq!(NormFusion::from_setting(Some("0")), NormFusion::Apart);
    assert_eq!(NormFusion::from_setting(Some("yes")), NormFusion::Apart);
    assert_eq!(NormFusion::from_setting(Some("binary")), NormFusion::Binary);
    assert_eq!(NormFusion::from_setting(Some("1")), NormFusion::All);
    assert_eq!(NormFusion::from_setting(Some("all")), NormFusion::All);
    for binary in [false, true] {
        assert!(!NormFusion::Apart.folds(binary));
        assert_eq!(NormFusion::Binary.folds(binary), binary);
        assert!(NormFusion::All.folds(binary));
    }
}

#[test]
fn the_merged_attention_combine_takes_the_place_of_combine_and_quantization_in_decode_only() {
    let d = dims(Preset::B27);
    let attn = Fusion {
        attn: true,
        ..Fusion::default()
    };
    let plain = forward_ops(&d, 1, Head::Last, true, Fusion::default());
    let fused = forward_ops(&d, 1, Head::Last, true, attn);
    assert_eq!(plain.len() - fused.len(), d.n_attention());
    let expanded: Vec<Op> = fused
        .iter()
        .flat_map(|op| match *op {
            Op::AttnCombineQuant { layer } => vec![
                Op::AttnCombine { layer, ntok: 1 },
                Op::PlainQuant { ntok: 1 },
            ],
            op => vec![op],
        })
        .collect();
    assert_eq!(expanded, plain);
    for ntok in [2, 256] {
        assert_eq!(
            forward_ops(&d, ntok, Head::Last, false, attn),
            forward_ops(&d, ntok, Head::Last, false, Fusion::default())
        );
    }
    // Heads of 64 values are not whole pieces of the quantization: the two kernels stay.
    let tiny = dims(Preset::Tiny);
    assert_eq!(tiny.head_dim, 64);
    assert_eq!(
        forward_ops(&tiny, 1, Head::Last, true, attn),
        forward_ops(&tiny, 1, Head::Last, true, Fusion::default())
    );
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
    // Not the narrower 1-bit kernels.
    for cols in [5120, 6144] {
        let l = gemv_b1_launch(GpuFormat::Q1, 5120, cols, sms, smem, false, (0, 0), 16).unwrap();
        assert!(x_staged(l, cols).is_none(), "{}", l.kernel);
    }
}

#[test]
fn staged_activations_take_the_2_bit_kernels_and_their_image_twins_three_blocks_a_multiprocessor() {
    let (sms, smem) = (132, 227 << 10);
    for format in [GpuFormat::Q2G64, GpuFormat::Q2G128] {
        // The 27B's 2-bit binary decode GEMVs (gate | up, the recurrent and attention inputs,
        // the LM head, the output projections), and the guarded kernel's 4096 columns.
        for (rows, cols) in [
            (34816, 5120),
            (16480, 5120),
            (248320, 5120),
            (5120, 6144),
            (77, 4096),
        ] {
            let l = gemv_b1_launch(format, rows, cols, sms, smem, false, (0, 0), 16).unwrap();
            let x = x_staged(l, cols).unwrap();
            assert_eq!(x.kernel, format!("{}_xs", l.kernel));
            assert_eq!(
                x.image_kernel,
                l.image_kernel.map(|k| format!("{k}_xs")).as_deref()
            );
            for k in [Some(x.kernel), x.image_kernel].into_iter().flatten() {
                assert!(crate::compile::KERNELS.contains(&k), "{k}");
            }
            // The same grid and tiles; the stages that fit beside the row's codes (the 27B's
            // g64 rows keep their two, its g128 rows' three become two, the guarded g128
            // kernel's four three), and three such blocks still fit a multiprocessor.
            assert_eq!(
                (x.grid, x.tile_rows, x.stage_bytes),
                (l.grid, 16, l.stage_bytes)
            );
            let kept = match (format, cols) {
                (GpuFormat::Q2G128, 5120 | 6144) => 2,
                (GpuFormat::Q2G128, 4096) => 3,
                _ => l.stages,
            };
            assert_eq!(x.stages, kept, "{} {rows}×{cols}", l.kernel);
            assert_eq!(
                x.smem_bytes,
                1024 + gemv_b1_x_bytes(cols)
                    + cols.div_ceil(1024) * 1024
                    + x.stages * l.stage_bytes
            );
            assert!(
                3 * (x.smem_bytes + GEMV_B1_STATIC_SMEM + SMEM_RESERVED_PER_BLOCK)
                    <= SM90_SMEM_PER_SM
            );
        }
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
fn the_short_attention_takes_the_place_of_prep_split_and_merge_in_one_token_passes_only() {
    let d = dims(Preset::B27);
    let merged = Fusion {
        attn: true,
        ..Fusion::default()
    };
    let short = Fusion {
        attn_short: true,
        ..merged
    };
    let plain = forward_ops(&d, 1, Head::Last, true, merged);
    let with = forward_ops(&d, 1, Head::Last, true, short);
    assert_eq!(plain.len() - with.len(), 2 * d.n_attention());
    let expanded: Vec<Op> = with
        .iter()
        .flat_map(|op| match *op {
            Op::AttnShort { layer } => vec![
                Op::AttnPrep { layer, ntok: 1 },
                Op::AttnSplit { layer, ntok: 1 },
                Op::AttnCombineQuant { layer },
            ],
            op => vec![op],
        })
        .collect();
    assert_eq!(expanded, plain);
    for ntok in [2, 256] {
        assert_eq!(
            forward_ops(&d, ntok, Head::Last, false, short),
            forward_ops(&d, ntok, Head::Last, false, merged)
        );
    }
    // Heads of 64 values are not whole pieces of the quantization.
    let tiny = dims(Preset::Tiny);
    assert_eq!(
        forward_ops(&tiny, 1, Head::Last, true, short),
        forward_ops(&tiny, 1, Head::Last, true, merged)
    );
}

#[test]
fn the_short_attention_launch_fits_its_rings_and_refuses_what_it_cannot_hold() {
    let d = dims(Preset::B27);
    let h200 = 227 << 10;
    let f16 = attn_short_launch(&d, KvCache::F16, h200).unwrap();
    // Eight warps of two tiles of 8 positions of 256 f16 keys and values, and the step's tile.
    assert_eq!(f16.kernel, "attn_short");
    assert_eq!(f16.threads, 256);
    assert_eq!(
        f16.smem_bytes,
        (8 * ATTN_SHORT_STAGES + 1) * 2 * ATTN_SHORT_TILE * 512
    );
    let q8 = attn_short_launch(&d, KvCache::Q8_0, h200).unwrap();
    assert_eq!(q8.kernel, "attn_short_q8");
    assert_eq!(
        q8.smem_bytes,
        (8 * ATTN_SHORT_STAGES + 1) * 2 * ATTN_SHORT_TILE * (256 + 16)
    );
    // The merge's accumulators fit where the rings were.
    assert!(f16.smem_bytes >= 4 * 8 * 256 && q8.smem_bytes >= 4 * 8 * 256);
    // A device of 99 KiB a block holds the q8_0 rings, not the f16 ones.
    assert!(attn_short_launch(&d, KvCache::F16, 99 << 10).is_none());
    assert!(attn_short_launch(&d, KvCache::Q8_0, 99 << 10).is_some());
    // Heads of 64 values: never.
    let tiny = dims(Preset::Tiny);
    assert!(attn_short_launch(&tiny, KvCache::F16, h200).is_none());
    // The short path's tiles are the split kernels' (their copy and row readers).
    assert!(ATTN_TILES.contains(&ATTN_SHORT_TILE));
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
fn four_2_bit_blocks_are_asked_for_the_wide_rows_or_every_2_bit_row() {
    use GpuFormat::*;
    let wide = B2Four::from_setting(Some("wide"));
    let all = B2Four::from_setting(Some("all"));
    assert_eq!(B2Four::from_setting(None), B2Four::Off);
    assert_eq!(B2Four::from_setting(Some("off")), B2Four::Off);
    for f in [Q2G64, Q2G128] {
        assert_eq!(wide.blocks(f, 6144), Some(4));
        assert_eq!(wide.blocks(f, 5120), None);
        // The guarded kernel of up to 12 chunks, bounded with the wide ones.
        assert_eq!(wide.blocks(f, 4096), Some(4));
        assert_eq!(all.blocks(f, 5120), Some(4));
        assert_eq!(B2Four::Off.blocks(f, 6144), None);
    }
    // 1-bit rows keep their plans.
    assert_eq!(all.blocks(Q1, 6144), None);
    // The wide kernels bounded alone, or every 2-bit kernel.
    assert_eq!(wide.defines(), ["-DB2_MINB_WIDE=4"]);
    assert_eq!(all.defines(), ["-DB2_MINB=4", "-DB2_MINB_WIDE=4"]);
    assert!(B2Four::Off.defines().is_empty());
    // What a program compiled is read back from its options.
    for b in [B2Four::Off, wide, all] {
        let mut defines = vec!["-DHIDDEN=5120".to_string()];
        defines.extend(b.defines());
        assert_eq!(B2Four::from_defines(&defines), b);
    }
}
