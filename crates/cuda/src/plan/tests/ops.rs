//! A forward call's list of launches: the fusions, the folds and the order of the ops.

use super::super::*;
use super::{dims, ALL, NORM_ONLY};
use model::synth::Preset;

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
fn a_token_without_logits_runs_the_layers_ops_of_a_token_with_them() {
    // Stepped passes run their first tokens without logits and their last with them: the
    // state each leaves must have the same bits, so the layers' ops must be the same, bar the
    // last residual GEMV, which has no output norm to fold without the head.
    for preset in [Preset::Tiny, Preset::Small] {
        let d = dims(preset);
        for fusion in [ALL, NORM_ONLY, Fusion::default()] {
            let none = forward_ops(&d, 1, Head::None, false, fusion);
            let last = forward_ops(&d, 1, Head::Last, false, fusion);
            let k = none.len();
            assert!(k > 1 && last.len() > k, "{preset:?} {fusion:?}");
            assert_eq!(none[..k - 1], last[..k - 1], "{preset:?} {fusion:?}");
            let down = Some(Mat::FfnDown(d.layers.len() - 1));
            assert_eq!(none[k - 1].matrix(), down, "{preset:?} {fusion:?}");
            assert_eq!(last[k - 1].matrix(), down, "{preset:?} {fusion:?}");
            assert!(!none.iter().any(|o| o.matrix() == Some(Mat::Output)));
        }
    }
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

#[test]
fn every_swiglu_launch_covers_the_feed_forward_once_and_rotations_keep_whole_blocks() {
    for ffn in [dims(Preset::B27).ffn, 256, 1024, 3072] {
        for (ntok, rotated) in [(1, false), (1, true), (7, false), (7, true)] {
            for w in SWIGLU_WARPS {
                let ((bx, by, bz), (threads, ty, tz)) = swiglu_launch(ffn, ntok, rotated, w);
                assert_eq!((by, bz, ty, tz), (ntok as u32, 1, 1, 1));
                let per_block = 128 * threads as usize / 32;
                // Enough blocks for every value, and no block wholly past the end.
                assert!(bx as usize * per_block >= ffn && (bx as usize - 1) * per_block < ffn);
                // A rotation's 1024 values are one block's; multi-token passes keep eight warps.
                if rotated || ntok > 1 {
                    assert_eq!(threads, 256, "ffn {ffn} ntok {ntok} rotated {rotated}");
                } else {
                    assert_eq!(threads as usize, 32 * w);
                }
            }
        }
    }
    assert!(SWIGLU_WARPS.contains(&SWIGLU_DECODE_WARPS));
    assert_eq!(
        swiglu_launch(17_408, 1, false, 1),
        ((136, 1, 1), (32, 1, 1))
    );
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
fn a_skip_leaves_out_exactly_its_one_token_kernels() {
    let d = dims(Preset::B27);
    let decode = Fusion {
        swiglu: false,
        ..ALL
    };
    let ops = forward_ops(&d, 1, Head::Last, true, decode);
    let kept = |skip: Skip| ops.iter().filter(|op| !skip.drops(op)).count();
    // One SwiGLU per layer, one recurrence per recurrent layer, one short attention per
    // attention layer.
    assert_eq!(ops.len() - kept(Skip::Swiglu), 64);
    assert_eq!(ops.len() - kept(Skip::Gdn), 48);
    assert_eq!(ops.len() - kept(Skip::GdnSwiglu), 48 + 64);
    assert_eq!(ops.len() - kept(Skip::Attn), 16);
    assert_eq!(ops.len() - kept(Skip::All), 64 + 48 + 16);
    // A prefill's SwiGLUs stay.
    let prefill = forward_ops(&d, 8, Head::Last, false, decode);
    assert!(prefill.iter().all(|op| !Skip::GdnSwiglu.drops(op)));
    assert_eq!(Skip::parse("swiglu"), Some(Skip::Swiglu));
    assert_eq!(Skip::parse("gdn"), Some(Skip::Gdn));
    assert_eq!(Skip::parse("gdn+swiglu"), Some(Skip::GdnSwiglu));
    assert_eq!(Skip::parse("attn"), Some(Skip::Attn));
    assert_eq!(Skip::parse("all"), Some(Skip::All));
    assert_eq!(Skip::parse("norm"), None);
}
