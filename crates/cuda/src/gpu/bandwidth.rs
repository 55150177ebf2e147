//! The device's memory bandwidth: a copy (the harness's reference for each kernel's GB/s) and
//! a read of a buffer far larger than the L2 cache (the decode floor `niwaki bench` holds a
//! step against: a step reads its bytes once).

use cudarc::driver::result;

use super::{Arg, DevBuf, Gpu};
use crate::error::{Context, CudaError, Result};

/// Threads of a `read_sum` block.
const READ_THREADS: u32 = 512;
/// `read_sum` blocks per multiprocessor: with [`READ_THREADS`], every thread a multiprocessor
/// of sm_90 holds.
const READ_BLOCKS_PER_SM: u32 = 4;
/// The smallest read test: well past the H200's 50 MB of L2 cache, so that it measures memory.
pub const MIN_READ_TEST_BYTES: usize = 1 << 30;

/// A read test's buffer, allocated once so that repeated tests cost only their reads.
pub struct ReadTest {
    buf: DevBuf,
    sink: DevBuf,
}

impl Gpu {
    /// Device-to-device copy bandwidth (bytes read + written per second) over `bytes`.
    pub fn copy_bandwidth(&self, bytes: usize) -> Result<f64> {
        let a = self.alloc(bytes, "bandwidth test")?;
        let b = self.alloc(bytes, "bandwidth test")?;
        let s = &self.stream;
        let secs = self.time(s, 10, || {
            // SAFETY: both buffers are `bytes` long.
            unsafe { result::memcpy_dtod_async(b.ptr, a.ptr, bytes, s.cu_stream()) }
                .ctx(|| "copy".into())
        })?;
        Ok(2.0 * bytes as f64 / secs)
    }

    /// A read test over `bytes` (whole 16-byte words), refused below `MIN_READ_TEST_BYTES`:
    /// a smaller buffer would be read from the cache.
    pub fn read_test(&self, bytes: usize) -> Result<ReadTest> {
        if bytes < MIN_READ_TEST_BYTES {
            return Err(CudaError::Unsupported(format!(
                "a read-bandwidth test of {bytes} bytes would measure the cache: it needs at \
                 least {MIN_READ_TEST_BYTES}"
            )));
        }
        Ok(ReadTest {
            buf: self.alloc(bytes & !15, "the read-bandwidth test")?,
            sink: self.alloc(4, "the read-bandwidth test's sum")?,
        })
    }

    /// Bytes per second reading the test's buffer once: the median of `iters` reads.
    pub fn read_bandwidth(&self, t: &ReadTest, iters: usize) -> Result<f64> {
        let sms = self.info.multiprocessors.max(1) as u32;
        let s = &self.stream;
        let words = (t.buf.bytes / 16) as u64;
        let secs = self.time(s, iters.max(1), || {
            self.launch(
                s,
                "read_sum",
                (sms * READ_BLOCKS_PER_SM, 1, 1),
                (READ_THREADS, 1, 1),
                &[Arg::Ptr(t.buf.ptr), Arg::U64(words), Arg::Ptr(t.sink.ptr)],
            )
        })?;
        Ok(t.buf.bytes as f64 / secs)
    }
}
