//! The backend's switches: which paths and kernels a pass takes, read at start from the
//! environment and set by the harness and the benchmarks for measuring.

use std::sync::atomic::{AtomicBool, Ordering};

use super::decode_gemv::{X_COPY_ALL, X_COPY_OFF, X_COPY_PLAN};
use super::{DevMat, FoldKind, FoldOut, Gpu};
use crate::plan::{self, Dims, Gemv1Tuning};
use crate::repack::GpuFormat;

/// The prefetch setting that leaves each matrix its default ([`Gpu::prefetch_for`]).
pub(super) const PREFETCH_BY_MATRIX: usize = usize::MAX;
/// [`Gpu::attn_tile`]'s setting for "the cache type's default tile".
pub const ATTN_TILE_BY_CACHE: usize = 0;

/// Whether an attention tile names a kernel a device runs (the tensor-core ones, 16, from
/// sm_80).
pub(super) fn attn_tile_runs(tile: usize, ampere: bool) -> bool {
    plan::ATTN_TILES.contains(&tile) && (tile != 16 || ampere)
}

impl Gpu {
    /// Whether draws with a top-k limit select their candidates on the GPU.
    pub fn topk(&self) -> bool {
        self.topk.load(Ordering::Relaxed)
    }

    /// Whether draws without a top-k limit get their candidates and weight sums on the GPU.
    pub fn topk_sums(&self) -> bool {
        self.topk() && self.topk_sums.load(Ordering::Relaxed)
    }

    /// Sets the sums' part of [`Gpu::topk_sums`] (the harness checks them).
    pub fn set_topk_sums(&self, on: bool) {
        self.topk_sums.store(on, Ordering::Relaxed);
    }

    /// Whether kernels are launched with programmatic dependent launch.
    pub fn pdl(&self) -> bool {
        self.pdl.load(Ordering::Relaxed)
    }

    /// Whether one-token GEMVs use the bulk-copy kernel.
    pub fn gemv1(&self) -> bool {
        self.gemv1.load(Ordering::Relaxed)
    }

    /// Whether a pass of `ntok` tokens runs the recurrence in chunks.
    pub fn gdn_chunked(&self, ntok: usize) -> bool {
        ntok >= plan::GDN_CHUNK_MIN_TOKENS && self.gdn_chunked.load(Ordering::Relaxed)
    }

    /// Turns the chunked recurrence on (where its shared memory fits the device) or off (token
    /// by token); returns the previous setting.
    pub fn set_gdn_chunked(&self, on: bool) -> bool {
        self.gdn_chunked
            .swap(on && self.gdn_chunks_fit, Ordering::Relaxed)
    }

    /// Key rows per lane of the recurrent step in multi-token passes.
    pub fn gdn_rows(&self) -> usize {
        self.gdn_rows.load(Ordering::Relaxed)
    }

    /// Key rows per lane of the recurrent step in a pass of `ntok` tokens.
    pub fn gdn_rows_for(&self, ntok: usize) -> usize {
        if ntok > 1 {
            self.gdn_rows()
        } else {
            plan::GDN_STEP_DECODE_ROWS
        }
    }

    /// Warps of a decode step's `quant_swiglu` block where nothing is rotated.
    pub fn swiglu_warps(&self) -> usize {
        self.swiglu_warps
    }

    /// Sets [`Gpu::gdn_rows`] (one of [`plan::GDN_STEP_ROWS`], for measuring the variants).
    pub fn set_gdn_rows(&self, rows: usize) {
        assert!(
            plan::GDN_STEP_ROWS.contains(&rows),
            "no recurrent step of {rows} rows per lane"
        );
        self.gdn_rows.store(rows, Ordering::Relaxed);
    }

    /// Whether multi-token passes multiply on the tensor cores.
    pub fn mma(&self) -> bool {
        self.mma.load(Ordering::Relaxed)
    }

    /// Turns the tensor-core GEMM off or back on (never on for a device without it).
    pub fn set_mma(&self, on: bool) {
        self.mma
            .store(on && self.info.compute_capability.0 >= 8, Ordering::Relaxed);
    }

    /// The split attention's staging the program was compiled for ([`crate::compile::attn_ring`]).
    pub fn attn_ring(&self) -> plan::AttnRing {
        self.attn_ring
    }

