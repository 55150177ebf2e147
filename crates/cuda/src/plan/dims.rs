//! The model's shapes as the kernels need them, and the defines they are compiled with.

use super::*;

/// The model's shapes as the kernels need them, checked against what the kernels support.
#[derive(Clone, Debug, PartialEq)]
pub struct Dims {
    pub hidden: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub rope_dims: usize,
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
    pub conv_kernel: usize,
    pub layers: Vec<LayerKind>,
    pub rms_eps: f32,
    pub rope_base: f32,
    pub context_length: usize,
    /// Which activations are Hadamard-rotated (none unless set from the file).
    pub rotation: Rotation,
}

impl Dims {
    pub fn from_config(c: &Config) -> Result<Dims> {
        let d = Dims {
            hidden: c.hidden,
            ffn: c.ffn,
            vocab: c.vocab,
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            rope_dims: c.rope_dims,
            key_heads: c.gdn_key_heads,
            value_heads: c.gdn_value_heads,
            key_dim: c.gdn_key_dim,
            value_dim: c.gdn_value_dim,
            conv_kernel: c.conv_kernel,
            layers: c.layers.clone(),
            rms_eps: c.rms_eps,
            rope_base: c.rope_base,
            context_length: c.context_length,
            rotation: Rotation::default(),
        };
        d.check()?;
        Ok(d)
    }

    pub(crate) fn check(&self) -> Result<()> {
        let bad = |s: String| Err(CudaError::Unsupported(s));
        if self.key_dim != 128 || self.value_dim != 128 {
            return bad(format!(
                "gated delta net head dims {}×{} (the kernels need 128×128)",
                self.key_dim, self.value_dim
            ));
        }
        if !self.head_dim.is_multiple_of(32) || self.head_dim > 256 {
            return bad(format!(
                "attention head dim {} (needs a multiple of 32, at most 256)",
                self.head_dim
            ));
        }
        let group = self.n_head / self.n_head_kv;
        if group > 8 {
            return bad(format!("{group} query heads per kv head (at most 8)"));
        }
        for (what, n) in [
            ("hidden", self.hidden),
            ("ffn", self.ffn),
            ("gdn inner", self.gdn_inner()),
            ("attention width", self.attn_width()),
        ] {
            if n % 128 != 0 {
                return bad(format!("{what} width {n} is not a multiple of 128"));
            }
        }
        if self.conv_kernel < 2 || self.conv_kernel > 8 {
            return bad(format!("conv kernel {} (2..=8)", self.conv_kernel));
        }
        Ok(())
    }

    /// Values of the attention output (every query head's), which its projection reads.
    pub fn attn_width(&self) -> usize {
        self.n_head * self.head_dim
    }
    pub fn gdn_inner(&self) -> usize {
        self.value_heads * self.value_dim
    }
    pub fn conv_channels(&self) -> usize {
        2 * self.key_heads * self.key_dim + self.gdn_inner()
    }
    /// Rows of the stacked qkv | z | alpha | beta projection.
    pub fn gdn_in_rows(&self) -> usize {
        self.conv_channels() + self.gdn_inner() + 2 * self.value_heads
    }
    /// Rows of the stacked q+gate | k | v projection.
    pub fn attn_in_rows(&self) -> usize {
        2 * self.n_head * self.head_dim + 2 * self.n_head_kv * self.head_dim
    }
    pub fn ffn_in_rows(&self) -> usize {
        2 * self.ffn
    }
    pub fn proj_rows(&self) -> usize {
        self.gdn_in_rows()
            .max(self.attn_in_rows())
            .max(self.ffn_in_rows())
    }
    /// The shapes (rows, columns) of a one-token pass's GEMVs, each once: gate | up, the
    /// recurrent and attention inputs, the recurrent and attention outputs, ffn_down, the LM
    /// head.
    pub fn decode_gemv_shapes(&self) -> Vec<(usize, usize)> {
        let h = self.hidden;
        let all = [
            (self.ffn_in_rows(), h),
            (self.gdn_in_rows(), h),
            (self.attn_in_rows(), h),
            (h, self.gdn_inner()),
            (h, self.attn_width()),
            (h, self.ffn),
            (self.vocab, h),
        ];
        let mut out: Vec<(usize, usize)> = Vec::new();
        for s in all {
            if !out.contains(&s) {
                out.push(s);
            }
        }
        out
    }
    pub fn max_cols(&self) -> usize {
        self.hidden
            .max(self.ffn)
            .max(self.gdn_inner())
            .max(self.attn_width())
    }
    pub fn n_attention(&self) -> usize {
        self.layers
            .iter()
            .filter(|&&k| k == LayerKind::Attention)
            .count()
    }
    pub fn n_recurrent(&self) -> usize {
        self.layers.len() - self.n_attention()
    }
    /// Index of layer `il` among the layers of its kind.
    pub fn kind_index(&self, il: usize) -> usize {
        let kind = self.layers[il];
        self.layers[..il].iter().filter(|&&k| k == kind).count()
    }

