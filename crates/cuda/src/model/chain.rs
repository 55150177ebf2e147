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
}

impl ChainMode {
    fn suffix(self) -> &'static str {
        match self {
            Self::Dot => "",
            Self::Synced => "_synced",
            Self::Free => "_free",
        }
    }
}

/// What the probe measured: seconds per replay of a graph launching it once per GEMV and of one
/// launching it once for all; the GEMVs; how many logits of the last GEMV (the LM head, after
/// the whole chain in one launch) differ in any bit from the decode kernel's (0 where not
/// compared); and where the blocks waited in one more launch of the whole chain.
#[derive(Clone, Copy, Debug)]
pub struct ChainTimes {
    pub each: f64,
    pub once: f64,
    pub gemvs: usize,
    pub differing: usize,
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
    /// Consumer warp 0 between GEMVs, in the consumers' block barriers and the grid barrier.
    pub barrier: [f64; 2],
    /// Consumer warp 0 staging the activations.
    pub staging: [f64; 2],
    /// Consumer warp 0 waiting for its tiles' bytes.
    pub tile_wait: [f64; 2],
    /// The block, start to end.
    pub block: [f64; 2],
    /// The multiprocessors' clock (GHz), mean and largest.
    pub clock_ghz: [f64; 2],
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
        }
    }
}

impl CudaModel {
    /// The persistent-step probe (`kernels/gemv_chain.cu`, consumers a row a warp) on a decode
    /// step's GEMVs in the step's order, in tiles of [`plan::CHAIN_WARPS`] rows; the consumers
    /// as `mode` says (the logits compared only where they multiply). The
    /// LM head is compared with the dp4a decode GEMV, whose arithmetic the probe's is. 1-bit
    /// and 2-bit g64 weights only (else `None`). The outputs go where the step's would; the
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
        let kernel = format!("gemv_chain_{fmt}{}", mode.suffix());
        let g = &self.gpu;
        // One descriptor per GEMV (kernels/gemv_chain.cu's ChainGemv: 5 pointers, 4 ints).
        let mut desc: Vec<u64> = Vec::new();
        let mut max_cols = 0;
        let mut max_tile = 0;
        for op in forward_ops(&self.dims, 1, Head::Last, true, Fusion::default()) {
            let Op::Gemv { mat, out, .. } = op else {
                continue;
            };
            let (m, io) = (self.mat(mat), self.gemv_io(st, mat, 1, out));
            if m.format != self.output.format {
                return Ok(None);
            }
            max_cols = max_cols.max(m.cols);
            max_tile = max_tile.max(plan::chain_tile_bytes(m.format, m.cols));
            desc.extend([m.codes.ptr, m.scales.ptr, io.xq, io.xs, io.out]);
            desc.push(m.rows as u64 | (m.cols as u64) << 32);
            desc.push(u64::from(io.accumulate));
        }
        let n = desc.len() / 7;
        let descs = g.upload(&desc, "chain descriptors")?;
        let count = g.alloc(8, "chain barrier")?;
        let x_bytes = plan::x_bytes(max_cols, false);
        let smem = g.smem_limit.saturating_sub(plan::GEMV1_STATIC_SMEM);
        let ring = smem.saturating_sub(x_bytes) / 128 * 128;
        let threads = 32 * (plan::CHAIN_WARPS + 1);
        if ring < max_tile || g.blocks_per_sm(&kernel, threads, smem)? < 1 {
            return Ok(None);
        }
        let blocks = g.info.multiprocessors.max(1) as usize;
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
                ],
            )
        };
        let launch = |first: usize, ng: usize| launch_with(first, ng, 0);
        let zero = || {
            g.launch(
                &st.stream,
                "fill_u64",
                (1, 1, 1),
                (64, 1, 1),
                &[Arg::Ptr(count.ptr), Arg::I32(1), Arg::U64(0)],
            )
        };
        let each = self.time_graph(st, || (0..n).try_for_each(|i| launch(i, 1)))?;
        let once = self.time_graph(st, || {
            zero()?;
            launch(0, n)
        })?;
        zero()?;
        launch_with(0, n, stats.ptr)?;
        let mut counters = vec![0u64; plan::CHAIN_STATS * blocks];
        g.read(&st.stream, stats.ptr, &mut counters)?;
        let waits = ChainWaits::from_stats(&counters);
        let mut differing = 0;
        if mode == ChainMode::Dot {
            let logits = |st: &CudaState| -> Result<Vec<u32>> {
                let mut v = vec![0u32; self.dims.vocab];
                g.read(&st.stream, st.s("logits"), &mut v)?;
                Ok(v)
            };
            zero()?;
            launch(0, n)?;
            let chained = logits(st)?;
            let (b1, b2) = (g.set_b1(false), g.set_b2(false));
            let plain = self.exec(
                st,
                &Op::Gemv {
                    mat: Mat::Output,
                    ntok: 1,
                    out: Out::Logits { argmax: false },
                },
            );
            g.set_b1(b1);
            g.set_b2(b2);
            plain?;
            differing = chained
                .iter()
                .zip(&logits(st)?)
                .filter(|(a, b)| a != b)
                .count();
        }
        st.stream.synchronize().ctx(|| "gemv chain".into())?;
        Ok(Some(ChainTimes {
            each,
            once,
            gemvs: n,
            differing,
            waits,
        }))
    }
}
