//! Which tests one `niwaki bench` runs, from its `-p`, `-n` and `-d` lists.

/// One test: the positions in the context before it, and the prompt tokens it prefills and the
/// tokens it decodes (each from that depth).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Test {
    pub depth: usize,
    pub n_prompt: usize,
    pub n_gen: usize,
}

impl Test {
    /// Positions the test adds to its depth.
    pub fn room(self) -> usize {
        self.n_prompt.max(self.n_gen)
    }
}

/// The tests, depth by depth in the order given. One prompt length and one decode length make
/// one test of both, as a single `niwaki bench` always has (zeros skip their half). Several
/// make a test of each, as llama-bench runs them: every prompt length alone, then every decode
/// length alone, zeros left out.
pub fn tests(prompts: &[usize], gens: &[usize], depths: &[usize]) -> Vec<Test> {
    let mut out = Vec::new();
    for &depth in depths {
        if let ([n_prompt], [n_gen]) = (prompts, gens) {
            out.push(Test {
                depth,
                n_prompt: *n_prompt,
                n_gen: *n_gen,
            });
            continue;
        }
        let pp = prompts.iter().filter(|&&p| p > 0).map(|&n_prompt| Test {
            depth,
            n_prompt,
            n_gen: 0,
        });
        let tg = gens.iter().filter(|&&n| n > 0).map(|&n_gen| Test {
            depth,
            n_prompt: 0,
            n_gen,
        });
        out.extend(pp.chain(tg));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(depth: usize, n_prompt: usize, n_gen: usize) -> Test {
        Test {
            depth,
            n_prompt,
            n_gen,
        }
    }

    #[test]
    fn one_value_each_is_one_test_of_prefill_and_decode_at_each_depth() {
        assert_eq!(tests(&[512], &[128], &[0]), vec![t(0, 512, 128)]);
        assert_eq!(
            tests(&[0], &[64], &[0, 4096]),
            vec![t(0, 0, 64), t(4096, 0, 64)]
        );
    }

    #[test]
    fn several_values_are_each_a_test_of_its_own_zeros_left_out() {
        assert_eq!(
            tests(&[1, 0, 16], &[128], &[0]),
            vec![t(0, 1, 0), t(0, 16, 0), t(0, 0, 128)]
        );
        assert_eq!(
            tests(&[512], &[0, 32, 64], &[8, 0]),
            vec![
                t(8, 512, 0),
                t(8, 0, 32),
                t(8, 0, 64),
                t(0, 512, 0),
                t(0, 0, 32),
                t(0, 0, 64)
            ]
        );
        assert_eq!(t(0, 16, 128).room(), 128);
    }
}