    /// The `#define`s the kernels are compiled with, for the default attention ring.
    pub fn defines(&self) -> Vec<String> {
        self.defines_for(AttnRing::simt(ATTN_RING_POSITIONS))
    }

    /// The `#define`s the kernels are compiled with, the split attention's staging as `ring`
    /// says (see [`attn_ring_positions`]).
    pub fn defines_for(&self, ring: AttnRing) -> Vec<String> {
        [
            ("HD", self.head_dim),
            ("NH", self.n_head),
            ("NKV", self.n_head_kv),
            ("ROPE", self.rope_dims),
            ("HK", self.key_heads),
            ("HV", self.value_heads),
            ("DK", self.key_dim),
            ("DV", self.value_dim),
            ("KERN", self.conv_kernel),
            ("NSPLIT", ATTN_SPLITS),
            ("AMINLEN", ATTN_MIN_SPLIT_LEN),
            ("ARING", ring.simt),
            ("AM_WARPS", ring.mma_warps),
            ("AM_STAGES", ring.mma_stages),
            ("AM_PREFETCH", ring.mma_prefetch),
            ("AQ_STAGES", ATTN_Q8_MMA_STAGES),
            ("AP_TILE", ATTN_PREFILL_TILE),
            ("AP_STAGES", ATTN_PREFILL_STAGES),
            ("AW_TILE", ATTN_PREFILL_WG_TILE),
            ("AW_STAGES", ATTN_PREFILL_WG_STAGES),
            ("AS_TILE", ATTN_SHORT_TILE),
            ("AS_STAGES", ATTN_SHORT_STAGES),
            ("GEMV1_WARPS", GEMV1_WARPS),
            ("GEMV1_MAX_STAGES", GEMV1_MAX_STAGES),
            ("RING_LATE_Q1", usize::from(RING_LATE_Q1)),
            ("SHARE_UNROLL", SHARE_UNROLL),
            ("CH_WARPS", CHAIN_WARPS),
            ("CH_SLOTS", CHAIN_SLOTS),
            ("CH_STATS", CHAIN_STATS),
            ("MM_WARPS", GEMM_WARPS),
            ("MM_BN", GEMM_TOKENS),
            ("MM_KC", GEMM_STAGE_VALUES),
            ("MM_STAGES", GEMM_STAGES),
            ("MM_WSTRIDE", GEMM_ROW_STRIDE),
            ("HG_STAGES", HGEMM_STAGES),
            ("HG_STAGE_PER_WG", HGEMM_STAGE_PER_WG),
            ("HG_TMA_EXTRA", HGEMM_TMA_EXTRA),
            ("GC", GDN_CHUNK),
        ]
        .iter()
        .map(|(k, v)| format!("-D{k}={v}"))
        .collect()
    }
}
