//! Where a short pass's time goes (`NIWAKI_HARNESS_ONLY=passes`): on 27B models, a pass of n
//! tokens as `forward` runs it (stepped where `plan::short_passes` steps it), as one pass
//! launched by the host, and as the same kernels replayed in one CUDA graph; and its ops timed
//! one kind at a time inside graphs. Against the host-launched pass, the graph's time is what
//! capturing short passes could save.

use std::time::Instant;

use model::Logits;
use niwaki_cuda::CudaModel;
use quant::Format;

use crate::bench::{load_27b, op_table};
use crate::report::*;

/// The pass lengths timed, and those whose ops are tabled.
const LENGTHS: [usize; 11] = [1, 2, 3, 4, 5, 6, 8, 12, 16, 32, 64];
const TABLED: [usize; 2] = [4, 16];

/// Median wall seconds of 5 forward calls of `n` tokens (after one untimed), each waited for.
fn forward_secs(g: &CudaModel, st: &mut niwaki_cuda::CudaState, n: usize) -> R<f64> {
    let tokens: Vec<u32> = (0..n as u32).map(|i| 1000 + 7 * i).collect();
    g.forward(st, &tokens, Logits::Last)?;
    let mut t = Vec::new();
    for _ in 0..5 {
        let at = Instant::now();
        g.forward(st, &tokens, Logits::Last)?;
        t.push(at.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    Ok(t[2])
}

/// [`forward_secs`] of `n` tokens as one pass (nothing stepped), its kernels launched with
/// PDL or plainly stream-ordered; the model's settings as they were afterwards.
fn one_pass_secs(g: &CudaModel, st: &mut niwaki_cuda::CudaState, n: usize, pdl: bool) -> R<f64> {
    let steps = g.set_step_tokens(0);
    let longest = g.gpu().pdl_tokens();
    g.gpu().set_pdl_tokens(if pdl { n } else { n - 1 });
    let secs = forward_secs(g, st, n);
    g.set_step_tokens(steps);
    g.gpu().set_pdl_tokens(longest);
    secs
}

pub(crate) fn pass_section(rep: &mut Report, formats: &[Format]) -> R<()> {
    for &format in formats {
        let g = load_27b(format)?;
        let mut st = g.new_state(16384)?;
        let history: Vec<u32> = (0..64).collect();
        g.forward(&mut st, &history, Logits::None)?;
        let stepped = g.step_tokens();
        rep.line(format!(
            "\n{format} short passes after 64 tokens, ms (as run: `forward` with passes of 2-{stepped} tokens stepped, GEMM from {} tokens; one pass: unstepped, host-launched (PDL: its kernels launched with programmatic dependent launch); in a graph: the one pass's kernels replayed in one CUDA graph, median of 5; ops summed: each kind of op timed inside graphs as `profile` does)\n",
            g.gpu().gemm_min_tokens()
        ));
        rep.line("| tokens | as run | one pass | one pass, PDL | in a graph | ops summed | ops | graph saves |");
        rep.line("|---|---|---|---|---|---|---|---|");
        let mut tables = Vec::new();
        for n in LENGTHS {
            let as_run = forward_secs(&g, &mut st, n)?;
            let pass = one_pass_secs(&g, &mut st, n, false)?;
            let with_pdl = one_pass_secs(&g, &mut st, n, true)?;
            let graph = g.time_pass_graph(&mut st, n)?;
            let prof = g.profile(&mut st, n, 4)?;
            let summed: f64 = prof.iter().map(|p| p.1 as f64 * p.2).sum();
            rep.line(format!(
                "| {n} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {:.0}% |",
                as_run * 1e3,
                pass * 1e3,
                with_pdl * 1e3,
                graph * 1e3,
                summed * 1e3,
                g.pass_ops(&st, n),
                100.0 * (1.0 - graph / pass)
            ));
            if TABLED.contains(&n) {
                tables.push(op_table(
                    &format!("{format} pass of {n} tokens by op (inside graphs of 4 launches cycling over the layers' ops of a kind)"),
                    "pass",
                    &prof,
                ));
            }
        }
        for t in tables {
            rep.line(t);
        }
    }
    Ok(())
}
