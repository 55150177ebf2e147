//! A pass's ops (`plan::Op`) turned into kernel launches: which weights, scratch regions and
//! state each op reads and writes, and the launch of each. The GEMVs, norms and quantizations
//! are here; the recurrent layers' own launches in `recurrence.rs`, the attention layers' in
//! `attention.rs`.

use super::*;
use crate::gpu::planes_twin;

impl CudaModel {
    /// Sampling's selection after a pass's logits (stream-ordered launches: `Gpu::top_k_enqueue`).
    pub(super) fn topk_tail(
        &self,
        st: &CudaState,
        k: usize,
        t: u32,
        floor: Option<u32>,
    ) -> Result<()> {
        let scratch = st.topk_scratch();
        let job = TopkJob {
            logits: st.s("logits"),
            n: self.dims.vocab,
            k,
            temperature: f32::from_bits(t),
        };
        self.gpu.top_k_enqueue(&st.stream, job, scratch)?;
        match floor {
            Some(f) => self
                .gpu
                .weight_sums_enqueue(&st.stream, job, f32::from_bits(f), scratch),
            None => Ok(()),
        }
    }

    /// Whether a pass of `n` tokens at the state's position takes the one-kernel short
    /// attention (one token, a short context: [`crate::gpu::Gpu::attn_short_for`]).
    pub(super) fn short_attn(&self, st: &CudaState, n: usize) -> bool {
        n == 1
            && self
                .gpu
                .attn_short_for(st.bytes.kv_cache, st.pos + 1)
                .is_some()
    }

    /// The fusions of a pass of `n` tokens at the state's position, as a decode step's graph
    /// takes them (the probes time what decode runs).
    pub(super) fn pass_fusion(&self, st: &CudaState, n: usize) -> Fusion {
        Fusion {
            attn_short: self.short_attn(st, n),
            ..self.gpu.fusion()
        }
    }

    /// A pass's kernels, with the fusions a pass of `n` tokens takes at the state's position
    /// ([`CudaModel::pass_fusion`]; a graph's key records the one that varies with it).
    pub(super) fn exec_all(&self, st: &CudaState, n: usize, head: Head, tail: Tail) -> Result<()> {
        let argmax = tail == Tail::Argmax;
        let mut ops = forward_ops(&self.dims, n, head, argmax, self.pass_fusion(st, n));
        if let (1, Some(skip)) = (n, self.gpu.skip()) {
            ops.retain(|op| !skip.drops(op));
        }
        let all = || {
            ops.iter().try_for_each(|op| self.exec(st, op))?;
            if let Tail::TopK { k, t, floor } = tail {
                self.topk_tail(st, k, t, floor)?;
            }
            Ok(())
        };
        self.pass_launches(n, all)
    }

    /// Runs `f`, whose launches are a pass of `n` tokens, launched as such a pass is: with PDL
    /// up to [`crate::gpu::Gpu::pdl_tokens`] tokens, plainly stream-ordered past that.
    pub(super) fn pass_launches<T>(&self, n: usize, f: impl FnOnce() -> T) -> T {
        if n <= self.gpu.pdl_tokens() {
            f()
        } else {
            crate::gpu::serial_launches(f)
        }
    }

    pub(super) fn mat(&self, m: Mat) -> &DevMat {
        match m {
            Mat::Output => &self.output,
            Mat::FfnIn(l) => &self.layers[l].ffn_in,
            Mat::FfnDown(l) => &self.layers[l].ffn_down,
            Mat::GdnIn(l) | Mat::GdnOut(l) | Mat::GdnAb(l) => match &self.layers[l].mix {
                MixW::Gdn(g) => match m {
                    Mat::GdnIn(_) => &g.inp,
                    Mat::GdnAb(_) => g
                        .ab
                        .as_deref()
                        .expect("the plan splits alpha | beta only where they were uploaded apart"),
                    _ => &g.out,
                },
                MixW::Attn(_) => unreachable!("layer {l} is not recurrent"),
            },
            Mat::AttnIn(l) | Mat::AttnOut(l) => match &self.layers[l].mix {
                MixW::Attn(a) => {
                    if matches!(m, Mat::AttnIn(_)) {
                        &a.inp
                    } else {
                        &a.out
                    }
                }
                MixW::Gdn(_) => unreachable!("layer {l} is not attention"),
            },
        }
    }

    pub(super) fn norm_weight(&self, norm: Norm) -> &DevBuf {
        match norm {
            Norm::Attn(l) => &self.layers[l].attn_norm,
            Norm::Post(l) => &self.layers[l].post_norm,
            Norm::Output => &self.output_norm,
        }
    }

