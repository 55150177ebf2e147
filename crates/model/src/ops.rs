//! Element-wise and reduction operations of the forward pass, in plain f32.

use std::ops::Range;
use std::sync::Mutex;

use quant::{QuantizedActs, PANEL};

use crate::disjoint::Disjoint;
use crate::input::{Input, Kernels};
use crate::pool;
use crate::weights::Matrix;

/// Rows handed out per task: enough work to amortise the hand-out, small enough that the last
/// tasks of a matrix balance across cores.
const ROWS_PER_TASK: usize = 16;

/// `out[t][r] = W[r] · x[t]` for every token of `input`. Each (row, token) product is computed
/// the same way whatever the token count or thread count, so chunked prefill and one-token steps
/// agree bit for bit.
pub fn matmul(w: &Matrix, input: &Input, out: &mut [f32]) {
    let tokens = input.tokens();
    assert_eq!(out.len(), tokens * w.rows, "{}: output length", w.name());
    match input.kernels() {
        Kernels::Exact => matmul_exact(w, input.f32_for(w), tokens, out),
        Kernels::Int8 => matmul_int8(w, input.acts_for(w), out),
    }
}

fn matmul_exact(w: &Matrix, x: &[f32], tokens: usize, out: &mut [f32]) {
    assert_eq!(x.len(), tokens * w.cols, "{}: input length", w.name());
    let data = w.data();
    let rb = w.row_bytes();
    let rows = w.rows;
    let dst = Disjoint::new(out);
    pool::global().run(rows.div_ceil(ROWS_PER_TASK), |task| {
        let r0 = task * ROWS_PER_TASK;
        for r in r0..(r0 + ROWS_PER_TASK).min(rows) {
            // Rows outer, tokens inner: each weight row is read once per chunk of tokens.
            let row = &data[r * rb..(r + 1) * rb];
            for t in 0..tokens {
                let v = quant::dot(w.format, row, &x[t * w.cols..(t + 1) * w.cols]);
                // SAFETY: `t * rows + r < out.len()` (asserted above) and row `r` belongs to
                // this task alone.
                unsafe { dst.write(t * rows + r, v) };
            }
        }
    });
}

/// Panels handed out per task on tiled weights (the decode kernel runs two at a time).
const PANELS_PER_TASK: usize = 2;
/// The fewest panels a task of a one-token pass takes ([`decode_panel_tasks`]): ~340 KB of a
/// 5120-wide 2-bit matrix, ~190 KB of a 1-bit one. 27B files on 2 Zen 4 cores, decode steps
/// alternated in one process with fixed tasks of 8 panels (the split before): Q1_0 −6.4% and
/// Q2_0 −5.8% per token (medians) at 16; at 8, −2 to −6% (Q1_0); at 32 level on Q2_0; fixed
/// tasks of 16 panels level with 8.
const DECODE_MIN_PANELS: usize = 16;
/// Where a matrix has fewer than four such tasks per thread, the minimum drops towards this
/// (the fixed task size before), so that many cores still share a small matrix.
const DECODE_MIN_PANELS_FLOOR: usize = 8;

/// The fewest panels a task takes for a matrix of `panels` panels on `threads` threads.
fn decode_min_panels(panels: usize, threads: usize) -> usize {
    (panels / (4 * threads.max(1))).clamp(DECODE_MIN_PANELS_FLOOR, DECODE_MIN_PANELS)
}

/// The most rows a task of [`int8_row_tasks`] takes.
const MAX_TASK_ROWS: usize = if ROWS_PER_TASK > PANELS_PER_TASK * PANEL {
    ROWS_PER_TASK
} else {
    PANELS_PER_TASK * PANEL
};

