//! The kernel launches of a forward call, in order.

use super::*;

/// A packed matrix of the model, by role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mat {
    /// qkv | z | alpha | beta of a recurrent layer (qkv | z only where [`Mat::GdnAb`] is apart).
    GdnIn(usize),
    /// alpha | beta of a recurrent layer whose qkv | z read the input Hadamard-rotated and they
    /// do not (or the reverse): written to the same rows of the projection as within GdnIn.
    GdnAb(usize),
    GdnOut(usize),
    /// q+gate | k | v of an attention layer.
    AttnIn(usize),
    AttnOut(usize),
    /// gate | up.
    FfnIn(usize),
    FfnDown(usize),
    Output,
}

impl Mat {
    /// The matrix's role without its layer, for tables of time per kind of op.
    pub fn kind(self) -> &'static str {
        match self {
            Mat::GdnIn(_) => "GdnIn",
            Mat::GdnAb(_) => "GdnAb",
            Mat::GdnOut(_) => "GdnOut",
            Mat::AttnIn(_) => "AttnIn",
            Mat::AttnOut(_) => "AttnOut",
            Mat::FfnIn(_) => "FfnIn",
            Mat::FfnDown(_) => "FfnDown",
            Mat::Output => "Output",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Norm {
    Attn(usize),
    Post(usize),
    Output,
}

/// Where a GEMV writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Out {
    /// The projection buffer (overwritten).
    Proj,
    /// Added into the residual stream.
    Residual,
    /// The logits buffer (overwritten), with the per-token argmax when asked.
    Logits { argmax: bool },
}

/// One step of a forward call over `ntok` tokens (layer indices are model layer indices).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// RMS-norm tokens `tok0..tok0+ntok` of the residual and quantize them to int8, Hadamard-
    /// rotated in between with `rot`.
    NormQuant {
        norm: Norm,
        tok0: usize,
        ntok: usize,
        rot: bool,
    },
    Gemv {
        mat: Mat,
        ntok: usize,
        out: Out,
    },
    /// One token: RMS norm + quantize inside the GEMV's own blocks (NormQuant then Gemv when
    /// the device has no fused kernel for the matrix).
    NormGemv {
        norm: Norm,
        tok0: usize,
        mat: Mat,
        out: Out,
    },
    /// One token: a GEMV adding into the residual whose last writes of each 128-value piece
    /// also leave the next norm's input quantized, unscaled, with the pieces' sums of squares
    /// (kernels/quant.cu's fold); [`Op::GemvScaled`] reads it.
    GemvFold {
        mat: Mat,
        norm: Norm,
    },
    /// One token: a GEMV of the input a [`Op::GemvFold`] left, its outputs times the norm's
    /// 1/rms (`norm`: the one folded, for running it apart where no decode GEMV takes `mat`).
    GemvScaled {
        mat: Mat,
        norm: Norm,
        out: Out,
    },
    /// One token: the gate | up GEMV of the input a [`Op::GemvFold`] left (as
    /// [`Op::GemvScaled`]) whose last writes of each 128-value piece of gate and up also
    /// quantize silu(gate)·up for the down GEMV (kernels/quant.cu's fold), where
    /// [`Op::SwigluQuant`] would.
    GemvSwiglu {
        mat: Mat,
        norm: Norm,
    },
    Conv {
        layer: usize,
        ntok: usize,
    },
    /// Normalized q, k and the gates of every token of a multi-token pass, ahead of the step.
    GdnPrep {
        layer: usize,
        ntok: usize,
    },
    GdnStep {
        layer: usize,
        ntok: usize,
    },
    /// One token: Conv, GdnStep and GatedQuant of a recurrent layer in one kernel.
    GdnDecode {
        layer: usize,
    },
    /// Per-head RMS norm · ssm_norm · silu(z), quantized.
    GatedQuant {
        layer: usize,
        ntok: usize,
    },
    /// q/k norms, RoPE, appending k and v to the cache.
    AttnPrep {
        layer: usize,
        ntok: usize,
    },
    AttnSplit {
        layer: usize,
        ntok: usize,
    },
    /// Merges the splits and applies the output gate.
    AttnCombine {
        layer: usize,
        ntok: usize,
    },
    /// One token: AttnCombine and PlainQuant in one kernel.
    AttnCombineQuant {
        layer: usize,
    },
    /// One token over a short context: AttnPrep, AttnSplit and AttnCombineQuant in one kernel.
    AttnShort {
        layer: usize,
    },
    /// Quantizes the attention output for its projection.
    PlainQuant {
        ntok: usize,
    },
    /// silu(gate) · up, quantized.
    SwigluQuant {
        ntok: usize,
    },
    ResetArgmax {
        ntok: usize,
    },
}

