//! What a GEMV or GEMM launch reads and writes besides its matrix: activations, outputs, the
//! norms folded into it, the next matrix to prefetch.

use super::DevMat;

/// What a GEMV reads and writes: int8 activations `xq` with their group scales `xs` (and
/// maybe the f16 `xh`) for `ntok` tokens, and `out[t][row]` at `out + 4·(t·out_stride + row)`, added to when
/// `accumulate`; `argmax`, when set, receives each token's argmax key.
#[derive(Clone, Copy, Debug)]
pub struct GemvIo {
    pub xq: u64,
    pub xs: u64,
    /// The same activations as plane words (kernels/quant.cu, `quant128`), where the
    /// quantization wrote them (one token).
    pub xp: Option<u64>,
    /// The same activations as f16, in the f16 GEMM's order (kernels/quant.cu), where the
    /// quantization wrote them.
    pub xh: Option<u64>,
    pub ntok: usize,
    pub out: u64,
    pub out_stride: usize,
    pub accumulate: bool,
    pub argmax: Option<u64>,
    /// Scratch for the partial sums of a split-K GEMM: address and capacity in floats (`None`:
    /// never split).
    pub split_scratch: Option<(u64, usize)>,
    /// Weights of the next GEMV for a one-token GEMV to pull into the L2 cache.
    pub prefetch: Option<Prefetch>,
    /// One token: the activations are a folded norm's, unscaled ([`FoldOut`]): the outputs
    /// take its 1/rms.
    pub rms_in: Option<RmsIn>,
    /// One token, adding into the residual: the next norm folded into the last writes.
    pub fold: Option<FoldOut>,
}

/// Where a folded norm left the 1/rms of the activations a GEMV reads: its pieces' sums of
/// squares (`cols` / 128 floats) and the norm's epsilon.
#[derive(Clone, Copy, Debug)]
pub struct RmsIn {
    pub piece_ss: u64,
    pub eps: f32,
}

/// What a one-token GEMV folds into its last writes (kernels/quant.cu, `FoldOut`): the
/// pieces' arrival counters (zeroed once, never reset), where the codes and their group pairs
/// go, and what they quantize.
#[derive(Clone, Copy, Debug)]
pub struct FoldOut {
    pub counters: u64,
    pub xq: u64,
    pub xs: u64,
    /// Where the codes' plane words go too, if anywhere.
    pub xp: Option<u64>,
    pub kind: FoldKind,
}

/// What a fold quantizes, and what its arithmetic needs besides the GEMV's outputs.
#[derive(Clone, Copy, Debug)]
pub enum FoldKind {
    /// A residual GEMV leaves the next norm's input, x·w unscaled (`weight`: the norm's), with
    /// the pieces' sums of squares at `piece_ss`.
    Norm { weight: u64, piece_ss: u64 },
    /// A gate | up GEMV of `ffn` rows each leaves silu(gate)·up for the down GEMV.
    Swiglu { ffn: usize },
}

/// The first bytes of a matrix (codes and scales in proportion, as its tiles are read), which
/// a one-token GEMV asks the L2 cache to fetch for the GEMV after it: the memory then keeps
/// streaming while the kernels between the two wait on each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefetch {
    pub codes: u64,
    pub code_bytes: usize,
    pub scales: u64,
    pub scale_bytes: usize,
}

impl Prefetch {
    /// Up to `limit` bytes of `m`, from its start; `None` for a zero limit.
    pub fn of(m: &DevMat, limit: usize) -> Option<Prefetch> {
        let total = m.codes.bytes + m.scales.bytes;
        if limit == 0 || total == 0 {
            return None;
        }
        let part =
            |bytes: usize| (bytes as u128 * limit.min(total) as u128 / total as u128) as usize;
        Some(Prefetch {
            codes: m.codes.ptr,
            code_bytes: part(m.codes.bytes),
            scales: m.scales.ptr,
            scale_bytes: part(m.scales.bytes),
        })
    }
}

impl GemvIo {
    /// One token into `out` (overwritten), no argmax.
    pub fn one(xq: u64, xs: u64, out: u64) -> GemvIo {
        GemvIo {
            xq,
            xs,
            xp: None,
            xh: None,
            ntok: 1,
            out,
            out_stride: 0,
            accumulate: false,
            argmax: None,
            split_scratch: None,
            prefetch: None,
            rms_in: None,
            fold: None,
        }
    }
}

/// The residual row a fused decode GEMV RMS-norms and quantizes itself.
#[derive(Clone, Copy, Debug)]
pub struct NormIn {
    /// The residual stream, `[tokens][cols]` f32.
    pub x: u64,
    pub tok0: usize,
    /// The norm's weight, `cols` f32.
    pub weight: u64,
    pub eps: f32,
}
