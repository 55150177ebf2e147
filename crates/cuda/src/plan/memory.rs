//! Device memory: the KV cache format, a sequence's state, the scratch of a pass, and the
//! check that an allocation fits.

use super::*;

/// How the attention layers cache keys and values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvCache {
    /// f16 values.
    #[default]
    F16,
    /// llama.cpp's q8_0: int8 values and one f16 scale per 32 (34 bytes per 32 values, 53% of
    /// f16), so a decode step at depth reads about half the cache bytes.
    Q8_0,
}

impl KvCache {
    /// Bytes of one cached value (scales apart).
    pub const fn value_bytes(self) -> usize {
        match self {
            KvCache::F16 => 2,
            KvCache::Q8_0 => 1,
        }
    }

    /// Bytes of the scales of a row of `head_dim` values.
    pub const fn scale_bytes(self, head_dim: usize) -> usize {
        match self {
            KvCache::F16 => 0,
            KvCache::Q8_0 => 2 * head_dim / 32,
        }
    }
}

/// Whether a sequence's state can be saved and rewound (`CudaModel::save`: its conv and
/// recurrent states, both parities' buffers, copied on the device; `NIWAKI_CUDA_CHECKPOINTS=0`
/// turns it off): on since the harness's check (`NIWAKI_HARNESS_ONLY=rewind`: rewound sequences
/// against fresh ones, bit for bit) passed on a device. Where off, `niwaki bench` fills its
/// depth afresh for each test.
pub const CHECKPOINTS: bool = true;

/// Bytes of the per-sequence state for a context of `ctx` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateBytes {
    /// Conv state: `[recurrent layers]` of [`StateBytes::conv_per_layer`].
    pub conv: usize,
    /// Recurrent state: `[recurrent layers]` of [`StateBytes::ssm_per_layer`].
    pub ssm: usize,
    /// K and V caches, from [`StateBytes::kv_offset`]: the values `[attention layers][ctx][kv
    /// heads][head dim]` of K then of V, then (q8_0) their scales `[layers][ctx][kv heads][head
    /// dim / 32]`, K then V.
    pub kv: usize,
    pub kv_cache: KvCache,
    /// Bytes of one layer's K (or V) values, and of its scales.
    pub kv_values: usize,
    pub kv_scales: usize,
}

impl StateBytes {
    /// Bytes of one recurrent layer's conv state: two buffers of `[kernel − 1][channels]` f32,
    /// the current one at the parity of the position (kernels/gdn.cu, `gdn_decode`).
    pub fn conv_per_layer(d: &Dims) -> usize {
        4 * 2 * (d.conv_kernel - 1) * d.conv_channels()
    }

    /// Bytes of one recurrent layer's state: two buffers of `[value heads][key dim][value dim]`
    /// f32, the current one at the parity of the position (kernels/gdn.cu, `ssm_read`), so that
    /// a decode step run ahead of the host can be dropped.
    pub fn ssm_per_layer(d: &Dims) -> usize {
        4 * 2 * d.value_heads * d.key_dim * d.value_dim
    }

    pub fn new(d: &Dims, ctx: usize, kv_cache: KvCache) -> StateBytes {
        let g = d.n_recurrent();
        let rows = ctx * d.n_head_kv;
        let kv_values = rows * d.head_dim * kv_cache.value_bytes();
        let kv_scales = rows * kv_cache.scale_bytes(d.head_dim);
        StateBytes {
            conv: g * Self::conv_per_layer(d),
            ssm: g * Self::ssm_per_layer(d),
            kv: 2 * d.n_attention() * (kv_values + kv_scales),
            kv_cache,
            kv_values,
            kv_scales,
        }
    }

    /// Where the caches start: after the recurrent states, 256-byte aligned (the attention
    /// kernels read 8- and 16-byte units).
    pub fn kv_offset(&self) -> usize {
        (self.conv + self.ssm).div_ceil(256) * 256
    }

    pub fn total(&self) -> usize {
        self.kv_offset() + self.kv
    }

    /// Offsets of attention layer `i`'s K values, V values, K scales and V scales (of `n`
    /// attention layers) from the start of the state.
    pub fn kv_layer(&self, i: usize, n: usize) -> [usize; 4] {
        let base = self.kv_offset();
        let scales = base + 2 * n * self.kv_values;
        [
            base + i * self.kv_values,
            base + (n + i) * self.kv_values,
            scales + i * self.kv_scales,
            scales + (n + i) * self.kv_scales,
        ]
    }
}

