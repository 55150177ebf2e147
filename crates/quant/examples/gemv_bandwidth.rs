//! GEMV throughput of the int8 kernels next to the machine's plain read bandwidth.
//!
//! For every format: a stack of 5120-column × 17408-row matrices (the FFN shape of a 27B model),
//! enough of them to exceed the last-level cache, multiplied by one token with 1 and 2 threads
//! (rows split in halves). Prints packed-weight GB/s, and the GB/s of an AVX-512 sum over the
//! same bytes; the ratio is what decode speed depends on.
//!
//! With `--tiled 1` the Bonsai formats are re-tiled into 16-row panels first and run on the tiled
//! kernels (`gemm_tiled`).
//!
//! `cargo run --release -p quant --example gemv_bandwidth [-- --isa avx2 --formats Q1_0,Q2_0 --tokens N --gib 1 --tiled 1 --q1 nibbles|spread]`

use std::hint::black_box;
use std::time::Instant;

use quant::{Format, Isa, Q1Bits, QuantizedActs, Ternary, TiledMatrix, PANEL};

const COLS: usize = 5120;
const ROWS: usize = 17408;

struct Args {
    isa: Isa,
    formats: Vec<Format>,
    tokens: usize,
    gib: f64,
    tiled: bool,
    /// The bit order of tiled Q1_0 chunk words.
    q1: Q1Bits,
    /// Panels per task where threads take tasks in turn (as the engine's pool hands them out),
    /// rather than a contiguous share each (0).
    task_panels: usize,
    /// With `task_panels`: tasks that shrink from a share of what is left down to that size.
    guided: bool,
}

fn parse_args() -> Args {
    let mut isa = Isa::best();
    let mut formats = vec![
        Format::Q1_0,
        Format::Q2_0,
        Format::Q2_0G128,
        Format::PQ2_0,
        Format::PTQ1_0,
        Format::Q8_0,
        Format::Q4_1,
        Format::BF16,
    ];
    let mut tokens = 1;
    let mut gib = 1.0;
    let mut tiled = false;
    let mut q1 = Q1Bits::preferred();
    let mut task_panels = 0;
    let mut guided = false;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i + 1 < args.len() {
        match args[i].as_str() {
            "--isa" => {
                isa = *Isa::available()
                    .iter()
                    .find(|x| x.name() == args[i + 1])
                    .expect("an available ISA")
            }
            "--formats" => {
                formats = args[i + 1]
                    .split(',')
                    .map(|n| Format::from_name(n).expect("a format name"))
                    .collect()
            }
            "--tokens" => tokens = args[i + 1].parse().expect("a token count"),
            "--gib" => gib = args[i + 1].parse().expect("GiB of weights"),
            "--tiled" => tiled = args[i + 1] == "1",
            "--task-panels" => task_panels = args[i + 1].parse().expect("panels per task"),
            "--guided" => guided = args[i + 1] == "1",
            "--q1" => {
                q1 = match args[i + 1].as_str() {
                    "nibbles" => Q1Bits::Nibbles,
                    "spread" => Q1Bits::Spread,
                    other => panic!("--q1 nibbles|spread, not {other}"),
                }
            }
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    Args {
        isa,
        formats,
        tokens,
        gib,
        tiled,
        q1,
        task_panels,
        guided,
    }
}

/// One benchmarked matrix: native rows, and the tiled copy when `--tiled 1`.
struct Mat<'a> {
    isa: Isa,
    format: Format,
    w: &'a [u8],
    tiled: Option<&'a TiledMatrix>,
    row_bytes: usize,
}

impl Mat<'_> {
    /// Rows `lo..hi` times `acts` into `out`: the native kernels, or the tiled ones on whole
    /// panels (`lo`, `hi` multiples of the panel height or the end).
    fn multiply(&self, (lo, hi): (usize, usize), acts: &[QuantizedActs], out: &mut [f32]) {
        match self.tiled {
            Some(m) => {
                let panels = lo / PANEL..hi.div_ceil(PANEL);
                // `--isa avx2` runs the AVX2 tiled kernels where they take the layout.
                if self.isa != Isa::Avx2 || !quant::gemm_tiled_avx2(m, panels.clone(), acts, out) {
                    quant::gemm_tiled(m, panels, acts, out)
                }
            }
            None => quant::gemm_rows_with(
                self.isa,
                self.format,
                self.w,
                self.row_bytes,
                lo..hi,
                acts,
                out,
            ),
        }
    }
}

