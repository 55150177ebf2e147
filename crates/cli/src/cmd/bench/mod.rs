//! `niwaki bench`: prefill and decode speed over repetitions, and decode against the floor
//! the memory bandwidth sets, measured in the same command.

mod cpu_bandwidth;
mod picks;
mod plan;
mod report;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use model::{Logits, Model};
use rand::{Rng, SeedableRng};

use crate::load;
use cpu_bandwidth::{proc_kib, CpuProbe};
use plan::Test;
use report::{Place, Report};

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// Prompt tokens for the prefill test (0 skips it). Several, comma-separated (`-p 1,16,512`),
    /// are each a test of their own, as llama-bench's.
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    pub n_prompt: Vec<usize>,
    /// Generated tokens for the decode test (0 skips it); several as for `-p`.
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    pub n_gen: Vec<usize>,
    /// Positions already in the context when each test starts, as llama-bench's `-d`; several,
    /// comma-separated, run every test at each.
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    pub depth: Vec<usize>,
    /// How the depth is filled before each test (untimed): `prompt` prefills that many random
    /// tokens, as llama-bench does; `zeros` only moves the position over a zeroed cache, which
    /// is quicker but shows kernels whose work depends on the cache's contents none.
    #[arg(long, value_enum, default_value_t = DepthFill::Prompt)]
    pub depth_fill: DepthFill,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    pub reps: usize,
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub place: load::Placement,
    /// Tokens per prefill chunk.
    #[arg(long, default_value_t = engine::DEFAULT_PREFILL_CHUNK)]
    pub chunk: usize,
    /// Bytes read by the memory-bandwidth test (on the GPU at least 1 GiB).
    #[arg(long, default_value_t = 4 << 30)]
    pub bw_bytes: usize,
    /// Decode by copying each step's row of logits to the host and picking the token there, as
    /// a caller reading the logits would (llama-bench's tg copies the row too). By default the
    /// backend picks the greedy token where it computes the logits, as `run` and `serve` do at
    /// temperature 0 (on the GPU only the token comes back).
    #[arg(long)]
    pub host_logits: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DepthFill {
    Prompt,
    Zeros,
}

impl DepthFill {
    pub fn as_str(self) -> &'static str {
        match self {
            DepthFill::Prompt => "prompt",
            DepthFill::Zeros => "zeros",
        }
    }
}

/// Refuses a depth whose KV cache (`bytes`) does not fit beside the rest of the run
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

/// Bytes one decode step must move: every weight matrix except the embedding table (one row of
/// it), reading and writing the recurrent state, and reading a KV cache of `context` positions
/// in the format `kv`.
fn bytes_per_token(model: &Model, context: usize, kv: load::KvCacheArg) -> u64 {
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
    weights + 2 * c.recurrent_state_bytes() as u64 + kv.bytes(c, context)
}

/// What the repetitions measured: tok/s of each, and the bytes of the last decode run's
/// sequence state at its end (0 with no decode run).
struct Runs {
    pp: Vec<f64>,
    tg: Vec<f64>,
    state_bytes: u64,
    /// The tokens each decode run picked.
    picks: Option<picks::Picks>,
    /// Decode tokens run untimed, on the state the runs then take, before the first.
    warmup: usize,
}

/// Decode tokens of the untimed warm-up where the runs share a rewound state: two, so that
/// both kinds of step (the first token fed by the host, the next picked on the device) have
/// made what they make once, as llama-bench's warm-up run does before it times.
const TG_WARMUP: usize = 2;

/// `n` greedy decode steps from `tok`: the picked tokens.
fn decode<B: engine::Backend>(
    model: &B,
    state: &mut B::State,
    mut tok: u32,
    n: usize,
    host_logits: bool,
) -> Result<Vec<u32>> {
    let mut toks = Vec::with_capacity(n);
    for _ in 0..n {
        tok = if host_logits {
            let logits = model.forward(state, &[tok], Logits::Last)?;
            engine::sampler::argmax(&logits).unwrap_or(0) as u32
        } else {
            model.forward_argmax(state, &[tok])?
        };
        toks.push(tok);
    }
    Ok(toks)
}