/// Which tokens of a call produce logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head {
    None,
    Last,
    All,
}

/// Which one-token GEMVs norm and quantize their input themselves ([`Op::NormGemv`]), the
/// others' norms running as their own kernel.
///
/// Apart is the default. Folded into the binary GEMVs (whose consumer warps norm and quantize
/// their own chunks in registers, the same bits as the norm kernel), 27B Q1_0 decode on the H200
/// measured 346.1, 346.3 and 343.0 tok/s against 358.8, 350.7 and 353.2 with the norms apart
/// (`niwaki bench --device cuda -p 8 -n 128 -r 3`, medians, rounds interleaved): each of a
/// GEMV's ~400 blocks then reads the whole row in f32 (20 KB, four times the int8 codes it
/// reads otherwise) where one small kernel read it once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormFusion {
    /// Every norm its own kernel.
    Apart,
    /// Folded into the binary 1-bit GEMVs (`kernels/gemv_b1.cu`, up to six chunks a warp).
    Binary,
    /// Into the dp4a GEMVs too, whose every block norms and stages the whole row first.
    All,
}

impl NormFusion {
    /// From `NIWAKI_CUDA_FUSE_NORM`: `binary` into the binary GEMVs, `1` or `all` into every
    /// GEMV, else apart.
    pub fn from_setting(v: Option<&str>) -> NormFusion {
        match v {
            Some("binary") => NormFusion::Binary,
            Some("1" | "all") => NormFusion::All,
            _ => NormFusion::Apart,
        }
    }

    /// Whether a one-token GEMV whose matrix goes to the binary kernel (`binary`) or not
    /// takes its norm.
    pub fn folds(self, binary: bool) -> bool {
        match self {
            NormFusion::Apart => false,
            NormFusion::Binary => binary,
            NormFusion::All => true,
        }
    }
}

/// Which of a one-token pass's ops are merged into fewer kernels (multi-token passes keep
/// them apart). The default merges nothing, the plain op list; what a device runs is
/// `Gpu::fusion` (the recurrence merged unless turned off).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Fusion {
    /// Each norm folded into the GEMV that reads it ([`Op::NormGemv`]).
    pub norm: bool,
    /// A recurrent layer's conv, step and gated norm in one kernel ([`Op::GdnDecode`]).
    pub gdn: bool,
    /// An attention layer's split merge and its output's quantization in one kernel
    /// ([`Op::AttnCombineQuant`]; heads of a multiple of 128 values).
    pub attn: bool,
    /// Each norm after a residual GEMV folded into that GEMV's last writes ([`Op::GemvFold`],
    /// [`Op::GemvScaled`]; rows of whole 128-value pieces, at most [`FOLD_MAX_PIECES`]; not in
    /// Hadamard-rotated models, whose norms rotate 1024 values at a time). Takes precedence
    /// over `norm` where both apply.
    pub fold: bool,
    /// With `fold`, each SwiGLU folded into the gate | up GEMV's last writes
    /// ([`Op::GemvSwiglu`]; feed-forward widths of whole 128-value pieces).
    pub swiglu: bool,
    /// An attention layer's whole one-token attention in one kernel ([`Op::AttnShort`]; heads
    /// of a multiple of 128 values): a property of the pass, whose context is short enough.
    pub attn_short: bool,
}

/// Pieces of 128 values a folded norm's row may have: the GEMV after it adds their sums of
/// squares one per lane, two lanes' worth a warp.
pub const FOLD_MAX_PIECES: usize = 64;

