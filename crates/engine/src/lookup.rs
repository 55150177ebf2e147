//! Prompt-lookup drafting: the tokens that followed the latest earlier occurrence of the
//! sequence's last few tokens, proposed as what comes next. Output that repeats its context
//! (code being edited, quoted passages, lists, a greedy loop) is then verified several tokens a
//! pass; a draft that is wrong costs a pass and changes nothing ([`crate::generate_with`]).

/// How drafts are looked up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LookupConfig {
    /// Most tokens drafted at once.
    pub max_draft: usize,
    /// Longest and shortest run of last tokens looked up (the longest that occurs earlier wins).
    pub ngram_max: usize,
    pub ngram_min: usize,
}

impl Default for LookupConfig {
    /// Drafts of up to 8 tokens from runs of 4 down to 2: a single token matches too often to
    /// be worth a pass.
    fn default() -> Self {
        LookupConfig {
            max_draft: 8,
            ngram_max: 4,
            ngram_min: 2,
        }
    }
}

impl LookupConfig {
    /// Up to `max_draft` tokens to try after `history`: those that followed the latest earlier
    /// occurrence of its last n tokens, for the longest n from `ngram_max` down to `ngram_min`
    /// that occurs; none where no run does.
    pub fn draft(&self, history: &[u32]) -> Vec<u32> {
        let len = history.len();
        for n in (self.ngram_min.max(1)..=self.ngram_max).rev() {
            if len <= n {
                continue;
            }
            let tail = &history[len - n..];
            // Latest first: the nearest context is the likeliest to go on the same way.
            if let Some(start) = (0..len - n).rev().find(|&s| &history[s..s + n] == tail) {
                let from = start + n;
                return history[from..(from + self.max_draft).min(len)].to_vec();
            }
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::LookupConfig;

    #[test]
    fn the_latest_occurrence_of_the_longest_run_gives_the_draft() {
        let c = LookupConfig {
            max_draft: 3,
            ngram_max: 3,
            ngram_min: 2,
        };
        // "1 2 3" occurs at 0 and 5; the latest (5) is followed by 9 9.
        let h = [1, 2, 3, 7, 8, 1, 2, 3, 9, 9, 4, 1, 2, 3];
        assert_eq!(c.draft(&h), vec![9, 9, 4]);
        // Only the 2-run "5 6" occurs earlier: its continuation, cut at max_draft.
        let h = [5, 6, 10, 11, 12, 13, 0, 5, 6];
        assert_eq!(c.draft(&h), vec![10, 11, 12]);
        // The continuation stops where the history does.
        let h = [4, 5, 4, 5];
        assert_eq!(c.draft(&h), vec![4, 5]);
    }

    #[test]
    fn no_earlier_run_or_too_short_a_history_drafts_nothing() {
        let c = LookupConfig::default();
        assert!(c.draft(&[]).is_empty());
        assert!(c.draft(&[1, 2]).is_empty());
        assert!(c.draft(&[1, 2, 3, 4, 5, 6]).is_empty());
        // A single repeated token is not a run of two.
        assert!(c.draft(&[7, 1, 2, 7]).is_empty());
    }
}
