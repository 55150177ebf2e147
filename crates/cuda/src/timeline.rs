//! A decode step's timeline from the kernels' records ([`crate::gpu::TraceRecord`]): the records
//! grouped into launches, and per kind of op how long its launches ran and how long each waited
//! after the launch before it had ended.

use std::collections::BTreeMap;

use crate::gpu::{TraceKind, TraceRecord, TRACE_MARKS};

/// Records of one (kind, tag) whose waits ended further apart than this belong to different
/// launches: a launch's blocks end their waits within a few microseconds of each other, and the
/// same kernel on the same tag comes back a layer (tens of microseconds) later at the soonest.
pub const SPLIT_NS: u64 = 5_000;

/// One launch: its op's name and the extremes of its blocks' times (ns).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub name: String,
    pub kind: TraceKind,
    pub blocks: usize,
    /// The first block to begin waiting for the previous kernel (it was resident from then).
    pub first_wait0: u64,
    /// The first block whose wait ended (the previous kernel had completed).
    pub first_wait1: u64,
    pub last_end: u64,
    /// Multiprocessors its blocks ran on, and the most blocks any one of them ran: how the
    /// block scheduler spread the launch.
    pub sms: usize,
    pub most_on_one_sm: usize,
    /// Where its blocks mark it (the decode GEMVs): when the last block had written its rows
    /// (mark 2, before a fold). (When the median block held its activations is
    /// `marks_median[0]`.)
    pub rows_last: Option<u64>,
    /// When the first of its blocks' consumers took their first tile (mark 1). They take it
    /// once they hold their activations, so the tile itself may have arrived well before
    /// (`NIWAKI_CUDA_ABLATE=watch` times its arrival).
    pub tile_first: Option<u64>,
    /// Each mark's median over the blocks that set it (for a GEMV, mark 0: the median block
    /// holding its activations).
    pub marks_median: [Option<u64>; TRACE_MARKS],
}

/// Per kind of op: launches, and their mean times (µs).
#[derive(Clone, Debug, PartialEq)]
pub struct OpTimes {
    pub name: String,
    pub kind: TraceKind,
    pub launches: usize,
    /// From the first block's wait ending to the last block's end.
    pub active_us: f64,
    /// From the previous launch's last block ending to this one's first wait ending: the
    /// dependence's latency (0 where the wait ended first; launches with no predecessor in the
    /// trace left out).
    pub gap_us: f64,
    /// How long the first block was resident before its wait ended.
    pub early_us: f64,
    /// Multiprocessors a launch's blocks ran on (mean), and the most blocks one multiprocessor
    /// ran in any launch.
    pub sms: f64,
    pub most_on_one_sm: usize,
    /// From the first block's wait ending to the median block holding its activations, and to
    /// the last block's rows written (means over the launches whose blocks mark them): with
    /// `active_us`, what a launch spends before its arithmetic and after its last row.
    pub ready_us: Option<f64>,
    pub rows_us: Option<f64>,
    /// From the first block's wait ending to the first tile any block's consumers took (mean
    /// over the launches whose blocks mark it).
    pub tile_us: Option<f64>,
    /// From the first block's wait ending to each mark's median block (means over the launches
    /// whose blocks set it): what [`TraceKind::mark_names`] names, for the other kernels.
    pub marks_us: [Option<f64>; TRACE_MARKS],
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
                let mut per_sm: BTreeMap<u32, usize> = BTreeMap::new();
                for r in group {
                    *per_sm.entry(r.sm).or_default() += 1;
                }
                let marks_median: [Option<u64>; TRACE_MARKS] = std::array::from_fn(|k| {
                    let mut set: Vec<u64> = group
                        .iter()
                        .map(|r| r.marks[k])
                        .filter(|&m| m > 0)
                        .collect();
                    set.sort_unstable();
                    set.get(set.len() / 2).copied()
                });
                // Marks 0-2 are the GEMVs' activations, first tile and rows; other kernels' are
                // their own (TraceKind::mark_names).
                let gemv_marks = |k: usize| {
                    group
                        .iter()
                        .map(move |r| r.marks[k])
                        .filter(|&m| m > 0 && kind.is_gemv())
                };
                out.push(Launch {
                    name: name(kind, tag),
                    kind,
                    blocks: group.len(),
                    first_wait0: group.iter().map(|r| r.wait0).min().unwrap_or(0),
                    first_wait1: group[0].wait1,
                    last_end: group.iter().map(|r| r.end).max().unwrap_or(0),
                    sms: per_sm.len(),
                    most_on_one_sm: per_sm.values().copied().max().unwrap_or(0),
                    rows_last: gemv_marks(2).max(),
                    tile_first: gemv_marks(1).min(),
                    marks_median,
                });
                start = i;
            }
        }
    }
    out.sort_by_key(|l| l.first_wait1);
    out
}

