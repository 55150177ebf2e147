//! The CPU's read-bandwidth test and the peak resident set, measured beside the decode runs.

use std::time::Instant;

/// A `key:  N kB` line of a /proc file, in bytes.
pub fn proc_kib(path: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// Peak resident set size of this process, from /proc (0 where unavailable).
fn peak_rss_bytes() -> u64 {
    proc_kib("/proc/self/status", "VmHWM:").unwrap_or(0)
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
/// test's buffer exists, and the bandwidth after every decode run.
pub struct CpuProbe {
    bytes: usize,
    test: Option<Bandwidth>,
    /// Peak RSS before the first test (0 until then).
    pub rss: u64,
}

impl CpuProbe {
    pub fn new(bytes: usize) -> CpuProbe {
        CpuProbe {
            bytes,
            test: None,
            rss: 0,
        }
    }

    /// GB/s now (after a decode run, or, with none, after the prefill runs).
    pub fn probe(&mut self) -> f64 {
        let bytes = self.bytes;
        let rss = &mut self.rss;
        self.test
            .get_or_insert_with(|| {
                // Every decode run has the same footprint: the first one's peak is theirs.
                *rss = peak_rss_bytes();
                Bandwidth::new(bytes)
            })
            .measure()
    }
}

/// A wrapping sum of `words`, read as the decode kernels read their weights: two streams at
/// once (the two halves), each asking for its bytes a little ahead, with the widest loads the
/// CPU has, so the loop measures memory, not issue. On a 2-core Zen 5 VM, where decode had run
/// past the floor one plain stream measured, a 4 GiB C loop of 2 threads alternating the two
/// ways read more this way in each of 8 pairs: 1-14% in the 7 within one phase of the VM's
/// memory (38.2 → 39.2 GB/s, 42.3 → 43.3, 62.0 → 70.7).
fn sum_words(words: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU supports AVX-512F (checked just above).
        return unsafe { sum_words_avx512(words) };
    }
    sum_words_plain(words)
}

fn sum_words_plain(words: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let chunks = words.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for k in 0..8 {
            acc[k] = acc[k].wrapping_add(c[k]);
        }
    }
    tail.iter()
        .chain(acc.iter())
        .fold(0u64, |a, &b| a.wrapping_add(b))
}

/// Bytes ahead of each stream's loads that [`sum_words_avx512`] asks for.
#[cfg(target_arch = "x86_64")]
const AHEAD: usize = 512;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_words_avx512(words: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    /// Adds a 256-byte block into `acc`, asking first for the block [`AHEAD`] bytes on.
    #[inline(always)]
    unsafe fn add_block(acc: &mut [__m512i; 4], block: &[u64]) {
        let p = block.as_ptr().cast::<i8>();
        for line in 0..4 {
            // A prefetch never faults, whatever the address.
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(AHEAD + 64 * line));
        }
        for (k, x) in acc.iter_mut().enumerate() {
            // SAFETY: `block` holds 32 u64s, so each of the four 64-byte loads is in bounds;
            // unaligned loads are allowed.
            let v = unsafe { _mm512_loadu_si512(block.as_ptr().add(8 * k).cast()) };
            *x = _mm512_add_epi64(*x, v);
        }
    }
    // Two halves of whole 256-byte blocks, read in step; what is left over, plainly.
    let blocks = words.len() / 32 / 2;
    let (first, rest) = words.split_at(blocks * 32);
    let (second, tail) = rest.split_at(blocks * 32);
    let (mut acc_a, mut acc_b) = ([_mm512_setzero_si512(); 4], [_mm512_setzero_si512(); 4]);
    for (a, b) in first.chunks_exact(32).zip(second.chunks_exact(32)) {
        // SAFETY: both blocks hold 32 u64s (chunks_exact).
        unsafe {
            add_block(&mut acc_a, a);
            add_block(&mut acc_b, b);
        }
    }
    let total = acc_a
        .iter()
        .chain(&acc_b)
        .fold(_mm512_setzero_si512(), |t, &a| _mm512_add_epi64(t, a));
    (_mm512_reduce_add_epi64(total) as u64).wrapping_add(sum_words_plain(tail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_lines_are_read_in_bytes() {
        // This process's own status always has its peak resident set on Linux.
        if cfg!(target_os = "linux") {
            assert!(proc_kib("/proc/self/status", "VmHWM:").unwrap_or(0) > 0);
            assert!(proc_kib("/proc/meminfo", "MemAvailable:").unwrap_or(0) > 0);
        }
        assert_eq!(proc_kib("/proc/self/status", "NoSuchKey:"), None);
    }

    #[test]
    fn the_sums_count_every_word_including_a_tail() {
        for n in [0usize, 1, 7, 8, 31, 32, 33, 100, 64 * 7 + 5] {
            let words: Vec<u64> = (0..n as u64).map(|i| i * 3 + 1).collect();
            let want = words.iter().fold(0u64, |a, &b| a.wrapping_add(b));
            assert_eq!(sum_words_plain(&words), want, "{n} words");
            assert_eq!(sum_words(&words), want, "{n} words");
        }
    }
}
