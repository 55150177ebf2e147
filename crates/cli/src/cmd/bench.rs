use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Result};
use model::{Logits, Model};
use rand::{Rng, SeedableRng};

use crate::load;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// Prompt tokens for the prefill test (0 skips it).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub n_prompt: usize,
    /// Generated tokens for the decode test (0 skips it).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub n_gen: usize,
    /// Positions already in the context when each test starts (their cache contents zeros: a
    /// benchmark of the reads at that depth, as llama-bench's `-d`).
    #[arg(short = 'd', long = "n-depth", default_value_t = 0)]
    pub depth: usize,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    pub reps: usize,
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Dot kernels.
    #[arg(long, value_enum, default_value_t)]
    pub kernels: load::KernelsArg,
    /// Where to run (cuda needs a binary built with `--features cuda`).
    #[arg(long, value_enum, default_value_t)]
    pub device: load::DeviceArg,
    /// KV-cache format on the GPU.
    #[arg(long, value_enum, default_value_t)]
    pub kv_cache: load::KvCacheArg,
    /// Tokens per prefill chunk.
    #[arg(long, default_value_t = engine::DEFAULT_PREFILL_CHUNK)]
    pub chunk: usize,
    /// Bytes read by the memory-bandwidth test.
    #[arg(long, default_value_t = 4 << 30)]
    pub bw_bytes: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, Default)]
struct Stats {
    median: f64,
    min: f64,
    max: f64,
}

fn stats(mut v: Vec<f64>) -> Stats {
    if v.is_empty() {
        return Stats::default();
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    let median = if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    };
    Stats {
        median,
        min: v[0],
        max: v[v.len() - 1],
    }
}

/// A `key:  N kB` line of a /proc file, in bytes.
fn proc_kib(path: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// Peak resident set size of this process, from /proc (0 where unavailable).
fn peak_rss_bytes() -> u64 {
    proc_kib("/proc/self/status", "VmHWM:").unwrap_or(0)
}

/// Refuses a depth whose f32 KV cache (`bytes`) does not fit beside the rest of the run
/// (`others`: the re-tiled weights, about the file's size, more for `--kernels int8-wide`,
/// and the bandwidth test's buffer) in the machine's available memory (`avail`, where known),
/// rather than letting the system kill the run partway through.
fn check_depth_fits(depth: usize, bytes: u64, others: u64, avail: Option<u64>) -> Result<()> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    match avail {
        Some(avail) if bytes + others > avail => bail!(
            "-d {depth}: the CPU's KV cache for it needs {:.1} GiB beside {:.1} GiB of weights and \
             bandwidth buffer (--bw-bytes), and {:.1} GiB of memory is available",
            gib(bytes),
            gib(others),
            gib(avail)
        ),
        _ => Ok(()),
    }
}

/// The read-bandwidth test: a buffer far larger than the caches, summed with the engine's
/// threads. Allocated once, so that tests between decode runs cost only their passes.
struct Bandwidth {
    buf: Vec<u64>,
}

impl Bandwidth {
    fn new(bytes: usize) -> Bandwidth {
        Bandwidth {
            buf: (0..(bytes / 8) as u64).collect(),
        }
    }

    /// GB/s: the best of three passes.
    fn measure(&self) -> f64 {
        let words = self.buf.len();
        let pool = model::pool::global();
        let tasks = pool.threads() * 16;
        let per = words.div_ceil(tasks);
        let mut best = 0f64;
        for _ in 0..3 {
            let sink = std::sync::atomic::AtomicU64::new(0);
            let t = Instant::now();
            pool.run(tasks, |i| {
                let part = &self.buf[(i * per).min(words)..((i + 1) * per).min(words)];
                sink.fetch_add(sum_words(part), std::sync::atomic::Ordering::Relaxed);
            });
            let gbs = (words * 8) as f64 / t.elapsed().as_secs_f64() / 1e9;
            std::hint::black_box(sink.into_inner());
            best = best.max(gbs);
        }
        best
    }
}

/// What the CPU bench measures beside the decode runs: the peak RSS before the bandwidth
/// test's buffer exists, and the bandwidth after every decode run. On a shared machine the
/// bandwidth moves from minute to minute (23 to 29 GB/s from one bench to the next on the
/// 2-core development machine), so each run is held against the tests on either side of it
/// rather than against one test at the end.
struct Beside {
    bytes: usize,
    test: Option<Bandwidth>,
    rss: u64,
    /// GB/s after decode run i.
    after: Vec<f64>,
}

