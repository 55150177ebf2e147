//! Whole models against the CPU engine and the twin: logits, greedy agreement, the q8_0 KV
//! cache, determinism.

use model::synth::{self, Preset};
use model::{Logits, Model};
use niwaki_cuda::plan::{ClusterFold, GemmKernel};
use niwaki_cuda::repack::FORMATS;
use niwaki_cuda::twin::Twin;
use niwaki_cuda::{CudaModel, CudaState, KvCache};
use quant::Format;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::report::*;

pub(crate) fn whole_model(rep: &mut Report, preset: Preset, vocab: usize) -> R<()> {
    for format in FORMATS {
        let shape = preset.shape(vocab);
        let m = random_model(&shape, format, 5)?;
        against_cpu(rep, preset, &format.to_string(), &m, vocab)?;
    }
    Ok(())
}

/// Ternary-Bonsai-2's Hadamard rotation folded into small models (the CPU engine applies it
/// exactly; the GPU rotates inside its quantizations and runs α, β on their own GEMV).
pub(crate) fn whole_model_rotated(rep: &mut Report) -> R<()> {
    let (preset, vocab) = (Preset::Small, 4096);
    for format in [Format::Q2_0, Format::Q1_0] {
        let m = rotated(&preset.shape(vocab), format, 5)?;
        against_cpu(
            rep,
            preset,
            &format!("{format}, Hadamard-rotated"),
            &m,
            vocab,
        )?;
    }
    Ok(())
}

/// A model of random weights (`seed`) with a Hadamard rotation folded in as Ternary-Bonsai-2
/// stores it.
pub(crate) fn rotated(shape: &synth::Shape, format: Format, seed: u64) -> R<Model> {
    let t = synth::random_f32_tensors(shape, format, seed);
    let signs = synth::hadamard::signs(shape, 6).ok_or("the shape cannot be rotated")?;
    let folded = synth::hadamard::fold(shape, &t, &signs);
    let mut w = synth::writer_from_f32(shape, &folded, format, "h")?;
    synth::hadamard::write_metadata(&mut w, shape, &signs);
    open(&w)
}

