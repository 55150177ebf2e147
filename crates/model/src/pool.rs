//! A persistent worker pool for the per-token path. A parallel section hands out small tasks
//! from a shared counter, so a thread that finishes early takes more work and no core idles at
//! the end of a matrix. Tasks are claimed in shrinking runs (a share of what is left), so the
//! counter is touched a few dozen times per section rather than once per task. Idle workers
//! spin briefly (a token's matmuls follow each other within microseconds) and then park.
//!
//! A section is published without a lock: a worker that saw the new epoch while the caller
//! still held one would sleep on it, and wake only after the caller had done much of the
//! section alone (27B Q1_0 decode on a 2-core Xeon: ~130 such sleeps a token, the worker off
//! its core 30% of the time). The lock is only for parking.

use std::cell::UnsafeCell;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking.
const SPIN: Duration = Duration::from_micros(200);

type Task<'a> = &'a (dyn Fn(usize) + Sync);

struct Job {
    /// Erased-lifetime pointer to the caller's closure; valid until `pending` reaches zero,
    /// which the caller waits for before returning.
    task: *const (dyn Fn(usize) + Sync + 'static),
    n_tasks: usize,
}

struct Shared {
    /// Threads that drain tasks (workers and the caller).
    threads: usize,
    epoch: AtomicUsize,
    /// The section being run: written by the caller while `closed` is set (no worker reads it
    /// then), read by workers counted in `active` once they have seen `closed` clear.
    job: UnsafeCell<Option<Job>>,
    /// Workers parked or about to park: the caller takes `park` to wake them only when some are.
    sleepers: AtomicUsize,
    park: Mutex<()>,
    /// Next task index to hand out.
    next: AtomicUsize,
    /// Tasks finished (or panicked).
    done: AtomicUsize,
    /// Workers currently inside a section's closure.
    active: AtomicUsize,
    /// Set once every task is done: late workers must not touch the closure any more.
    closed: AtomicBool,
    wake: Condvar,
    shutdown: AtomicBool,
    /// Set when a task panicked; the caller re-raises it.
    panicked: AtomicBool,
}

// SAFETY: `job` is written and read under the protocol its comment gives (see `Pool::run`); the
// closure behind it is `Sync` and outlives every use.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<thread::JoinHandle<()>>,
    /// Serialises parallel sections issued from different threads.
    section: Mutex<()>,
}

/// Waits for `cond`, spinning first and then yielding, so an oversubscribed machine still lets
/// the thread being waited for run.
fn wait_until(cond: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !cond() {
        if spins < 2000 {
            spins += 1;
            std::hint::spin_loop();
        } else {
            thread::yield_now();
        }
    }
}

impl Pool {
    /// A pool of `threads` in total: the calling thread plus `threads − 1` workers.
    pub fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            threads: threads.max(1),
            epoch: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            sleepers: AtomicUsize::new(0),
            park: Mutex::new(()),
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            closed: AtomicBool::new(true),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
        });
        let workers = (1..threads.max(1))
            .map(|i| {
                let s = shared.clone();
                thread::Builder::new()
                    .name(format!("niwaki-worker-{i}"))
                    .spawn(move || worker(&s))
                    .expect("spawning a worker thread")
            })
            .collect();
        Pool {
            shared,
            workers,
            section: Mutex::new(()),
        }
    }

    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Calls `task(i)` for every `i < n_tasks`, spread over the pool, and returns when all are
    /// done. Tasks run in no particular order; each runs exactly once. A panic in any task is
    /// re-raised here once every task has finished.
    pub fn run(&self, n_tasks: usize, task: impl Fn(usize) + Sync) {
        if n_tasks == 0 {
            return;
        }
        if self.workers.is_empty() || n_tasks == 1 {
            (0..n_tasks).for_each(task);
            return;
        }
        let _section = self.section.lock().unwrap_or_else(|e| e.into_inner());
        let task_ref: Task<'_> = &task;
        // SAFETY: workers dereference this pointer only while counted in `active` and only
        // while `closed` is false; this function sets `closed` and waits for `active` to reach
        // zero before returning, so the borrow outlives every use.
        let task_static: *const (dyn Fn(usize) + Sync + 'static) =
            unsafe { std::mem::transmute(task_ref) };
        let s = &self.shared;
        s.panicked.store(false, Ordering::Relaxed);
        s.next.store(0, Ordering::SeqCst);
        s.done.store(0, Ordering::SeqCst);
        // SAFETY: `closed` is set, so no worker reads the job: one counted in `active` reads it
        // only after seeing `closed` clear, which the store below publishes after this write.
        unsafe {
            *s.job.get() = Some(Job {
                task: task_static,
                n_tasks,
            })
        };
        s.closed.store(false, Ordering::SeqCst);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        // A parking worker counts itself in `sleepers` before it checks the epoch under `park`:
        // either it sees the new epoch, or it is counted here and waiting by the time the lock
        // is ours, so the wake-up reaches it.
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _park = s.park.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        drain(s, &task, n_tasks);
        wait_until(|| s.done.load(Ordering::SeqCst) >= n_tasks);
        s.closed.store(true, Ordering::SeqCst);
        wait_until(|| s.active.load(Ordering::SeqCst) == 0);
        if s.panicked.load(Ordering::Relaxed) {
            panic!("a task of a parallel section panicked");
        }
    }
}