impl Beside {
    fn new(bytes: usize) -> Beside {
        Beside {
            bytes,
            test: None,
            rss: 0,
            after: Vec::new(),
        }
    }

    /// After a decode run (or, with none, after the prefill runs).
    fn probe(&mut self) {
        if self.test.is_none() {
            // Every decode run has the same footprint: the first one's peak is theirs.
            self.rss = peak_rss_bytes();
            self.test = Some(Bandwidth::new(self.bytes));
        }
        if let Some(t) = &self.test {
            self.after.push(t.measure());
        }
    }

    /// The bandwidth decode run `i` is held against: the mean of the tests before and after
    /// it (after the first, only the one after).
    fn around(&self, i: usize) -> f64 {
        match (
            i.checked_sub(1).and_then(|j| self.after.get(j)),
            self.after.get(i),
        ) {
            (Some(b), Some(a)) => (a + b) / 2.0,
            (_, Some(a)) => *a,
            (Some(b), None) => *b,
            (None, None) => 0.0,
        }
    }
}

/// A wrapping sum of `words`: widest loads the CPU has, so the loop measures memory, not issue.
fn sum_words(words: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU supports AVX-512F (checked just above).
        return unsafe { sum_words_avx512(words) };
    }
    let mut acc = [0u64; 8];
    for c in words.chunks_exact(8) {
        for k in 0..8 {
            acc[k] = acc[k].wrapping_add(c[k]);
        }
    }
    acc.iter().fold(0u64, |a, &b| a.wrapping_add(b))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_words_avx512(words: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_si512(); 4];
    let chunks = words.chunks_exact(32);
    let tail = chunks.remainder();
    for c in chunks {
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: `c` holds 32 u64s, so each of the four 64-byte loads is in bounds;
            // unaligned loads are allowed.
            let v = unsafe { _mm512_loadu_si512(c.as_ptr().add(8 * k).cast()) };
            *a = _mm512_add_epi64(*a, v);
        }
    }
    let total = _mm512_add_epi64(
        _mm512_add_epi64(acc[0], acc[1]),
        _mm512_add_epi64(acc[2], acc[3]),
    );
    tail.iter()
        .fold(_mm512_reduce_add_epi64(total) as u64, |a, &b| {
            a.wrapping_add(b)
        })
}

/// Bytes one decode step must move: every weight matrix except the embedding table (one row of
/// it), reading and writing the recurrent state, and reading a KV cache of `context` positions
/// that holds 32 elements in `bytes_per_32` bytes (the CPU's f32 cache: 128).
fn bytes_per_token(model: &Model, context: usize, bytes_per_32: usize) -> u64 {
    let file = model.file();
    let weights: u64 = file
        .tensors()
        .iter()
        .map(|t| {
            if t.name == "token_embd.weight" {
                t.size / t.rows().max(1)
            } else {
                t.size
            }
        })
        .sum();
    let c = &model.config;
    // kv_bytes_per_token counts the CPU's f32 cache: 128 bytes per 32 elements.
    let kv = (c.kv_bytes_per_token() * context * bytes_per_32 / 128) as u64;
    weights + 2 * c.recurrent_state_bytes() as u64 + kv
}

/// Prefill and decode tok/s of every repetition, on any backend; `after_decode` runs after
/// each decode repetition.
fn measure<B: engine::Backend>(
    model: &B,
    new_state: impl Fn() -> Result<B::State>,
    prompt: &[u32],
    a: &Args,
    mut after_decode: impl FnMut(),
) -> Result<(Vec<f64>, Vec<f64>)> {
    let mut pp = Vec::new();
    for r in 0..a.reps {
        if a.n_prompt == 0 {
            break;
        }
        let mut state = new_state()?;
        let t = Instant::now();
        engine::prefill(model, &mut state, prompt, a.chunk)?;
        let s = a.n_prompt as f64 / t.elapsed().as_secs_f64();
        eprintln!("pp{} run {}/{}: {s:.2} tok/s", a.n_prompt, r + 1, a.reps);
        pp.push(s);
    }
    let mut tg = Vec::new();
    for r in 0..a.reps {
        if a.n_gen == 0 {
            break;
        }
        let mut state = new_state()?;
        let mut tok = prompt.first().copied().unwrap_or(1);
        let t = Instant::now();
        for _ in 0..a.n_gen {
            let logits = model.forward(&mut state, &[tok], Logits::Last)?;
            tok = engine::sampler::argmax(&logits).unwrap_or(0) as u32;
        }
        let s = a.n_gen as f64 / t.elapsed().as_secs_f64();
        eprintln!("tg{} run {}/{}: {s:.2} tok/s", a.n_gen, r + 1, a.reps);
        tg.push(s);
        after_decode();
    }
    Ok((pp, tg))
}

