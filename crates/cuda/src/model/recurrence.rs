//! The recurrent (gated delta net) layers' launches: the convolution, the gate's inputs, the
//! recurrence in steps or chunks, the one-kernel decode step and the gated norm's quantization.

use super::*;
use crate::gpu::planes_twin;

impl CudaModel {
    /// The causal convolution over the recurrent layer's q, k and v channels, its state carried.
    pub(super) fn conv(&self, st: &CudaState, layer: usize, ntok: usize) -> Result<()> {
        let (g, s, d) = (&*self.gpu, &*st.stream, &self.dims);
        let (proj, pos) = (st.s("proj"), st.s("pos"));
        let ch = d.conv_channels();
        g.launch(
            s,
            "gdn_conv",
            (ch.div_ceil(32) as u32, 1, 1),
            // Up to 8 tokens at once per channel; a decode step's one token needs one row.
            (32, ntok.min(8) as u32, 1),
            &[
                Arg::Ptr(proj),
                Arg::I32(d.gdn_in_rows() as i32),
                Arg::I32(ntok as i32),
                Arg::Ptr(pos),
                Arg::Ptr(self.conv_state(st, layer)),
                Arg::Ptr(self.gdn(layer).conv.ptr),
                Arg::Ptr(st.s("conv")),
            ],
        )
    }

    /// The normalized queries and keys and the gates a multi-token recurrence reads.
    pub(super) fn gdn_prep(&self, st: &CudaState, layer: usize, ntok: usize) -> Result<()> {
        let (g, s, d) = (&*self.gpu, &*st.stream, &self.dims);
        let [conv, proj, stride, aoff, boff, a, dt_bias] = self.gdn_inputs(st, layer);
        g.launch(
            s,
            "gdn_prep",
            (d.key_heads as u32, ntok as u32, 1),
            (32, 2, 1),
            &[
                conv,
                proj,
                stride,
                aoff,
                boff,
                a,
                dt_bias,
                Arg::Ptr(st.s("gdn_qk")),
                Arg::Ptr(st.s("gdn_gb")),
            ],
        )
    }

    /// A long pass's recurrence in chunks: each chunk's own products, then a scan over the chunks.
    pub(super) fn gdn_step_chunked(&self, st: &CudaState, layer: usize, ntok: usize) -> Result<()> {
        let (g, s, d) = (&*self.gpu, &*st.stream, &self.dims);
        let pos = st.s("pos");
        let [conv, proj, stride, aoff, _, a, dt_bias] = self.gdn_inputs(st, layer);
        let chunks = ntok.div_ceil(plan::GDN_CHUNK);
        g.launch_smem(
            s,
            "gdn_chunk_prep",
            (d.value_heads as u32, chunks as u32, 1),
            (256, 1, 1),
            plan::gdn_prep_smem(d) as u32,
            &[
                conv,
                proj,
                stride,
                aoff,
                a,
                dt_bias,
                Arg::Ptr(st.s("gdn_qk")),
                Arg::Ptr(st.s("gdn_gb")),
                Arg::I32(ntok as i32),
                Arg::Ptr(st.s("gdn_chunks")),
            ],
        )?;
        g.launch(
            s,
            "gdn_chunk_scan",
            (d.value_heads as u32, (d.value_dim / 32) as u32, 1),
            (256, 1, 1),
            &[
                Arg::Ptr(st.s("gdn_chunks")),
                Arg::I32(chunks as i32),
                Arg::Ptr(st.s("gdn_qk")),
                Arg::I32(ntok as i32),
                Arg::Ptr(pos),
                Arg::Ptr(self.ssm_state(st, layer)),
                Arg::Ptr(st.s("gdn")),
            ],
        )
    }

    /// The recurrence a token at a time, its blocks over the heads and their state's rows.
    pub(super) fn gdn_step(&self, st: &CudaState, layer: usize, ntok: usize) -> Result<()> {
        let (g, s, d) = (&*self.gpu, &*st.stream, &self.dims);
        let pos = st.s("pos");
        let [conv, proj, stride, aoff, boff, a, dt_bias] = self.gdn_inputs(st, layer);
        let prepped = crate::plan::gdn_prepped(ntok);
        let rows = g.gdn_rows_for(ntok);
        g.launch(
            s,
            plan::gdn_step_kernel(rows),
            plan::gdn_step_grid(d, rows),
            (32, 4, 1),
            &[
                conv,
                proj,
                stride,
                aoff,
                boff,
                Arg::I32(ntok as i32),
                a,
                dt_bias,
                Arg::Ptr(if prepped { st.s("gdn_qk") } else { 0 }),
                Arg::Ptr(if prepped { st.s("gdn_gb") } else { 0 }),
                Arg::Ptr(pos),
                Arg::Ptr(self.ssm_state(st, layer)),
                Arg::Ptr(st.s("gdn")),
            ],
        )
    }

