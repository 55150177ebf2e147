//! The persistent-step probe, for the harness: a decode step's GEMVs launched once each
//! against all of them in one launch with a grid-wide barrier between GEMVs
//! (`kernels/gemv_chain.cu`).

use super::*;

/// What the probe's consumers do with a tile (`kernels/gemv_chain.cu`'s MODE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainMode {
    /// Multiply, with the grid barrier and the activations' staging between GEMVs.
    Dot,
    /// Release each tile unread, keeping the barriers and the staging.
    Synced,
    /// Release each tile unread, with neither: the ring's streaming alone.
    Free,
    /// Multiply, with no grid barrier: each GEMV's input staged by segments, each once the
    /// previous GEMV's tiles that would produce it are counted done (by each block's
    /// signalling warp).
    Flow,
    /// As [`ChainMode::Flow`], releasing each tile unread: the dataflow's waits and staging
    /// without the arithmetic.
    FlowSynced,
    /// Multiply as the decode's binary GEMVs do (binary MMAs against plane words), with the
    /// grid barrier and the staging between GEMVs.
    Binary,
}

impl ChainMode {
    fn suffix(self) -> &'static str {
        match self {
            Self::Dot => "",
            Self::Synced => "_synced",
            Self::Free => "_free",
            Self::Flow => "_flow",
            Self::FlowSynced => "_flow_synced",
            Self::Binary => "_bin",
        }
    }
}

/// What the probe measured: seconds per replay of a graph launching it once per GEMV and of one
/// launching it once for all; the GEMVs; how many logits of the last GEMV (the LM head, after
/// the whole chain in one launch) differ in any bit from the dp4a decode kernel's (0 where not
/// compared), or with [`ChainMode::Binary`] their largest difference from the binary decode
/// kernel's over the largest of its logits' magnitudes (its sums run in another order); and
/// where the blocks waited in one more launch of the whole chain.
#[derive(Clone, Copy, Debug)]
pub struct ChainTimes {
    pub each: f64,
    pub once: f64,
    pub gemvs: usize,
    pub differing: usize,
    pub relative: f64,
    pub waits: ChainWaits,
}

/// Per block of one launch of the whole chain, the mean and the largest over blocks (µs; the
/// multiprocessors' cycles converted at the clock measured over each block's run).
#[derive(Clone, Copy, Debug, Default)]
pub struct ChainWaits {
    /// The producer waiting for room in its ring.
    pub producer: [f64; 2],
    /// Tiles a block's producer issued.
    pub tiles: [f64; 2],
    /// Consumer warp 0 between GEMVs, in the consumers' block barriers and the grid barrier
    /// (in the flow modes, waiting for its segments' producers and in the barriers after).
    pub barrier: [f64; 2],
    /// Consumer warp 0 staging the activations.
    pub staging: [f64; 2],
    /// Consumer warp 0 waiting for its tiles' bytes.
    pub tile_wait: [f64; 2],
    /// The block, start to end.
    pub block: [f64; 2],
    /// The multiprocessors' clock (GHz), mean and largest.
    pub clock_ghz: [f64; 2],
    /// The signalling warp's GPU-scope fences (the flow modes; 0 in the others).
    pub fences: [f64; 2],
}

impl ChainWaits {
    /// From the kernel's counters, [`plan::CHAIN_STATS`] a block.
    fn from_stats(stats: &[u64]) -> Self {
        let blocks: Vec<&[u64]> = stats.chunks_exact(plan::CHAIN_STATS).collect();
        let ghz = |b: &[u64]| b[6] as f64 / b[5].max(1) as f64;
        let per = |f: &dyn Fn(&[u64]) -> f64| -> [f64; 2] {
            let v: Vec<f64> = blocks.iter().map(|b| f(b)).collect();
            let n = v.len().max(1) as f64;
            [
                v.iter().sum::<f64>() / n,
                v.iter().copied().fold(0.0, f64::max),
            ]
        };
        let us = |i: usize| move |b: &[u64]| b[i] as f64 / ghz(b).max(1e-9) / 1e3;
        Self {
            producer: per(&us(0)),
            tiles: per(&|b| b[1] as f64),
            barrier: per(&us(2)),
            staging: per(&us(3)),
            tile_wait: per(&us(4)),
            block: per(&|b| b[5] as f64 / 1e3),
            clock_ghz: per(&ghz),
            fences: per(&|b| b[7] as f64),
        }
    }
}