pub fn main(a: Args) -> Result<ExitCode> {
    if a.reps == 0 {
        bail!("-r must be at least 1");
    }
    load::check_kv_cache(a.device, a.kv_cache)?;
    load::init_threads(a.threads)?;
    // Positions a test adds to the depth's.
    let room = a.n_prompt.max(a.n_gen);
    let model = load::open_model_checked(&a.model, None, a.kernels, |m| {
        let c = &m.config;
        if a.depth + room > c.context_length {
            bail!(
                "-d {} + the longer of -p {} and -n {} exceed the context of {}",
                a.depth,
                a.n_prompt,
                a.n_gen,
                c.context_length
            );
        }
        if a.device == load::DeviceArg::Cpu {
            let bytes = (c.kv_bytes_per_token() * (a.depth + room)) as u64;
            let weights = std::fs::metadata(&a.model).map_or(0, |f| f.len());
            let avail = proc_kib("/proc/meminfo", "MemAvailable:");
            check_depth_fits(a.depth, bytes, weights + a.bw_bytes as u64, avail)?;
        }
        Ok(())
    })?;
    let threads = model::pool::global().threads();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
    let vocab = model.config.vocab as u32;
    let prompt: Vec<u32> = (0..a.n_prompt).map(|_| rng.gen_range(0..vocab)).collect();

    let mut beside = Beside::new(a.bw_bytes);
    let (pp, tg) = match a.device {
        load::DeviceArg::Cpu => measure(
            &model,
            || {
                let mut st = model.new_state();
                st.bench_seek(a.depth, room);
                Ok(st)
            },
            &prompt,
            &a,
            || beside.probe(),
        )?,
        #[cfg(feature = "cuda")]
        load::DeviceArg::Cuda => {
            let gpu = load::cuda_model(&model, a.kv_cache)?;
            let ctx = a.depth + room + 1;
            let new_state = || -> Result<niwaki_cuda::CudaState> {
                let mut st = gpu.new_state(ctx)?;
                st.bench_seek(a.depth);
                Ok(st)
            };
            measure(&gpu, new_state, &prompt, &a, || {})?
        }
        #[cfg(not(feature = "cuda"))]
        load::DeviceArg::Cuda => return Err(load::no_cuda()),
    };
    if a.device == load::DeviceArg::Cuda {
        // The decode floor there is the GPU's bandwidth, which the CUDA harness measures.
        let (pp, tg) = (stats(pp), stats(tg));
        let o = serde_json::json!({
            "model": a.model.display().to_string(), "device": "cuda",
            "kv_cache": a.kv_cache.as_str(),
            "n_prompt": a.n_prompt, "n_gen": a.n_gen, "n_depth": a.depth, "repetitions": a.reps,
            "pp_tok_s": pp.median, "pp_min": pp.min, "pp_max": pp.max,
            "tg_tok_s": tg.median, "tg_min": tg.min, "tg_max": tg.max,
            "bytes_per_token": bytes_per_token(&model, a.depth + a.n_gen / 2, a.kv_cache.bytes_per_32()),
        });
        println!("{o}");
        return Ok(ExitCode::SUCCESS);
    }
    if tg.is_empty() {
        beside.probe();
    }
    let rss = beside.rss;
    // The cache a decode step reads: on average the depth plus half the generated tokens.
    let bpt = bytes_per_token(&model, a.depth + a.n_gen / 2, 128);
    // Each decode run against the floor of the bandwidth measured around it.
    let fractions: Vec<f64> = tg
        .iter()
        .enumerate()
        .map(|(i, &s)| s * bpt as f64 / (beside.around(i) * 1e9))
        .collect();
    let (pp, tg) = (stats(pp), stats(tg));
    let bw_runs = stats(beside.after.clone());
    let bw = bw_runs.median;
    let floor = bw * 1e9 / bpt as f64;
    let fraction = stats(fractions.clone()).median;
    let file_bytes = model.file().file_len();
    if fraction > 1.0 {
        // Decode cannot outrun the memory: the bandwidth test ran while something else loaded
        // the machine, and the fraction means nothing.
        eprintln!(
            "warning: decode ran above the measured bandwidth floor ({:.0}%): the bandwidth test \
             ({bw:.1} GB/s) was disturbed; rerun on a quieter machine",
            100.0 * fraction
        );
    }
    if a.json {
        let o = serde_json::json!({
            "model": a.model.display().to_string(),
            "threads": threads,
            "n_prompt": a.n_prompt, "n_gen": a.n_gen, "n_depth": a.depth, "repetitions": a.reps,
            "pp_tok_s": pp.median, "pp_min": pp.min, "pp_max": pp.max,
            "tg_tok_s": tg.median, "tg_min": tg.min, "tg_max": tg.max,
            "peak_rss_bytes": rss, "file_bytes": file_bytes,
            "read_bw_gbs": bw, "read_bw_tests_gbs": beside.after,
            "bytes_per_token": bpt,
            "floor_tok_s": floor, "floor_fraction": fraction,
            "floor_fraction_runs": fractions,
        });
        println!("{o}");
    } else {
        println!("| model | threads | test | tok/s median | min | max |");
        println!("|---|---|---|---|---|---|");
        let name = a
            .model
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let at = if a.depth > 0 {
            format!(" @ d{}", a.depth)
        } else {
            String::new()
        };
        if a.n_prompt > 0 {
            println!(
                "| {name} | {threads} | pp{}{at} | {:.2} | {:.2} | {:.2} |",
                a.n_prompt, pp.median, pp.min, pp.max
            );
        }
        if a.n_gen > 0 {
            println!(
                "| {name} | {threads} | tg{}{at} | {:.2} | {:.2} | {:.2} |",
                a.n_gen, tg.median, tg.min, tg.max
            );
        }
        println!();
        println!(
            "read bandwidth: {bw:.1} GB/s ({threads} threads; median of {} tests, one after each \
             decode run: {:.1}–{:.1}); bytes per token: {:.3} GB",
            beside.after.len(),
            bw_runs.min,
            bw_runs.max,
            bpt as f64 / 1e9
        );
        println!(
            "decode floor: {floor:.2} tok/s; decode reaches {:.1}% of it (median over the runs, \
             each against the tests before and after it)",
            100.0 * fraction
        );
        println!(
            "peak RSS: {:.2} GiB (file {:.2} GiB)",
            rss as f64 / (1u64 << 30) as f64,
            file_bytes as f64 / (1u64 << 30) as f64
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_depth_whose_cache_exceeds_the_available_memory_is_refused_with_the_numbers() {
        let e = check_depth_fits(262_144, 34 << 30, 4 << 30, Some(20 << 30))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("34.0 GiB") && e.contains("4.0 GiB") && e.contains("20.0 GiB"),
            "{e}"
        );
        assert!(check_depth_fits(4096, 1 << 30, 4 << 30, Some(20 << 30)).is_ok());
        // The cache alone fits, not beside the weights.
        assert!(check_depth_fits(65_536, 17 << 30, 4 << 30, Some(20 << 30)).is_err());
        // Unknown available memory: nothing to hold the depth against.
        assert!(check_depth_fits(4096, 1 << 40, 4 << 30, None).is_ok());
    }

    #[test]
    fn proc_lines_are_read_in_bytes() {
        // This process's own status always has its peak resident set on Linux.
        if cfg!(target_os = "linux") {
            assert!(proc_kib("/proc/self/status", "VmHWM:").unwrap_or(0) > 0);
            assert!(proc_kib("/proc/meminfo", "MemAvailable:").unwrap_or(0) > 0);
        }
        assert_eq!(proc_kib("/proc/self/status", "NoSuchKey:"), None);
    }
}