/// The counters' slot of a residual GEMV whose norm is folded: one per residual write of a
/// layer (the mixer's output, then the feed-forward's), each [`FOLD_MAX_PIECES`] counters.
pub fn fold_slot(mat: Mat) -> Option<usize> {
    match mat {
        Mat::GdnOut(l) | Mat::AttnOut(l) => Some(2 * l),
        Mat::FfnDown(l) => Some(2 * l + 1),
        _ => None,
    }
}

/// The launches of one forward pass over `ntok` tokens (at most [`MAX_CHUNK`]), a one-token
/// pass's merged as `fusion` asks.
/// A Hadamard-rotated model merges nothing: its quantizations rotate, the fused kernels do not.
pub fn forward_ops(d: &Dims, ntok: usize, head: Head, argmax: bool, fusion: Fusion) -> Vec<Op> {
    assert!((1..=MAX_CHUNK).contains(&ntok));
    let r = d.rotation;
    let fusion = if r.any() { Fusion::default() } else { fusion };
    let mut ops = Vec::new();
    let gemv = |mat, out| Op::Gemv { mat, ntok, out };
    let fuse = fusion.norm && ntok == 1;
    for (il, kind) in d.layers.iter().enumerate() {
        let norm = |rot| Op::NormQuant {
            norm: Norm::Attn(il),
            tok0: 0,
            ntok,
            rot,
        };
        match kind {
            LayerKind::Recurrent if r.split_gdn_in() => {
                ops.push(norm(r.gdn_ab));
                ops.push(gemv(Mat::GdnAb(il), Out::Proj));
                ops.push(norm(r.gdn_in));
            }
            LayerKind::Recurrent => ops.push(norm(r.gdn_in)),
            LayerKind::Attention => ops.push(norm(r.attn_in)),
        }
        match kind {
            LayerKind::Recurrent => {
                ops.push(gemv(Mat::GdnIn(il), Out::Proj));
                if fusion.gdn && ntok == 1 {
                    ops.push(Op::GdnDecode { layer: il });
                } else {
                    ops.push(Op::Conv { layer: il, ntok });
                    if gdn_prepped(ntok) {
                        ops.push(Op::GdnPrep { layer: il, ntok });
                    }
                    ops.push(Op::GdnStep { layer: il, ntok });
                    ops.push(Op::GatedQuant { layer: il, ntok });
                }
                ops.push(gemv(Mat::GdnOut(il), Out::Residual));
            }
            LayerKind::Attention
                if fusion.attn_short && ntok == 1 && d.head_dim.is_multiple_of(128) =>
            {
                ops.push(gemv(Mat::AttnIn(il), Out::Proj));
                ops.push(Op::AttnShort { layer: il });
                ops.push(gemv(Mat::AttnOut(il), Out::Residual));
            }
            LayerKind::Attention => {
                ops.push(gemv(Mat::AttnIn(il), Out::Proj));
                ops.push(Op::AttnPrep { layer: il, ntok });
                ops.push(Op::AttnSplit { layer: il, ntok });
                // The merged kernel quantizes whole 128-value pieces of a head.
                if fusion.attn && ntok == 1 && d.head_dim.is_multiple_of(128) {
                    ops.push(Op::AttnCombineQuant { layer: il });
                } else {
                    ops.push(Op::AttnCombine { layer: il, ntok });
                    ops.push(Op::PlainQuant { ntok });
                }
                ops.push(gemv(Mat::AttnOut(il), Out::Residual));
            }
        }
        ops.push(Op::NormQuant {
            norm: Norm::Post(il),
            tok0: 0,
            ntok,
            rot: r.ffn_in,
        });
        ops.push(gemv(Mat::FfnIn(il), Out::Proj));
        ops.push(Op::SwigluQuant { ntok });
        ops.push(gemv(Mat::FfnDown(il), Out::Residual));
    }
    // A pass without logits still takes the fusions below: its layers' ops must be the ones a
    // pass with logits runs, so that token-by-token passes give the same bits either way.
    let rows = match head {
        Head::None => None,
        Head::Last => Some((ntok - 1, 1)),
        Head::All => Some((0, ntok)),
    };
    if let Some((tok0, n)) = rows {
        if argmax {
            ops.push(Op::ResetArgmax { ntok: n });
        }
        ops.push(Op::NormQuant {
            norm: Norm::Output,
            tok0,
            ntok: n,
            rot: r.output,
        });
        ops.push(Op::Gemv {
            mat: Mat::Output,
            ntok: n,
            out: Out::Logits { argmax },
        });
    }
    if fusion.fold && ntok == 1 && d.hidden.is_multiple_of(128) && d.hidden / 128 <= FOLD_MAX_PIECES
    {
        fold_norms(&mut ops);
        if fusion.swiglu && d.ffn.is_multiple_of(128) {
            fold_swiglus(&mut ops);
        }
    }
    if fuse {
        fuse_norms(&mut ops);
    }
    ops
}

