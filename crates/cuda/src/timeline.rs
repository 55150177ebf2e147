//! A decode step's timeline from the kernels' records ([`gpu::TraceRecord`]): the records
//! grouped into launches, and per kind of op how long its launches ran and how long each waited
//! after the launch before it had ended.

use std::collections::BTreeMap;

use crate::gpu::{TraceKind, TraceRecord};

/// Records of one (kind, tag) whose waits ended further apart than this belong to different
/// launches: a launch's blocks end their waits within a few microseconds of each other, and the
/// same kernel on the same tag comes back a layer (tens of microseconds) later at the soonest.
pub const SPLIT_NS: u64 = 5_000;

/// One launch: its op's name and the extremes of its blocks' times (ns).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub name: String,
    pub blocks: usize,
    /// The first block to begin waiting for the previous kernel (it was resident from then).
    pub first_wait0: u64,
    /// The first block whose wait ended (the previous kernel had completed).
    pub first_wait1: u64,
    pub last_end: u64,
}

/// Per kind of op: launches, and their mean times (µs).
#[derive(Clone, Debug, PartialEq)]
pub struct OpTimes {
    pub name: String,
    pub launches: usize,
    /// From the first block's wait ending to the last block's end.
    pub active_us: f64,
    /// From the previous launch's last block ending to this one's first wait ending: the
    /// dependence's latency (0 where the wait ended first; launches with no predecessor in the
    /// trace left out).
    pub gap_us: f64,
    /// How long the first block was resident before its wait ended.
    pub early_us: f64,
}

/// Groups the records into launches, in the order their first waits ended. `name` names a
/// record's op from its kind and tag.
pub fn launches(records: &[TraceRecord], name: impl Fn(TraceKind, u64) -> String) -> Vec<Launch> {
    let mut by_key: BTreeMap<(TraceKind, u64), Vec<&TraceRecord>> = BTreeMap::new();
    for r in records {
        by_key.entry((r.kind, r.tag)).or_default().push(r);
    }
    let mut out = Vec::new();
    for ((kind, tag), mut recs) in by_key {
        recs.sort_by_key(|r| r.wait1);
        let mut start = 0;
        for i in 1..=recs.len() {
            if i == recs.len() || recs[i].wait1 - recs[i - 1].wait1 > SPLIT_NS {
                let group = &recs[start..i];
                out.push(Launch {
                    name: name(kind, tag),
                    blocks: group.len(),
                    first_wait0: group.iter().map(|r| r.wait0).min().unwrap_or(0),
                    first_wait1: group[0].wait1,
                    last_end: group.iter().map(|r| r.end).max().unwrap_or(0),
                });
                start = i;
            }
        }
    }
    out.sort_by_key(|l| l.first_wait1);
    out
}

/// Mean times per op name, in the order the names first appear.
pub fn summarize(launches: &[Launch]) -> Vec<OpTimes> {
    let mut order: Vec<String> = Vec::new();
    // Launches, then sums of active time, of gaps, gaps counted, early time (ns).
    let mut sums: BTreeMap<String, (usize, f64, f64, usize, f64)> = BTreeMap::new();
    for (i, l) in launches.iter().enumerate() {
        let active = l.last_end.saturating_sub(l.first_wait1) as f64;
        let early = l.first_wait1.saturating_sub(l.first_wait0) as f64;
        // The first launch has no predecessor in the trace; nor does one after a pause longer
        // than a step (between graph replays).
        let gap = match i.checked_sub(1).map(|p| &launches[p]) {
            Some(p) if l.first_wait1 >= p.last_end && l.first_wait1 - p.last_end < 1_000_000 => {
                Some((l.first_wait1 - p.last_end) as f64)
            }
            Some(p) if l.first_wait1 < p.last_end => Some(0.0),
            _ => None,
        };
        let e = sums.entry(l.name.clone()).or_insert_with(|| {
            order.push(l.name.clone());
            (0, 0.0, 0.0, 0, 0.0)
        });
        e.0 += 1;
        e.1 += active;
        if let Some(g) = gap {
            e.2 += g;
            e.3 += 1;
        }
        e.4 += early;
    }
    order
        .into_iter()
        .map(|name| {
            let (n, active, gap, gaps, early) = sums[&name];
            let mean = |v: f64, n: usize| v / n.max(1) as f64 / 1e3;
            OpTimes {
                name,
                launches: n,
                active_us: mean(active, n),
                gap_us: mean(gap, gaps),
                early_us: mean(early, n),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(kind: TraceKind, tag: u64, wait0: u64, wait1: u64, end: u64) -> TraceRecord {
        TraceRecord {
            kind,
            tag,
            block: 0,
            sm: 0,
            wait0,
            wait1,
            end,
        }
    }

    #[test]
    fn records_group_into_launches_and_gaps_follow_the_previous_launchs_end() {
        use TraceKind::*;
        // A norm (two blocks), a GEMV (three blocks, resident early), the norm kernel again on
        // another tag, then the first norm's tag again a layer later.
        let recs = [
            rec(GemvBinary, 7, 1_000, 3_500, 9_000),
            rec(Norm, 1, 500, 1_000, 2_000),
            rec(GemvBinary, 7, 1_200, 3_000, 8_000),
            rec(Norm, 1, 600, 1_100, 2_500),
            rec(GemvBinary, 7, 1_500, 3_200, 8_500),
            rec(Norm, 2, 8_000, 10_000, 11_000),
            rec(Norm, 1, 40_000, 41_000, 42_000),
        ];
        let name = |k: TraceKind, tag: u64| format!("{k:?} {tag}");
        let l = launches(&recs, name);
        let got: Vec<(&str, usize, u64, u64, u64)> = l
            .iter()
            .map(|l| {
                (
                    l.name.as_str(),
                    l.blocks,
                    l.first_wait0,
                    l.first_wait1,
                    l.last_end,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("Norm 1", 2, 500, 1_000, 2_500),
                ("GemvBinary 7", 3, 1_000, 3_000, 9_000),
                ("Norm 2", 1, 8_000, 10_000, 11_000),
                ("Norm 1", 1, 40_000, 41_000, 42_000),
            ]
        );
        let s = summarize(&l);
        let by = |n: &str| s.iter().find(|o| o.name == n).unwrap().clone();
        // Norm 1: active 1.5 and 1.0 µs; the first has no predecessor, the second follows Norm
        // 2's end by 30 µs; resident 0.5 and 1.0 µs before its wait ended.
        let n1 = by("Norm 1");
        assert_eq!(n1.launches, 2);
        assert!((n1.active_us - 1.25).abs() < 1e-9);
        assert!((n1.gap_us - 30.0).abs() < 1e-9);
        assert!((n1.early_us - 0.75).abs() < 1e-9);
        let g = by("GemvBinary 7");
        assert!((g.active_us - 6.0).abs() < 1e-9 && (g.gap_us - 0.5).abs() < 1e-9);
        assert!((g.early_us - 2.0).abs() < 1e-9);
        // Norm 2's wait ended 1 µs after the GEMV's last block.
        assert!((by("Norm 2").gap_us - 1.0).abs() < 1e-9);
        // A wait ending before the previous launch's last block counts as no gap.
        let overlapping = [
            rec(GemvBinary, 7, 0, 1_000, 5_000),
            rec(Norm, 1, 2_000, 4_000, 6_000),
        ];
        assert_eq!(summarize(&launches(&overlapping, name))[1].gap_us, 0.0);
        let names: Vec<&str> = s.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names, ["Norm 1", "GemvBinary 7", "Norm 2"]);
    }
}
