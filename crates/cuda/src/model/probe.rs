//! Measuring a forward pass, for the harness: each op's time inside a graph, a decode step
//! cut down to some of its ops, the kernels' own timeline, and the folded norms' and SwiGLU's
//! outputs against their twins.

use super::*;

impl CudaModel {
    /// Where a pass of `ntok` tokens spends its time: for each kind of op, the seconds one
    /// launch takes inside a CUDA graph of `reps` launches (cycling through the layers' ops of
    /// that kind, so that a matrix is not served from L2 by its own previous launch; median of
    /// 5 replays), with how often the op occurs per pass. Launched as `forward` would (PDL for
    /// one token only). The ops run on `st` as they are (its contents are meaningless
    /// afterwards).
    #[doc(hidden)]
    pub fn profile(
        &self,
        st: &mut CudaState,
        ntok: usize,
        reps: usize,
    ) -> Result<Vec<(String, usize, f64)>> {
        self.profile_ops(st, ntok, reps, true)
    }

    /// [`CudaModel::profile`] of one-token passes with each kind's first op launched `reps`
    /// times over rather than the layers' ops in turn: a matrix smaller than the L2 cache is then
    /// read from it by every launch but the first. Against `profile`, what a GEMV costs when its
    /// weights are already on chip (its ramp, tail and arithmetic) rather than in memory.
    #[doc(hidden)]
    pub fn profile_hot(
        &self,
        st: &mut CudaState,
        reps: usize,
    ) -> Result<Vec<(String, usize, f64)>> {
        self.profile_ops(st, 1, reps, false)
    }

    /// `profile` (`cycle`: the layers' ops of a kind in turn) or `profile_hot` (its first op).
    fn profile_ops(
        &self,
        st: &mut CudaState,
        ntok: usize,
        reps: usize,
        cycle: bool,
    ) -> Result<Vec<(String, usize, f64)>> {
        // The kernels read the position from the device: make it the one the host plans with.
        st.drop_ahead();
        st.set_pos()?;
        let mut kinds: Vec<(String, Vec<Op>)> = Vec::new();
        let argmax = ntok == 1;
        for op in forward_ops(
            &self.dims,
            ntok,
            Head::Last,
            argmax,
            self.pass_fusion(st, ntok),
        ) {
            let name = match op {
                Op::Gemv { mat, .. } => format!("Gemv {}", mat.kind()),
                Op::NormGemv { mat, .. } => format!("NormGemv {}", mat.kind()),
                Op::GemvFold { mat, .. } => format!("GemvFold {}", mat.kind()),
                Op::GemvScaled { mat, .. } => format!("GemvScaled {}", mat.kind()),
                Op::GemvSwiglu { mat, .. } => format!("GemvSwiglu {}", mat.kind()),
                other => format!("{other:?}"),
            };
            let key: String = name
                .split(['(', '{'])
                .next()
                .unwrap_or_default()
                .trim()
                .to_string();
            match kinds.iter_mut().find(|k| k.0 == key) {
                Some(k) => k.1.push(op),
                None => kinds.push((key, vec![op])),
            }
        }
        let mut out = Vec::new();
        for (key, ops) in kinds {
            let secs = self.time_graph(st, || {
                let pick = |i: usize| if cycle { &ops[i % ops.len()] } else { &ops[0] };
                self.pass_launches(ntok, || (0..reps).try_for_each(|i| self.exec(st, pick(i))))
            })?;
            out.push((key, ops.len(), secs / reps as f64));
        }
        st.stream.synchronize().ctx(|| "profile".into())?;
        Ok(out)
    }

    /// Seconds per replay of a one-token pass's graph (GPU argmax) holding only the ops `keep`
    /// accepts, median of 5: the results are meaningless, the time says where a token's time
    /// goes when ops run back to back as in decode (the GEMVs alone against the rest).
    #[doc(hidden)]
    pub fn time_decode_subset(
        &self,
        st: &mut CudaState,
        keep: &dyn Fn(&Op) -> bool,
    ) -> Result<f64> {
        st.drop_ahead();
        st.set_pos()?;
        let ops: Vec<Op> = forward_ops(&self.dims, 1, Head::Last, true, self.pass_fusion(st, 1))
            .into_iter()
            .filter(|op| keep(op))
            .collect();
        let secs = self.time_graph(st, || ops.iter().try_for_each(|op| self.exec(st, op)))?;
        st.stream.synchronize().ctx(|| "decode subset".into())?;
        Ok(secs)
    }

