//! The recurrent step's variants (key rows per lane) and the chunked gated-delta-net recurrence
//! against the step with 32 rows per lane (`gdn_step_r32`, the one-token passes' step, which the
//! whole-model checks hold to the CPU twin and engine) on random inputs and states.

use niwaki_cuda::gpu::{Arg, Gpu};
use niwaki_cuda::plan::{self, Dims};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::report::*;

pub(crate) fn gdn_chunk_checks(rep: &mut Report, gpu: &Gpu, d: &Dims) -> R<()> {
    let s = &gpu.stream;
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let (hk, hv, dk, dv) = (d.key_heads, d.value_heads, d.key_dim, d.value_dim);
    let ch = d.conv_channels();
    let max_tok = 256;
    // Gates from mild to vanishing (a chunk's cumulative product underflows f32).
    let a_neg: Vec<f32> = (0..hv).map(|_| -rng.gen_range(0.05f32..30.0)).collect();
    let dt_bias: Vec<f32> = (0..hv).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    let (a_d, dt_d) = (gpu.upload(&a_neg, "a")?, gpu.upload(&dt_bias, "dt")?);
    let qk = gpu.alloc(4 * max_tok * 2 * hk * dk, "qk")?;
    let gb = gpu.alloc(8 * max_tok * hv, "gb")?;
    let chunks = gpu.alloc(
        4 * hv * max_tok.div_ceil(plan::GDN_CHUNK) * plan::gdn_chunk_floats(d),
        "chunks",
    )?;
    let state: Vec<f32> = (0..hv * dk * dv)
        .map(|_| rng.gen_range(-0.5f32..0.5))
        .collect();
    // The state's two buffers (kernels/gdn.cu, `ssm_read`): the pass reads the one at the
    // position's parity (1 here), with NaN in the other, and writes the one of position + ntok.
    let floats = hv * dk * dv;
    let both: Vec<f32> = std::iter::repeat_n(f32::NAN, floats)
        .chain(state.iter().copied())
        .collect();
    let pos = gpu.upload(&[1u32, 0], "pos")?;
    // Per variant (steps of 16 and 8 rows per lane, chunks): worst relative L2 of the outputs
    // and of the final state.
    let mut worst = [(0f64, 0f64); 3];
    // Passes whose buffer read is not the one written, each variant's and the reference's.
    let mut read_kept = 0;
    let mut odd_passes = 0;
    for ntok in [16usize, 99, 256] {
        let conv: Vec<f32> = (0..ntok * ch)
            .map(|_| rng.gen_range(-1.0f32..1.0))
            .collect();
        // a at 0, b at hv of each token's 2·hv.
        let proj: Vec<f32> = (0..ntok * 2 * hv)
            .map(|_| rng.gen_range(-3.0f32..3.0))
            .collect();
        let (conv_d, proj_d) = (gpu.upload(&conv, "conv")?, gpu.upload(&proj, "proj")?);
        let common = [
            Arg::Ptr(conv_d.ptr),
            Arg::Ptr(proj_d.ptr),
            Arg::I32(2 * hv as i32),
            Arg::I32(0),
        ];
        gpu.launch(
            s,
            "gdn_prep",
            (hk as u32, ntok as u32, 1),
            (32, 2, 1),
            &[
                &common[..],
                &[
                    Arg::I32(hv as i32),
                    Arg::Ptr(a_d.ptr),
                    Arg::Ptr(dt_d.ptr),
                    Arg::Ptr(qk.ptr),
                    Arg::Ptr(gb.ptr),
                ],
            ]
            .concat(),
        )?;
        // Rows per lane of the step, or None: in chunks.
        let mut run = |rows: Option<usize>| -> R<(Vec<f32>, Vec<f32>)> {
            let sd = gpu.upload(&both, "S")?;
            let o = gpu.alloc(4 * ntok * hv * dv, "o")?;
            match rows {
                None => {
                    let n = ntok.div_ceil(plan::GDN_CHUNK);
                    gpu.launch_smem(
                        s,
                        "gdn_chunk_prep",
                        (hv as u32, n as u32, 1),
                        (256, 1, 1),
                        plan::gdn_prep_smem(d) as u32,
                        &[
                            &common[..],
                            &[
                                Arg::Ptr(a_d.ptr),
                                Arg::Ptr(dt_d.ptr),
                                Arg::Ptr(qk.ptr),
                                Arg::Ptr(gb.ptr),
                                Arg::I32(ntok as i32),
                                Arg::Ptr(chunks.ptr),
                            ],
                        ]
                        .concat(),
                    )?;
                    gpu.launch(
                        s,
                        "gdn_chunk_scan",
                        (hv as u32, (dv / 32) as u32, 1),
                        (256, 1, 1),
                        &[
                            Arg::Ptr(chunks.ptr),
                            Arg::I32(n as i32),
                            Arg::Ptr(qk.ptr),
                            Arg::I32(ntok as i32),
                            Arg::Ptr(pos.ptr),
                            Arg::Ptr(sd.ptr),
                            Arg::Ptr(o.ptr),
                        ],
                    )?;
                }
                Some(rows) => {
                    gpu.launch(
                        s,
                        plan::gdn_step_kernel(rows),
                        plan::gdn_step_grid(d, rows),
                        (32, 4, 1),
                        &[
                            &common[..],
                            &[
                                Arg::I32(hv as i32),
                                Arg::I32(ntok as i32),
                                Arg::Ptr(a_d.ptr),
                                Arg::Ptr(dt_d.ptr),
                                Arg::Ptr(qk.ptr),
                                Arg::Ptr(gb.ptr),
                                Arg::Ptr(pos.ptr),
                                Arg::Ptr(sd.ptr),
                                Arg::Ptr(o.ptr),
                            ],
                        ]
                        .concat(),
                    )?;
                }
            }
            let mut out = vec![0f32; ntok * hv * dv];
            let mut st = vec![0f32; 2 * floats];
            gpu.read(s, o.ptr, &mut out)?;
            gpu.read(s, sd.ptr, &mut st)?;
            let written = (1 + ntok) % 2;
            if written == 0 {
                odd_passes += 1;
                read_kept += usize::from(
                    st[floats..]
                        .iter()
                        .zip(&state)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                );
            }
            Ok((out, st[written * floats..(written + 1) * floats].to_vec()))
        };
        let (o_ref, s_ref) = run(Some(32))?;
        for (w, rows) in worst.iter_mut().zip([Some(16), Some(8), None]) {
            let (o_x, s_x) = run(rows)?;
            let finite = o_x.iter().chain(&s_x).all(|v| v.is_finite());
            let e = if finite {
                (rel_l2(&o_x, &o_ref), rel_l2(&s_x, &s_ref))
            } else {
                (f64::INFINITY, f64::INFINITY)
            };
            *w = (w.0.max(e.0), w.1.max(e.1));
        }
    }
    let kept = read_kept == odd_passes && odd_passes > 0;
    rep.line(format!(
        "| recurrent state's two buffers | every variant, passes of odd length | {} | the buffer read unchanged after {read_kept} of {odd_passes} passes writing the other |",
        if kept { "PASS" } else { "FAIL" }
    ));
    rep.check(kept, "the recurrent state read is left as it was".into());
    let names = [
        "gdn step, 16 rows per lane".to_string(),
        "gdn step, 8 rows per lane".to_string(),
        format!(
            "gdn chunked ({}-token chunks: prep + scan)",
            plan::GDN_CHUNK
        ),
    ];
    // The step variants differ from the reference only in how a key-row sum is split.
    for ((name, w), tol) in names.iter().zip(worst).zip([1e-5, 1e-5, 1e-4]) {
        let ok = w.0 < tol && w.1 < tol;
        rep.line(format!(
            "| {name} vs the step of 32 rows per lane | {hv} heads of {dk}×{dv}, 16/99/256 tokens, random state, gates down to e^-30·softplus | {} | relative L2: outputs {:.1e}, final state {:.1e} (tol {tol:.0e}) |",
            if ok { "PASS" } else { "FAIL" },
            w.0,
            w.1
        ));
        rep.check(ok, format!("{name}, {hv} heads"));
    }
    Ok(())
}