/// Mean times per op of records that carry their op's name (as
/// `CudaModel::trace_decode_records` gives them): their launches, summarized.
pub fn summarize_named(records: &[(TraceRecord, String)]) -> Vec<OpTimes> {
    let names: BTreeMap<(TraceKind, u64), &str> = records
        .iter()
        .map(|(r, name)| ((r.kind, r.tag), name.as_str()))
        .collect();
    let plain: Vec<TraceRecord> = records.iter().map(|(r, _)| *r).collect();
    summarize(&launches(&plain, |kind, tag| {
        names
            .get(&(kind, tag))
            .copied()
            .unwrap_or_default()
            .to_string()
    }))
}

/// One op's launches so far, and its sums over them (times in ns).
#[derive(Default)]
struct Sums {
    launches: usize,
    active: f64,
    gap: f64,
    gaps: usize,
    early: f64,
    sms: usize,
    most_on_one_sm: usize,
    rows: (f64, usize),
    tile: (f64, usize),
    marks: [(f64, usize); TRACE_MARKS],
}

/// Mean times per op name, in the order the names first appear.
pub fn summarize(launches: &[Launch]) -> Vec<OpTimes> {
    let mut order: Vec<(String, TraceKind)> = Vec::new();
    let mut sums: BTreeMap<String, Sums> = BTreeMap::new();
    for (i, l) in launches.iter().enumerate() {
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
            order.push((l.name.clone(), l.kind));
            Sums::default()
        });
        e.launches += 1;
        e.active += l.last_end.saturating_sub(l.first_wait1) as f64;
        if let Some(g) = gap {
            e.gap += g;
            e.gaps += 1;
        }
        e.early += l.first_wait1.saturating_sub(l.first_wait0) as f64;
        e.sms += l.sms;
        e.most_on_one_sm = e.most_on_one_sm.max(l.most_on_one_sm);
        let since_wait = |t: u64| t.saturating_sub(l.first_wait1) as f64;
        if let Some(t) = l.rows_last {
            e.rows = (e.rows.0 + since_wait(t), e.rows.1 + 1);
        }
        if let Some(t) = l.tile_first {
            e.tile = (e.tile.0 + since_wait(t), e.tile.1 + 1);
        }
        for (m, t) in e.marks.iter_mut().zip(l.marks_median) {
            if let Some(t) = t {
                *m = (m.0 + since_wait(t), m.1 + 1);
            }
        }
    }
    let mean_us = |(sum, n): (f64, usize)| (n > 0).then(|| sum / n as f64 / 1e3);
    order
        .into_iter()
        .map(|(name, kind)| {
            let e = &sums[&name];
            let n = e.launches.max(1) as f64;
            OpTimes {
                launches: e.launches,
                active_us: e.active / n / 1e3,
                gap_us: e.gap / e.gaps.max(1) as f64 / 1e3,
                early_us: e.early / n / 1e3,
                sms: e.sms as f64 / n,
                most_on_one_sm: e.most_on_one_sm,
                // A GEMV's mark 0: its median block holding its activations.
                ready_us: mean_us(e.marks[0]).filter(|_| kind.is_gemv()),
                rows_us: mean_us(e.rows),
                tile_us: mean_us(e.tile),
                marks_us: e.marks.map(mean_us),
                name,
                kind,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(kind: TraceKind, tag: u64, wait0: u64, wait1: u64, end: u64) -> TraceRecord {
        on_sm(kind, tag, wait0, wait1, end, 0)
    }

    fn marked(wait1: u64, ready: u64, rows: u64, end: u64) -> TraceRecord {
        TraceRecord {
            marks: [ready, ready + 100, rows, 0, 0, 0],
            ..rec(TraceKind::GemvBinary, 7, 0, wait1, end)
        }
    }

    fn on_sm(kind: TraceKind, tag: u64, wait0: u64, wait1: u64, end: u64, sm: u32) -> TraceRecord {
        TraceRecord {
            kind,
            tag,
            block: 0,
            sm,
            wait0,
            wait1,
            end,
            marks: [0; crate::gpu::TRACE_MARKS],
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

    #[test]
    fn the_blocks_marks_give_the_median_blocks_activations_the_first_tile_and_the_last_rows() {
        // Two launches: blocks holding their activations at 3.7, 3.5, 4.0 µs (waits ending from
        // 3.0) and writing their rows by 6.0 and 7.0 (one block marking none), ending at 9.0;
        // then, 50 µs on, blocks at 1.2 and 1.6 µs after the wait, rows by 2.0.
        let recs = [
            marked(3_000, 3_700, 6_000, 8_000),
            marked(3_100, 3_500, 7_000, 9_000),
            marked(3_200, 4_000, 0, 8_500),
            marked(53_000, 54_200, 55_000, 56_000),
            marked(53_000, 54_600, 54_000, 56_500),
        ];
        let l = launches(&recs, |k, t| format!("{k:?} {t}"));
        let got: Vec<_> = l
            .iter()
            .map(|l| (l.marks_median[0], l.rows_last, l.tile_first))
            .collect();
        // Each block's first tile 0.1 µs after its activations: the launch's first at 3.6 and
        // 54.3.
        assert_eq!(
            got,
            [
                (Some(3_700), Some(7_000), Some(3_600)),
                (Some(54_600), Some(55_000), Some(54_300))
            ]
        );
        let s = summarize(&l);
        // (0.7 + 1.6) / 2, (4.0 + 2.0) / 2 and (0.6 + 1.3) / 2 µs from the first wait's end.
        assert!((s[0].ready_us.unwrap() - 1.15).abs() < 1e-9);
        assert!((s[0].rows_us.unwrap() - 3.0).abs() < 1e-9);
        assert!((s[0].tile_us.unwrap() - 0.95).abs() < 1e-9);
        // Kernels that mark nothing have neither.
        let plain = summarize(&launches(
            &[rec(TraceKind::Norm, 1, 0, 1_000, 2_000)],
            |k, t| format!("{k:?} {t}"),
        ));
        assert_eq!(
            (plain[0].ready_us, plain[0].rows_us, plain[0].tile_us),
            (None, None, None)
        );
    }

    #[test]
    fn a_recurrences_marks_are_its_own_not_the_gemvs_columns() {
        // One launch of the recurrence, waits ending from 1.0 µs: three blocks set marks 0 and
        // 3 (conv at 1.5, 1.4, 1.6; step at 2.5, 2.9, 2.7), one of them mark 5 too.
        let gdn = |wait1: u64, conv: u64, step: u64, held: u64| TraceRecord {
            marks: [conv, 0, 0, step, 0, held],
            ..rec(TraceKind::Gdn, 3, 0, wait1, 4_000)
        };
        let recs = [
            gdn(1_000, 1_500, 2_500, 0),
            gdn(1_010, 1_400, 2_900, 1_200),
            gdn(1_020, 1_600, 2_700, 0),
        ];
        let l = launches(&recs, |k, t| format!("{k:?} {t}"));
        assert_eq!(l[0].kind, TraceKind::Gdn);
        assert_eq!(
            l[0].marks_median,
            [Some(1_500), None, None, Some(2_700), None, Some(1_200)]
        );
        let s = summarize(&l);
        // Not the GEMVs' activations, first tile and rows.
        assert_eq!(
            (s[0].ready_us, s[0].tile_us, s[0].rows_us),
            (None, None, None)
        );
        let us: Vec<Option<f64>> = s[0].marks_us.to_vec();
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-9);
        assert!(close(us[0], 0.5) && close(us[3], 1.7) && close(us[5], 0.2));
        assert_eq!((us[1], us[2], us[4]), (None, None, None));
        // Every mark the recurrence sets is named, each once.
        let mut named: Vec<usize> = TraceKind::Gdn.mark_names().iter().map(|m| m.0).collect();
        named.sort_unstable();
        assert_eq!(named, [0, 1, 2, 3, 4, 5]);
        assert!(TraceKind::GemvBinary.is_gemv() && !TraceKind::Gdn.is_gemv());
    }

    #[test]
    fn named_records_summarize_by_their_names() {
        use TraceKind::*;
        // Two layers' GEMVs of one kind (two tags, one name) and a norm.
        let named = [
            (
                rec(GemvBinary, 7, 0, 1_000, 3_000),
                "Gemv GdnIn".to_string(),
            ),
            (rec(Norm, 1, 3_000, 3_500, 4_000), "Norm".to_string()),
            (
                rec(GemvBinary, 9, 50_000, 51_000, 54_000),
                "Gemv GdnIn".to_string(),
            ),
        ];
        let s = summarize_named(&named);
        let got: Vec<(&str, usize)> = s.iter().map(|o| (o.name.as_str(), o.launches)).collect();
        assert_eq!(got, [("Gemv GdnIn", 2), ("Norm", 1)]);
        assert!((s[0].active_us - 2.5).abs() < 1e-9);
    }

    #[test]
    fn a_launch_counts_the_multiprocessors_its_blocks_ran_on() {
        use TraceKind::*;
        // Two launches of one GEMV a layer apart: blocks on multiprocessors 0, 0, 1, then on 2,
        // 3, 4, 4, 4.
        let recs = [
            on_sm(GemvBinary, 7, 0, 1_000, 2_000, 0),
            on_sm(GemvBinary, 7, 0, 1_100, 2_000, 0),
            on_sm(GemvBinary, 7, 0, 1_200, 2_000, 1),
            on_sm(GemvBinary, 7, 0, 50_000, 51_000, 2),
            on_sm(GemvBinary, 7, 0, 50_000, 51_000, 3),
            on_sm(GemvBinary, 7, 0, 50_100, 51_000, 4),
            on_sm(GemvBinary, 7, 0, 50_100, 51_000, 4),
            on_sm(GemvBinary, 7, 0, 50_200, 51_000, 4),
        ];
        let l = launches(&recs, |k, t| format!("{k:?} {t}"));
        let got: Vec<(usize, usize, usize)> = l
            .iter()
            .map(|l| (l.blocks, l.sms, l.most_on_one_sm))
            .collect();
        assert_eq!(got, [(3, 2, 2), (5, 3, 3)]);
        let s = summarize(&l);
        assert_eq!(s.len(), 1);
        assert!((s[0].sms - 2.5).abs() < 1e-9);
        assert_eq!(s[0].most_on_one_sm, 3);
    }
}
