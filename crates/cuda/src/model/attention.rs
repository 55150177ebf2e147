//! The attention layers' launches: the queries' and keys' norms, RoPE and cache append, the
//! split (flash-decoding) attention and its merge, and the one-kernel short attention.

use super::*;
use crate::gpu::planes_twin;

impl CudaModel {
    /// The queries' and keys' norms and RoPE, and the keys and values appended to the cache.
    pub(super) fn attn_prep(&self, st: &CudaState, layer: usize, ntok: usize) -> Result<()> {
        let (g, s, d) = (&*self.gpu, &*st.stream, &self.dims);
        let (proj, pos) = (st.s("proj"), st.s("pos"));
        let w = self.attn(layer);
        let kv = self.kv(st, layer);
        g.launch(
            s,
            Self::kv_kernel(st, "attn_prep", "attn_prep_q8"),
            ((d.n_head + d.n_head_kv) as u32, ntok as u32, 1),
            (d.head_dim as u32, 1, 1),
            &[
                &[
                    Arg::Ptr(proj),
                    Arg::I32(d.attn_in_rows() as i32),
                    Arg::Ptr(pos),
                    Arg::Ptr(w.q_norm.ptr),
                    Arg::Ptr(w.k_norm.ptr),
                    Arg::F32(d.rms_eps),
                    Arg::F32(d.rope_base),
                    Arg::Ptr(st.s("q")),
                ][..],
                &kv,
            ]
            .concat(),
        )
    }

    /// Attention over the cache in splits of positions, each split's partial result apart.
    pub(super) fn attn_split(&self, st: &CudaState, layer: usize, ntok: usize) -> Result<()> {
        let (g, s, d) = (&*self.gpu, &*st.stream, &self.dims);
        let pos = st.s("pos");
        let [k, v, ks, vs] = self.kv(st, layer);
        let head = [
            Arg::Ptr(st.s("q")),
            k,
            v,
            ks,
            vs,
            Arg::Ptr(pos),
            Arg::F32(1.0 / (d.head_dim as f32).sqrt()),
        ];
        // The query-tiled kernel also takes the pass's tokens and its split length.
        let (a, grid, tail, nsplit) = match self.attn_prefill_plan(st, ntok) {
            Some((k, nsplit, len)) => (
                k.launch,
                k.grid(d, ntok, nsplit),
                vec![
                    Arg::I32(ntok as i32),
                    Arg::I32(nsplit as i32),
                    Arg::I32(len as i32),
                ],
                nsplit,
            ),
            None => {
                let (a, nsplit) = self.attn_split_plan(st, ntok);
                let grid = g.attn_split_grid(d.n_head_kv, nsplit, ntok);
                (a, grid, vec![Arg::I32(nsplit as i32)], nsplit)
            }
        };
        // The partial rows' room is sized for the kernels chosen at start; a pass writing more
        // would overwrite the regions after it.
        let room = st.layout.size("part") / (4 * d.n_head * (d.head_dim + 2));
        if ntok * nsplit > room {
            return Err(CudaError::Invariant(format!(
                "{ntok} tokens × {nsplit} splits of {}: {room} partial rows a head",
                a.kernel
            )));
        }
        let part = [Arg::Ptr(st.s("part"))];
        g.launch_smem(
            s,
            a.kernel,
            grid,
            (a.threads as u32, 1, 1),
            a.smem_bytes as u32,
            &[&head[..], &tail, &part].concat(),
        )
    }

    /// The splits' partial results merged, and the output gate applied.
    pub(super) fn attn_combine(&self, st: &CudaState, ntok: usize) -> Result<()> {
        let (g, s, d) = (&*self.gpu, &*st.stream, &self.dims);
        let (proj, pos) = (st.s("proj"), st.s("pos"));
        let tail = [
            Arg::Ptr(pos),
            Arg::Ptr(proj),
            Arg::I32(d.attn_in_rows() as i32),
            Arg::Ptr(st.s("attn")),
        ];
        // One-token passes: small blocks over all splits (up to 128 at depth);
        // multi-token passes: a block per row (the same bits, far fewer blocks), with the
        // query-tiled attention's split length where it ran (0: the split kernels' rule).
        if ntok == 1 {
            let z = (d.head_dim / 32) as u32;
            let nsplit = Arg::I32(self.attn_split_plan(st, 1).1 as i32);
            let args = [&[Arg::Ptr(st.s("part")), nsplit][..], &tail].concat();
            return g.launch(
                s,
                "attn_combine",
                (d.n_head as u32, 1, z),
                (256, 1, 1),
                &args,
            );
        }
        let (nsplit, len) = match self.attn_prefill_plan(st, ntok) {
            Some((_, nsplit, len)) => (nsplit, len),
            None => (self.attn_split_plan(st, ntok).1, 0),
        };
        let head = [
            Arg::Ptr(st.s("part")),
            Arg::I32(nsplit as i32),
            Arg::I32(len as i32),
        ];
        g.launch(
            s,
            "attn_combine_rows",
            (d.n_head as u32, ntok as u32, 1),
            (d.head_dim as u32, 1, 1),
            &[&head[..], &tail].concat(),
        )
    }

