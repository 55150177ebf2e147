//! How a run of tokens is cut into forward passes of at most a given length.

/// The passes `n` tokens take at most `most` a pass, as `(start, len)` in order: as few as
/// that allows, their lengths within one of each other (the longer first). A pass reads every
/// weight once whatever it holds, and on a GPU a pass of a few tokens takes kernels made for
/// one token, each weight stream nearly a whole pass's time: so 270 tokens run as 135 + 135,
/// not 256 + 14. `most` 0 counts as 1.
pub fn even(n: usize, most: usize) -> impl Iterator<Item = (usize, usize)> {
    let count = n.div_ceil(most.max(1));
    // No passes (n 0): nothing below is asked for.
    let base = n.checked_div(count).unwrap_or(0);
    let longer = n.checked_rem(count).unwrap_or(0);
    (0..count).map(move |i| {
        let start = i * base + i.min(longer);
        (start, base + usize::from(i < longer))
    })
}

#[cfg(test)]
mod tests {
    use super::even;

    fn lens(n: usize, most: usize) -> Vec<usize> {
        even(n, most).map(|(_, len)| len).collect()
    }

    #[test]
    fn a_short_tail_is_shared_out() {
        assert_eq!(lens(270, 256), vec![135, 135]);
        assert_eq!(lens(257, 256), vec![129, 128]);
        assert_eq!(lens(2 * 256 + 22, 256), vec![178, 178, 178]);
        assert_eq!(lens(512, 256), vec![256, 256]);
        assert_eq!(lens(100, 256), vec![100]);
        assert_eq!(lens(0, 256), Vec::<usize>::new());
        assert_eq!(lens(3, 0), vec![1, 1, 1]);
    }

    #[test]
    fn the_passes_cover_every_token_once_in_order_within_the_bound() {
        for most in [1, 2, 7, 64, 256] {
            for n in 0..700 {
                let passes: Vec<_> = even(n, most).collect();
                let mut at = 0;
                for &(start, len) in &passes {
                    assert_eq!(start, at, "n {n} most {most}");
                    assert!((1..=most).contains(&len), "n {n} most {most}: {len}");
                    at += len;
                }
                assert_eq!(at, n);
                assert_eq!(passes.len(), n.div_ceil(most));
                let (lo, hi) = passes
                    .iter()
                    .fold((usize::MAX, 0), |(lo, hi), &(_, l)| (lo.min(l), hi.max(l)));
                assert!(passes.is_empty() || hi - lo <= 1, "n {n} most {most}");
            }
        }
    }
}
