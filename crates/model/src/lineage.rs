//! Which checkpoints a sequence can still go back to. A checkpoint keeps a sequence's position
//! and recurrent part but not its KV cache, which the tokens after it only add to; so it holds
//! only for the sequence it was saved from, and only while that sequence has not been rewound
//! below it since (the tokens consumed after such a rewind overwrite the cache rows the
//! checkpoint relies on). A [`Lineage`] is that record; the CPU and GPU states each keep one.

use std::sync::atomic::{AtomicU64, Ordering};

/// Identities handed to sequences; 0 is no sequence's, so a checkpoint never saved matches none.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A sequence's identity and the rewinds it has been through.
#[derive(Debug)]
pub struct Lineage {
    id: u64,
    /// Rewinds so far.
    epoch: u64,
    /// (epoch, position) of the rewinds that went lower than every later one, in order: their
    /// positions rise, so the first after a save is the lowest the sequence has gone since.
    lows: Vec<(u64, usize)>,
}

/// Where in a sequence's lineage a checkpoint was saved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mark {
    id: u64,
    epoch: u64,
}

/// Why a checkpoint no longer holds for a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stale {
    /// Saved from another sequence (or from this one before it was cloned, or never saved).
    OtherSequence,
    /// The sequence went back to `low` after the save, below the checkpoint's position: its
    /// cache rows from there on now hold other tokens.
    Overwritten { low: usize },
}

impl Lineage {
    /// A new sequence's: its own identity, no rewinds.
    pub fn new() -> Lineage {
        Lineage {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            epoch: 0,
            lows: Vec::new(),
        }
    }

    /// What a checkpoint saved now records.
    pub fn mark(&self) -> Mark {
        Mark {
            id: self.id,
            epoch: self.epoch,
        }
    }

    /// Whether a checkpoint marked `m` at position `pos` still holds for this sequence.
    pub fn check(&self, m: Mark, pos: usize) -> Result<(), Stale> {
        if m.id != self.id {
            return Err(Stale::OtherSequence);
        }
        let since = self.lows.partition_point(|&(e, _)| e <= m.epoch);
        match self.lows.get(since) {
            Some(&(_, low)) if low < pos => Err(Stale::Overwritten { low }),
            _ => Ok(()),
        }
    }

    /// Records a rewind to `pos`.
    pub fn rewound(&mut self, pos: usize) {
        self.epoch += 1;
        while self.lows.last().is_some_and(|&(_, p)| p >= pos) {
            self.lows.pop();
        }
        self.lows.push((self.epoch, pos));
    }
}

impl Default for Lineage {
    fn default() -> Self {
        Lineage::new()
    }
}

/// A clone is another sequence from there on: checkpoints saved from either afterwards must
/// not apply to the other, so it takes a new identity (and refuses the original's earlier
/// checkpoints too, which is safe).
impl Clone for Lineage {
    fn clone(&self) -> Self {
        Lineage::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_holds_until_a_rewind_goes_below_it() {
        let mut l = Lineage::new();
        let at20 = l.mark();
        assert_eq!(l.check(at20, 20), Ok(()));
        // Back to 20 itself, again and again (a benchmark's tests from one depth).
        l.rewound(20);
        l.rewound(20);
        assert_eq!(l.check(at20, 20), Ok(()));
        let at35 = l.mark();
        // Up to 35 and back to 25: the checkpoint at 20 holds, the one at 35 does not.
        l.rewound(25);
        assert_eq!(l.check(at20, 20), Ok(()));
        assert_eq!(l.check(at35, 35), Err(Stale::Overwritten { low: 25 }));
        // A save after the rewind holds.
        let at40 = l.mark();
        l.rewound(40);
        assert_eq!(l.check(at40, 40), Ok(()));
        // Below 20: every checkpoint above 10 saved before this is gone, even after higher
        // rewinds since.
        l.rewound(10);
        l.rewound(30);
        assert_eq!(l.check(at20, 20), Err(Stale::Overwritten { low: 10 }));
        assert_eq!(l.check(at40, 40), Err(Stale::Overwritten { low: 10 }));
        assert_eq!(l.check(at20, 10), Ok(()));
        assert_eq!(l.lows, vec![(5, 10), (6, 30)]);
    }

    #[test]
    fn another_sequence_or_a_clone_refuses_a_checkpoint() {
        let a = Lineage::new();
        let b = Lineage::new();
        assert_eq!(b.check(a.mark(), 0), Err(Stale::OtherSequence));
        assert_eq!(a.clone().check(a.mark(), 0), Err(Stale::OtherSequence));
        assert_eq!(a.check(Mark::default(), 0), Err(Stale::OtherSequence));
    }
}