    /// The same for one token, its output quantized for the output projection in the same kernel.
    pub(super) fn attn_combine_quant(&self, st: &CudaState) -> Result<()> {
        let (g, s, d) = (&*self.gpu, &*st.stream, &self.dims);
        let (xq, xs) = (st.s("xq"), st.s("xs"));
        let (proj, pos) = (st.s("proj"), st.s("pos"));
        let (name, args) = planes_twin(
            "attn_combine_quant",
            &[
                Arg::Ptr(st.s("part")),
                Arg::I32(self.attn_split_plan(st, 1).1 as i32),
                Arg::Ptr(pos),
                Arg::Ptr(proj),
                Arg::I32(d.attn_in_rows() as i32),
                Arg::Ptr(st.s("attn")),
                Arg::Ptr(xq),
                Arg::Ptr(xs),
            ],
            self.planes_of(st, xq, 1),
        );
        g.launch(
            s,
            &name,
            (d.n_head as u32, 1, (d.head_dim / 128) as u32),
            (256, 1, 1),
            &args,
        )
    }

    /// A one-token pass's whole attention layer in one kernel, over a short context.
    pub(super) fn attn_short(&self, st: &CudaState, layer: usize) -> Result<()> {
        let (g, s, d) = (&*self.gpu, &*st.stream, &self.dims);
        let (xq, xs) = (st.s("xq"), st.s("xs"));
        let (proj, pos) = (st.s("proj"), st.s("pos"));
        let w = self.attn(layer);
        let a = g.attn_short_launch(st.bytes.kv_cache).ok_or_else(|| {
            CudaError::Unsupported("the short attention on this device and cache".into())
        })?;
        let (name, args) = planes_twin(
            a.kernel,
            &[
                &[
                    Arg::Ptr(proj),
                    Arg::Ptr(pos),
                    Arg::Ptr(w.q_norm.ptr),
                    Arg::Ptr(w.k_norm.ptr),
                    Arg::F32(d.rms_eps),
                    Arg::F32(d.rope_base),
                    Arg::F32(1.0 / (d.head_dim as f32).sqrt()),
                ][..],
                &self.kv(st, layer),
                &[Arg::Ptr(st.s("attn")), Arg::Ptr(xq), Arg::Ptr(xs)],
            ]
            .concat(),
            self.planes_of(st, xq, 1),
        );
        g.launch_smem(
            s,
            &name,
            (d.n_head as u32, 1, 1),
            (a.threads as u32, 1, 1),
            a.smem_bytes as u32,
            &args,
        )?;
        g.count_attn_short();
        Ok(())
    }

    /// Layer `l`'s attention weights (the plan gives attention ops attention layers only).
    fn attn(&self, l: usize) -> &AttnW {
        match &self.layers[l].mix {
            MixW::Attn(a) => a,
            MixW::Gdn(_) => unreachable!("layer {l} is not attention"),
        }
    }

    /// Layer `l`'s K values, V values, K scales and V scales (the scales of a q8_0 cache).
    fn kv(&self, st: &CudaState, l: usize) -> [Arg; 4] {
        let d = &self.dims;
        let at = st.bytes.kv_layer(d.kind_index(l), d.n_attention());
        let q8 = st.bytes.kv_cache == KvCache::Q8_0;
        [
            Arg::Ptr(st.state.at(at[0])),
            Arg::Ptr(st.state.at(at[1])),
            Arg::Ptr(if q8 { st.state.at(at[2]) } else { 0 }),
            Arg::Ptr(if q8 { st.state.at(at[3]) } else { 0 }),
        ]
    }

    /// The attention-split launch of a pass of `ntok` tokens and its split count (the merge must
    /// use the same).
    fn attn_split_plan(&self, st: &CudaState, ntok: usize) -> (plan::AttnLaunch, usize) {
        let kv = st.bytes.kv_cache;
        let tile = self.gpu.attn_tile_for(kv, st.pos + ntok, ntok);
        let (a, decode) = self.gpu.attn_launch(&self.dims, kv, tile);
        (a, attn_splits(st.pos + ntok, ntok, decode))
    }

    /// The query-tiled attention's launch, split count and split length for a pass of `ntok`
    /// tokens where it takes it (its merge must use the same).
    fn attn_prefill_plan(
        &self,
        st: &CudaState,
        ntok: usize,
    ) -> Option<(plan::PrefillLaunch, usize, usize)> {
        let (k, places) = self.gpu.attn_prefill_for(st.bytes.kv_cache, ntok)?;
        let n_ctx = st.pos + ntok;
        let rule = self.gpu.attn_prefill_rule();
        let (nsplit, len) =
            plan::attn_prefill_splits(n_ctx, k.blocks(&self.dims, ntok), places, rule);
        Some((k, nsplit, len))
    }

    /// An attention kernel's name for the state's cache type.
    fn kv_kernel(st: &CudaState, f16: &'static str, q8: &'static str) -> &'static str {
        match st.bytes.kv_cache {
            KvCache::F16 => f16,
            KvCache::Q8_0 => q8,
        }
    }
}