    /// Seconds per replay of a whole pass of `ntok` tokens (the last token's logits) captured
    /// in one CUDA graph, median of 5: the kernels `forward` launches for one unstepped pass,
    /// without the host's launches between them. The pass runs on `st` as it is (its contents
    /// are meaningless afterwards).
    #[doc(hidden)]
    pub fn time_pass_graph(&self, st: &mut CudaState, ntok: usize) -> Result<f64> {
        st.drop_ahead();
        st.set_pos()?;
        let secs = self.time_graph(st, || self.exec_all(st, ntok, Head::Last, Tail::None))?;
        st.stream.synchronize().ctx(|| "pass graph".into())?;
        Ok(secs)
    }

    /// The ops of an unstepped pass of `ntok` tokens at the state's position (each one launch
    /// or a few).
    #[doc(hidden)]
    pub fn pass_ops(&self, st: &CudaState, ntok: usize) -> usize {
        forward_ops(
            &self.dims,
            ntok,
            Head::Last,
            false,
            self.pass_fusion(st, ntok),
        )
        .len()
    }

    /// The words of the folded output norm's input that a one-token pass left (codes, group
    /// pairs, the pieces' sums of squares) and that its twin, `quant_rms` unscaled on the
    /// residual the pass ended with, writes differently; and the words compared. Meaningful
    /// right after a one-token pass with [`Fusion::fold`] on (the last residual GEMV then
    /// folds the output norm).
    #[doc(hidden)]
    pub fn fold_twin_differences(&self, st: &CudaState) -> Result<(usize, usize)> {
        let g = &*self.gpu;
        let e = self.dims.hidden;
        let names = ["fold_xq", "fold_xs", "fold_ss"];
        let bufs = names
            .iter()
            .map(|&n| g.alloc(st.layout.size(n), "fold twin"))
            .collect::<Result<Vec<_>>>()?;
        self.norm_quant(
            st,
            Norm::Output,
            0,
            1,
            false,
            (bufs[0].ptr, bufs[1].ptr, bufs[2].ptr),
        )?;
        let regions: Vec<(u64, u64, usize)> = names
            .iter()
            .zip(&bufs)
            .map(|(&name, b)| {
                // Only the pieces a row has carry sums.
                let n = match name {
                    "fold_ss" => 4 * e / 128,
                    _ => st.layout.size(name),
                };
                (st.s(name), b.ptr, n)
            })
            .collect();
        self.words_differing(st, &regions)
    }

    /// The plane words a one-token pass left beside its activations' codes that differ from
    /// their CPU twin ([`repack::plane_words`] of those codes), and the words compared: the
    /// last down GEMV's input (`xp` beside the `ffn` codes of `xq`) and the output norm's
    /// (`fold_xp` beside `fold_xq`). Meaningful right after a one-token pass of a 1-bit model
    /// with the plane words and the folded norms on.
    #[doc(hidden)]
    pub fn planes_twin_differences(&self, st: &CudaState) -> Result<(usize, usize)> {
        let d = &self.dims;
        let (mut differing, mut words) = (0, 0);
        for (codes, planes, n) in [("xq", "xp", d.ffn), ("fold_xq", "fold_xp", d.hidden)] {
            let mut q = vec![0i8; n];
            let mut p = vec![0u32; n / 4];
            self.gpu.read(&st.stream, st.s(codes), &mut q)?;
            self.gpu.read(&st.stream, st.s(planes), &mut p)?;
            let twin = repack::plane_words(&q);
            differing += twin.iter().zip(&p).filter(|(a, b)| a != b).count();
            words += p.len();
        }
        Ok((differing, words))
    }

    /// Of `(a, b, bytes)` regions of device memory, the 4-byte words where a and b differ, and
    /// the words compared.
    pub(super) fn words_differing(
        &self,
        st: &CudaState,
        regions: &[(u64, u64, usize)],
    ) -> Result<(usize, usize)> {
        let (mut differing, mut words) = (0, 0);
        for &(a, b, n) in regions {
            let mut x = vec![0u32; n / 4];
            let mut y = vec![0u32; n / 4];
            self.gpu.read(&st.stream, a, &mut x)?;
            self.gpu.read(&st.stream, b, &mut y)?;
            differing += x.iter().zip(&y).filter(|(p, q)| p != q).count();
            words += x.len();
        }
        Ok((differing, words))
    }