    /// The device sign vector for rotating a `width`-wide activation when `rot`, else 0 (the
    /// kernels' "no rotation").
    pub(super) fn signs_if(&self, rot: bool, width: usize) -> Result<u64> {
        if !rot {
            return Ok(0);
        }
        self.signs
            .iter()
            .find(|(w, _)| *w == width)
            .map(|(_, b)| b.ptr)
            .ok_or_else(|| {
                CudaError::Unsupported(format!("no Hadamard sign vector of width {width}"))
            })
    }

    /// Whether the model's one-token passes may use plane words: its matrices are 1-bit (its
    /// states' scratch then holds the words' regions).
    pub(super) fn reads_planes(&self) -> bool {
        self.layers
            .iter()
            .any(|l| l.ffn_down.format == GpuFormat::Q1)
    }

    /// Where a quantization of `ntok` tokens into the scratch codes `xq` (`xq` or `fold_xq`)
    /// also leaves their plane words, and the GEMVs reading those codes find them: for one
    /// token only (the words' regions hold one), where [`crate::gpu::Gpu`]'s plane words are on
    /// and the model's matrices are 1-bit. Every quantization and every GEMV asks here, so the
    /// words are written wherever they are read.
    pub(super) fn planes_of(&self, st: &CudaState, xq: u64, ntok: usize) -> Option<u64> {
        if ntok != 1 || !self.gpu.b1_planes() || !self.reads_planes() {
            return None;
        }
        [("xq", "xp"), ("fold_xq", "fold_xp")]
            .into_iter()
            .find(|&(codes, _)| st.s(codes) == xq)
            .map(|(_, planes)| st.s(planes))
    }

    /// RMS norm and quantization of residual rows `tok0..tok0 + ntok` into `(xq, xs)`, rotated
    /// with `rot`; with a third address, one token left unscaled with its pieces' sums of
    /// squares there (the twin of a folded norm, kernels/quant.cu).
    pub(super) fn norm_quant(
        &self,
        st: &CudaState,
        norm: Norm,
        tok0: usize,
        ntok: usize,
        rot: bool,
        (xq, xs, piece_ss): (u64, u64, u64),
    ) -> Result<()> {
        let (g, d) = (&*self.gpu, &self.dims);
        let e = d.hidden;
        let xh = g.wants_f16_acts(ntok).then(|| st.s("xh"));
        let (name, args) = planes_twin(
            "quant_rms",
            &[
                Arg::Ptr(st.s("x")),
                Arg::I32(e as i32),
                Arg::I32(tok0 as i32),
                Arg::Ptr(self.norm_weight(norm).ptr),
                Arg::F32(d.rms_eps),
                Arg::Ptr(xq),
                Arg::Ptr(xs),
                Arg::Ptr(if piece_ss == 0 { xh.unwrap_or(0) } else { 0 }),
                Arg::Ptr(self.signs_if(rot, e)?),
                Arg::Ptr(piece_ss),
            ],
            self.planes_of(st, xq, ntok),
        );
        g.launch(
            &st.stream,
            &name,
            // A block per 1024 values for one token (latency), one per token for many.
            (
                if ntok == 1 {
                    e.div_ceil(1024) as u32
                } else {
                    1
                },
                ntok as u32,
                1,
            ),
            (256, 1, 1),
            &args,
        )
    }

    /// Where the residual GEMV of `mat` leaves the folded `norm`'s input.
    pub(super) fn fold_out(&self, st: &CudaState, mat: Mat, norm: Norm) -> Result<FoldOut> {
        let slot = plan::fold_slot(mat).ok_or_else(|| {
            CudaError::Unsupported(format!("no folded norm after {}", mat.kind()))
        })?;
        Ok(FoldOut {
            counters: st.s("fold_cnt") + (4 * plan::FOLD_MAX_PIECES * slot) as u64,
            xq: st.s("fold_xq"),
            xs: st.s("fold_xs"),
            xp: self.planes_of(st, st.s("fold_xq"), 1),
            kind: FoldKind::Norm {
                weight: self.norm_weight(norm).ptr,
                piece_ss: st.s("fold_ss"),
            },
        })
    }

    /// Where the gate | up GEMV `mat` leaves its folded SwiGLU: the activations ffn_down reads,
    /// with its layer's counters.
    pub(super) fn swiglu_fold_out(&self, st: &CudaState, mat: Mat) -> Result<FoldOut> {
        let Mat::FfnIn(l) = mat else {
            return Err(CudaError::Unsupported(format!(
                "a folded SwiGLU after {}",
                mat.kind()
            )));
        };
        let ffn = self.dims.ffn;
        Ok(FoldOut {
            counters: st.s("swiglu_cnt") + (4 * (ffn / 128) * l) as u64,
            xq: st.s("xq"),
            xs: st.s("xs"),
            xp: self.planes_of(st, st.s("xq"), 1),
            kind: FoldKind::Swiglu { ffn },
        })
    }

