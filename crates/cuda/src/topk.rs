//! Sampling's top-k on the GPU: the passes of `kernels/topk.cu` over a logits row, and the
//! candidates they leave.

use cudarc::driver::CudaStream;

use crate::error::Result;
use crate::gpu::{serial_launches, Arg, Gpu};
use crate::plan::{topk_passes, topk_unkey, weight_chunks, TopkPass};

/// What the selection found in a row.
#[derive(Clone, Debug, PartialEq)]
pub enum Selected {
    /// `(id, logit / temperature)` of the best k finite logits, best first, ties to the lower id
    /// (as `model::rank::top_k`); fewer when fewer are finite.
    Top(Vec<(u32, f32)>),
    /// The row holds ±∞ (the sampler then needs the whole row).
    Infinite,
}

/// Where a selection works: two key buffers of `plan::topk_scratch_keys` keys each, a flag
/// (zero before the first selection; each leaves it so), and the per-chunk weight sums
/// (`plan::weight_chunks` pairs of f32).
#[derive(Clone, Copy, Debug)]
pub struct TopkScratch {
    pub keys: [u64; 2],
    pub flag: u64,
    pub chunks: u64,
}

/// One selection: the best `k` of the `n` logits at `logits` by logit / `temperature`.
#[derive(Clone, Copy, Debug)]
pub struct TopkJob {
    pub logits: u64,
    pub n: usize,
    pub k: usize,
    pub temperature: f32,
}

impl TopkScratch {
    /// Where a selection of the best `k` of `n` leaves its answer: the key buffer its last pass
    /// writes.
    pub fn answer(&self, n: usize, k: usize) -> u64 {
        let passes = topk_passes(n, k).map_or(1, |p| p.len());
        self.keys[(passes - 1) % 2]
    }
}

impl Gpu {
    /// Enqueues the selection `job` (k as `plan::topk_passes` allows, temperature > 0) on
    /// `stream`, its launches plainly stream-ordered (see `kernels/topk.cu`; resident early
    /// beside the LM head, its blocks of 1024 threads would only wait there). Returns where the
    /// `k + 1` keys of the answer will be: the k best (0 past the finite ones), then whether the
    /// row holds ±∞ ([`Selected::from_keys`] reads them). The flag must be zero (as the
    /// selection leaves it).
    pub fn top_k_enqueue(
        &self,
        stream: &CudaStream,
        job: TopkJob,
        scratch: TopkScratch,
    ) -> Result<u64> {
        let TopkJob {
            logits,
            n,
            k,
            temperature,
        } = job;
        let passes = topk_passes(n, k).ok_or_else(|| {
            crate::CudaError::Unsupported(format!("a top-{k} of {n} logits on the GPU"))
        })?;
        let mut src = logits;
        for (i, &TopkPass { inputs, blocks }) in passes.iter().enumerate() {
            let dst = scratch.keys[i % 2];
            let grid = (blocks as u32, 1, 1);
            let block = (TOPK_THREADS, 1, 1);
            let (name, args) = if i == 0 {
                let args = vec![
                    Arg::Ptr(src),
                    Arg::I32(inputs as i32),
                    Arg::F32(temperature),
                    Arg::I32(k as i32),
                    Arg::Ptr(dst),
                    Arg::Ptr(scratch.flag),
                ];
                ("topk_logits", args)
            } else {
                let args = vec![
                    Arg::Ptr(src),
                    Arg::I32(inputs as i32),
                    Arg::I32(k as i32),
                    Arg::Ptr(dst),
                    Arg::Ptr(scratch.flag),
                ];
                ("topk_keys", args)
            };
            serial_launches(|| self.launch(stream, name, grid, block, &args))?;
            src = dst;
        }
        Ok(scratch.answer(n, k))
    }

    /// Enqueues, after [`Gpu::top_k_enqueue`] of the same arguments, `model::rank::weight_sums`
    /// of the row with the selection's best as the maximum and `floor` as min-p's floor, in
    /// the same order (so the same bits): the pair lands after the answer's flag.
    pub fn weight_sums_enqueue(
        &self,
        stream: &CudaStream,
        job: TopkJob,
        floor: f32,
        scratch: TopkScratch,
    ) -> Result<()> {
        let TopkJob {
            logits,
            n,
            k,
            temperature,
        } = job;
        let answer = scratch.answer(n, k);
        let chunks = weight_chunks(n);
        let per_block = 16;
        serial_launches(|| {
            self.launch(
                stream,
                "weight_chunks",
                (chunks.div_ceil(per_block) as u32, 1, 1),
                ((per_block * model::rank::WEIGHT_LANES) as u32, 1, 1),
                &[
                    Arg::Ptr(logits),
                    Arg::I32(n as i32),
                    Arg::F32(temperature),
                    Arg::F32(floor),
                    Arg::Ptr(answer),
                    Arg::Ptr(scratch.chunks),
                ],
            )?;
            self.launch(
                stream,
                "weight_total",
                (1, 1, 1),
                (32, 1, 1),
                &[
                    Arg::Ptr(scratch.chunks),
                    Arg::I32(chunks as i32),
                    Arg::Ptr(answer + 8 * (k as u64 + 1)),
                ],
            )
        })
    }

    /// [`Gpu::top_k_enqueue`], then its answer read back (synchronizing `stream`).
    pub fn top_k(
        &self,
        stream: &CudaStream,
        job: TopkJob,
        scratch: TopkScratch,
    ) -> Result<Selected> {
        let at = self.top_k_enqueue(stream, job, scratch)?;
        let mut keys = vec![0u64; job.k + 1];
        self.read(stream, at, &mut keys)?;
        Ok(Selected::from_keys(&keys))
    }

    /// [`Gpu::top_k`] with the weight sums: (total, kept) read back too.
    pub fn top_k_sums(
        &self,
        stream: &CudaStream,
        job: TopkJob,
        floor: f32,
        scratch: TopkScratch,
    ) -> Result<(Selected, f32, f32)> {
        let k = job.k;
        let at = self.top_k_enqueue(stream, job, scratch)?;
        self.weight_sums_enqueue(stream, job, floor, scratch)?;
        let mut keys = vec![0u64; k + 2];
        self.read(stream, at, &mut keys)?;
        let (total, kept) = unpack_sums(keys[k + 1]);
        Ok((Selected::from_keys(&keys[..k + 1]), total, kept))
    }
}

/// The (total, kept) pair `weight_total` writes, as the 8 bytes read back.
pub fn unpack_sums(word: u64) -> (f32, f32) {
    (
        f32::from_bits(word as u32),
        f32::from_bits((word >> 32) as u32),
    )
}

impl Selected {
    /// The answer of a selection: its k keys, best first, then the ±∞ flag.
    pub fn from_keys(keys: &[u64]) -> Selected {
        match keys.split_last() {
            Some((&0, top)) => Selected::Top(top.iter().copied().map_while(topk_unkey).collect()),
            _ => Selected::Infinite,
        }
    }
}

/// Threads of a selection block (`TOPK_THREADS` in the kernel: one compare-exchange each per
/// step of a sort of `plan::TOPK_CHUNK` keys).
const TOPK_THREADS: u32 = (crate::plan::TOPK_CHUNK / 2) as u32;