/// Random packed bytes with finite scales in ±0.5 (so no block has a NaN scale).
fn random_weights(format: Format, bytes: usize) -> Vec<u8> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut w = vec![0u8; bytes];
    for c in w.chunks_mut(8) {
        let v = next().to_le_bytes();
        c.copy_from_slice(&v[..c.len()]);
    }
    let scale_at: &[usize] = match format {
        Format::Q4_1 => &[0, 2],
        Format::PTQ1_0 => &[26],
        Format::F32 | Format::F16 | Format::BF16 => &[],
        _ => &[0],
    };
    if scale_at.is_empty() {
        // Float formats: overwrite with small finite values.
        let vals: Vec<f32> = (0..bytes / format.block_bytes())
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        return quant::quantize(format, &vals).expect("whole values");
    }
    for block in w.chunks_exact_mut(format.block_bytes()) {
        for &at in scale_at {
            let d = half::f16::from_f32((next() % 1000) as f32 / 2000.0 - 0.25);
            block[at..at + 2].copy_from_slice(&d.to_bits().to_le_bytes());
        }
    }
    w
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn read_sum(bytes: &[u8]) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_si512(); 4];
    let chunks = bytes.len() / 256;
    let p = bytes.as_ptr();
    for i in 0..chunks {
        for (k, a) in acc.iter_mut().enumerate() {
            let v = _mm512_loadu_si512(p.add(256 * i + 64 * k) as *const __m512i);
            *a = _mm512_add_epi64(*a, v);
        }
    }
    let s = _mm512_add_epi64(
        _mm512_add_epi64(acc[0], acc[1]),
        _mm512_add_epi64(acc[2], acc[3]),
    );
    _mm512_reduce_add_epi64(s) as u64
}

fn read_bytes(bytes: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F.
        return unsafe { read_sum(bytes) };
    }
    bytes.chunks(8).map(|c| c[0] as u64).sum()
}

#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

/// CPU seconds this thread has run (immune to other processes sharing the cores).
fn thread_cpu_seconds() -> f64 {
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer; 3 is CLOCK_THREAD_CPUTIME_ID on Linux.
    unsafe { clock_gettime(3, &mut ts) };
    ts.sec as f64 + ts.nsec as f64 * 1e-9
}

/// Best-of-`reps` seconds of `f` run on `threads` threads, each given its share index: wall
/// time, and the longest CPU time any thread ran (what the run takes on otherwise idle cores).
fn time<F: Fn(usize, usize) + Sync>(threads: usize, reps: usize, f: F) -> (f64, f64) {
    let (mut wall, mut cpu) = (f64::INFINITY, f64::INFINITY);
    let timed = |k: usize| {
        let c = thread_cpu_seconds();
        f(k, threads);
        thread_cpu_seconds() - c
    };
    for _ in 0..reps {
        let start = Instant::now();
        let longest = std::thread::scope(|s| {
            let others: Vec<_> = (1..threads).map(|k| s.spawn(move || timed(k))).collect();
            let mine = timed(0);
            others
                .into_iter()
                .map(|h| h.join().expect("bench thread"))
                .fold(mine, f64::max)
        });
        wall = wall.min(start.elapsed().as_secs_f64());
        cpu = cpu.min(longest);
    }
    (wall, cpu)
}

/// Compute-bound throughput: a 384 KiB slice of the matrix (well inside a 1 MiB L2 cache beside
/// the activations) run repeatedly on one thread, in GB per CPU-second of the thread (the best
/// of several timings).
fn hot(m: &Mat, acts: &[QuantizedActs]) -> f64 {
    let row_bytes = m.row_bytes;
    let rows = ((384 << 10) / row_bytes).max(PANEL) / PANEL * PANEL;
    let mut out = vec![0.0f32; rows * acts.len()];
    let mut best = 0.0f64;
    for _ in 0..20 {
        let start = thread_cpu_seconds();
        let reps = 100;
        for _ in 0..reps {
            m.multiply((0, rows), acts, &mut out);
            black_box(&out);
        }
        let s = thread_cpu_seconds() - start;
        best = best.max((rows * row_bytes * reps) as f64 / s / 1e9);
    }
    best
}

