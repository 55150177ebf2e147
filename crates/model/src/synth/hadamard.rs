//! Ternary-Bonsai-2's Hadamard rotation on synthetic models: fold a random rotation into given
//! weights (the logits must not change), or mark random weights as folded (for speed).

use gguf::{GgufWriter, Value};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{Role, Shape, TensorSpec};
use crate::hadamard::fwht;

/// Matrices Ternary-Bonsai-2 stores folded (suffixes of `blk.N.*`; also `output.weight`). α and β
/// of the recurrent layers read the input unrotated.
const FOLDED: [&str; 10] = [
    "attn_qkv.weight",
    "attn_gate.weight",
    "ssm_out.weight",
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_output.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
];

const BLOCK: usize = 1024;

/// Random ±1 sign vectors for every input width a rotation of `shape` needs, or `None` when a
/// width is not a multiple of the 1024-value block.
pub fn signs(shape: &Shape, seed: u64) -> Option<Vec<(usize, Vec<f32>)>> {
    let mut widths = vec![
        shape.hidden,
        shape.ffn,
        shape.gdn_value_heads * shape.gdn_value_dim,
        shape.n_head * shape.head_dim,
    ];
    widths.sort_unstable();
    widths.dedup();
    if widths.iter().any(|w| w % BLOCK != 0) {
        return None;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    Some(
        widths
            .into_iter()
            .map(|w| {
                let v = (0..w).map(|_| if rng.gen() { 1.0 } else { -1.0 }).collect();
                (w, v)
            })
            .collect(),
    )
}

fn is_folded(name: &str) -> bool {
    name == "output.weight"
        || (name.starts_with("blk.") && FOLDED.iter().any(|s| name.ends_with(s)))
}

/// R·x per 1024-value block: signs, FWHT, 1/32.
fn rotate(x: &[f32], signs: &[f32]) -> Vec<f32> {
    let mut v: Vec<f32> = x.iter().zip(signs).map(|(a, s)| a * s).collect();
    for b in v.chunks_mut(BLOCK) {
        fwht(b);
        b.iter_mut().for_each(|x| *x /= 32.0);
    }
    v
}

/// A row of ssm_out's input in tiled value-head order (head k + key_heads·r) put in grouped order
/// (r + per_key·k), as the spec writes it out.
fn tiled_to_grouped(x: &[f32], shape: &Shape) -> Vec<f32> {
    let (kh, d) = (shape.gdn_key_heads, shape.gdn_value_dim);
    let per_key = shape.gdn_value_heads / kh;
    let mut out = vec![0f32; x.len()];
    for k in 0..kh {
        for r in 0..per_key {
            let (src, dst) = ((k + kh * r) * d, (r + per_key * k) * d);
            out[dst..dst + d].copy_from_slice(&x[src..src + d]);
        }
    }
    out
}

/// `tensors` as Ternary-Bonsai-2 would store them with the rotation of `signs`: each folded
/// matrix row rotated (ssm_out's first put in grouped order), each embedding row rotated.
pub fn fold(
    shape: &Shape,
    tensors: &[(TensorSpec, Vec<f32>)],
    signs: &[(usize, Vec<f32>)],
) -> Vec<(TensorSpec, Vec<f32>)> {
    let sign = |w: usize| {
        &signs
            .iter()
            .find(|(x, _)| *x == w)
            .expect("a sign vector for every width of the shape")
            .1
    };
    tensors
        .iter()
        .map(|(spec, v)| {
            let cols = spec.dims[0] as usize;
            let out = if spec.name == "token_embd.weight" {
                v.chunks(cols)
                    .flat_map(|row| rotate(row, sign(cols)))
                    .collect()
            } else if spec.role == Role::Matrix && is_folded(&spec.name) {
                v.chunks(cols)
                    .flat_map(|row| {
                        if spec.name.ends_with("ssm_out.weight") {
                            rotate(&tiled_to_grouped(row, shape), sign(cols))
                        } else {
                            rotate(row, sign(cols))
                        }
                    })
                    .collect()
            } else {
                v.clone()
            };
            (spec.clone(), out)
        })
        .collect()
}

/// The `prism.hadamard.*` keys of a fold with `signs` of every folded matrix of `shape`
/// (grouped ssm_out input, the embedding stored rotated).
pub fn write_metadata(w: &mut GgufWriter, shape: &Shape, signs: &[(usize, Vec<f32>)]) {
    let k = |s: &str| format!("prism.hadamard.{s}");
    let names: Vec<String> = shape
        .tensors()
        .into_iter()
        .filter(|t| t.role == Role::Matrix && is_folded(&t.name))
        .map(|t| t.name)
        .collect();
    w.set(&k("version"), Value::U32(1))
        .set(&k("block_size"), Value::U32(BLOCK as u32))
        .set(
            &k("transform"),
            Value::String("normalized-sylvester-walsh-hadamard".into()),
        )
        .set(&k("sign_mode"), Value::String("explicit".into()))
        .set(
            &k("sign_widths"),
            Value::i32s(signs.iter().map(|(w, _)| *w as i32)),
        )
        .set(
            &k("sign_values"),
            Value::i32s(signs.iter().flat_map(|(_, v)| v.iter().map(|&s| s as i32))),
        )
        .set(&k("weight_names"), Value::strings(names))
        .set(
            &k("inverse_weight_names"),
            Value::strings(["token_embd.weight"]),
        )
        .set(&k("gdn_v_grouped"), Value::Bool(true));
}