/// One model's GPU logits against the CPU engine's (and the twin's, on the tiny preset).
fn against_cpu(
    rep: &mut Report,
    preset: Preset,
    label: &str,
    m: &model::Model,
    vocab: usize,
) -> R<()> {
    {
        let g = CudaModel::load(m)?;
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let prompt: Vec<u32> = (0..20).map(|_| rng.gen_range(0..vocab as u32)).collect();
        let mut cs = m.new_state();
        let a = m.forward(&mut cs, &prompt, Logits::All)?;
        // The prefill's GEMMs as the model runs them (f16 on sm_90a), against the CPU only:
        // its twin is the int8 arithmetic (the f16 GEMM has its own, in the kernel checks).
        let f16_prefill = if g.gpu().wants_f16_acts(prompt.len()) {
            let mut fs = g.new_state(256)?;
            Some(rel_l2(&g.forward(&mut fs, &prompt, Logits::All)?, &a))
        } else {
            None
        };
        // The rest on the int8 GEMM and the token-by-token recurrence, which the twin
        // reproduces to float rounding.
        let mut gs = g.new_state(256)?;
        let b = on_twin_arithmetic(&g, || g.forward(&mut gs, &prompt, Logits::All))?;
        let mut worst = rel_l2(&b, &a);
        let mut worst_abs = max_abs(&b, &a);
        let mut flips = Vec::new();
        // The CPU twin of the GPU arithmetic (tiny only: it is slow). GPU vs twin must agree to
        // float rounding; twin vs CPU is what int8 activations cost.
        let mut twin = (preset == Preset::Tiny).then(|| Twin::new(m)).transpose()?;
        let (mut gpu_twin, mut twin_cpu) = (0f64, 0f64);
        if let Some(tw) = twin.as_mut() {
            for (i, &p) in prompt.iter().enumerate() {
                let l = tw.step(p)?;
                gpu_twin = gpu_twin.max(rel_l2(&b[i * vocab..(i + 1) * vocab], &l));
                twin_cpu = twin_cpu.max(rel_l2(&l, &a[i * vocab..(i + 1) * vocab]));
            }
        }
        let mut tok = top2(&a[a.len() - vocab..]).0 as u32;
        // Teacher-forced decode: both sides get the CPU's greedy token.
        for step in 0..12 {
            let a = m.forward(&mut cs, &[tok], Logits::Last)?;
            let b = g.forward(&mut gs, &[tok], Logits::Last)?;
            if let Some(tw) = twin.as_mut() {
                let l = tw.step(tok)?;
                gpu_twin = gpu_twin.max(rel_l2(&b, &l));
                twin_cpu = twin_cpu.max(rel_l2(&l, &a));
            }
            worst = worst.max(rel_l2(&b, &a));
            let d = max_abs(&b, &a);
            worst_abs = worst_abs.max(d);
            let (ia, gap) = top2(&a);
            let ib = top2(&b).0;
            if ia != ib {
                flips.push((step, gap, d));
            }
            tok = ia as u32;
        }
        // Free-running greedy on both, GPU argmax on the device.
        let mut cs = m.new_state();
        let mut gs = g.new_state(256)?;
        let mut last = m.forward(&mut cs, &prompt, Logits::Last)?;
        let mut ca = top2(&last).0 as u32;
        let mut gb = g.forward_greedy(&mut gs, &prompt)?;
        let mut same = 0;
        let mut diverge = None;
        for _ in 0..16 {
            if ca != gb {
                diverge = Some(top2(&last).1);
                break;
            }
            same += 1;
            last = m.forward(&mut cs, &[ca], Logits::Last)?;
            ca = top2(&last).0 as u32;
            gb = g.forward_greedy(&mut gs, &[gb])?;
        }
        let near_ties = flips.iter().all(|&(_, gap, d)| gap < 4.0 * d);
        // Identical arithmetic can still differ where a 1-ulp difference upstream (expf, sqrtf)
        // moves an activation across an int8 rounding boundary; such a flip propagates, but stays
        // far inside the quantization noise itself (twin vs CPU).
        // Or, where such a flip has grown over the 32 steps of a random model, the GPU must stay
        // no further from exact f32 than the twin itself (the kernels are checked exactly above).
        let twin_ok =
            twin.is_none() || gpu_twin < 2e-3 || gpu_twin < 0.3 * twin_cpu || worst <= twin_cpu;
        let ok = worst < 0.2 && near_ties && twin_ok && f16_prefill.is_none_or(|e| e < 0.2);
        let twin_col = if twin.is_some() {
            format!("{gpu_twin:.1e} | {twin_cpu:.2e}")
        } else {
            "— | —".to_string()
        };
        rep.line(format!(
            "| {preset:?} | {label} | {} | {twin_col} | {worst:.2e} | {} | {worst_abs:.2e} | {} | {same}/16{} |",
            if ok { "PASS" } else { "FAIL" },
            f16_prefill.map_or("—".to_string(), |e| format!("{e:.2e}")),
            if flips.is_empty() {
                "none".to_string()
            } else {
                flips
                    .iter()
                    .map(|(s, gap, d)| format!("step {s}: gap {gap:.2e}, err {d:.2e}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            },
            diverge.map_or(String::new(), |gap| format!(" (CPU top-2 gap {gap:.2e})"))
        ));
        rep.check(ok, format!("whole model {preset:?} {label}"));
    }
    Ok(())
}

/// `f` with the twin's arithmetic: every GEMM on the int8 kernel and the recurrence token by
/// token; then back to each matrix's preferred GEMM and the recurrence as it was.
fn on_twin_arithmetic<T>(g: &CudaModel, f: impl FnOnce() -> T) -> T {
    g.gpu().set_gemm_kernel(Some(GemmKernel::INT8));
    let chunked = g.gpu().set_gdn_chunked(false);
    let r = f();
    g.gpu().set_gemm_kernel(None);
    g.gpu().set_gdn_chunked(chunked);
    r
}

/// The q8_0 KV cache against the f16 one and the CPU engine: a 20-token prefill (all logits) and
/// 12 teacher-forced decode steps, then 16 free-running greedy tokens against the f16 cache.
pub(crate) fn kv_q8_checks(rep: &mut Report) -> R<()> {
    for (preset, vocab) in [(Preset::Tiny, 1000usize), (Preset::Small, 4096)] {
        for format in [Format::Q2_0, Format::Q1_0] {
            let shape = preset.shape(vocab);
            let m = random_model(&shape, format, 5)?;
            let mut g = CudaModel::load(&m)?;
            let mut rng = ChaCha8Rng::seed_from_u64(9);
            let prompt: Vec<u32> = (0..20).map(|_| rng.gen_range(0..vocab as u32)).collect();
            let mut cs = m.new_state();
            let mut want = m.forward(&mut cs, &prompt, Logits::All)?;
            let mut steps = Vec::new();
            let mut tok = top2(&want[want.len() - vocab..]).0 as u32;
            for _ in 0..12 {
                steps.push(tok);
                let l = m.forward(&mut cs, &[tok], Logits::Last)?;
                tok = top2(&l).0 as u32;
                want.extend(l);
            }
            let mut run = |kv: KvCache| -> R<(Vec<f32>, Vec<u32>)> {
                g.kv_cache = kv;
                let mut gs = g.new_state(256)?;
                // On the twin's arithmetic (int8 GEMM, token-by-token recurrence; whole_model checks the
                // f16 one against the CPU).
                let mut out = on_twin_arithmetic(&g, || g.forward(&mut gs, &prompt, Logits::All))?;
                for &s in &steps {
                    out.extend(g.forward(&mut gs, &[s], Logits::Last)?);
                }
                let mut gs = g.new_state(256)?;
                let mut toks = vec![g.forward_greedy(&mut gs, &prompt)?];
                for _ in 0..15 {
                    toks.push(g.forward_greedy(&mut gs, &[*toks.last().unwrap()])?);
                }
                Ok((out, toks))
            };
            let (f16, f16_toks) = run(KvCache::F16)?;
            let (q8, q8_toks) = run(KvCache::Q8_0)?;
            let (e_f16, e_q8, e_rel) = (rel_l2(&f16, &want), rel_l2(&q8, &want), rel_l2(&q8, &f16));
            let same = f16_toks
                .iter()
                .zip(&q8_toks)
                .take_while(|(a, b)| a == b)
                .count();
            // Tiny: the CPU twin of the GPU arithmetic with the same q8_0 cache, by position,
            // under whole_model's rule.
            let (mut gpu_twin, mut twin_cpu) = (0f64, 0f64);
            if preset == Preset::Tiny {
                let mut tw = Twin::with_kv_cache(&m, KvCache::Q8_0)?;
                for (i, &tok) in prompt.iter().chain(&steps).enumerate() {
                    let l = tw.step(tok)?;
                    let row = i * vocab..(i + 1) * vocab;
                    gpu_twin = gpu_twin.max(rel_l2(&q8[row.clone()], &l));
                    twin_cpu = twin_cpu.max(rel_l2(&l, &want[row]));
                }
            }
            let twin_ok = preset != Preset::Tiny
                || gpu_twin < 2e-3
                || gpu_twin < 0.3 * twin_cpu
                || e_q8 <= twin_cpu;
            let ok = e_q8 < 0.2 && twin_ok && q8.iter().all(|v| v.is_finite());
            let twin_col = if preset == Preset::Tiny {
                format!("{gpu_twin:.1e}")
            } else {
                "—".to_string()
            };
            rep.line(format!(
                "| {preset:?} | {format} | {} | {e_f16:.2e} | {e_q8:.2e} | {e_rel:.2e} | {twin_col} | {same}/16 |",
                if ok { "PASS" } else { "FAIL" }
            ));
            rep.check(ok, format!("q8_0 KV cache {preset:?} {format}"));
        }
    }
    Ok(())
}

/// The merged kernels of decode steps against the kernels they replace, logits bit for bit over
/// calls of 20, 1, 1, 1, 5, 1, 1, 2, 1, 1, 1 tokens (odd and even passes move the conv state
/// between its two buffers): the one-kernel recurrence (`gdn_decode`) against conv, step and
/// gated norm, and the attention merge with its quantization (`attn_combine_quant`) against
/// `attn_combine` and `quant_plain`.
pub(crate) fn fused_recurrence(rep: &mut Report) -> R<()> {
    for (preset, vocab) in [(Preset::Tiny, 1000usize), (Preset::Small, 4096)] {
        let shape = preset.shape(vocab);
        let m = random_model(&shape, Format::Q2_0, 12)?;
        let g = CudaModel::load(&m)?;
        let mut rng = ChaCha8Rng::seed_from_u64(13);
        let mut tok = || rng.gen_range(0..vocab as u32);
        let calls: Vec<Vec<u32>> = [20, 1, 1, 1, 5, 1, 1, 2, 1, 1, 1]
            .iter()
            .map(|&n| (0..n).map(|_| tok()).collect())
            .collect();
        let run = |gdn: bool, attn: bool| -> R<Vec<f32>> {
            let (g0, a0) = (g.gpu().set_fuse_gdn(gdn), g.gpu().set_fuse_attn(attn));
            let out = (|| -> R<Vec<f32>> {
                let mut st = g.new_state(256)?;
                let mut out = Vec::new();
                for c in &calls {
                    out.extend(g.forward(&mut st, c, Logits::Last)?);
                }
                Ok(out)
            })();
            g.gpu().set_fuse_gdn(g0);
            g.gpu().set_fuse_attn(a0);
            out
        };
        let plain = run(false, false)?;
        // Heads of 64 values (Tiny) keep attn_combine and quant_plain: nothing to compare.
        let merges_attn = shape.head_dim % 128 == 0;
        for (what, gdn, attn) in [
            (
                "One-kernel decode recurrence against conv + step + gated norm",
                true,
                false,
            ),
            (
                "One-kernel decode attention merge + quantization against the two kernels",
                false,
                true,
            ),
        ] {
            if attn && !merges_attn {
                continue;
            }
            let b = run(gdn, attn)?;
            let differing = plain
                .iter()
                .zip(&b)
                .filter(|(x, y)| x.to_bits() != y.to_bits())
                .count();
            let ok = plain.len() == b.len() && differing == 0;
            rep.line(format!(
                "{what} ({preset:?}, Q2_0, {} calls): {differing} of {} logits differ in any bit",
                calls.len(),
                plain.len()
            ));
            rep.check(ok, format!("{what} {preset:?}"));
        }
    }
    folded_norms(rep)?;
    folded_swiglus(rep)?;
    clustered_folds(rep)?;
    plane_words(rep)?;
    short_attention(rep)
}

/// The CPU model, the same on the GPU, and the calls a fold check runs.
type FoldFixture = (model::Model, CudaModel, Vec<Vec<u32>>);

/// A random model of `preset` in `format` on both engines (weights and tokens from `seeds`), and
/// calls of 20, 1, 1, 1, 5, 1, 1, 2, 1, 1, 1, 1, 1 random tokens: multi-token passes between
/// one-token ones, which the folds take.
fn fold_fixture(preset: Preset, vocab: usize, format: Format, seeds: (u64, u64)) -> R<FoldFixture> {
    let shape = preset.shape(vocab);
    let m = random_model(&shape, format, seeds.0)?;
    fold_calls(m, vocab, seeds.1)
}

/// `m` on the GPU beside it, and the fold checks' calls, their tokens drawn from `seed`.
fn fold_calls(m: model::Model, vocab: usize, seed: u64) -> R<FoldFixture> {
    let g = CudaModel::load(&m)?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let calls = [20, 1, 1, 1, 5, 1, 1, 2, 1, 1, 1, 1, 1]
        .iter()
        .map(|&n| (0..n).map(|_| rng.gen_range(0..vocab as u32)).collect())
        .collect();
    Ok((m, g, calls))
}

/// A twin check after a one-token call: words differing, words compared.
type TwinCheck<'a> = &'a dyn Fn(&CudaState) -> niwaki_cuda::Result<(usize, usize)>;
/// Each call's logits, and the twin checks' words differing and compared, summed.
type CallsRun = (Vec<Vec<f32>>, (usize, usize));

/// Each call's logits on a fresh state (of 256 tokens, or the calls' if more), and with `twin`,
/// the words it finds differing and the words it compared, summed over the checks it makes
/// after each one-token call.
fn run_calls(g: &CudaModel, calls: &[Vec<u32>], twin: Option<TwinCheck>) -> R<CallsRun> {
    let mut st = g.new_state(calls.iter().map(Vec::len).sum::<usize>().max(256))?;
    let (mut out, mut diff, mut words) = (Vec::new(), 0, 0);
    for c in calls {
        out.push(g.forward(&mut st, c, Logits::Last)?);
        if let (Some(twin), 1) = (twin, c.len()) {
            let (d, w) = twin(&st)?;
            diff += d;
            words += w;
        }
    }
    Ok((out, (diff, words)))
}

/// The norms folded into the residual GEMVs (`Fusion::fold`) against the norms apart: what the
/// folded decode GEMVs leave for the output norm must be its twin's bits (quant_rms unscaled on
/// the same residual); the logits, whose activations are quantized before rather than after the
/// 1/rms, within the engine's tolerance of the CPU and no further from it than the norms apart.
pub(crate) fn folded_norms(rep: &mut Report) -> R<()> {
    for (preset, vocab) in [(Preset::Tiny, 1000usize), (Preset::Small, 4096)] {
        for format in [Format::Q2_0, Format::Q1_0] {
            let (m, g, calls) = fold_fixture(preset, vocab, format, (12, 17))?;
            let mut cs = m.new_state();
            let cpu = calls
                .iter()
                .map(|c| m.forward(&mut cs, c, Logits::Last))
                .collect::<Result<Vec<_>, _>>()?;
            let launches0 = g.gpu().fold_launches();
            let was = g.gpu().set_fold_norm(false);
            let apart = run_calls(&g, &calls, None);
            g.gpu().set_fold_norm(true);
            let folded = run_calls(&g, &calls, Some(&|st| g.fold_twin_differences(st)));
            g.gpu().set_fold_norm(was);
            let ((apart, _), (folded, (twin_diff, twin_words))) = (apart?, folded?);
            let launches = g.gpu().fold_launches() - launches0;
            let (fa, fc, ac) = (
                worst_rel_l2(&folded, &apart),
                worst_rel_l2(&folded, &cpu),
                worst_rel_l2(&apart, &cpu),
            );
            let ok = launches > 0 && twin_diff == 0 && fc < 0.2 && fc <= 1.25 * ac + 1e-3;
            rep.line(format!(
                "Norms folded into the residual decode GEMVs ({preset:?}, {format:?}, {} calls, {launches} folded launches): twin of the output norm's input {twin_diff} of {twin_words} words differ (must be 0); logits folded vs apart {fa:.2e}, folded vs CPU {fc:.2e}, apart vs CPU {ac:.2e} (relative L2, worst call) {}",
                calls.len(),
                if ok { "PASS" } else { "FAIL" }
            ));
            rep.check(ok, format!("folded norms {preset:?} {format:?}"));
        }
    }
    Ok(())
}

/// A decode setting that must not change a bit, and how to check it: `set` turns it on or off
/// (returning the previous setting), `launches` counts the launches that took it, `twin` checks
/// what it left after a one-token call (words differing, words compared).
struct BitExactSetting<'a> {
    set: &'a dyn Fn(&CudaModel, bool) -> bool,
    launches: &'a dyn Fn(&CudaModel) -> usize,
    twin: &'a ModelTwinCheck,
}

/// A twin check after a one-token call of a model: words differing, words compared.
type ModelTwinCheck = dyn Fn(&CudaModel, &CudaState) -> niwaki_cuda::Result<(usize, usize)>;

/// What [`either_way`] found: the launches that took the setting, the twin's words differing
/// and compared, the logits differing in any bit and compared.
struct EitherWay {
    launches: usize,
    twin_diff: usize,
    twin_words: usize,
    differing: usize,
    compared: usize,
}

impl EitherWay {
    /// The setting ran, and changed neither the twin's words nor any logit.
    fn ok(&self) -> bool {
        self.launches > 0
            && self.twin_words > 0
            && self.twin_diff == 0
            && self.compared > 0
            && self.differing == 0
    }

    /// The report's line and check: `head` says what ran on what (up to its calls), `took` how
    /// its launches took the setting, `twin` whose twin the words are, `against` what the
    /// setting's logits were compared with.
    fn report(
        &self,
        rep: &mut Report,
        head: String,
        took: &str,
        twin: &str,
        against: &str,
        check: String,
    ) {
        rep.line(format!(
            "{head}, {} {took}): twin of {twin} {} of {} words differ; logits against {against} {} of {} differ in any bit (both must be 0) {}",
            self.launches,
            self.twin_diff,
            self.twin_words,
            self.differing,
            self.compared,
            if self.ok() { "PASS" } else { "FAIL" }
        ));
        rep.check(self.ok(), check);
    }
}

/// `calls` with the setting off, then on, the norms folded on both sides.
fn either_way(g: &CudaModel, calls: &[Vec<u32>], s: &BitExactSetting) -> R<EitherWay> {
    let launches0 = (s.launches)(g);
    let (norms, was) = (g.gpu().set_fold_norm(true), (s.set)(g, false));
    let off = run_calls(g, calls, None);
    (s.set)(g, true);
    let on = run_calls(g, calls, Some(&|st| (s.twin)(g, st)));
    (s.set)(g, was);
    g.gpu().set_fold_norm(norms);
    let ((off, _), (on, twin)) = (off?, on?);
    let (off, on) = (off.concat(), on.concat());
    let differing = off
        .iter()
        .zip(&on)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    let compared = if off.len() == on.len() { off.len() } else { 0 };
    Ok(EitherWay {
        launches: (s.launches)(g) - launches0,
        twin_diff: twin.0,
        twin_words: twin.1,
        differing,
        compared,
    })
}

/// The SwiGLUs folded into the gate | up GEMVs (`Fusion::swiglu`, the norms folded on both
/// sides) against `quant_swiglu` apart: the same arithmetic, so every logit in every bit, and
/// what the last layer's fold left must be its twin's (`quant_swiglu` on the same projection).
pub(crate) fn folded_swiglus(rep: &mut Report) -> R<()> {
    let setting = BitExactSetting {
        set: &|g, on| g.gpu().set_fold_swiglu(on),
        launches: &|g| g.gpu().swiglu_launches(),
        twin: &|g, st| g.swiglu_twin_differences(st),
    };
    // The 27B's widths last: there a block's gate | up tiles arrive one by one.
    for (preset, vocab) in [
        (Preset::Tiny, 1000usize),
        (Preset::Small, 4096),
        (Preset::B27, 4096),
    ] {
        for format in [Format::Q2_0, Format::Q1_0] {
            // At the 27B's widths a gate | up block takes several tiles, as the 27B's do.
            let (name, (_, g, calls)) = if preset == Preset::B27 {
                let wide = fold_calls(wide_27b(vocab, format, 14)?, vocab, 19)?;
                ("the 27B's widths, 4 layers".to_string(), wide)
            } else {
                let f = fold_fixture(preset, vocab, format, (14, 19))?;
                (format!("{preset:?}"), f)
            };
            either_way(&g, &calls, &setting)?.report(
                rep,
                format!(
                    "SwiGLU folded into the gate | up decode GEMVs ({name}, {format:?}, {} calls",
                    calls.len()
                ),
                "folded launches",
                "the last layer's SwiGLU",
                "quant_swiglu apart",
                format!("folded SwiGLU {name} {format:?}"),
            );
        }
    }
    Ok(())
}

pub(crate) fn determinism(rep: &mut Report) -> R<()> {
    let vocab = 4096;
    let shape = Preset::Small.shape(vocab);
    let m = random_model(&shape, Format::Q2_0, 8)?;
    let g = CudaModel::load(&m)?;
    let prompt: Vec<u32> = (0..37).map(|i| (i * 101 % vocab) as u32).collect();
    let mut runs = Vec::new();
    let mut logits = Vec::new();
    for _ in 0..10 {
        let mut st = g.new_state(512)?;
        let mut out = vec![g.forward_greedy(&mut st, &prompt)?];
        for _ in 0..32 {
            let next = g.forward_greedy(&mut st, &[*out.last().unwrap()])?;
            out.push(next);
        }
        logits.push(g.forward(&mut st, &[1], Logits::Last)?);
        runs.push(out);
    }
    let same = runs.iter().all(|r| *r == runs[0]);
    let same_logits = logits.iter().all(|l| {
        l.iter()
            .zip(&logits[0])
            .all(|(a, b)| a.to_bits() == b.to_bits())
    });
    rep.line(format!(
        "Determinism (small, Q2_0, 37-token prompt + 32 greedy tokens, 10 runs): tokens identical: {same}; final logits bit-identical: {same_logits}"
    ));
    rep.check(same && same_logits, "determinism".into());
    Ok(())
}

/// The folded norms' pieces gathered in clusters of eight blocks (`fold_cluster`,
/// `NIWAKI_CUDA_FOLD_CLUSTER`) against the arrival counters (`fold_arrive`): the same values
/// folded by the same arithmetic, so every logit in every bit, and what the decode GEMVs leave
/// for the output norm its twin's (quant_rms unscaled). On the small preset, whose residual
/// GEMVs (1024 rows, 1024 and 3072 columns) take the binary kernels; the tiny one's take none.
pub(crate) fn clustered_folds(rep: &mut Report) -> R<()> {
    let setting = BitExactSetting {
        set: &|g, on| {
            let c = if on {
                ClusterFold::All
            } else {
                ClusterFold::Off
            };
            g.gpu().set_fold_cluster(c) != ClusterFold::Off
        },
        launches: &|g| g.gpu().cluster_fold_launches(),
        twin: &|g, st| g.fold_twin_differences(st),
    };
    for format in [Format::Q2_0, Format::Q1_0, Format::Q2_0G128] {
        let (_, g, calls) = fold_fixture(Preset::Small, 4096, format, (16, 21))?;
        either_way(&g, &calls, &setting)?.report(
            rep,
            format!(
                "Folded norms gathered in clusters (Small, {format:?}, {} calls",
                calls.len()
            ),
            "clustered launches",
            "the output norm's input",
            "the arrival counters",
            format!("clustered folds {format:?}"),
        );
    }
    Ok(())
}

/// One-token passes of 1-bit models on their activations' plane words (written by every
/// quantization, read by the 1-bit binary GEMVs' `_p` kernels; `NIWAKI_CUDA_B1_PLANES`)
/// against the GEMVs forming them from the codes: the same words, so every logit in every bit,
/// and the words a pass left must be their CPU twin's (`repack::plane_words` of the codes).
/// On the small preset and at the 27B's widths (5120, 6144 and 17408 columns: the exact
/// kernels, ffn_down's staged in shared memory).
pub(crate) fn plane_words(rep: &mut Report) -> R<()> {
    let setting = BitExactSetting {
        set: &|g, on| g.gpu().set_b1_planes(on),
        launches: &|g| g.gpu().planes_launches(),
        twin: &|g, st| g.planes_twin_differences(st),
    };
    let vocab = 4096;
    for (name, (_, g, calls)) in [
        (
            "Small",
            fold_fixture(Preset::Small, vocab, Format::Q1_0, (22, 23))?,
        ),
        (
            "the 27B's widths, 4 layers",
            fold_calls(wide_27b(vocab, Format::Q1_0, 24)?, vocab, 25)?,
        ),
    ] {
        either_way(&g, &calls, &setting)?.report(
            rep,
            format!(
                "Plane words written by the quantizations, read by the 1-bit binary GEMVs ({name}, Q1_0, {} calls",
                calls.len()
            ),
            "launches on them",
            "the plane words (repack::plane_words of the codes)",
            "the GEMVs forming them",
            format!("plane words {name}"),
        );
    }
    Ok(())
}

/// The one-kernel short attention (`attn_short`) against the prep, split and merge kernels it
/// replaces, on both caches: each one-token call's logits against the split path's (another
/// order of sums, so not bit for bit) and both against the CPU engine's, the short path no
/// further from the CPU than the split one; the same calls twice give the same bits. The
/// calls: 20 tokens then twelve of one (contexts the default takes), and a 300-token prompt then
/// four of one with the short path taking every context (each warp's ring taken round several
/// times).
pub(crate) fn short_attention(rep: &mut Report) -> R<()> {
    let vocab = 4096;
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    let mut toks =
        |n: usize| -> Vec<u32> { (0..n).map(|_| rng.gen_range(0..vocab as u32)).collect() };
    let short_calls: Vec<Vec<u32>> = std::iter::once(toks(20))
        .chain((0..12).map(|_| toks(1)))
        .collect();
    let long_calls: Vec<Vec<u32>> = std::iter::once(toks(300))
        .chain((0..4).map(|_| toks(1)))
        .collect();
    let small = |format| random_model(&Preset::Small.shape(vocab), format, 32);
    for (name, format, m) in [
        ("Small", Format::Q2_0, small(Format::Q2_0)?),
        ("Small", Format::Q1_0, small(Format::Q1_0)?),
        (
            "the 27B's widths, 4 layers",
            Format::Q1_0,
            wide_27b(vocab, Format::Q1_0, 33)?,
        ),
    ] {
        let mut g = CudaModel::load(&m)?;
        for kv in [KvCache::F16, KvCache::Q8_0] {
            g.kv_cache = kv;
            for (calls, longest) in [(&short_calls, None), (&long_calls, Some(4096))] {
                let mut cs = m.new_state();
                let cpu = calls
                    .iter()
                    .map(|c| m.forward(&mut cs, c, Logits::Last))
                    .collect::<Result<Vec<_>, _>>()?;
                let run = |max: Option<usize>| -> R<Vec<Vec<f32>>> {
                    let was = max.map(|n| g.gpu().set_attn_short_max(n));
                    let out = run_calls(&g, calls, None);
                    if let Some(w) = was {
                        g.gpu().set_attn_short_max(w);
                    }
                    Ok(out?.0)
                };
                let split = run(Some(0))?;
                let launches0 = g.gpu().attn_short_launches();
                let short = run(longest)?;
                let launches = g.gpu().attn_short_launches() - launches0;
                let again = run(longest)?;
                // The one-token calls: the first call is the multi-token prompt.
                let (ss, sc, pc) = (
                    worst_rel_l2(&short[1..], &split[1..]),
                    worst_rel_l2(&short[1..], &cpu[1..]),
                    worst_rel_l2(&split[1..], &cpu[1..]),
                );
                let repeat = short
                    .concat()
                    .iter()
                    .zip(again.concat())
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                let finite = short.iter().flatten().all(|v| v.is_finite());
                let ok = launches > 0 && repeat && finite && sc < 0.2 && sc <= 1.25 * pc + 1e-3;
                rep.line(format!(
                    "One-kernel short attention ({name}, {format:?}, {kv:?} cache, {} then {} one-token calls, {launches} launches): logits short vs split {ss:.2e}, short vs CPU {sc:.2e}, split vs CPU {pc:.2e} (relative L2, worst one-token call); repeated bit-identical: {repeat} {}",
                    calls[0].len(),
                    calls.len() - 1,
                    if ok { "PASS" } else { "FAIL" }
                ));
                rep.check(
                    ok,
                    format!(
                        "short attention {name} {format:?} {kv:?} {}",
                        calls[0].len()
                    ),
                );
            }
        }
    }
    Ok(())
}
