//! Ternary-Bonsai-2's Hadamard rotation as the GPU applies it: which activations are rotated
//! inside the kernel that quantizes them, derived from the file's folded matrices.

use model::hadamard::Hadamard;

use super::*;

/// Block of values the kernels rotate at a time (a block of 256 threads, four values each).
pub const ROT_BLOCK: usize = 1024;

/// Which quantized activations are rotated. An activation is rotated for every matrix that reads
/// it, so the matrices reading one activation must all be folded or all not — except a recurrent
/// layer's α and β rows, which may read the input unrotated while its qkv and z read it rotated:
/// they then get a GEMV of their own ([`Mat::GdnAb`]) on a second quantization of the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Rotation {
    /// q+gate | k | v.
    pub attn_in: bool,
    /// qkv | z.
    pub gdn_in: bool,
    /// α | β.
    pub gdn_ab: bool,
    pub gdn_out: bool,
    pub attn_out: bool,
    /// gate | up.
    pub ffn_in: bool,
    pub ffn_down: bool,
    pub output: bool,
    /// ssm_out's input goes from tiled to grouped value-head order before it is rotated (only
    /// where ssm_out is folded).
    pub gdn_v_grouped: bool,
}

impl Rotation {
    pub fn any(&self) -> bool {
        self.attn_in
            || self.gdn_in
            || self.gdn_ab
            || self.gdn_out
            || self.attn_out
            || self.ffn_in
            || self.ffn_down
            || self.output
    }

    /// Whether α | β need a GEMV of their own (they read the input otherwise than qkv | z).
    pub fn split_gdn_in(&self) -> bool {
        self.gdn_in != self.gdn_ab
    }

    /// The rotation of a file's folded matrices, or an error naming what the GPU cannot do.
    pub fn from_hadamard(hd: &Hadamard, d: &Dims) -> Result<Rotation> {
        let bad = CudaError::Unsupported;
        // Every layer's matrices of one role must agree, and the parts of a stacked matrix too.
        let mut roles: Vec<(&'static str, Option<bool>)> = Vec::new();
        let mut agree = |role: &'static str, names: &[String]| -> Result<()> {
            let first = hd.folds(&names[0]);
            if let Some(n) = names.iter().find(|n| hd.folds(n) != first) {
                return Err(bad(format!(
                    "{} and {n} read one input but only one of them is Hadamard-folded",
                    names[0]
                )));
            }
            match roles.iter_mut().find(|(r, _)| *r == role) {
                Some((_, Some(prev))) if *prev != first => Err(bad(format!(
                    "{} is Hadamard-folded in some layers and not in others",
                    names[0]
                ))),
                Some(slot) => {
                    slot.1 = Some(first);
                    Ok(())
                }
                None => {
                    roles.push((role, Some(first)));
                    Ok(())
                }
            }
        };
        for (il, kind) in d.layers.iter().enumerate() {
            let n = |s: &str| format!("blk.{il}.{s}.weight");
            match kind {
                LayerKind::Recurrent => {
                    agree("gdn_in", &[n("attn_qkv"), n("attn_gate")])?;
                    agree("gdn_ab", &[n("ssm_alpha"), n("ssm_beta")])?;
                    agree("gdn_out", &[n("ssm_out")])?;
                }
                LayerKind::Attention => {
                    agree("attn_in", &[n("attn_q"), n("attn_k"), n("attn_v")])?;
                    agree("attn_out", &[n("attn_output")])?;
                }
            }
            agree("ffn_in", &[n("ffn_gate"), n("ffn_up")])?;
            agree("ffn_down", &[n("ffn_down")])?;
        }
        agree("output", &["output.weight".to_string()])?;
        let role = |r: &str| roles.iter().any(|&(x, f)| x == r && f == Some(true));
        let rot = Rotation {
            attn_in: role("attn_in"),
            gdn_in: role("gdn_in"),
            gdn_ab: role("gdn_ab"),
            gdn_out: role("gdn_out"),
            attn_out: role("attn_out"),
            ffn_in: role("ffn_in"),
            ffn_down: role("ffn_down"),
            output: role("output"),
            gdn_v_grouped: hd.gdn_v_grouped() && role("gdn_out"),
        };
        // Only the activations of folded matrices are rotated on the GPU (the embedding is
        // un-rotated on the host, at any block size).
        if rot.any() && hd.block() != ROT_BLOCK {
            return Err(bad(format!(
                "Hadamard blocks of {} values (the GPU rotates blocks of {ROT_BLOCK})",
                hd.block()
            )));
        }
        for (on, what, width) in [
            (
                rot.attn_in || rot.gdn_in || rot.gdn_ab || rot.ffn_in || rot.output,
                "hidden",
                d.hidden,
            ),
            (rot.ffn_down, "ffn", d.ffn),
            (rot.gdn_out, "gated delta net inner", d.gdn_inner()),
            (rot.attn_out, "attention", d.n_head * d.head_dim),
        ] {
            if on && (hd.signs(width).is_none() || !width.is_multiple_of(ROT_BLOCK)) {
                return Err(bad(format!(
                    "rotated {what} input of width {width} has no sign vector or is not a multiple of {ROT_BLOCK}"
                )));
            }
        }
        Ok(rot)
    }
}
