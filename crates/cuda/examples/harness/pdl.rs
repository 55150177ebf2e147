//! Do a kernel's bulk copies issued before its `griddepcontrol.wait` stream while the kernel
//! before it still runs, and when do its blocks start (`NIWAKI_HARNESS_ONLY=pdl`,
//! kernels/pdl_probe.cu)? A first kernel that spins touching no memory, or one that streams a
//! buffer, then a dependent one whose blocks copy a tile each, before their wait or after it,
//! from bytes no earlier case read; the times are the blocks' own (global timer), in µs from
//! the first block's wait ending.

use cudarc::driver::sys;
use niwaki_cuda::gpu::{Arg, Gpu};

use crate::report::{Report, R};

/// Bytes a block copies: a 2-bit 16-row tile of 5120 columns with its scales, about.
const TILE: usize = 22 << 10;
/// Replays of each case (a fresh region each, unless the case reads the last one again).
const REPS: usize = 5;
/// Bytes the streaming kernel reads (past the L2 cache).
const STREAM: usize = 96 << 20;
/// How long the spinning kernel spins: far longer than any launch takes to reach the device.
const SPIN_US: u64 = 100;

/// The kernel before the copies.
#[derive(Clone, Copy)]
enum First {
    /// Spins [`SPIN_US`]; with `touch`, its threads first read a word every 64 KiB of the
    /// region the copies read (their pages' translations cached); its first `quick` blocks end
    /// at once.
    Spin { touch: bool, quick: i32 },
    /// Streams [`STREAM`] bytes, one block a multiprocessor.
    Stream,
    /// [`FEW`] blocks spin [`FEW_US`], leaving the multiprocessors to the dependent kernel's
    /// blocks at once (as a decode step's norm does).
    Few,
}

/// The blocks of [`First::Few`], and how long they spin.
const FEW: u32 = 5;
const FEW_US: u64 = 20;
/// Threads and shared memory of [`Case::big`]'s blocks: a 2-bit decode GEMV's.
const BIG_THREADS: u32 = 288;
const BIG_SMEM: u32 = 72 << 10;

/// How a block brings its bytes in (`pdl_copy`'s `how`).
#[derive(Clone, Copy)]
enum How {
    /// One bulk copy.
    Bulk = 0,
    /// One bulk copy with the decode GEMVs' L2 policy for weights.
    Weights = 1,
    /// Warp 0's plain loads.
    Plain = 2,
}

struct Case {
    name: &'static str,
    first: First,
    /// The copies are issued before the wait (else after it).
    before: bool,
    how: How,
    /// The region the previous replay copied (in L2) rather than a fresh one.
    again: bool,
    /// Both kernels captured into a graph and launched as one, as decode runs its step.
    graph: bool,
    /// Blocks of a decode GEMV's threads and shared memory ([`BIG_THREADS`], [`BIG_SMEM`]).
    big: bool,
}

const SPIN: First = First::Spin {
    touch: false,
    quick: 0,
};

const fn case(name: &'static str, first: First, before: bool) -> Case {
    Case {
        name,
        first,
        before,
        how: How::Bulk,
        again: false,
        graph: false,
        big: false,
    }
}

const CASES: [Case; 16] = [
    case("before the wait, spin", SPIN, true),
    case("after the wait, spin", SPIN, false),
    Case {
        how: How::Weights,
        ..case("before the wait, spin, weights' L2 policy", SPIN, true)
    },
    case(
        "before the wait, spin, pages touched",
        First::Spin {
            touch: true,
            quick: 0,
        },
        true,
    ),
    case(
        "before the wait, spin, one block ending at once",
        First::Spin {
            touch: false,
            quick: 1,
        },
        true,
    ),
    Case {
        again: true,
        ..case("before the wait, spin, bytes in L2", SPIN, true)
    },
    case("before the wait, after a stream", First::Stream, true),
    Case {
        how: How::Weights,
        ..case(
            "before the wait, after a stream, weights' L2 policy",
            First::Stream,
            true,
        )
    },
    case("after the wait, after a stream", First::Stream, false),
    Case {
        graph: true,
        ..case("before the wait, spin, in a graph", SPIN, true)
    },
    Case {
        graph: true,
        ..case(
            "before the wait, after a stream, in a graph",
            First::Stream,
            true,
        )
    },
    Case {
        how: How::Plain,
        ..case(
            "before the wait, after a stream, plain loads",
            First::Stream,
            true,
        )
    },
    Case {
        how: How::Plain,
        graph: true,
        ..case(
            "before the wait, after a stream, in a graph, plain loads",
            First::Stream,
            true,
        )
    },
    case("before the wait, few blocks spinning", First::Few, true),
    Case {
        big: true,
        ..case(
            "before the wait, few blocks spinning, GEMV-sized blocks",
            First::Few,
            true,
        )
    },
    Case {
        big: true,
        ..case(
            "before the wait, after a stream, GEMV-sized blocks",
            First::Stream,
            true,
        )
    },
];

