//! The persistent-step probes, for the harness: a decode step's GEMVs launched once each
//! against all of them in one launch with a grid-wide barrier between GEMVs
//! (`kernels/gemv_chain.cu`, consumers a row a warp; `kernels/gemv_chain_b1.cu`, the binary
//! decode kernels' consumers).

use super::*;

/// What a probe measured: seconds per replay of a graph launching it once per GEMV and of one
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

/// How a probe is launched: its kernel, threads and dynamic shared memory a block, its
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

/// Both probes' descriptors: 5 pointers and 4 ints (the kernels' `ChainGemv`; the binary probe's
/// first pointer is the codes' tensor map).
const DESC_WORDS: usize = 7;

impl CudaModel {
    /// The decode step's GEMVs in order, as the probes take them (no fold: each GEMV reads its
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
            desc.extend(descriptor(m.codes.ptr, m, &io));
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
        self.run_chain(st, &launch, dot.then_some(false)).map(Some)
    }

    /// The persistent-step probe with the binary decode kernels' consumers
    /// (`kernels/gemv_chain_b1.cu`, `groups` of [`plan::GEMV1_WARPS`] consumer warps, one of
    /// [`plan::CHAIN_B1_GROUPS`]) on a decode step's GEMVs, tiles of 16 rows as those kernels
    /// take them (a tensor map per matrix). `dot` false: the consumers release each tile
    /// without multiplying (the logits are not compared). The LM head is compared with the binary decode
    /// GEMV, whose arithmetic and order of summation the probe's are. `None` where the device
    /// is not sm_90, a matrix is not of the output's format or has a width the kernel does not
    /// know ([`plan::chain_b1_tile_bytes`]), or a block does not fit. The outputs go where the
    /// step's would; the state's contents are meaningless afterwards.
    #[doc(hidden)]
    pub fn time_gemv_chain_b1(
        &self,
        st: &mut CudaState,
        groups: usize,
        dot: bool,
    ) -> Result<Option<ChainTimes>> {
        let g = &self.gpu;
        let fmt = self.output.format;
        if g.info.compute_capability.0 != 9 || !plan::CHAIN_B1_GROUPS.contains(&groups) {
            return Ok(None);
        }
        let gemvs = self.chain_gemvs(st);
        let mut maps: Vec<u64> = Vec::new();
        let mut max_tile = 0;
        for (m, _) in &gemvs {
            let Some(tile) =
                plan::chain_b1_tile_bytes(m.format, m.cols).filter(|_| m.format == fmt)
            else {
                return Ok(None);
            };
            max_tile = max_tile.max(tile);
            let map = m.codes_map(16)?;
            maps.extend(map.0.opaque);
        }
        let map_bufs = g.upload(&maps, "chain tensor maps")?;
        let mut desc: Vec<u64> = Vec::new();
        for (i, (m, io)) in gemvs.iter().enumerate() {
            desc.extend(descriptor(map_bufs.ptr + 128 * i as u64, m, io));
        }
        // The ring in whole 1024 bytes, and 1024 more to align its start.
        let ring = g
            .smem_limit
            .saturating_sub(plan::CHAIN_B1_STATIC_SMEM + 1024)
            / 1024
            * 1024;
        let launch = ChainLaunch {
            kernel: format!(
                "gemv_chain_b1_{}{}",
                fmt.kernel_name(),
                if groups == 1 { "" } else { "_g2" }
            ),
            threads: 32 * (plan::GEMV1_WARPS * groups + 2),
            smem: ring + 1024,
            descs: g.upload(&desc, "chain descriptors")?,
            count: g.alloc(8, "chain barrier")?,
            mid: vec![Arg::I32(ring as i32), Arg::I32(i32::from(dot))],
        };
        if ring < max_tile || g.blocks_per_sm(&launch.kernel, launch.threads, launch.smem)? < 1 {
            return Ok(None);
        }
        let times = self.run_chain(st, &launch, dot.then_some(true));
        drop(map_bufs);
        times.map(Some)
    }

    /// Times a probe launched once per GEMV and once for all (one block a multiprocessor);
    /// with `compare`, runs the chain once more and counts the LM head's logits that differ
    /// from the decode GEMV's, the binary kernels on (`Some(true)`) or off.
    fn run_chain(
        &self,
        st: &mut CudaState,
        l: &ChainLaunch,
        compare: Option<bool>,
    ) -> Result<ChainTimes> {
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
        if let Some(binary) = compare {
            let logits = |st: &CudaState| -> Result<Vec<u32>> {
                let mut v = vec![0u32; self.dims.vocab];
                g.read(&st.stream, st.s("logits"), &mut v)?;
                Ok(v)
            };
            zero()?;
            launch(0, n)?;
            let chained = logits(st)?;
            let (b1, b2) = (g.set_b1(binary), g.set_b2(binary));
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

/// A probe's descriptor of one GEMV: its codes (or their tensor map), scales, activations and
/// output, then rows and columns in one word and whether the output is added to.
fn descriptor(codes: u64, m: &DevMat, io: &GemvIo) -> [u64; DESC_WORDS] {
    [
        codes,
        m.scales.ptr,
        io.xq,
        io.xs,
        io.out,
        m.rows as u64 | (m.cols as u64) << 32,
        u64::from(io.accumulate),
    ]
}