    /// The grid of a split kernel's launch ([`plan::attn_split_grid`], in the order the program
    /// was compiled for).
    pub fn attn_split_grid(&self, n_head_kv: usize, nsplit: usize, ntok: usize) -> (u32, u32, u32) {
        plan::attn_split_grid(n_head_kv, nsplit, ntok, self.attn_token_major)
    }

    /// Whether this device runs the attention-split kernel `name`.
    pub fn attn_runs(&self, name: &str) -> bool {
        self.attn_blocks_per_sm.contains_key(name)
    }

    /// Cache positions per warp tile of the attention split: one of [`plan::ATTN_TILES`], or
    /// [`ATTN_TILE_BY_CACHE`] (the default, `NIWAKI_CUDA_ATTN_TILE` unset): by cache type,
    /// context and pass, [`plan::default_attn_tile`].
    pub fn attn_tile(&self) -> usize {
        self.attn_tile.load(Ordering::Relaxed)
    }

    /// The tile a pass of `ntok` tokens over a context of `n_ctx` positions of a `kv` cache
    /// takes.
    pub fn attn_tile_for(&self, kv: plan::KvCache, n_ctx: usize, ntok: usize) -> usize {
        match self.attn_tile() {
            ATTN_TILE_BY_CACHE => plan::default_attn_tile(kv, n_ctx, ntok),
            t => t,
        }
    }

    /// The one-kernel short attention's launch where a one-token pass over `n_ctx` positions of
    /// a `kv` cache takes it (heads of whole 128-value pieces, the shared memory there, the
    /// context at most [`Gpu::set_attn_short_max`]'s).
    pub fn attn_short_for(&self, kv: plan::KvCache, n_ctx: usize) -> Option<plan::AttnLaunch> {
        if n_ctx > self.attn_short_max.load(Ordering::Relaxed) {
            return None;
        }
        self.attn_short_launch(kv)
    }

    /// The one-kernel short attention's launch for a `kv` cache, where this device holds it.
    pub fn attn_short_launch(&self, kv: plan::KvCache) -> Option<plan::AttnLaunch> {
        self.attn_short
            .iter()
            .find(|(k, _)| *k == kv)
            .map(|&(_, a)| a)
    }

    /// Sets the longest context whose one-token passes take the short attention (0: none);
    /// returns the previous. A state's captured graphs keep what they were captured with.
    pub fn set_attn_short_max(&self, n: usize) -> usize {
        self.attn_short_max.swap(n, Ordering::Relaxed)
    }

    /// The query-tiled attention's launch and the places its splits fill (the device's, times
    /// the waves asked for), where a pass of `ntok` tokens over a `kv` cache takes it: several
    /// tokens, a device that runs it for that cache, and the cache type's setting on (over an
    /// f16 cache, the warpgroup form where it is on and runs).
    pub fn attn_prefill_for(
        &self,
        kv: plan::KvCache,
        ntok: usize,
    ) -> Option<(plan::PrefillLaunch, usize)> {
        let on = match kv {
            plan::KvCache::F16 => self.attn_prefill_on[0],
            plan::KvCache::Q8_0 => self.attn_prefill_on[1],
        };
        let wg = self
            .attn_prefill_wg_launch()
            .filter(|_| self.attn_prefill_wg_on && kv == plan::KvCache::F16);
        let (a, places) = wg
            .or_else(|| self.attn_prefill_launch(kv))
            .filter(|_| on && ntok > 1)?;
        Some((a, places * self.attn_prefill_waves))
    }

    /// How multi-token passes pick the query-tiled attention's split count.
    pub fn attn_prefill_rule(&self) -> plan::SplitRule {
        self.attn_prefill_rule
    }

    /// The query-tiled attention's launch and places for a `kv` cache where this device runs
    /// it, whatever the switches say (the harness checks it).
    pub fn attn_prefill_launch(&self, kv: plan::KvCache) -> Option<(plan::PrefillLaunch, usize)> {
        self.attn_prefill
            .iter()
            .find(|(k, ..)| *k == kv)
            .map(|&(_, a, places)| (a, places))
    }