pub(crate) fn pdl_section(rep: &mut Report, gpu: &Gpu) -> R<()> {
    let s = &gpu.stream;
    let sms = gpu.info.multiprocessors.max(1) as u32;
    let blocks = 3 * sms as usize;
    let per_rep = blocks * TILE;
    let stream = gpu.alloc(STREAM, "pdl probe stream")?;
    let region = gpu.alloc(per_rep * (REPS * CASES.len() + 1), "pdl probe source")?;
    let out = gpu.alloc(32 * blocks, "pdl probe times")?;
    let sink = gpu.alloc(4, "pdl probe sink")?;
    rep.line(format!(
        "\nBulk copies before griddepcontrol.wait ({blocks} blocks of {} KiB after a kernel that \
         spins {SPIN_US} µs, streams {} MiB or has {FEW} blocks spin {FEW_US} µs; µs from the \
         first wait's end, medians over blocks, then over {REPS} replays):",
        TILE >> 10,
        STREAM >> 20
    ));
    rep.line("| case | issued | copy done | wait ended | copy time (done − issued) |");
    rep.line("|---|---|---|---|---|");
    let mut next = 0usize;
    for c in &CASES {
        let mut rows: Vec<[f64; 4]> = Vec::new();
        for _ in 0..REPS {
            if !c.again {
                next += 1;
            }
            let src = region.ptr + (next * per_rep) as u64;
            if c.graph {
                s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
            }
            match c.first {
                First::Stream => gpu.launch(
                    s,
                    "read_sum",
                    (sms, 1, 1),
                    (512, 1, 1),
                    &[
                        Arg::Ptr(stream.ptr),
                        Arg::U64((STREAM / 16) as u64),
                        Arg::Ptr(sink.ptr),
                    ],
                )?,
                First::Few => gpu.launch(
                    s,
                    "pdl_spin",
                    (FEW, 1, 1),
                    (32, 1, 1),
                    &[
                        Arg::U64(FEW_US * 1000),
                        Arg::Ptr(0),
                        Arg::U64(0),
                        Arg::U64(1),
                        Arg::Ptr(sink.ptr),
                        Arg::I32(0),
                    ],
                )?,
                First::Spin { touch, quick } => gpu.launch(
                    s,
                    "pdl_spin",
                    (sms, 1, 1),
                    (32, 1, 1),
                    &[
                        Arg::U64(SPIN_US * 1000),
                        Arg::Ptr(if touch { src } else { 0 }),
                        Arg::U64((per_rep / 4) as u64),
                        Arg::U64(16 << 10),
                        Arg::Ptr(sink.ptr),
                        Arg::I32(quick),
                    ],
                )?,
            }
            gpu.launch_smem(
                s,
                "pdl_copy",
                (blocks as u32, 1, 1),
                (if c.big { BIG_THREADS } else { 64 }, 1, 1),
                if c.big { BIG_SMEM } else { TILE as u32 },
                &[
                    Arg::Ptr(src),
                    Arg::I32(TILE as i32),
                    Arg::I32(i32::from(c.before)),
                    Arg::I32(c.how as i32),
                    Arg::Ptr(out.ptr),
                ],
            )?;
            // Kept until the times are read: the replay may still run.
            let graph = if c.graph {
                let g = s
                    .end_capture(sys::CUgraphInstantiate_flags(0))?
                    .ok_or("the probe's graph is empty")?;
                g.launch()?;
                Some(g)
            } else {
                None
            };
            let mut t = vec![0u64; 4 * blocks];
            gpu.read(s, out.ptr, &mut t)?;
            drop(graph);
            rows.push(block_medians(&t, blocks));
        }
        rep.line(format!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} |",
            c.name,
            median_of(&rows, 0),
            median_of(&rows, 1),
            median_of(&rows, 2),
            median_of(&rows, 3)
        ));
    }
    Ok(())
}

/// The blocks' median issue, completion and wait end (µs from the first wait end) and copy
/// time, from `pdl_copy`'s records (issued, done, wait ended, multiprocessor).
fn block_medians(t: &[u64], blocks: usize) -> [f64; 4] {
    let t0 = (0..blocks).map(|b| t[4 * b + 2]).min().unwrap_or(0);
    let us = |a: u64, b: u64| (a as i64 - b as i64) as f64 / 1e3;
    let med = |f: &dyn Fn(usize) -> f64| median((0..blocks).map(f).collect());
    [
        med(&|b| us(t[4 * b], t0)),
        med(&|b| us(t[4 * b + 1], t0)),
        med(&|b| us(t[4 * b + 2], t0)),
        med(&|b| us(t[4 * b + 1], t[4 * b])),
    ]
}

fn median_of(rows: &[[f64; 4]], k: usize) -> f64 {
    median(rows.iter().map(|r| r[k]).collect())
}

/// The upper median (of an even count, the larger middle value).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