fn main() {
    let Args {
        isa,
        formats,
        tokens,
        gib,
        tiled,
        q1,
        task_panels,
        guided,
    } = parse_args();
    println!(
        "ISA {}, {tokens} token(s), {COLS} columns × {ROWS} rows per matrix (tiled Q1_0: {q1:?})",
        isa.name()
    );
    println!(
        "{:>10} {:>6} | {:>7} {:>7} {:>7} {:>7} {:>5} {:>5} | {:>7} {:>7} {:>7} {:>7} {:>5} {:>5} | {:>6}",
        "format", "MiB", "read1", "kern1", "cpu-rd1", "cpu-k1", "%", "cpu%",
        "read2", "kern2", "cpu-rd2", "cpu-k2", "%", "cpu%", "L2 1t"
    );
    let x: Vec<f32> = (0..COLS)
        .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
        .collect();
    let acts: Vec<QuantizedActs> = (0..tokens).map(|_| QuantizedActs::new(&x)).collect();
    for format in formats {
        let row_bytes = format.row_bytes(COLS).expect("whole blocks");
        let matrix = row_bytes * ROWS;
        let copies = ((gib * (1u64 << 30) as f64) / matrix as f64)
            .ceil()
            .max(1.0) as usize;
        let rows = ROWS * copies;
        let w = random_weights(format, row_bytes * rows);
        let t0 = Instant::now();
        let tiled = (tiled && TiledMatrix::supports(format)).then(|| {
            TiledMatrix::with_layout(format, &w, rows, COLS, Ternary::Packed, q1)
                .expect("a tileable matrix")
        });
        if tiled.is_some() {
            eprintln!("{format}: tiled in {:.2} s", t0.elapsed().as_secs_f64());
        }
        let mat = Mat {
            isa,
            format,
            w: &w,
            tiled: tiled.as_ref(),
            row_bytes,
        };
        let mut out = vec![0.0f32; rows * tokens];
        let mut res = Vec::new();
        for threads in [1, 2] {
            let share = |k: usize, n: usize| {
                let panels = rows.div_ceil(PANEL);
                let lo = (panels * k / n * PANEL).min(rows);
                let hi = (panels * (k + 1) / n * PANEL).min(rows);
                (lo, hi)
            };
            let read = time(threads, 3, |k, n| {
                let (lo, hi) = share(k, n);
                black_box(read_bytes(&w[lo * row_bytes..hi * row_bytes]));
            });
            let out_ptr = out.as_mut_ptr() as usize;
            let kern = time(threads, 3, |k, n| {
                let ranges: Vec<(usize, usize)> = if task_panels == 0 {
                    vec![share(k, n)]
                } else if guided {
                    guided_tasks(rows.div_ceil(PANEL), n, task_panels)
                        .into_iter()
                        .skip(k)
                        .step_by(n)
                        .map(|(a, b)| (a * PANEL, (b * PANEL).min(rows)))
                        .collect()
                } else {
                    let step = task_panels * PANEL;
                    (k * step..rows)
                        .step_by(n * step)
                        .map(|lo| (lo, (lo + step).min(rows)))
                        .collect()
                };
                for (lo, hi) in ranges {
                    // SAFETY: each thread writes its own disjoint ranges of `out`.
                    let o = unsafe {
                        std::slice::from_raw_parts_mut(
                            (out_ptr as *mut f32).add(lo * tokens),
                            (hi - lo) * tokens,
                        )
                    };
                    mat.multiply((lo, hi), &acts, o);
                }
            });
            black_box(&out);
            let gbs = |s: f64| w.len() as f64 / s / 1e9;
            res.push((gbs(read.0), gbs(kern.0), gbs(read.1), gbs(kern.1)));
        }
        let pct = |a: f64, b: f64| format!("{:.0}%", 100.0 * a / b);
        println!(
            "{:>10} {:>6.0} | {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>5} {:>5} | {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>5} {:>5} | {:>6.2}",
            format.name(),
            w.len() as f64 / (1u64 << 20) as f64,
            res[0].0,
            res[0].1,
            res[0].2,
            res[0].3,
            pct(res[0].1, res[0].0),
            pct(res[0].3, res[0].2),
            res[1].0,
            res[1].1,
            res[1].2,
            res[1].3,
            pct(res[1].1, res[1].0),
            pct(res[1].3, res[1].2),
            hot(&mat, &acts),
        );
    }
    println!("GB/s of packed weights over 1 and 2 threads: read = AVX-512 sum of the same bytes,");
    println!(
        "kern = gemm_rows; cpu-* use the longest thread CPU time instead of wall time (robust"
    );
    println!(
        "to other processes time-sharing the cores); % = kern ÷ read. L2 1t = GB per CPU-second"
    );
    println!("of one thread on an L2-resident slice: the compute ceiling.");
}

/// Panel ranges of a guided split: each task a share 1 / (2·threads) of the panels left, but
/// at least `min` panels.
fn guided_tasks(panels: usize, threads: usize, min: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < panels {
        let size = ((panels - at).div_ceil(2 * threads))
            .max(min)
            .min(panels - at);
        out.push((at, at + size));
        at += size;
    }
    out
}