/// Named regions of one state's scratch memory, 256-byte aligned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scratch {
    pub regions: Vec<(&'static str, usize, usize)>,
    pub bytes: usize,
}

impl Scratch {
    /// The regions of a state whose passes take up to `tokens` tokens and write up to
    /// `part_rows` of the attention's partial rows a query head ([`attn_part_rows`]); `planes`:
    /// its model's one-token passes write plane words (1-bit models), else those regions take no
    /// bytes.
    pub fn new(d: &Dims, tokens: usize, part_rows: usize, planes: bool) -> Scratch {
        let t = tokens;
        let p = usize::from(planes);
        let sizes = [
            ("x", 4 * t * d.hidden),
            ("xq", t * d.max_cols()),
            ("xs", 8 * t * d.max_cols() / 64),
            ("xh", 2 * t * d.max_cols()),
            ("proj", 4 * t * d.proj_rows()),
            ("conv", 4 * t * d.conv_channels()),
            ("gdn", 4 * t * d.gdn_inner()),
            ("gdn_qk", 4 * t * 2 * d.key_heads * d.key_dim),
            ("gdn_gb", 8 * t * d.value_heads),
            (
                "gdn_chunks",
                4 * d.value_heads * t.div_ceil(GDN_CHUNK) * gdn_chunk_floats(d),
            ),
            ("q", 4 * t * d.n_head * d.head_dim),
            ("attn", 4 * t * d.n_head * d.head_dim),
            ("part", 4 * part_rows * d.n_head * (d.head_dim + 2)),
            ("logits", 4 * t * d.vocab),
            ("argmax", 8 * t),
            // Two alternating key buffers of the sampling top-k, whose first pass keeps the
            // most (of one row).
            ("topk", 2 * 8 * topk_scratch_keys(d.vocab, TOPK_MAX)),
            ("topk_flag", 4),
            ("weight_chunks", 8 * weight_chunks(d.vocab)),
            ("gemm_part", 4 * GEMM_MAX_SPLITS * t * d.hidden),
            // A folded norm's output (one token) beside the activations the GEMV leaving it
            // reads, the sums of squares of its pieces, and each residual GEMV's counters.
            ("fold_xq", d.hidden),
            ("fold_xs", 8 * d.hidden / 64),
            ("fold_ss", 4 * FOLD_MAX_PIECES),
            ("fold_cnt", 4 * FOLD_MAX_PIECES * 2 * d.layers.len()),
            // Each gate | up GEMV's counters where it folds the SwiGLU.
            ("swiglu_cnt", 4 * d.ffn.div_ceil(128) * d.layers.len()),
            ("pos", 8),
            // One token's activations as plane words (as many bytes as its codes), and the
            // folded norm's output as plane words. Last, so that they move no other region, and
            // empty for models that read none (2-bit), whose layout is then the one from before
            // plane words (that the regions cost the 2-bit decode 1.2% was a guess: without them
            // it measured the same, 306.4 against 305.9 tok/s on the H200's 27B Q2_0).
            ("xp", p * d.max_cols()),
            ("fold_xp", p * d.hidden),
        ];
        let mut regions = Vec::new();
        let mut at = 0;
        for (name, n) in sizes {
            regions.push((name, at, n));
            at += n.div_ceil(256) * 256;
        }
        Scratch { regions, bytes: at }
    }

    fn region(&self, name: &str) -> &(&'static str, usize, usize) {
        self.regions
            .iter()
            .find(|r| r.0 == name)
            .unwrap_or_else(|| panic!("no scratch region {name}"))
    }

    /// Bytes of a region.
    pub fn size(&self, name: &str) -> usize {
        self.region(name).2
    }

    /// Byte offset of a region.
    pub fn offset(&self, name: &str) -> usize {
        self.region(name).1
    }
}

/// Fails with the numbers when `need` bytes do not fit in `free`.
pub fn check_fits(what: &str, parts: &[(&str, usize)], free: usize) -> Result<()> {
    let need: usize = parts.iter().map(|p| p.1).sum();
    if need <= free {
        return Ok(());
    }
    let mib = |b: usize| (b as u64).div_ceil(1 << 20);
    let breakdown = parts
        .iter()
        .map(|(n, b)| format!("{n} {} MiB", mib(*b)))
        .collect::<Vec<_>>()
        .join(", ");
    Err(CudaError::OutOfMemory {
        what: what.into(),
        need_mib: mib(need),
        free_mib: mib(free),
        breakdown,
    })
}
