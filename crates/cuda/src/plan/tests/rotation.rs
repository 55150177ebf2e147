//! Rotated models: the quantizations that rotate, and the rotations refused.

use super::super::*;
use super::{dims, ALL};
use model::synth::Preset;

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