/// Hands each test a state at the depth: `new_state`'s, then `fill` (the depth's tokens,
/// empty where the depth is zeros or none) prefilled, untimed. Where the backend can rewind a
/// state ([`engine::Backend::can_rewind`]), one state is made and rewound to the depth after
/// each test, the same state as a fresh fill gives, whose one-time setup (the GPU's decode
/// graphs) a warm-up can then take out of the timed runs; elsewhere each test makes a fresh
/// one.
struct AtDepth<'a, B: engine::Backend, F> {
    model: &'a B,
    new_state: F,
    fill: &'a [u32],
    chunk: usize,
    kept: Option<(B::State, B::Checkpoint)>,
}

impl<'a, B: engine::Backend, F: Fn() -> Result<B::State>> AtDepth<'a, B, F> {
    fn new(model: &'a B, new_state: F, fill: &'a [u32], chunk: usize) -> Result<Self> {
        let mut d = AtDepth {
            model,
            new_state,
            fill,
            chunk,
            kept: None,
        };
        if model.can_rewind() {
            let state = d.fresh()?;
            let mut at = B::Checkpoint::default();
            model.save(&state, &mut at)?;
            d.kept = Some((state, at));
        }
        Ok(d)
    }

    fn fresh(&self) -> Result<B::State> {
        let mut state = (self.new_state)()?;
        if self.fill.is_empty() {
            return Ok(state);
        }
        // Seconds on a GPU at 32k, far longer on a CPU: said before it starts.
        let n = self.fill.len();
        eprintln!("filling the depth: a prefill of {n} tokens…");
        let t = Instant::now();
        engine::prefill(self.model, &mut state, self.fill, self.chunk)
            .with_context(|| format!("filling the depth of {n} positions"))?;
        let secs = t.elapsed().as_secs_f64();
        eprintln!("depth {n} filled by a prefill in {secs:.1} s (untimed)");
        Ok(state)
    }

    /// Runs `test` on a state at the depth. A kept state is rewound after it, which also
    /// leaves the device idle for what follows (the bandwidth test), as dropping a fresh one
    /// does.
    fn with<R>(&mut self, test: impl FnOnce(&mut B::State) -> Result<R>) -> Result<R> {
        match &mut self.kept {
            Some((state, at)) => {
                let r = test(state)?;
                self.model.rewind(state, at)?;
                Ok(r)
            }
            None => test(&mut self.fresh()?),
        }
    }
}

/// Prefill and decode tok/s of every repetition of test `t`, on any backend, each from a state
/// at its depth ([`AtDepth`]); `after_decode` runs after each decode repetition, `bytes` tells
/// a state's size.
fn measure<B: engine::Backend, F: Fn() -> Result<B::State>>(
    depth: &mut AtDepth<'_, B, F>,
    bytes: impl Fn(&B::State) -> u64,
    (t, prompt, first): (Test, &[u32], u32),
    a: &Args,
    mut after_decode: impl FnMut() -> Result<()>,
) -> Result<Runs> {
    let model = depth.model;
    let mut pp = Vec::new();
    for r in 0..a.reps {
        if t.n_prompt == 0 {
            break;
        }
        let s = depth.with(|state| {
            let start = Instant::now();
            engine::prefill(model, state, prompt, a.chunk)?;
            Ok(t.n_prompt as f64 / start.elapsed().as_secs_f64())
        })?;
        eprintln!("pp{} run {}/{}: {s:.2} tok/s", t.n_prompt, r + 1, a.reps);
        pp.push(s);
    }
    let mut tg = Vec::new();
    let mut state_bytes = 0;
    let mut picked = Vec::new();
    let warmup = if t.n_gen > 0 && depth.kept.is_some() {
        let n = TG_WARMUP.min(t.n_gen);
        depth.with(|state| decode(model, state, first, n, a.host_logits))?;
        n
    } else {
        0
    };
    for r in 0..a.reps {
        if t.n_gen == 0 {
            break;
        }
        let (s, toks, held) = depth.with(|state| {
            let start = Instant::now();
            let toks = decode(model, state, first, t.n_gen, a.host_logits)?;
            Ok((
                t.n_gen as f64 / start.elapsed().as_secs_f64(),
                toks,
                bytes(state),
            ))
        })?;
        picked.push(toks);
        eprintln!("tg{} run {}/{}: {s:.2} tok/s", t.n_gen, r + 1, a.reps);
        tg.push(s);
        state_bytes = held;
        after_decode()?;
    }
    Ok(Runs {
        pp,
        tg,
        state_bytes,
        picks: picks::Picks::of(&picked),
        warmup,
    })
}