    /// The words of the last layer's SwiGLU that a one-token pass left quantized (codes and
    /// group pairs) and that `quant_swiglu` on the projection the pass ended with writes
    /// differently; and the words compared. Meaningful right after a one-token pass with
    /// [`Fusion::swiglu`] on (the last gate | up GEMV then folds its SwiGLU, and nothing after
    /// the last down GEMV writes the activations or the projection).
    #[doc(hidden)]
    pub fn swiglu_twin_differences(&self, st: &CudaState) -> Result<(usize, usize)> {
        let g = &*self.gpu;
        let f = self.dims.ffn;
        let sizes = [("xq", f), ("xs", 8 * f / 64)];
        let twin = sizes
            .iter()
            .map(|&(_, n)| g.alloc(n, "swiglu twin"))
            .collect::<Result<Vec<_>>>()?;
        self.swiglu_quant(st, 1, (twin[0].ptr, twin[1].ptr))?;
        let regions: Vec<(u64, u64, usize)> = sizes
            .iter()
            .zip(&twin)
            .map(|(&(name, n), b)| (st.s(name), b.ptr, n))
            .collect();
        self.words_differing(st, &regions)
    }

    /// Where a decode step's time goes, from the kernels' timeline records: per kind of op,
    /// its launches and their mean run, the dependence's latency before each and how early
    /// its blocks were resident ([`crate::timeline`]), over the replays of the step's graph
    /// that [`CudaModel::time_decode_subset`] times. `None` where the kernels keep no records
    /// (`NIWAKI_CUDA_TRACE` unset). GEMVs are named by matrix, other ops by kernel.
    #[doc(hidden)]
    pub fn trace_decode(
        &self,
        st: &mut CudaState,
    ) -> Result<Option<Vec<crate::timeline::OpTimes>>> {
        Ok(self
            .trace_decode_records(st, &|_| true)?
            .map(|records| crate::timeline::summarize_named(&records)))
    }

    /// The records of the graph replays of a decode step holding the ops `keep` accepts
    /// (`NIWAKI_CUDA_TRACE`; `None` where the kernels keep none; as
    /// [`CudaModel::time_decode_subset`], a subset's results are meaningless and its times say
    /// how those ops run back to back), each with its op's name ("Gemv" and the matrix's kind
    /// for the GEMVs, else the kernel's kind).
    pub fn trace_decode_records(
        &self,
        st: &mut CudaState,
        keep: &dyn Fn(&Op) -> bool,
    ) -> Result<Option<Vec<(crate::gpu::TraceRecord, String)>>> {
        if !self.gpu.tracing() {
            return Ok(None);
        }
        self.gpu.take_trace()?;
        self.time_decode_subset(st, keep)?;
        let Some(records) = self.gpu.take_trace()? else {
            return Ok(None);
        };
        let mut gemvs = std::collections::HashMap::new();
        for op in forward_ops(&self.dims, 1, Head::Last, true, self.pass_fusion(st, 1)) {
            if let Some(mat) = op.matrix() {
                gemvs.insert(self.mat(mat).scales.ptr, format!("Gemv {}", mat.kind()));
            }
        }
        Ok(Some(
            records
                .into_iter()
                .map(|r| {
                    let name = gemvs
                        .get(&r.tag)
                        .cloned()
                        .unwrap_or_else(|| format!("{:?}", r.kind));
                    (r, name)
                })
                .collect(),
        ))
    }

    /// Median seconds of 5 replays of the graph `record` captures on the state's stream (after
    /// one warm-up replay).
    pub(super) fn time_graph(
        &self,
        st: &CudaState,
        record: impl FnOnce() -> Result<()>,
    ) -> Result<f64> {
        st.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .ctx(|| "beginning graph capture".into())?;
        let res = record();
        let g = st
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .ctx(|| "ending graph capture".into())?;
        res?;
        let g = g.ok_or_else(|| CudaError::Unsupported("empty graph".into()))?;
        g.launch().ctx(|| "graph warm-up".into())?;
        self.gpu
            .time(&st.stream, 5, || g.launch().ctx(|| "graph launch".into()))
    }
}