/// Replaces each one-token residual GEMV, the unrotated NormQuant after it (an argmax reset may
/// stand between) and the GEMV after that with a GemvFold and a GemvScaled.
fn fold_norms(ops: &mut Vec<Op>) {
    let mut out = Vec::with_capacity(ops.len());
    let mut i = 0;
    while i < ops.len() {
        if let Op::Gemv {
            mat,
            ntok: 1,
            out: Out::Residual,
        } = ops[i]
        {
            let reset = matches!(ops.get(i + 1), Some(Op::ResetArgmax { .. }));
            let at = i + 1 + usize::from(reset);
            if let (
                Some(&Op::NormQuant {
                    norm,
                    tok0: 0,
                    ntok: 1,
                    rot: false,
                }),
                Some(&Op::Gemv {
                    mat: next,
                    ntok: 1,
                    out: o,
                }),
            ) = (ops.get(at), ops.get(at + 1))
            {
                if fold_slot(mat).is_some() {
                    out.push(Op::GemvFold { mat, norm });
                    if reset {
                        out.push(ops[i + 1]);
                    }
                    out.push(Op::GemvScaled {
                        mat: next,
                        norm,
                        out: o,
                    });
                    i = at + 2;
                    continue;
                }
            }
        }
        out.push(ops[i]);
        i += 1;
    }
    *ops = out;
}

/// Replaces each pair of neighbouring ops that `merge` turns into one op with that op.
fn merge_pairs(ops: &mut Vec<Op>, merge: impl Fn(Op, Op) -> Option<Op>) {
    let mut out = Vec::with_capacity(ops.len());
    let mut i = 0;
    while i < ops.len() {
        if let Some(m) = ops.get(i + 1).and_then(|&next| merge(ops[i], next)) {
            out.push(m);
            i += 2;
        } else {
            out.push(ops[i]);
            i += 1;
        }
    }
    *ops = out;
}

/// Replaces each one-token gate | up GemvScaled and the SwigluQuant after it with a
/// GemvSwiglu.
fn fold_swiglus(ops: &mut Vec<Op>) {
    merge_pairs(ops, |op, next| match (op, next) {
        (
            Op::GemvScaled {
                mat: mat @ Mat::FfnIn(_),
                norm,
                out: Out::Proj,
            },
            Op::SwigluQuant { ntok: 1 },
        ) => Some(Op::GemvSwiglu { mat, norm }),
        _ => None,
    });
}

/// Replaces each one-token NormQuant directly followed by a GEMV with a NormGemv.
fn fuse_norms(ops: &mut Vec<Op>) {
    merge_pairs(ops, |op, next| match (op, next) {
        (
            Op::NormQuant {
                norm,
                tok0,
                ntok: 1,
                rot: false,
            },
            Op::Gemv { mat, ntok: 1, out },
        ) => Some(Op::NormGemv {
            norm,
            tok0,
            mat,
            out,
        }),
        _ => None,
    });
}

/// Kernel launches an op list makes with the dp4a kernels (a GEMV over more than
/// [`GEMV_TOKENS`] tokens is several; the tensor-core GEMM makes one, or two when split).
pub fn launches(ops: &[Op]) -> usize {
    ops.iter()
        .map(|op| match op {
            Op::Gemv { ntok, .. } => ntok.div_ceil(GEMV_TOKENS),
            _ => 1,
        })
        .sum()
}