/// Splits `rows` into tasks of `rows_per_task` rows over the pool; each task calls
/// `gemm(r0..r1, t0..t1, buf)` for chunks of its tokens, with `buf[(r − r0)·T + (t − t0)]` laid out
/// as `quant::gemm_rows` writes it, and the results land in `out[t·rows + r]`.
fn int8_row_tasks(
    rows: usize,
    tokens: usize,
    rows_per_task: usize,
    out: &mut [f32],
    gemm: impl Fn(Range<usize>, Range<usize>, &mut [f32]) + Sync,
) {
    // One token writes straight into `out`; more use the task's stack scratch.
    assert!(tokens == 1 || rows_per_task <= MAX_TASK_ROWS);
    let dst = Disjoint::new(out);
    pool::global().run(rows.div_ceil(rows_per_task), |task| {
        let r0 = task * rows_per_task;
        let r1 = (r0 + rows_per_task).min(rows);
        if tokens == 1 {
            // One token: the task's rows are contiguous in `out`, so the kernel writes there
            // (no scratch to clear: a decode token runs ~10⁵ of these tasks).
            // SAFETY: rows r0..r1 belong to this task alone and lie inside `out` (asserted by
            // the caller: `out.len() == rows`).
            let rows_out = unsafe { dst.slice_mut(r0..r1) };
            return gemm(r0..r1, 0..1, rows_out);
        }
        let mut local = [0f32; MAX_TASK_ROWS * MAX_LOCAL_TOKENS];
        for t0 in (0..tokens).step_by(MAX_LOCAL_TOKENS) {
            let t1 = (t0 + MAX_LOCAL_TOKENS).min(tokens);
            let nt = t1 - t0;
            let buf = &mut local[..(r1 - r0) * nt];
            gemm(r0..r1, t0..t1, buf);
            // Tokens outer: each token's rows land in consecutive places of `out`.
            for t in t0..t1 {
                for r in r0..r1 {
                    // SAFETY: row `r` belongs to this task alone and `t < tokens`, so the index
                    // is inside `out` (asserted by the caller) and written by no other task.
                    unsafe { dst.write(t * rows + r, buf[(r - r0) * nt + (t - t0)]) };
                }
            }
        }
    });
}

fn matmul_int8(w: &Matrix, acts: &[QuantizedActs], out: &mut [f32]) {
    let tokens = acts.len();
    match w.tiled() {
        // Tasks start on panel boundaries, so each covers whole panels.
        Some(m) if tokens == 1 => decode_tiled(m, acts, out),
        Some(m) => int8_row_tasks(
            m.rows(),
            tokens,
            PANELS_PER_TASK * PANEL,
            out,
            |r, t, buf| quant::gemm_tiled(m, r.start / PANEL..r.end.div_ceil(PANEL), &acts[t], buf),
        ),
        None => {
            let (data, rb) = (w.data(), w.row_bytes());
            int8_row_tasks(w.rows, tokens, ROWS_PER_TASK, out, |r, t, buf| {
                quant::gemm_rows(w.format, data, rb, r, &acts[t], buf)
            })
        }
    }
}

/// Panel ranges of a one-token pass over `panels` panels on `threads` threads, in the order
/// the pool hands them out: each a share 1 / (2·threads) of the panels left, but at least
/// [`decode_min_panels`]. The first tasks are long, so each thread's two weight streams (see
/// `quant::tiled`) run on through many consecutive panels; the last are short, so the cores
/// still finish together.
fn decode_panel_tasks(panels: usize, threads: usize) -> Vec<Range<usize>> {
    let min = decode_min_panels(panels, threads);
    let mut tasks = Vec::new();
    let mut at = 0;
    while at < panels {
        let left = panels - at;
        let size = left.div_ceil(2 * threads.max(1)).max(min).min(left);
        tasks.push(at..at + size);
        at += size;
    }
    tasks
}

/// One token times a tiled matrix, over [`decode_panel_tasks`].
fn decode_tiled(m: &quant::TiledMatrix, acts: &[QuantizedActs], out: &mut [f32]) {
    let tasks = decode_panel_tasks(m.panels(), pool::global().threads());
    let dst = Disjoint::new(out);
    pool::global().run(tasks.len(), |i| {
        let p = tasks[i].clone();
        let rows = p.start * PANEL..(p.end * PANEL).min(m.rows());
        // SAFETY: the tasks' panel ranges are disjoint, so are their rows, and they lie inside
        // `out` (one token: `out.len() == rows`, asserted by `matmul`).
        let rows_out = unsafe { dst.slice_mut(rows) };
        quant::gemm_tiled(m, p, acts, rows_out);
    });
}