    /// The warpgroup-MMA form (f16 cache; the entry `NIWAKI_CUDA_ATTN_PREFILL_WG_ENTRY` names)
    /// and its places where this device runs it, whatever `NIWAKI_CUDA_ATTN_PREFILL_WG` says
    /// (the harness checks it).
    pub fn attn_prefill_wg_launch(&self) -> Option<(plan::PrefillLaunch, usize)> {
        self.attn_prefill_wg_forms[self.attn_prefill_wg_entry as usize]
    }

    /// Every entry of the warpgroup-MMA form ([`plan::WgEntry::ALL`]) where this device runs
    /// them (the harness checks them all).
    pub fn attn_prefill_wg_forms(
        &self,
    ) -> [Option<(plan::PrefillLaunch, usize)>; plan::WgEntry::ALL.len()] {
        self.attn_prefill_wg_forms
    }

    /// Sets [`Gpu::attn_tile`] (for measuring the variants; others, and the tensor-core
    /// kernels' 16 before sm_80, are ignored).
    pub fn set_attn_tile(&self, tile: usize) {
        let ampere = self.info.compute_capability.0 >= 8;
        if tile == ATTN_TILE_BY_CACHE || attn_tile_runs(tile, ampere) {
            self.attn_tile.store(tile, Ordering::Relaxed);
        }
    }

    /// The attention-split launch for a cache type and tile ([`Gpu::attn_tile_for`]), and its
    /// splits per kv head in a one-token pass (one wave of blocks, or
    /// `NIWAKI_CUDA_ATTN_SPLITS`'s).
    pub fn attn_launch(
        &self,
        dims: &Dims,
        kv: plan::KvCache,
        tile: usize,
    ) -> (plan::AttnLaunch, usize) {
        let mut a = plan::attn_split_launch(dims, kv, tile, self.attn_ring);
        if !self.attn_blocks_per_sm.contains_key(a.kernel) {
            // A variant this device cannot run: the SIMT kernel with tiles of 8, which fits.
            a = plan::attn_split_launch(dims, kv, 8, self.attn_ring);
        }
        let bps = self.attn_blocks_per_sm.get(a.kernel).copied().unwrap_or(1);
        let sms = self.info.multiprocessors.max(1) as usize;
        let decode = self
            .attn_decode_splits
            .unwrap_or_else(|| plan::attn_decode_splits(bps, sms, dims.n_head_kv));
        (a, decode)
    }

    /// Bytes of `next` that the one-token GEMV before it pulls into the L2 cache (0: none). By
    /// default, by the kernel `next` goes to without a folded norm: with one it goes to the
    /// same kernel (a binary kernel declining the norm runs it apart, [`Gpu::gemv_decode`]).
    pub fn prefetch_for(&self, next: &DevMat) -> usize {
        match self.prefetch_bytes.load(Ordering::Relaxed) {
            PREFETCH_BY_MATRIX => plan::default_prefetch_bytes(self.takes_b1(next, false)),
            bytes => bytes,
        }
    }

    /// The prefetch's setting: bytes for every matrix, or `None` for each matrix's default.
    pub fn prefetch_setting(&self) -> Option<usize> {
        match self.prefetch_bytes.load(Ordering::Relaxed) {
            PREFETCH_BY_MATRIX => None,
            bytes => Some(bytes),
        }
    }

    /// Sets [`Gpu::prefetch_setting`] (for measuring it; never on before sm_90, and captured
    /// graphs keep what they were built with).
    pub fn set_prefetch(&self, bytes: Option<usize>) {
        let hopper = self.info.sm90();
        let v = match bytes {
            _ if !hopper => 0,
            None => PREFETCH_BY_MATRIX,
            Some(b) => b.min(PREFETCH_BY_MATRIX - 1),
        };
        self.prefetch_bytes.store(v, Ordering::Relaxed);
    }

    /// Which ops of a one-token pass run merged.
    pub fn fusion(&self) -> plan::Fusion {
        plan::Fusion {
            norm: self.gemv1() && self.norm_fusion() != plan::NormFusion::Apart,
            gdn: self.fuse_gdn.load(Ordering::Relaxed),
            attn: self.fuse_attn.load(Ordering::Relaxed),
            fold: self.gemv1() && self.fold_norm.load(Ordering::Relaxed),
            swiglu: self.gemv1() && self.fold_swiglu.load(Ordering::Relaxed),
            // A property of each pass (its context): the model sets it.
            attn_short: false,
        }
    }