    /// The one-token GEMV of `mat` after a folded `norm`: the decode kernel on the fold's
    /// input, its outputs scaled, or where no decode kernel takes the matrix, the norm apart
    /// from the residual (which the fold left intact) and the GEMV.
    pub(super) fn gemv_scaled(&self, st: &CudaState, mat: Mat, norm: Norm, out: Out) -> Result<()> {
        let (g, s, m) = (&*self.gpu, &*st.stream, self.mat(mat));
        if g.gemv_decode(s, m, &self.scaled_io(st, mat, out), None)? {
            return Ok(());
        }
        self.norm_quant(st, norm, 0, 1, false, (st.s("xq"), st.s("xs"), 0))?;
        g.gemv(s, m, &self.gemv_io(st, mat, 1, out))
    }

    /// A one-token GEMV of `mat` reading the input a folded norm left (unscaled, in the fold's
    /// buffers), its outputs times the norm's 1/rms.
    pub(super) fn scaled_io(&self, st: &CudaState, mat: Mat, out: Out) -> GemvIo {
        GemvIo {
            xq: st.s("fold_xq"),
            xs: st.s("fold_xs"),
            xp: self.planes_of(st, st.s("fold_xq"), 1),
            rms_in: Some(RmsIn {
                piece_ss: st.s("fold_ss"),
                eps: self.dims.rms_eps,
            }),
            ..self.gemv_io(st, mat, 1, out)
        }
    }

    /// A GEMV of `ntok` tokens from the scratch activations to `out`.
    pub(super) fn gemv_io(&self, st: &CudaState, mat: Mat, ntok: usize, out: Out) -> GemvIo {
        let m = self.mat(mat);
        let (out, out_stride, accumulate, argmax) = match out {
            // α | β uploaded apart go to their rows of the stacked projection.
            Out::Proj if matches!(mat, Mat::GdnAb(_)) => {
                let d = &self.dims;
                let at = d.gdn_in_rows() - 2 * d.value_heads;
                (st.s("proj") + 4 * at as u64, d.gdn_in_rows(), false, None)
            }
            Out::Proj if matches!(mat, Mat::GdnIn(_)) => {
                (st.s("proj"), self.dims.gdn_in_rows(), false, None)
            }
            Out::Proj => (st.s("proj"), m.rows, false, None),
            Out::Residual => (st.s("x"), self.dims.hidden, true, None),
            Out::Logits { argmax } => (
                st.s("logits"),
                self.dims.vocab,
                false,
                argmax.then(|| st.s("argmax")),
            ),
        };
        GemvIo {
            xq: st.s("xq"),
            xs: st.s("xs"),
            xp: self.planes_of(st, st.s("xq"), ntok),
            xh: self.gpu.wants_f16_acts(ntok).then(|| st.s("xh")),
            ntok,
            out,
            out_stride,
            accumulate,
            argmax,
            split_scratch: Some((st.s("gemm_part"), st.layout.size("gemm_part") / 4)),
            prefetch: match self.next_mat.iter().find(|p| p.0 == mat) {
                Some(&(_, next)) if ntok == 1 => {
                    let next = self.mat(next);
                    Prefetch::of(next, self.gpu.prefetch_for(next))
                }
                _ => None,
            },
            rms_in: None,
            fold: None,
        }
    }

    /// silu(gate)·up of `ntok` tokens of the projection, quantized into `(xq, xs)` (and the
    /// f16 activations where the pass's GEMMs read them).
    pub(super) fn swiglu_quant(
        &self,
        st: &CudaState,
        ntok: usize,
        (xq, xs): (u64, u64),
    ) -> Result<()> {
        let (g, d) = (&*self.gpu, &self.dims);
        let xh = g.wants_f16_acts(ntok).then(|| st.s("xh"));
        let signs = self.signs_if(d.rotation.ffn_down, d.ffn)?;
        let (grid, block) = plan::swiglu_launch(d.ffn, ntok, signs != 0, g.swiglu_warps());
        let (name, args) = planes_twin(
            "quant_swiglu",
            &[
                Arg::Ptr(st.s("proj")),
                Arg::I32(d.ffn_in_rows() as i32),
                Arg::I32(d.ffn as i32),
                Arg::Ptr(xq),
                Arg::Ptr(xs),
                Arg::Ptr(xh.unwrap_or(0)),
                Arg::Ptr(signs),
            ],
            self.planes_of(st, xq, ntok),
        );
        g.launch(&st.stream, &name, grid, block, &args)
    }