impl CudaModel {
    /// The persistent-step probe (`kernels/gemv_chain.cu`) on a decode step's GEMVs in the
    /// step's order, in tiles of [`plan::CHAIN_WARPS`] rows; the consumers as `mode` says (the
    /// logits compared only where they multiply). The LM head is compared with the decode GEMV
    /// whose arithmetic the mode's is: the dp4a kernel's bit for bit (consumers a row a warp),
    /// the binary kernel's within rounding ([`ChainMode::Binary`]). 1-bit and 2-bit g64
    /// weights only (else `None`). The outputs go where the step's would; the
    /// state's contents are meaningless afterwards.
    #[doc(hidden)]
    pub fn time_gemv_chain(
        &self,
        st: &mut CudaState,
        mode: ChainMode,
    ) -> Result<Option<ChainTimes>> {
        let fmt = match self.output.format {
            GpuFormat::Q1 => "q1",
            GpuFormat::Q2G64 => "q2g64",
            GpuFormat::Q2G128 => return Ok(None),
        };
        let binary = mode == ChainMode::Binary;
        let kernel = format!("gemv_chain_{fmt}{}", mode.suffix());
        let g = &self.gpu;
        // One descriptor per GEMV (kernels/gemv_chain.cu's ChainGemv: 5 pointers, 3 ints and
        // the padding to 56 bytes).
        let mut desc: Vec<u64> = Vec::new();
        let mut max_cols = 0;
        let mut max_tile = 0;
        // Binary pads each of a tile's rows by 16 bytes.
        let pad = if binary { 16 * plan::CHAIN_WARPS } else { 0 };
        for op in forward_ops(&self.dims, 1, Head::Last, true, Fusion::default()) {
            let Op::Gemv { mat, out, .. } = op else {
                continue;
            };
            let (m, io) = (self.mat(mat), self.gemv_io(st, mat, 1, out));
            if m.format != self.output.format {
                return Ok(None);
            }
            max_cols = max_cols.max(m.cols);
            max_tile = max_tile.max(plan::chain_tile_bytes(m.format, m.cols) + pad);
            desc.extend([m.codes.ptr, m.scales.ptr, io.xq, io.xs, io.out]);
            desc.push(m.rows as u64 | (m.cols as u64) << 32);
            desc.push(u64::from(io.accumulate));
        }
        let n = desc.len() / 7;
        let descs = g.upload(&desc, "chain descriptors")?;
        let count = g.alloc(8, "chain barrier")?;
        let blocks = g.info.multiprocessors.max(1) as usize;
        // The flow modes' counts (a block's finished tiles of each GEMV, tagged with the
        // launch's epoch) and the epoch, which each launch of the chain (or of each of its
        // GEMVs) raises first.
        let done = g.alloc(4 * n * blocks, "chain counts")?;
        let epoch = g.alloc(8, "chain epoch")?;
        let x_bytes = plan::x_bytes(max_cols, false);
        let smem = g.smem_limit.saturating_sub(plan::GEMV1_STATIC_SMEM);
        // Binary's partial sums of two tiles (16 rows by every consumer warp) after the ring.
        let part = if binary {
            2 * 4 * 16 * plan::CHAIN_WARPS
        } else {
            0
        };
        let ring = smem.saturating_sub(x_bytes + part) / 128 * 128;
        // The consumers, the producer and the flow modes' signaller.
        let threads = 32 * (plan::CHAIN_WARPS + 2);
        if ring < max_tile || g.blocks_per_sm(&kernel, threads, smem)? < 1 {
            return Ok(None);
        }
        let grid = (blocks as u32, 1, 1);
        let stats = g.alloc(8 * plan::CHAIN_STATS * blocks, "chain counters")?;
        let launch_with = |first: usize, ng: usize, stats: u64| {
            g.launch_smem(
                &st.stream,
                &kernel,
                grid,
                (threads as u32, 1, 1),
                smem as u32,
                &[
                    Arg::Ptr(descs.ptr + 56 * first as u64),
                    Arg::I32(ng as i32),
                    Arg::I32(x_bytes as i32),
                    Arg::I32(ring as i32),
                    Arg::Ptr(count.ptr),
                    Arg::Ptr(stats),
                    Arg::Ptr(done.ptr),
                    Arg::Ptr(epoch.ptr),
                ],
            )
        };
        let launch = |first: usize, ng: usize| launch_with(first, ng, 0);
        let bump = || {
            g.launch(
                &st.stream,
                "gemv_chain_epoch",
                (1, 1, 1),
                (32, 1, 1),
                &[Arg::Ptr(epoch.ptr)],
            )
        };
        // Before each launch of the whole chain: the epoch raised, the barrier's count zeroed.
        let before_chain = || {
            bump()?;
            g.launch(
                &st.stream,
                "fill_u64",
                (1, 1, 1),
                (64, 1, 1),
                &[Arg::Ptr(count.ptr), Arg::I32(1), Arg::U64(0)],
            )
        };
        let each = self.time_graph(st, || {
            bump()?;
            (0..n).try_for_each(|i| launch(i, 1))
        })?;
        let once = self.time_graph(st, || {
            before_chain()?;
            launch(0, n)
        })?;
        before_chain()?;
        launch_with(0, n, stats.ptr)?;
        let mut counters = vec![0u64; plan::CHAIN_STATS * blocks];
        g.read(&st.stream, stats.ptr, &mut counters)?;
        let waits = ChainWaits::from_stats(&counters);
        let (mut differing, mut relative) = (0, 0.0);
        if matches!(mode, ChainMode::Dot | ChainMode::Flow | ChainMode::Binary) {
            let logits = |st: &CudaState| -> Result<Vec<u32>> {
                let mut v = vec![0u32; self.dims.vocab];
                g.read(&st.stream, st.s("logits"), &mut v)?;
                Ok(v)
            };
            before_chain()?;
            launch(0, n)?;
            let chained = logits(st)?;
            // The decode GEMV whose arithmetic the mode's is: the binary one, or dp4a.
            let (was_b1, was_b2) = (g.set_b1(binary), g.set_b2(binary));
            let plain = self.exec(
                st,
                &Op::Gemv {
                    mat: Mat::Output,
                    ntok: 1,
                    out: Out::Logits { argmax: false },
                },
            );
            g.set_b1(was_b1);
            g.set_b2(was_b2);
            plain?;
            let plain = logits(st)?;
            if binary {
                let (mut diff, mut top) = (0.0f64, 0.0f64);
                for (&a, &b) in chained.iter().zip(&plain) {
                    let (a, b) = (f64::from(f32::from_bits(a)), f64::from(f32::from_bits(b)));
                    // A NaN must not pass as a small difference.
                    diff = if (a - b).is_nan() {
                        f64::INFINITY
                    } else {
                        diff.max((a - b).abs())
                    };
                    top = top.max(b.abs());
                }
                relative = diff / top.max(f64::MIN_POSITIVE);
            } else {
                differing = chained.iter().zip(&plain).filter(|(a, b)| a != b).count();
            }
        }
        st.stream.synchronize().ctx(|| "gemv chain".into())?;
        Ok(Some(ChainTimes {
            each,
            once,
            gemvs: n,
            differing,
            relative,
            waits,
        }))
    }
}
