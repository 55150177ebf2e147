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

/// How the probe is launched: its kernel, threads and dynamic shared memory a block, its
/// descriptors (one per GEMV, `DESC_BYTES` apart) and grid barrier's counter, and the
/// arguments between the GEMVs' count and the counter.
struct ChainLaunch {
    kernel: String,
    threads: usize,
    smem: usize,
    descs: DevBuf,
    count: DevBuf,
    mid: Vec<Arg>,
}

/// A descriptor: 5 pointers and 4 ints (the kernel's `ChainGemv`).
const DESC_WORDS: usize = 7;

impl CudaModel {
    /// The decode step's GEMVs in order, as the probe takes them (no fold: each GEMV reads its
    /// activations and writes its output), with their inputs and outputs on `st`.
    fn chain_gemvs(&self, st: &CudaState) -> Vec<(&DevMat, GemvIo)> {
        forward_ops(&self.dims, 1, Head::Last, true, Fusion::default())
            .into_iter()
            .filter_map(|op| match op {
                Op::Gemv { mat, out, .. } => Some((self.mat(mat), self.gemv_io(st, mat, 1, out))),
                _ => None,
            })
            .collect()
    }

    /// The persistent-step probe with consumers a row a warp (`kernels/gemv_chain.cu`) on a
    /// decode step's GEMVs, in tiles of [`plan::CHAIN_WARPS`] rows. `dot` false: the consumers
    /// release each tile without multiplying (the logits are not compared). The LM head is
    /// compared with the dp4a decode GEMV, whose arithmetic the probe's is. 1-bit and 2-bit g64
    /// weights only (else `None`). The outputs go where the step's would; the state's contents
    /// are meaningless afterwards.
    #[doc(hidden)]
    pub fn time_gemv_chain(&self, st: &mut CudaState, dot: bool) -> Result<Option<ChainTimes>> {
        let fmt = match self.output.format {
            GpuFormat::Q1 => "q1",
            GpuFormat::Q2G64 => "q2g64",
            GpuFormat::Q2G128 => return Ok(None),
        };
        let g = &self.gpu;
        let mut desc: Vec<u64> = Vec::new();
        let mut max_cols = 0;
        let mut max_tile = 0;
        for (m, io) in self.chain_gemvs(st) {
            if m.format != self.output.format {
                return Ok(None);
            }
            max_cols = max_cols.max(m.cols);
            max_tile = max_tile.max(plan::chain_tile_bytes(m.format, m.cols));
            desc.extend(descriptor(m, &io));
        }
        let x_bytes = plan::x_bytes(max_cols, false);
        let smem = g.smem_limit.saturating_sub(plan::GEMV1_STATIC_SMEM);
        let ring = smem.saturating_sub(x_bytes) / 128 * 128;
        let launch = ChainLaunch {
            kernel: format!("gemv_chain_{fmt}{}", if dot { "" } else { "_nodot" }),
            threads: 32 * (plan::CHAIN_WARPS + 1),
            smem,
            descs: g.upload(&desc, "chain descriptors")?,
            count: g.alloc(8, "chain barrier")?,
            mid: vec![Arg::I32(x_bytes as i32), Arg::I32(ring as i32)],
        };
        if ring < max_tile || g.blocks_per_sm(&launch.kernel, launch.threads, smem)? < 1 {
            return Ok(None);
        }
        self.run_chain(st, &launch, dot).map(Some)
    }

    /// Times a probe launched once per GEMV and once for all (one block a multiprocessor);
    /// with `compare`, runs the chain once more and counts the LM head's logits that differ
    /// from the dp4a decode GEMV's, whose arithmetic the probe's is.
    fn run_chain(&self, st: &mut CudaState, l: &ChainLaunch, compare: bool) -> Result<ChainTimes> {
        let g = &self.gpu;
        let n = l.descs.bytes / (8 * DESC_WORDS);
        let launch = |first: usize, ng: usize| {
            let args: Vec<Arg> = [
                Arg::Ptr(l.descs.ptr + (8 * DESC_WORDS * first) as u64),
                Arg::I32(ng as i32),
            ]
            .into_iter()
            .chain(l.mid.iter().cloned())
            .chain([Arg::Ptr(l.count.ptr)])
            .collect();
            g.launch_smem(
                &st.stream,
                &l.kernel,
                (g.info.multiprocessors.max(1) as u32, 1, 1),
                (l.threads as u32, 1, 1),
                l.smem as u32,
                &args,
            )
        };
        let zero = || {
            g.launch(
                &st.stream,
                "fill_u64",
                (1, 1, 1),
                (64, 1, 1),
                &[Arg::Ptr(l.count.ptr), Arg::I32(1), Arg::U64(0)],
            )
        };
        let each = self.time_graph(st, || (0..n).try_for_each(|i| launch(i, 1)))?;
        let once = self.time_graph(st, || {
            zero()?;
            launch(0, n)
        })?;
        let mut differing = 0;
        if compare {
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
        Ok(ChainTimes {
            each,
            once,
            gemvs: n,
            differing,
        })
    }
}

/// The probe's descriptor of one GEMV: its codes, scales, activations and
/// output, then rows and columns in one word and whether the output is added to.
fn descriptor(m: &DevMat, io: &GemvIo) -> [u64; DESC_WORDS] {
    [
        m.codes.ptr,
        m.scales.ptr,
        io.xq,
        io.xs,
        io.out,
        m.rows as u64 | (m.cols as u64) << 32,
        u64::from(io.accumulate),
    ]
}
