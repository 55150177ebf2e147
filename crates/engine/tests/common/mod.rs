//! What the generation-loop tests share: the tiny oracle model, and the CPU model as a device
//! that picks greedy tokens and selects sampling's candidates itself, counting each kind of call.

// Each test binary that includes this module uses part of it.
#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::path::PathBuf;

use engine::{Backend, Ranked, RankedRequest};
use model::{Logits, Model, State};
use tokenizer::Tokenizer;

pub fn tiny() -> (Model, Tokenizer) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/oracle/tiny-exact-q1.Q1_0.gguf");
    let model = Model::open(path).unwrap();
    let spec = tokenizer::spec_from_metadata(model.file().metadata()).unwrap();
    (model, Tokenizer::new(&spec).unwrap())
}

/// The CPU model as a selecting device: `forward` calls (a row of logits back), argmax picks,
/// top-k selections, and rows fetched after a selection.
pub struct Counting<'a> {
    pub m: &'a Model,
    pub rows: Cell<usize>,
    pub picked: Cell<usize>,
    pub ranked: Cell<usize>,
    pub last_rows: Cell<usize>,
    last: RefCell<Vec<f32>>,
}

impl<'a> Counting<'a> {
    pub fn new(m: &'a Model) -> Self {
        Counting {
            m,
            rows: Cell::new(0),
            picked: Cell::new(0),
            ranked: Cell::new(0),
            last_rows: Cell::new(0),
            last: RefCell::new(Vec::new()),
        }
    }
}

fn bump(c: &Cell<usize>) {
    c.set(c.get() + 1);
}

impl Backend for Counting<'_> {
    type State = State;
    type Checkpoint = ();
    fn state_len(&self, s: &State) -> usize {
        s.len()
    }
    fn context_length(&self, s: &State) -> usize {
        self.m.context_length(s)
    }
    fn forward(&self, s: &mut State, t: &[u32], l: Logits) -> engine::Result<Vec<f32>> {
        bump(&self.rows);
        Backend::forward(self.m, s, t, l)
    }
    fn forward_argmax(&self, s: &mut State, t: &[u32]) -> engine::Result<u32> {
        bump(&self.picked);
        self.m.forward_argmax(s, t)
    }
    fn forward_top_k(
        &self,
        s: &mut State,
        t: &[u32],
        request: RankedRequest,
    ) -> engine::Result<Ranked> {
        bump(&self.ranked);
        let row = Backend::forward(self.m, s, t, Logits::Last)?;
        let got = request.answer(&row);
        *self.last.borrow_mut() = row;
        Ok(got)
    }
    fn last_row(&self, _: &mut State) -> engine::Result<Vec<f32>> {
        bump(&self.last_rows);
        Ok(self.last.borrow().clone())
    }
}