/// Whether a pass of `ntok` tokens prepares the recurrence's state-independent parts in a
/// kernel of their own (a one-token step computes them inline: one launch fewer).
pub const fn gdn_prepped(ntok: usize) -> bool {
    ntok > 1
}

/// Key rows of a value column each lane of the recurrent step keeps in registers (a kernel
/// per count, `gdn_step_r<rows>`): fewer make more warps, for more shuffles per token.
pub const GDN_STEP_ROWS: [usize; 3] = [32, 16, 8];
/// For multi-token passes (H200, Q2_0 27B, 256-token passes: 154 → 139 µs per layer with 16,
/// pp512 6310 → 6420 tok/s; 8 rows: 6060). One-token steps keep [`GDN_STEP_DECODE_ROWS`].
pub const GDN_STEP_DEFAULT_ROWS: usize = 16;
/// For one-token passes. `gdn_decode` (the recurrence in one kernel) keeps 32 rows per lane too,
/// so that it and the separate kernels give the same bits.
pub const GDN_STEP_DECODE_ROWS: usize = 32;
const _: () = assert!(
    GDN_STEP_DECODE_ROWS == 32,
    "gdn_decode hard-codes 32 rows per lane"
);

/// The recurrent step's kernel for `rows` (one of [`GDN_STEP_ROWS`]).
pub fn gdn_step_kernel(rows: usize) -> &'static str {
    match rows {
        32 => "gdn_step_r32",
        16 => "gdn_step_r16",
        _ => "gdn_step_r8",
    }
}

/// The recurrent step's grid: value heads by blocks of 4 warps' columns (32 lanes over
/// key_dim / rows row groups each).
pub fn gdn_step_grid(d: &Dims, rows: usize) -> (u32, u32, u32) {
    let cols = 4 * 32 * rows / d.key_dim;
    (d.value_heads as u32, (d.value_dim / cols) as u32, 1)
}

/// Warps of a decode step's `quant_swiglu` block where nothing is rotated (a warp's 128 values
/// need no other warp's): blocks of one warp spread the step's 17,408 values (27B) over 136
/// multiprocessors rather than 17. On an H100, 27B decode (`ab-h200.sh`, `niwaki bench
/// --device cuda -p 0 -n 128 -r 3`, medians, two rounds alternated, 2026-12-05) Q1_0 429.19 /
/// 427.83 tok/s against eight warps' 418.10 / 417.39, Q2_0 293.68 / 293.19 against 292.28 /
/// 292.23 (two warps: 417.29 / 417.54 and 291.84 / 291.90; four: 417.26 / 417.38 and
/// 292.06 / 291.80), the same picked tokens; on the H200 (one round, against the build before)
/// Q1_0 474.55 against 456.83, Q2_0 338.96 against 337.95, PQ2_0 346.46 against 345.58, PTQ1_0
/// 346.57 against 344.10. `NIWAKI_CUDA_SWIGLU_WARPS` sets it.
pub const SWIGLU_DECODE_WARPS: usize = 1;
/// The warps a `quant_swiglu` block may have: whole 1024-value rotation blocks are eight.
pub const SWIGLU_WARPS: [usize; 4] = [1, 2, 4, 8];

/// `quant_swiglu`'s grid and block for `ntok` tokens of a feed-forward `ffn` wide, Hadamard-
/// rotated or not, decode steps in blocks of `decode_warps`: a rotation's blocks hold its 1024
/// values, and multi-token passes keep eight warps (their many blocks fill the device anyway).
pub fn swiglu_launch(
    ffn: usize,
    ntok: usize,
    rotated: bool,
    decode_warps: usize,
) -> ((u32, u32, u32), (u32, u32, u32)) {
    assert!(SWIGLU_WARPS.contains(&decode_warps));
    let warps = if rotated || ntok > 1 { 8 } else { decode_warps };
    (
        (ffn.div_ceil(128 * warps) as u32, ntok as u32, 1),
        (32 * warps as u32, 1, 1),
    )
}

