//! How a prefill cuts a prompt into passes.

use engine::Backend;
use model::Logits;

/// A device that records the length and the logits asked of each pass, and holds the tokens fed.
#[derive(Default)]
struct Passes(std::cell::RefCell<Vec<(usize, Logits)>>);

impl Backend for Passes {
    type State = usize;
    type Checkpoint = ();
    fn state_len(&self, s: &usize) -> usize {
        *s
    }
    fn context_length(&self, _: &usize) -> usize {
        1 << 20
    }
    fn forward(&self, s: &mut usize, t: &[u32], l: Logits) -> engine::Result<Vec<f32>> {
        self.0.borrow_mut().push((t.len(), l));
        *s += t.len();
        Ok(vec![0.0; 4])
    }
}

#[test]
fn a_prefill_shares_its_tokens_out_evenly_among_as_few_passes_as_its_chunk_allows() {
    let run = |n: usize, chunk: usize| {
        let b = Passes::default();
        let mut fed = 0;
        engine::prefill(&b, &mut fed, &vec![7; n], chunk).unwrap();
        assert_eq!(fed, n);
        b.0.into_inner()
    };
    // No short last pass: 270 tokens in chunks of 256 run as two of 135.
    assert_eq!(run(270, 256), [(135, Logits::None), (135, Logits::Last)]);
    assert_eq!(
        run(600, 256),
        [
            (200, Logits::None),
            (200, Logits::None),
            (200, Logits::Last)
        ]
    );
    assert_eq!(run(512, 256), [(256, Logits::None), (256, Logits::Last)]);
    assert_eq!(run(5, 256), [(5, Logits::Last)]);
    assert_eq!(
        run(5, 2),
        [(2, Logits::None), (2, Logits::None), (1, Logits::Last)]
    );
}