    /// Turns the SwiGLUs folded into the gate | up GEMVs of one-token passes on or off (sm_90
    /// only, and only where the norms are folded too); returns the previous setting.
    pub fn set_fold_swiglu(&self, on: bool) -> bool {
        self.swap_on_hopper(&self.fold_swiglu, on)
    }

    /// Sets a switch of an sm_90-only path (never on elsewhere); returns the previous setting.
    fn swap_on_hopper(&self, switch: &AtomicBool, on: bool) -> bool {
        switch.swap(on && self.info.sm90(), Ordering::Relaxed)
    }

    /// Sets which residual GEMVs gather their folded norms' pieces in clusters (sm_90 only:
    /// none elsewhere); returns the previous setting. A state's captured graphs keep what they
    /// were captured with.
    pub fn set_fold_cluster(&self, c: plan::ClusterFold) -> plan::ClusterFold {
        let c = if self.info.sm90() {
            c
        } else {
            plan::ClusterFold::Off
        };
        plan::ClusterFold::from_code(self.fold_cluster.swap(c.code(), Ordering::Relaxed))
    }

    /// Which residual GEMVs gather their folded norms' pieces in clusters.
    pub fn fold_cluster(&self) -> plan::ClusterFold {
        plan::ClusterFold::from_code(self.fold_cluster.load(Ordering::Relaxed))
    }

    /// Turns the plane words of one-token passes on or off (sm_90 only); returns the previous
    /// setting. A state's captured graphs keep what they were captured with.
    pub fn set_b1_planes(&self, on: bool) -> bool {
        self.swap_on_hopper(&self.b1_planes, on)
    }

    /// Whether one-token passes of models with 1-bit matrices use plane words.
    pub(crate) fn b1_planes(&self) -> bool {
        self.b1_planes.load(Ordering::Relaxed)
    }

    /// Decode GEMVs this device has launched on their activations' plane words.
    #[doc(hidden)]
    pub fn planes_launches(&self) -> usize {
        self.planes_launches.load(Ordering::Relaxed)
    }

    /// One-kernel short attentions this device has launched.
    #[doc(hidden)]
    pub fn attn_short_launches(&self) -> usize {
        self.attn_short_launches.load(Ordering::Relaxed)
    }

    /// Counts a launch of the one-kernel short attention.
    pub(crate) fn count_attn_short(&self) {
        self.attn_short_launches.fetch_add(1, Ordering::Relaxed);
    }

    /// The kernels one-token passes leave out (`NIWAKI_CUDA_SKIP`, a measurement only: the
    /// outputs are wrong), where set.
    pub fn skip(&self) -> Option<plan::Skip> {
        self.skip
    }

    /// Decode GEMVs this device has launched with the norm's fold gathered in a cluster.
    #[doc(hidden)]
    pub fn cluster_fold_launches(&self) -> usize {
        self.cluster_fold_launches.load(Ordering::Relaxed)
    }

    /// Counts a decode GEMV launched with its fold gathered in a cluster.
    pub(crate) fn count_cluster_fold(&self) {
        self.cluster_fold_launches.fetch_add(1, Ordering::Relaxed);
    }

    /// Turns the norms folded into the residual GEMVs of one-token passes on or off (sm_90
    /// only); returns the previous setting (as [`Gpu::set_fuse_gdn`]).
    pub fn set_fold_norm(&self, on: bool) -> bool {
        self.swap_on_hopper(&self.fold_norm, on)
    }

    /// Turns the one-kernel recurrence of one-token passes on or off (for checking it against
    /// the three kernels it replaces); returns the previous setting. A state's captured graphs
    /// keep what they were captured with.
    pub fn set_fuse_gdn(&self, on: bool) -> bool {
        self.fuse_gdn.swap(on, Ordering::Relaxed)
    }

    /// Turns the one-kernel attention merge and quantization of one-token passes on or off;
    /// returns the previous setting (as [`Gpu::set_fuse_gdn`]).
    pub fn set_fuse_attn(&self, on: bool) -> bool {
        self.fuse_attn.swap(on, Ordering::Relaxed)
    }