/// Tokens one task multiplies per pass over its rows (bounded so the scratch stays on the stack).
const MAX_LOCAL_TOKENS: usize = 64;

/// `x · rsqrt(mean(x²) + eps) · w`, written to `out`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss: f32 = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let scale = 1.0 / (ss + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// In-place RMS norm over each `w.len()`-wide head of `x`.
pub fn rms_norm_heads(x: &mut [f32], w: &[f32], eps: f32) {
    for head in x.chunks_mut(w.len()) {
        let ss: f32 = head.iter().map(|v| v * v).sum::<f32>() / head.len() as f32;
        let scale = 1.0 / (ss + eps).sqrt();
        for (v, &g) in head.iter_mut().zip(w) {
            *v = *v * scale * g;
        }
    }
}

/// `x · rsqrt(Σx² + eps)`, as the gated delta net normalises q and k.
pub fn l2_norm(x: &mut [f32], eps: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let scale = 1.0 / (ss + eps).sqrt();
    x.iter_mut().for_each(|v| *v *= scale);
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// `ln(1 + eˣ)`, linear above 20 as torch computes it.
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// NEOX rotary embedding on the first `dims` values of one head: pairs `(i, i + dims/2)`.
pub fn rope_neox(head: &mut [f32], pos: usize, dims: usize, base: f32) {
    let half = dims / 2;
    for i in 0..half {
        let inv_freq = 1.0 / base.powf((2 * i) as f32 / dims as f32);
        let (sin, cos) = (pos as f32 * inv_freq).sin_cos();
        let (a, b) = (head[i], head[i + half]);
        head[i] = a * cos - b * sin;
        head[i + half] = b * cos + a * sin;
    }
}

/// Values per task of [`zip_in_place`]: enough to amortise a task hand-out.
const ZIP_CHUNK: usize = 2048;

/// `x[i] = f(x[i], y[i])` over the pool. Element-wise work with `exp` in it (SiLU over the
/// 17408 FFN values of a layer) costs tens of microseconds a layer on one core.
pub fn zip_in_place(x: &mut [f32], y: &[f32], f: impl Fn(f32, f32) -> f32 + Sync) {
    assert_eq!(x.len(), y.len());
    let chunks: Vec<Mutex<&mut [f32]>> = x.chunks_mut(ZIP_CHUNK).map(Mutex::new).collect();
    pool::global().run(chunks.len(), |i| {
        let mut xs = chunks[i].lock().unwrap_or_else(|e| e.into_inner());
        let ys = &y[i * ZIP_CHUNK..];
        for (a, &b) in xs.iter_mut().zip(ys) {
            *a = f(*a, b);
        }
    });
}

pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

/// Index of the largest value ignoring NaN (`None` when there is none); ties go to the lowest
/// index, so every path that picks greedily picks the same token.
///
/// Two passes the compiler vectorizes — the largest value over 16 lanes, then the first block
/// of 64 holding it — instead of one branchy pass: 248k logits in 0.06 ms instead of 0.32 on
/// the development machine, on every sampled token. Equal to the plain loop (`argmax_serial`, tests): NaN never
/// compares greater, and the position pass finds the first value equal to the maximum (−0 and
/// +0 compare equal, as they do there).
pub fn argmax(x: &[f32]) -> Option<usize> {
    const LANES: usize = 16;
    let mut lane_max = [f32::NEG_INFINITY; LANES];
    let mut lane_seen = [false; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            let v = c[j];
            lane_max[j] = if v > lane_max[j] { v } else { lane_max[j] };
            lane_seen[j] |= !v.is_nan();
        }
    }
    let mut max = f32::NEG_INFINITY;
    let mut seen = false;
    for (&m, &s) in lane_max
        .iter()
        .zip(&lane_seen)
        .chain(rest.iter().map(|v| (v, &true)))
    {
        if !m.is_nan() {
            seen |= s;
            if m > max {
                max = m;
            }
        }
    }
    if !seen {
        return None;
    }
    let mut base = 0;
    for c in x.chunks(64) {
        if c.iter().fold(false, |hit, &v| hit | (v == max)) {
            return c.iter().position(|&v| v == max).map(|i| base + i);
        }
        base += c.len();
    }
    None
}

