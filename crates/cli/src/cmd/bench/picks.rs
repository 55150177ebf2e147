//! The tokens a decode test picked, told apart without printing them: a digest of the first
//! run's and whether every run picked the same. Two builds whose kernels give the same bits
//! pick the same tokens, so side-by-side runs of two builds check each other for free; runs of
//! one build that differ are nondeterminism, which the report names.

/// The decode runs' picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Picks {
    /// FNV-1a (64-bit) of the first run's token ids, each as four little-endian bytes.
    pub digest: u64,
    /// Every run picked the same tokens.
    pub agree: bool,
}

impl Picks {
    /// The picks of `runs` (each run's token ids in order); `None` without a run.
    pub fn of(runs: &[Vec<u32>]) -> Option<Picks> {
        let first = runs.first()?;
        Some(Picks {
            digest: fnv1a(first.iter().flat_map(|id| id.to_le_bytes())),
            agree: runs.iter().all(|r| r == first),
        })
    }

    /// The digest as 16 hex digits.
    pub fn hex(&self) -> String {
        format!("{:016x}", self.digest)
    }
}

fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_run_has_no_picks() {
        assert_eq!(Picks::of(&[]), None);
    }

    #[test]
    fn the_digest_is_fnv1a_64() {
        // The algorithm's published test vectors.
        assert_eq!(fnv1a([]), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(*b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(*b"foobar"), 0x8594_4171_f739_67e8);
        // A run's ids enter as their little-endian bytes.
        let id = u32::from_le_bytes(*b"foob");
        assert_eq!(
            Picks::of(&[vec![id]]).map(|p| p.digest),
            Some(fnv1a(*b"foob"))
        );
    }

    #[test]
    fn one_token_changed_changes_the_digest_and_runs_that_differ_disagree() {
        let a = vec![5u32, 17, 248_000, 3];
        let mut b = a.clone();
        b[2] += 1;
        let same = Picks::of(&[a.clone(), a.clone()]).unwrap();
        assert!(same.agree);
        assert_ne!(same.digest, Picks::of(&[b.clone()]).unwrap().digest);
        let mixed = Picks::of(&[a.clone(), b]).unwrap();
        assert!(!mixed.agree);
        // The first run's tokens name the digest.
        assert_eq!(mixed.digest, same.digest);
        assert_eq!(same.hex().len(), 16);
    }
}
