//! The persistent-step probe, for the harness: a decode step's GEMVs launched once each
//! against all of them in one launch with a grid-wide barrier between GEMVs
//! (`kernels/gemv_chain.cu`).

use super::*;

/// What the probe measured: seconds per replay of a graph launching it once per GEMV and of one
/// launching it once for all; the GEMVs; and how many logits of the last GEMV (the LM head,
/// after the whole chain in one launch) differ in any bit from the decode kernel's (0 where not
/// compared).
#[derive(Clone, Copy, Debug)]
pub struct ChainTimes {
    pub each: f64,
    pub once: f64,
    pub gemvs: usize,
    pub differing: usize,
}

impl CudaModel {
    /// The persistent-step probe (`kernels/gemv_chain.cu`, consumers a row a warp) on a decode
    /// step's GEMVs in the step's order, `blocks` resident blocks a multiprocessor in the shape
    /// [`plan::chain_shape`] gives (`None` where they do not fit, or a tile not a ring). `dot` false:
    /// the consumers release each tile without multiplying (the logits are not compared). The
    /// LM head is compared with the dp4a decode GEMV, whose arithmetic the probe's is. 1-bit
    /// and 2-bit g64 weights only (else `None`). The outputs go where the step's would; the
    /// state's contents are meaningless afterwards.
    #[doc(hidden)]
    pub fn time_gemv_chain(
        &self,
        st: &mut CudaState,
        dot: bool,
        blocks: usize,
    ) -> Result<Option<ChainTimes>> {
        let fmt = match self.output.format {
            GpuFormat::Q1 => "q1",
            GpuFormat::Q2G64 => "q2g64",
            GpuFormat::Q2G128 => return Ok(None),
        };
        let g = &self.gpu;
        let Some((warps, suffix, smem)) = plan::chain_shape(blocks, g.smem_limit) else {
            return Ok(None);
        };
        let kernel = format!(
            "gemv_chain_{fmt}{}{suffix}",
            if dot { "" } else { "_nodot" }
        );
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
            max_tile = max_tile.max(plan::chain_tile_bytes(m.format, m.cols, warps));
            desc.extend([m.codes.ptr, m.scales.ptr, io.xq, io.xs, io.out]);
            desc.push(m.rows as u64 | (m.cols as u64) << 32);
            desc.push(u64::from(io.accumulate));
        }
        let n = desc.len() / 7;
        let descs = g.upload(&desc, "chain descriptors")?;
        let count = g.alloc(8, "chain barrier")?;
        let x_bytes = plan::x_bytes(max_cols, false);
        let ring = smem.saturating_sub(x_bytes) / 128 * 128;
        let threads = 32 * (warps + 1);
        if ring < max_tile || g.blocks_per_sm(&kernel, threads, smem)? < blocks {
            return Ok(None);
        }
        let grid = (g.info.multiprocessors.max(1) as u32 * blocks as u32, 1, 1);
        let launch = |first: usize, ng: usize| {
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
                ],
            )
        };
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
        let mut differing = 0;
        if dot {
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
        }))
    }
}