/// Each claim takes this fraction of the tasks left per thread: large runs while much is left,
/// single tasks at the end so the threads still finish together. A decode token hands out some
/// 10⁵ tasks of ~2 µs; claiming them one at a time bounced the counter's cache line between
/// cores often enough to cost ~8% of a 27B Q1_0 token (measured on 2 cores, 1/4 per thread).
const CLAIM_SHARE: usize = 4;

/// The next run of tasks for this thread, or `None` when none are left.
fn claim(s: &Shared, n_tasks: usize) -> Option<Range<usize>> {
    let mut cur = s.next.load(Ordering::Relaxed);
    loop {
        if cur >= n_tasks {
            return None;
        }
        let take = ((n_tasks - cur) / (CLAIM_SHARE * s.threads)).max(1);
        match s
            .next
            .compare_exchange_weak(cur, cur + take, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => return Some(cur..cur + take),
            Err(now) => cur = now,
        }
    }
}

/// Runs tasks until none are left; every task taken is counted done, even one that panics.
/// Done tasks are counted once per call, not per task: the counter is shared between cores.
fn drain(s: &Shared, task: &(dyn Fn(usize) + Sync), n_tasks: usize) {
    let mut ran = 0;
    while let Some(run) = claim(s, n_tasks) {
        for i in run {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task(i))).is_err() {
                s.panicked.store(true, Ordering::Relaxed);
            }
            ran += 1;
        }
    }
    if ran > 0 {
        s.done.fetch_add(ran, Ordering::Release);
    }
}

fn worker(s: &Shared) {
    let mut seen = 0usize;
    loop {
        let start = Instant::now();
        let mut epoch = s.epoch.load(Ordering::Acquire);
        while epoch == seen && !s.shutdown.load(Ordering::Relaxed) {
            if start.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                let guard = s.park.lock().unwrap_or_else(|e| e.into_inner());
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                if s.epoch.load(Ordering::SeqCst) == seen && !s.shutdown.load(Ordering::Relaxed) {
                    drop(s.wake.wait_timeout(guard, Duration::from_millis(50)));
                }
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
            }
            epoch = s.epoch.load(Ordering::Acquire);
        }
        if s.shutdown.load(Ordering::Relaxed) {
            return;
        }
        seen = epoch;
        s.active.fetch_add(1, Ordering::SeqCst);
        if !s.closed.load(Ordering::SeqCst) {
            // SAFETY: counted in `active` with `closed` clear: the caller wrote the job before
            // clearing it and does not write it again before `active` is back to zero.
            if let Some(job) = unsafe { &*s.job.get() } {
                // SAFETY: as above: see `Pool::run`.
                let task = unsafe { &*job.task };
                drain(s, task, job.n_tasks);
            }
        }
        s.active.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _park = self.shared.park.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

static GLOBAL: OnceLock<Pool> = OnceLock::new();

/// Sets the global pool's size; only the first call (or first use) decides.
pub fn init(threads: usize) -> bool {
    let mut created = false;
    GLOBAL.get_or_init(|| {
        created = true;
        Pool::new(threads)
    });
    created
}

/// The global pool (all cores unless `init` chose otherwise).
pub fn global() -> &'static Pool {
    GLOBAL.get_or_init(|| Pool::new(thread::available_parallelism().map_or(1, |n| n.get())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once() {
        let pool = Pool::new(3);
        for n in [0, 1, 2, 7, 1000, 100_003] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, |i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "n = {n}"
            );
        }
    }

    #[test]
    fn many_sections_back_to_back() {
        let pool = Pool::new(2);
        let total = AtomicUsize::new(0);
        for _ in 0..2000 {
            pool.run(4, |i| {
                total.fetch_add(i, Ordering::Relaxed);
            });
        }
        assert_eq!(total.load(Ordering::Relaxed), 2000 * 6);
    }

    /// Each section needs both threads at once (task 0 waits for task 1 to start), after the
    /// worker has had time to park: a wake-up that did not reach it would leave the caller
    /// waiting for the worker's 50 ms timeout every round.
    #[test]
    fn a_parked_worker_is_woken_for_the_next_section() {
        let pool = Pool::new(2);
        let mut rounds = Vec::new();
        for _ in 0..15 {
            thread::sleep(SPIN * 10);
            let started = AtomicUsize::new(0);
            let t0 = Instant::now();
            pool.run(2, |_| {
                started.fetch_add(1, Ordering::SeqCst);
                let wait = Instant::now();
                while started.load(Ordering::SeqCst) < 2 {
                    assert!(
                        wait.elapsed() < Duration::from_secs(5),
                        "no second thread came"
                    );
                    std::hint::spin_loop();
                }
            });
            rounds.push(t0.elapsed());
        }
        rounds.sort();
        assert!(
            rounds[rounds.len() / 2] < Duration::from_millis(25),
            "median round {:?}",
            rounds[rounds.len() / 2]
        );
    }

    #[test]
    fn a_panicking_task_reaches_the_caller() {
        let pool = Pool::new(2);
        for _ in 0..20 {
            let ran = AtomicUsize::new(0);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                pool.run(8, |i| {
                    ran.fetch_add(1, Ordering::Relaxed);
                    assert!(i != 5);
                })
            }));
            assert!(r.is_err());
            assert_eq!(ran.load(Ordering::Relaxed), 8, "the other tasks still ran");
        }
        // The pool still works afterwards.
        let n = AtomicUsize::new(0);
        pool.run(10, |_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 10);
    }
}