/// Writes each test's report as soon as it is measured, so that a sweep cut short keeps what
/// it measured: a JSON object a line, or a table each, a blank line between.
struct Emit {
    json: bool,
    written: usize,
}

impl Emit {
    fn emit(&mut self, r: &Report) -> Result<()> {
        let fraction = r.fraction();
        if fraction > 1.0 {
            // Decode cannot outrun the memory: the bandwidth test ran while something else
            // loaded the machine, and the fraction means nothing.
            eprintln!(
                "warning: decode ran above the measured bandwidth floor ({:.0}%): the bandwidth \
                 test ({:.1} GB/s) was disturbed; rerun on a quieter machine",
                100.0 * fraction,
                r.bandwidth().median
            );
        }
        let mut stdout = std::io::stdout().lock();
        if self.json {
            writeln!(stdout, "{}", r.json())?;
        } else {
            if self.written > 0 {
                writeln!(stdout)?;
            }
            write!(stdout, "{}", r.table())?;
        }
        stdout.flush()?;
        self.written += 1;
        Ok(())
    }
}

pub fn main(a: Args) -> Result<ExitCode> {
    if a.reps == 0 {
        bail!("-r must be at least 1");
    }
    let kv = a.place.kv()?;
    load::init_threads(a.threads)?;
    let tests = plan::tests(&a.n_prompt, &a.n_gen, &a.depth);
    let longest = |f: fn(&Test) -> usize| tests.iter().map(f).max().unwrap_or(0);
    let (max_prompt, max_depth) = (longest(|t| t.n_prompt), longest(|t| t.depth));
    // Positions a test adds to its depth, at most: each depth's state holds room for all.
    let room = longest(|t| t.room());
    let model = a.place.open_checked(&a.model, None, kv, |m| {
        let c = &m.config;
        if max_depth + room > c.context_length {
            bail!(
                "-d {max_depth} + the longest of -p and -n ({room}) exceed the context of {}",
                c.context_length
            );
        }
        if a.place.device == load::DeviceArg::Cpu {
            let bytes = kv.bytes(c, max_depth + room);
            let weights = std::fs::metadata(&a.model).map_or(0, |f| f.len());
            let avail = proc_kib("/proc/meminfo", "MemAvailable:");
            check_depth_fits(max_depth, bytes, weights + a.bw_bytes as u64, avail)?;
        }
        Ok(())
    })?;
    let threads = model::pool::global().threads();
    // The longest prompt, then the deepest fill: each test takes the start of each, so that one
    // test alone draws the tokens it always drew.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
    let vocab = model.config.vocab as u32;
    let prompt: Vec<u32> = (0..max_prompt).map(|_| rng.gen_range(0..vocab)).collect();
    let fill: Vec<u32> = match a.depth_fill {
        DepthFill::Prompt => (0..max_depth).map(|_| rng.gen_range(0..vocab)).collect(),
        DepthFill::Zeros => Vec::new(),
    };
    // Every decode test starts from the same token.
    let first = prompt.first().copied().unwrap_or(1);
    let fill_of = |d: usize| &fill[..d.min(fill.len())];
    let zeros = a.depth_fill == DepthFill::Zeros;
    let file_bytes = model.file().file_len();
    let report = |place, t: Test, runs: Runs, bw_after| Report {
        model: &a.model,
        file_bytes,
        place,
        kv_cache: kv.as_str(),
        state_bytes: runs.state_bytes,
        n_prompt: t.n_prompt,
        n_gen: t.n_gen,
        depth: t.depth,
        depth_fill: a.depth_fill,
        reps: a.reps,
        host_logits: a.host_logits,
        pp: runs.pp,
        tg: runs.tg,
        picks: runs.picks,
        tg_warmup: runs.warmup,
        bw_after,
        // The cache a decode step reads: on average the depth plus half the generated tokens.
        bytes_per_token: bytes_per_token(&model, t.depth + t.n_gen / 2, kv),
    };
    let mut out = Emit {
        json: a.json,
        written: 0,
    };
    match a.place.device {
        load::DeviceArg::Cpu => {
            let mut probe = CpuProbe::new(a.bw_bytes);
            for at_depth in tests.chunk_by(|x, y| x.depth == y.depth) {
                let d = at_depth[0].depth;
                let new_state = || {
                    let mut st = model.new_state();
                    // With a prefilled depth, only the room for it and the tests.
                    if zeros {
                        st.bench_seek(d, room);
                    } else {
                        st.bench_seek(0, d + room);
                    }
                    Ok(st)
                };
                let mut at = AtDepth::new(&model, new_state, fill_of(d), a.chunk)?;
                for &t in at_depth {
                    let mut bw = Vec::new();
                    let runs = measure(
                        &mut at,
                        |st| st.bytes() as u64,
                        (t, &prompt[..t.n_prompt], first),
                        &a,
                        || {
                            bw.push(probe.probe());
                            Ok(())
                        },
                    )?;
                    if bw.is_empty() {
                        bw.push(probe.probe());
                    }
                    let place = Place::Cpu {
                        threads,
                        peak_rss: probe.rss,
                        simd: quant::Simd::in_use().name(),
                    };
                    out.emit(&report(place, t, runs, bw))?;
                }
            }
        }
        #[cfg(feature = "cuda")]
        load::DeviceArg::Cuda => {
            let gpu = load::cuda_model(&model, kv)?;
            let test = gpu
                .gpu()
                .read_test(a.bw_bytes)
                .context("the GPU's read-bandwidth test")?;
            let probe = |bw: &mut Vec<f64>| -> Result<()> {
                bw.push(gpu.gpu().read_bandwidth(&test, 5)? / 1e9);
                Ok(())
            };
            let bytes = |st: &niwaki_cuda::CudaState| st.device_bytes() as u64;
            for at_depth in tests.chunk_by(|x, y| x.depth == y.depth) {
                let d = at_depth[0].depth;
                let new_state = || -> Result<niwaki_cuda::CudaState> {
                    let mut st = gpu.new_state(d + room + 1)?;
                    if zeros {
                        st.bench_seek(d);
                    }
                    Ok(st)
                };
                let mut at = AtDepth::new(&gpu, new_state, fill_of(d), a.chunk)?;
                for &t in at_depth {
                    let mut bw = Vec::new();
                    let mut runs = measure(
                        &mut at,
                        bytes,
                        (t, &prompt[..t.n_prompt], first),
                        &a,
                        || probe(&mut bw),
                    )?;
                    if bw.is_empty() {
                        probe(&mut bw)?;
                    }
                    // A state's device memory does not depend on the tokens it holds: with no
                    // decode run, a fresh one's.
                    if runs.state_bytes == 0 {
                        runs.state_bytes = bytes(&new_state()?);
                    }
                    let place = Place::Cuda {
                        device: gpu.device().name.clone(),
                        weight_bytes: gpu.weight_bytes() as u64,
                    };
                    out.emit(&report(place, t, runs, bw))?;
                }
            }
        }
        #[cfg(not(feature = "cuda"))]
        load::DeviceArg::Cuda => return Err(load::no_cuda()),
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
}
