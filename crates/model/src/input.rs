//! An activation `[tokens][width]` that one or more matrices read. It hands each matrix the form
//! it needs — rotated or not (Hadamard-folded matrices), f32 or int8-quantized (the kernels) —
//! computing each form at most once, so matrices sharing an input share the work.

use std::cell::OnceCell;

use quant::QuantizedActs;

use crate::hadamard::Hadamard;
use crate::weights::Matrix;

/// Which dot kernels the matrices use.
///
/// A model starts on `Exact`, the reference path. `Int8` is the fast path applications choose
/// (the CLI's default): over the 2048-position oracle sequence it is closer to the exact answer
/// than llama.cpp on the same files in both mean KL and top-1 agreement (`engine`'s oracle
/// tests assert it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kernels {
    /// Packed weights against f32 activations: exact for lossless files.
    #[default]
    Exact,
    /// Activations quantized to int8 in groups of 16 with f32 scales, SIMD integer dot
    /// products: the fast path.
    Int8,
}

impl Kernels {
    pub fn parse(s: &str) -> Option<Kernels> {
        match s {
            "int8" => Some(Kernels::Int8),
            "exact" => Some(Kernels::Exact),
            _ => None,
        }
    }
}

/// What every matmul of one forward pass shares.
#[derive(Clone, Copy)]
pub struct Ctx<'a> {
    pub hadamard: Option<&'a Hadamard>,
    pub kernels: Kernels,
}

pub struct Input<'a> {
    raw: &'a [f32],
    tokens: usize,
    ctx: Ctx<'a>,
    /// The input of ssm_out: permuted to grouped head order first when the file says so.
    gdn_values: bool,
    rotated: OnceCell<Vec<f32>>,
    quantized: OnceCell<Vec<QuantizedActs>>,
    quantized_rotated: OnceCell<Vec<QuantizedActs>>,
}

impl<'a> Input<'a> {
    pub fn new(raw: &'a [f32], tokens: usize, ctx: Ctx<'a>) -> Self {
        Input {
            raw,
            tokens,
            ctx,
            gdn_values: false,
            rotated: OnceCell::new(),
            quantized: OnceCell::new(),
            quantized_rotated: OnceCell::new(),
        }
    }

    pub fn gdn_values(raw: &'a [f32], tokens: usize, ctx: Ctx<'a>) -> Self {
        Input {
            gdn_values: true,
            ..Input::new(raw, tokens, ctx)
        }
    }

    pub fn tokens(&self) -> usize {
        self.tokens
    }

    pub fn kernels(&self) -> Kernels {
        self.ctx.kernels
    }

    fn rotates(&self, m: &Matrix) -> Option<&'a Hadamard> {
        self.ctx.hadamard.filter(|hd| hd.is_folded(m))
    }

    /// The f32 activation `m` reads.
    pub fn f32_for(&self, m: &Matrix) -> &[f32] {
        match self.rotates(m) {
            Some(hd) => self.rotated.get_or_init(|| {
                let width = self.raw.len() / self.tokens;
                let mut out = Vec::with_capacity(self.raw.len());
                for x in self.raw.chunks(width) {
                    let mut v = if self.gdn_values && hd.gdn_v_grouped {
                        hd.tiled_to_grouped(x)
                    } else {
                        x.to_vec()
                    };
                    hd.rotate(&mut v);
                    out.extend_from_slice(&v);
                }
                out
            }),
            None => self.raw,
        }
    }

    /// The quantized activation `m` reads, one per token.
    pub fn acts_for(&self, m: &Matrix) -> &[QuantizedActs] {
        let cell = if self.rotates(m).is_some() {
            &self.quantized_rotated
        } else {
            &self.quantized
        };
        cell.get_or_init(|| {
            let x = self.f32_for(m);
            let width = x.len() / self.tokens;
            x.chunks(width).map(QuantizedActs::new).collect()
        })
    }
}