/// Tokens per chunk of the chunked recurrence (kernels/gdn_chunk.cu).
pub const GDN_CHUNK: usize = 64;
/// Passes of at least this many tokens may run the recurrence in chunks (fewer: token by
/// token, where the chain is short).
pub const GDN_CHUNK_MIN_TOKENS: usize = 16;

/// Floats per head and chunk of the chunked recurrence's scratch: W, U, the decayed q·k
/// products P, the cumulative gates and the decay ratios to the chunk's end.
pub fn gdn_chunk_floats(d: &Dims) -> usize {
    GDN_CHUNK * (d.key_dim + d.value_dim + GDN_CHUNK + 2)
}

/// Dynamic shared memory of `gdn_chunk_prep`: a chunk's k and q rows (padded by 4 floats), the
/// strictly lower triangle L, the cumulative log-gates and β.
pub fn gdn_prep_smem(d: &Dims) -> usize {
    4 * (2 * GDN_CHUNK * (d.key_dim + 4) + GDN_CHUNK * GDN_CHUNK + 2 * GDN_CHUNK)
}

impl Op {
    /// The matrix the op multiplies by, for the GEMV ops.
    pub fn matrix(&self) -> Option<Mat> {
        match *self {
            Op::Gemv { mat, .. }
            | Op::NormGemv { mat, .. }
            | Op::GemvFold { mat, .. }
            | Op::GemvScaled { mat, .. }
            | Op::GemvSwiglu { mat, .. } => Some(mat),
            _ => None,
        }
    }
}

/// For each matrix a forward pass multiplies by, the one multiplied next (the last one's is the
/// first: a decode step's next token starts again at the first layer).
pub fn next_matrices(ops: &[Op]) -> Vec<(Mat, Mat)> {
    let mats: Vec<Mat> = ops.iter().filter_map(Op::matrix).collect();
    mats.iter()
        .enumerate()
        .map(|(i, &m)| (m, mats[(i + 1) % mats.len()]))
        .collect()
}

/// Splits a call of `n` tokens into GPU passes of at most [`MAX_CHUNK`].
pub fn chunks(n: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n)
        .step_by(MAX_CHUNK)
        .map(move |s| (s, MAX_CHUNK.min(n - s)))
}

/// A measurement only (`NIWAKI_CUDA_SKIP`): which kernels a one-token pass leaves out, so that
/// a step's time without them (their work and their kernel boundaries) bounds what fusing
/// them away could gain. The ops after a skipped one read stale inputs: the outputs are wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// The SwiGLU's quantization between the gate | up and the down GEMV.
    Swiglu,
    /// The one-kernel recurrence between a recurrent layer's two GEMVs.
    Gdn,
    /// Both.
    GdnSwiglu,
    /// The one-kernel short attention between an attention layer's two GEMVs.
    Attn,
    /// All three: a step of GEMVs (and the first norm) alone.
    All,
}

impl Skip {
    /// The words `NIWAKI_CUDA_SKIP` takes, in the order of [`Skip::parse`].
    pub const WORDS: [&'static str; 5] = ["swiglu", "gdn", "gdn+swiglu", "attn", "all"];

    pub fn parse(word: &str) -> Option<Skip> {
        let all = [
            Skip::Swiglu,
            Skip::Gdn,
            Skip::GdnSwiglu,
            Skip::Attn,
            Skip::All,
        ];
        Self::WORDS.iter().position(|w| *w == word).map(|i| all[i])
    }

    /// Whether a one-token pass leaves `op` out.
    pub fn drops(self, op: &Op) -> bool {
        match op {
            Op::SwigluQuant { ntok: 1 } => {
                matches!(self, Skip::Swiglu | Skip::GdnSwiglu | Skip::All)
            }
            Op::GdnDecode { .. } => matches!(self, Skip::Gdn | Skip::GdnSwiglu | Skip::All),
            Op::AttnShort { .. } => matches!(self, Skip::Attn | Skip::All),
            _ => false,
        }
    }
}
