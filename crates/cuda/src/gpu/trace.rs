//! The kernels' timeline records (`kernels/common.cuh`, `TRACE_*`), for measuring where a decode
//! step's time goes: compiled in only when `NIWAKI_CUDA_TRACE` is set.

use cudarc::driver::DevicePtr;

use super::Gpu;
use crate::error::{Context, Result};

/// Records the device holds when tracing is asked for without a number.
const DEFAULT_CAPACITY: usize = 1 << 20;

/// The record capacity `NIWAKI_CUDA_TRACE` asks for: none where unset or `0`, its number where
/// that is at least [`MIN_CAPACITY`], else (`1`, …) the default.
pub(crate) fn capacity_from_env() -> usize {
    capacity(crate::knobs::number_set("NIWAKI_CUDA_TRACE"))
}

/// A decode step of the 27B writes about 10⁵ records: a smaller number is taken for "on".
const MIN_CAPACITY: usize = 4096;

fn capacity(v: Option<usize>) -> usize {
    match v {
        None | Some(0) => 0,
        Some(n) if n >= MIN_CAPACITY => n,
        Some(_) => DEFAULT_CAPACITY,
    }
}

/// The traced kernels, by the `kind` of their records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TraceKind {
    Norm,
    Swiglu,
    GemvBinary,
    GemvDp4a,
    Gdn,
    AttnPrep,
    AttnSplit,
    AttnMerge,
    AttnShort,
    Other(u32),
}

impl TraceKind {
    fn of(kind: u32) -> TraceKind {
        match kind {
            1 => TraceKind::Norm,
            2 => TraceKind::Swiglu,
            3 => TraceKind::GemvBinary,
            4 => TraceKind::GemvDp4a,
            5 => TraceKind::Gdn,
            6 => TraceKind::AttnPrep,
            7 => TraceKind::AttnSplit,
            8 => TraceKind::AttnMerge,
            9 => TraceKind::AttnShort,
            k => TraceKind::Other(k),
        }
    }

    /// The decode GEMVs, whose marks 0-2 are their activations ready, their first tile taken and
    /// their rows written (the timeline's *ready*, *tile* and *rows*).
    pub fn is_gemv(self) -> bool {
        matches!(self, TraceKind::GemvBinary | TraceKind::GemvDp4a)
    }

    /// What the kernel's marks time, in the order they come, for the kernels other than the
    /// GEMVs that mark anything (`gdn_decode`, kernels/gdn.cu): (mark, what).
    pub fn mark_names(self) -> &'static [(usize, &'static str)] {
        match self {
            TraceKind::Gdn => &[
                (0, "conv outputs in shared memory"),
                (5, "state held, past the conv's barrier (last warp)"),
                (3, "step done (last warp)"),
                (1, "past the step's barrier"),
                (2, "output normed and quantized (warp 0)"),
                (4, "state stores issued (last warp)"),
            ],
            _ => &[],
        }
    }
}

/// Moments a block may mark of its own (`TRACE_MARKS` in kernels/common.cuh).
pub const TRACE_MARKS: usize = 6;

/// One block's record: the kernel, the tag telling its launches apart (a pointer argument),
/// and the global timer (ns) when the block began and ended its wait for the previous kernel,
/// and when it ended; `marks`: the moments the kernel marks (0 where it marks none), for the
/// GEMVs its activations ready, its first tile arrived, its rows written and its first
/// consumer warp's tiles done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceRecord {
    pub kind: TraceKind,
    pub tag: u64,
    pub block: u32,
    pub sm: u32,
    pub wait0: u64,
    pub wait1: u64,
    pub end: u64,
    pub marks: [u64; TRACE_MARKS],
}

/// The device's layout of a record (`struct TraceRec`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawRecord {
    tag: u64,
    wait0: u64,
    wait1: u64,
    end: u64,
    kind: u32,
    block: u32,
    sm: u32,
    pad: u32,
    marks: [u64; TRACE_MARKS],
}

// The kernels store a record with 16-byte stores: its size must stay a multiple of 16 (as
// `TRACE_MARKS` in kernels/common.cuh says).
const _: () = assert!(std::mem::size_of::<RawRecord>().is_multiple_of(16));

impl Gpu {
    /// Whether the kernels were compiled with timeline records.
    pub fn tracing(&self) -> bool {
        self.trace_capacity > 0
    }

    /// The records written since the last call (up to the capacity; `None` where the kernels
    /// keep none), clearing them.
    pub fn take_trace(&self) -> Result<Option<Vec<TraceRecord>>> {
        if !self.tracing() {
            return Ok(None);
        }
        let s = &self.stream;
        s.synchronize()
            .ctx(|| "synchronising before the trace".into())?;
        // Compiled whole when tracing: one module holds the symbols.
        let count = self.modules[0]
            .get_global("niwaki_trace_n", s)
            .ctx(|| "finding the trace's count".into())?;
        let recs = self.modules[0]
            .get_global("niwaki_trace", s)
            .ctx(|| "finding the trace's records".into())?;
        let (count_ptr, _c) = count.device_ptr(s);
        let (recs_ptr, _r) = recs.device_ptr(s);
        let mut n = [0u32];
        self.read(s, count_ptr, &mut n)?;
        let n = (n[0] as usize).min(self.trace_capacity);
        // The records' symbol holds `trace_capacity` records of this layout.
        let mut raw = vec![RawRecord::default(); n];
        self.read(s, recs_ptr, &mut raw)?;
        self.write(s, count_ptr, &[0u32])?;
        s.synchronize().ctx(|| "clearing the trace".into())?;
        Ok(Some(
            raw.iter()
                .map(|r| TraceRecord {
                    kind: TraceKind::of(r.kind),
                    tag: r.tag,
                    block: r.block,
                    sm: r.sm,
                    wait0: r.wait0,
                    wait1: r.wait1,
                    end: r.end,
                    marks: r.marks,
                })
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracing_is_off_unless_asked_and_small_numbers_mean_on() {
        assert_eq!(capacity(None), 0);
        assert_eq!(capacity(Some(0)), 0);
        assert_eq!(capacity(Some(1)), DEFAULT_CAPACITY);
        assert_eq!(capacity(Some(5000)), 5000);
    }
}