/// The plain definition of `argmax`, its twin in tests.
#[cfg(test)]
fn argmax_serial(x: &[f32]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, &v) in x.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        if best.is_none_or(|b| v > x[b]) {
            best = Some(i);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_tasks_cover_every_panel_once_shrinking_to_the_minimum() {
        for threads in [1, 2, 3, 8] {
            for panels in [0, 1, 15, 16, 17, 320, 384, 1088, 15520] {
                let tasks = decode_panel_tasks(panels, threads);
                let mut at = 0;
                for (i, t) in tasks.iter().enumerate() {
                    assert_eq!(
                        t.start, at,
                        "{panels} panels, {threads} threads: contiguous"
                    );
                    assert!(
                        !t.is_empty(),
                        "{panels} panels, {threads} threads: empty task"
                    );
                    let left = panels - at;
                    let min = decode_min_panels(panels, threads);
                    let want = left.div_ceil(2 * threads).max(min).min(left);
                    assert_eq!(
                        t.len(),
                        want,
                        "{panels} panels, {threads} threads, task {i}"
                    );
                    if let Some(next) = tasks.get(i + 1) {
                        assert!(next.len() <= t.len(), "sizes never grow");
                        assert!(t.len() >= min, "only the last is short");
                    }
                    at = t.end;
                }
                assert_eq!(
                    at, panels,
                    "{panels} panels, {threads} threads: all covered"
                );
            }
        }
        // 320 panels (a 5120-row matrix) on 2 threads: a quarter of what is left each time,
        // then 16 at a time, the rest last.
        let sizes: Vec<usize> = decode_panel_tasks(320, 2).iter().map(|t| t.len()).collect();
        assert_eq!(sizes, [80, 60, 45, 34, 26, 19, 16, 16, 16, 8]);
        // The same matrix on 32 threads: tasks of 8 (40 of them), as many as before.
        assert_eq!(decode_panel_tasks(320, 32).len(), 40);
        assert!(decode_panel_tasks(320, 32).iter().all(|t| t.len() == 8));
    }

    #[test]
    fn argmax_equals_its_serial_twin() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1.5];
        for n in [0usize, 1, 15, 16, 17, 63, 64, 65, 1000, 4099] {
            for density in [0.0, 0.05, 0.5, 1.0] {
                let x: Vec<f32> = (0..n)
                    .map(|_| {
                        if rng.gen_bool(density) {
                            specials[rng.gen_range(0..specials.len())]
                        } else {
                            (rng.gen_range(0..8) as f32) - 4.0
                        }
                    })
                    .collect();
                assert_eq!(argmax(&x), argmax_serial(&x), "{n} values, {x:?}");
            }
        }
        assert_eq!(argmax(&[f32::NAN; 40]), None);
        assert_eq!(argmax(&[f32::NAN, -0.0, 0.0]), Some(1));
    }

    #[test]
    fn zip_in_place_matches_a_serial_loop() {
        for n in [0, 1, ZIP_CHUNK - 1, ZIP_CHUNK, 3 * ZIP_CHUNK + 17] {
            let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 4.0).collect();
            let y: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let want: Vec<f32> = x.iter().zip(&y).map(|(&a, &b)| silu(a) * b).collect();
            let mut got = x.clone();
            zip_in_place(&mut got, &y, |a, b| silu(a) * b);
            assert_eq!(got, want, "{n} values");
        }
    }
}