    /// Where a pass's quantizations also write f16 activations: passes whose GEMMs read those.
    pub(super) fn f16_acts(&self, st: &CudaState, ntok: usize) -> Option<u64> {
        self.gpu.wants_f16_acts(ntok).then(|| st.s("xh"))
    }

    pub(super) fn exec(&self, st: &CudaState, op: &Op) -> Result<()> {
        let g = &*self.gpu;
        let s = &*st.stream;
        let d = &self.dims;
        let (xq, xs) = (st.s("xq"), st.s("xs"));
        match *op {
            Op::NormQuant {
                norm,
                tok0,
                ntok,
                rot,
            } => self.norm_quant(st, norm, tok0, ntok, rot, (xq, xs, 0)),
            Op::GemvFold { mat, norm } => {
                let m = self.mat(mat);
                let mut io = self.gemv_io(st, mat, 1, Out::Residual);
                io.fold = Some(self.fold_out(st, mat, norm)?);
                if g.gemv_decode(s, m, &io, None)? {
                    return Ok(());
                }
                // No decode kernel takes the matrix: the GEMV, then the fold's twin.
                io.fold = None;
                g.gemv(s, m, &io)?;
                let out = (st.s("fold_xq"), st.s("fold_xs"), st.s("fold_ss"));
                self.norm_quant(st, norm, 0, 1, false, out)
            }
            Op::GemvScaled { mat, norm, out } => self.gemv_scaled(st, mat, norm, out),
            Op::GemvSwiglu { mat, norm } => {
                let io = GemvIo {
                    fold: Some(self.swiglu_fold_out(st, mat)?),
                    ..self.scaled_io(st, mat, Out::Proj)
                };
                if g.gemv_decode(s, self.mat(mat), &io, None)? {
                    return Ok(());
                }
                // No decode kernel takes the matrix: the scaled GEMV's path, then the SwiGLU
                // apart.
                self.gemv_scaled(st, mat, norm, Out::Proj)?;
                self.swiglu_quant(st, 1, (xq, xs))
            }
            Op::Gemv { mat, ntok, out } => {
                let m = self.mat(mat);
                g.gemv(s, m, &self.gemv_io(st, mat, ntok, out))
            }
            Op::NormGemv {
                norm,
                tok0,
                mat,
                out,
            } => {
                let m = self.mat(mat);
                let io = self.gemv_io(st, mat, 1, out);
                let pre = NormIn {
                    x: st.s("x"),
                    tok0,
                    weight: self.norm_weight(norm).ptr,
                    eps: d.rms_eps,
                };
                // A GEMV that adds into the residual must not also read it.
                if out != Out::Residual && g.gemv_decode(s, m, &io, Some(pre))? {
                    return Ok(());
                }
                self.norm_quant(st, norm, tok0, 1, false, (xq, xs, 0))?;
                g.gemv(s, m, &io)
            }
            Op::Conv { layer, ntok } => self.conv(st, layer, ntok),
            Op::GdnPrep { layer, ntok } => self.gdn_prep(st, layer, ntok),
            Op::GdnStep { layer, ntok } if g.gdn_chunked(ntok) => {
                self.gdn_step_chunked(st, layer, ntok)
            }
            Op::GdnStep { layer, ntok } => self.gdn_step(st, layer, ntok),
            Op::GdnDecode { layer } => self.gdn_decode(st, layer),
            Op::GatedQuant { layer, ntok } => self.gated_quant(st, layer, ntok),
            Op::AttnPrep { layer, ntok } => self.attn_prep(st, layer, ntok),
            Op::AttnSplit { layer, ntok } => self.attn_split(st, layer, ntok),
            Op::AttnCombine { ntok, .. } => self.attn_combine(st, ntok),
            Op::AttnCombineQuant { .. } => self.attn_combine_quant(st),
            Op::AttnShort { layer } => self.attn_short(st, layer),
            Op::PlainQuant { ntok } => {
                let w = d.n_head * d.head_dim;
                let signs = self.signs_if(d.rotation.attn_out, w)?;
                g.quantize_rotated(
                    s,
                    st.s("attn"),
                    w,
                    ntok,
                    xq,
                    xs,
                    self.f16_acts(st, ntok),
                    (signs != 0).then_some(signs),
                    self.planes_of(st, xq, ntok),
                )
            }
            Op::SwigluQuant { ntok } => self.swiglu_quant(st, ntok, (xq, xs)),
            Op::ResetArgmax { ntok } => g.launch(
                s,
                "fill_u64",
                (1, 1, 1),
                (64, 1, 1),
                &[Arg::Ptr(st.s("argmax")), Arg::I32(ntok as i32), Arg::U64(0)],
            ),
        }
    }
}