    /// A one-token pass's whole recurrent layer (conv, step, gated norm, quantization) in one kernel.
    pub(super) fn gdn_decode(&self, st: &CudaState, layer: usize) -> Result<()> {
        let (g, s, d) = (&*self.gpu, &*st.stream, &self.dims);
        let (xq, xs) = (st.s("xq"), st.s("xs"));
        let pos = st.s("pos");
        let [_, proj, _, aoff, boff, a, dt_bias] = self.gdn_inputs(st, layer);
        let (name, args) = planes_twin(
            "gdn_decode",
            &[
                proj,
                aoff,
                boff,
                Arg::I32(d.conv_channels() as i32),
                Arg::Ptr(pos),
                Arg::Ptr(self.conv_state(st, layer)),
                Arg::Ptr(self.gdn(layer).conv.ptr),
                a,
                dt_bias,
                Arg::Ptr(self.ssm_state(st, layer)),
                Arg::Ptr(self.gdn(layer).norm.ptr),
                Arg::F32(d.rms_eps),
                Arg::Ptr(xq),
                Arg::Ptr(xs),
                Arg::Ptr(self.f16_acts(st, 1).unwrap_or(0)),
            ],
            self.planes_of(st, xq, 1),
        );
        g.launch(s, &name, (d.value_heads as u32, 1, 1), (32, 16, 1), &args)
    }

    /// The gated norm of the recurrence's output, quantized for the output projection.
    pub(super) fn gated_quant(&self, st: &CudaState, layer: usize, ntok: usize) -> Result<()> {
        let (g, s, d) = (&*self.gpu, &*st.stream, &self.dims);
        let (xq, xs) = (st.s("xq"), st.s("xs"));
        let proj = st.s("proj");
        let (name, args) = planes_twin(
            "quant_gated",
            &[
                Arg::Ptr(st.s("gdn")),
                Arg::Ptr(proj),
                Arg::I32(d.gdn_in_rows() as i32),
                Arg::I32(d.conv_channels() as i32),
                Arg::Ptr(self.gdn(layer).norm.ptr),
                Arg::F32(d.rms_eps),
                Arg::Ptr(xq),
                Arg::Ptr(xs),
                Arg::Ptr(self.f16_acts(st, ntok).unwrap_or(0)),
                Arg::Ptr(self.signs_if(d.rotation.gdn_out, d.gdn_inner())?),
                Arg::I32(i32::from(d.rotation.gdn_out && d.rotation.gdn_v_grouped)),
            ],
            self.planes_of(st, xq, ntok),
        );
        g.launch(
            s,
            &name,
            (d.value_heads.div_ceil(8) as u32, ntok as u32, 1),
            (256, 1, 1),
            &args,
        )
    }

    /// What the recurrence's kernels read of a layer: the conv output, the projection (its row
    /// stride and where the gate inputs α and β start), the decay parameters.
    fn gdn_inputs(&self, st: &CudaState, l: usize) -> [Arg; 7] {
        let d = &self.dims;
        let w = self.gdn(l);
        let (ch, vd) = (d.conv_channels(), d.gdn_inner());
        [
            Arg::Ptr(st.s("conv")),
            Arg::Ptr(st.s("proj")),
            Arg::I32(d.gdn_in_rows() as i32),
            Arg::I32((ch + vd) as i32),
            Arg::I32((ch + vd + d.value_heads) as i32),
            Arg::Ptr(w.a.ptr),
            Arg::Ptr(w.dt_bias.ptr),
        ]
    }

    /// Layer `l`'s recurrent weights (the plan gives recurrent ops recurrent layers only).
    pub(super) fn gdn(&self, l: usize) -> &GdnW {
        match &self.layers[l].mix {
            MixW::Gdn(g) => g,
            MixW::Attn(_) => unreachable!("layer {l} is not recurrent"),
        }
    }

    /// Device address of a recurrent layer's conv state and of its recurrent (ssm) state.
    fn conv_state(&self, st: &CudaState, l: usize) -> u64 {
        let d = &self.dims;
        st.state.at(d.kind_index(l) * StateBytes::conv_per_layer(d))
    }
    fn ssm_state(&self, st: &CudaState, l: usize) -> u64 {
        let d = &self.dims;
        st.state
            .at(st.bytes.conv + d.kind_index(l) * StateBytes::ssm_per_layer(d))
    }
}