    /// The decode-GEMV tuning for a matrix: the defaults, or the knobs set by
    /// [`Gpu::set_gemv1_knobs`].
    pub fn gemv1_tuning(&self, format: GpuFormat, cols: usize) -> Gemv1Tuning {
        let shared = self.gemv1_share.load(Ordering::Relaxed);
        let mut t = Gemv1Tuning::for_shape_with(format, cols, shared);
        match self.blocks_per_sm.load(Ordering::Relaxed) {
            0 => {}
            n => t.blocks_per_sm = n,
        }
        match self.smem_budget.load(Ordering::Relaxed) {
            0 => {}
            n => t.smem_budget = n,
        }
        t
    }

    /// Which decode GEMVs norm their input themselves.
    pub fn norm_fusion(&self) -> plan::NormFusion {
        *self
            .norm_fusion
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sets norm fusion and the dp4a decode GEMV's blocks per multiprocessor and shared-memory
    /// budget (0: default), for measuring them; captured graphs keep what they were built with.
    pub fn set_gemv1_knobs(
        &self,
        norm: plan::NormFusion,
        blocks_per_sm: usize,
        smem_budget: usize,
    ) {
        *self
            .norm_fusion
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = norm;
        self.blocks_per_sm.store(blocks_per_sm, Ordering::Relaxed);
        self.smem_budget.store(smem_budget, Ordering::Relaxed);
    }

    /// Turns the sm_90 launch paths off or back on (for measuring what each brings; a state's
    /// captured graphs keep the setting they were captured with). Never turns on what the
    /// device lacks.
    pub fn set_fast_paths(&self, pdl: bool, gemv1: bool) {
        let hopper = self.info.sm90();
        self.pdl.store(pdl && hopper, Ordering::Relaxed);
        self.gemv1.store(gemv1 && hopper, Ordering::Relaxed);
    }

    /// Turns the binary-tensor-core decode GEMV of 1-bit rows off or back on (never on where
    /// the device lacks it); returns the previous setting.
    pub fn set_b1(&self, on: bool) -> bool {
        self.swap_on_hopper(&self.b1, on)
    }

    /// Whether 2-bit decode GEMVs go to the binary tensor cores where their plan takes them.
    pub fn b2(&self) -> bool {
        self.b2.load(Ordering::Relaxed)
    }

    /// Turns the binary-tensor-core decode GEMV of 2-bit rows on or off (as [`Gpu::set_b1`]);
    /// returns the previous setting.
    pub fn set_b2(&self, on: bool) -> bool {
        self.swap_on_hopper(&self.b2, on)
    }

    /// How many of a decode GEMV's first tiles are requested before its wait for the previous
    /// kernel.
    pub(super) fn early_tiles(&self) -> usize {
        self.early_tiles.load(Ordering::Relaxed)
    }

    /// Whether the f16 GEMM takes narrower tiles for short passes
    /// ([`plan::hgemm_tokens_for`]).
    pub fn hgemm_narrow(&self) -> bool {
        self.hgemm_narrow.load(Ordering::Relaxed)
    }

    /// Sets [`Gpu::hgemm_narrow`]; returns the previous setting. For the harness's
    /// comparisons.
    #[doc(hidden)]
    pub fn set_hgemm_narrow(&self, on: bool) -> bool {
        self.hgemm_narrow.swap(on, Ordering::Relaxed)
    }

    /// The longest pass launched with programmatic dependent launch ([`Gpu::pdl`] on).
    pub fn pdl_tokens(&self) -> usize {
        self.pdl_tokens.load(Ordering::Relaxed)
    }

    /// Sets [`Gpu::pdl_tokens`] (at least 1); returns the previous setting. For the harness's
    /// comparisons.
    #[doc(hidden)]
    pub fn set_pdl_tokens(&self, n: usize) -> usize {
        self.pdl_tokens.swap(n.max(1), Ordering::Relaxed)
    }

    /// The fewest tokens a pass multiplies on the tensor cores.
    pub fn gemm_min_tokens(&self) -> usize {
        self.gemm_min_tokens.load(Ordering::Relaxed)
    }

    /// Sets [`Gpu::gemm_min_tokens`] (at least 2: one token takes the decode GEMVs); returns
    /// the previous setting. A model sets its format's ([`plan::short_passes`]); the harness
    /// compares others.
    pub fn set_gemm_min_tokens(&self, n: usize) -> usize {
        self.gemm_min_tokens.swap(n.max(2), Ordering::Relaxed)
    }

    /// Sets [`Gpu::gemm_min_tokens`] to a model format's rule, unless
    /// `NIWAKI_CUDA_GEMM_MIN_TOKENS` set it at open.
    pub(crate) fn default_gemm_min_tokens(&self, n: usize) {
        if !self.gemm_min_tokens_switched {
            self.set_gemm_min_tokens(n);
        }
    }

    /// Sets [`Gpu::early_tiles`]; returns the previous setting. For the harness's comparisons.
    #[doc(hidden)]
    pub fn set_early_tiles(&self, n: usize) -> usize {
        self.early_tiles.swap(n, Ordering::Relaxed)
    }

    /// Rows per tile the binary decode GEMV asks for (16 or 32).
    #[doc(hidden)]
    pub fn b1_tile_rows(&self) -> usize {
        self.b1_tile_rows.load(Ordering::Relaxed)
    }

    /// Sets [`Gpu::b1_tile_rows`] (16 or 32); returns the previous setting. For the harness's
    /// comparison of the two.
    #[doc(hidden)]
    pub fn set_b1_tile_rows(&self, rows: usize) -> usize {
        self.b1_tile_rows
            .swap(if rows == 32 { 32 } else { 16 }, Ordering::Relaxed)
    }

    /// Whether the widest 1-bit rows' binary decode GEMVs stage their activations in shared
    /// memory where their plan has such a kernel ([`plan::x_staged`]); returns the previous
    /// setting. For the harness's checks.
    #[doc(hidden)]
    pub fn set_x_stage(&self, on: bool) -> bool {
        self.b1_x_stage.swap(on, Ordering::Relaxed)
    }

    /// Whether the widest 1-bit rows' binary decode GEMVs stage their activations in shared
    /// memory ([`plan::x_staged`]).
    pub fn x_stage(&self) -> bool {
        self.b1_x_stage.load(Ordering::Relaxed)
    }

    /// Where the dp4a decode GEMV stages its activations by the tensor-map copy: `Some(true)`
    /// wherever the row allows, `Some(false)` nowhere, `None` as the plan prefers (the default);
    /// returns the previous setting. For the harness's checks of both layouts.
    #[doc(hidden)]
    pub fn set_x_copy(&self, everywhere: Option<bool>) -> Option<bool> {
        let v = match everywhere {
            Some(true) => X_COPY_ALL,
            Some(false) => X_COPY_OFF,
            None => X_COPY_PLAN,
        };
        match self.x_copy.swap(v, Ordering::Relaxed) {
            X_COPY_ALL => Some(true),
            X_COPY_OFF => Some(false),
            _ => None,
        }
    }

    /// Decode GEMVs this device has launched with a folded norm.
    #[doc(hidden)]
    pub fn fold_launches(&self) -> usize {
        self.fold_launches.load(Ordering::Relaxed)
    }

    /// Decode GEMVs this device has launched with a folded SwiGLU.
    #[doc(hidden)]
    pub fn swiglu_launches(&self) -> usize {
        self.swiglu_launches.load(Ordering::Relaxed)
    }

    /// Counts a decode GEMV launched with `fold`.
    pub(super) fn count_fold(&self, fold: Option<FoldOut>) {
        let counter = match fold.map(|f| f.kind) {
            Some(FoldKind::Norm { .. }) => &self.fold_launches,
            Some(FoldKind::Swiglu { .. }) => &self.swiglu_launches,
            None => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Launches of the 2-bit binary decode GEMVs from tile images this device has made.
    #[doc(hidden)]
    pub fn image_launches(&self) -> usize {
        self.image_launches.load(Ordering::Relaxed)
    }

    /// Launches of the swizzled decode GEMVs (`gemv1_*_x`) this device has made.
    #[doc(hidden)]
    pub fn x_copy_launches(&self) -> usize {
        self.x_copy_launches.load(Ordering::Relaxed)
    }

    /// With `nodot`, decode GEMVs (of the formats that have the probe) stream their weights and
    /// multiply nothing: their outputs are wrong. For timing the memory pipeline against the
    /// arithmetic; returns the previous setting.
    #[doc(hidden)]
    pub fn set_gemv1_probe(&self, nodot: bool) -> bool {
        self.gemv1_nodot.swap(nodot, Ordering::Relaxed)
    }
}
