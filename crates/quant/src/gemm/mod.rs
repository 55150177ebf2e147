//! Row × token products of packed weights with quantized activations: the kernels a model's
//! matrix multiplies run on.
//!
//! [`gemm_rows`] computes `out[(r − rows.start)·T + t] = row r · act t` for a range of rows and a
//! chunk of `T` tokens. The model owns threading: it splits the rows of a matrix between its
//! threads and calls this once per share. Each weight row is read from memory once per call,
//! whatever `T` is (extra tokens re-read it from L1).
//!
//! # The arithmetic
//! Block formats dot against [`QuantizedActs`] (int8 codes in 32-value blocks with f32 scales).
//! For each weight block and each activation block inside it the kernels form the exact integer
//! sum `S = Σ w_int·q` (`w_int` is the weight's code: ±1 for Q1_0, code − 1 for the 2-bit formats,
//! trit − 1 for PTQ1_0, the int8 for Q8_0, the nibble for Q4_1), then combine in f32:
//! `row · act = Σ_blocks d_w · Σ_act-blocks d_a·S` (Q4_1 adds `m · d_a · Σq` per block).
//! Q1_0 splits `S = 2·Σ_{bit set} q − Σq`: per block, `2·Σ_{bit set} q` scaled by `d_a` group
//! by group, then the block's `Σ_g (−Σq_g)·d_g` ([`QuantizedActs`] keeps it per 128-value span)
//! added once, so its fastest kernels spend one float step per group instead of two.
//! The scalar twin ([`gemm_rows_scalar`]) does exactly this in block order; the SIMD kernels form
//! the same integer sums four values per 32-bit lane and add the lane terms `d_w·d_a·S_lane` in a
//! different order. The integer parts are bit-identical, so with scales whose products are exact
//! (powers of two) every path returns the same f32; in general they agree within
//! `2·(blocks + 8)·ε·Σ|w·x|` (see `tests/gemm.rs`).
//!
//! All four 2-bit codes are handled, code 3 (+2·d) included, at no cost: the kernels multiply
//! unsigned codes and subtract the activation sum, so no ternary-only assumption is made and no
//! load-time [`count_code3`](crate::count_code3) check is needed for correctness.
//!
//! Float formats (F32, F16, BF16) dot their rows with the f32 values kept in [`QuantizedActs`]
//! (no activation rounding); SIMD and scalar differ only in summation order.

use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::{Format, QuantizedActs};

pub(crate) mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

/// An instruction set a kernel is compiled for, chosen at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust: the scalar twin itself.
    Scalar,
    /// AVX2 + FMA + F16C, integer dots with `vpmaddubsw`/`vpmaddwd`.
    Avx2,
    /// AVX2 with AVX-VNNI (`vpdpbusd` on 256-bit registers).
    Avx2Vnni,
    /// AVX-512 F/BW/VL/VNNI/VBMI on 512-bit registers.
    Avx512,
}

impl Isa {
    /// Every ISA this CPU can run, slowest first (always starts with [`Isa::Scalar`]).
    pub fn available() -> Vec<Isa> {
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut v = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if x86::has_avx2() {
                v.push(Isa::Avx2);
            }
            if x86::has_avx2_vnni() {
                v.push(Isa::Avx2Vnni);
            }
            if x86::has_avx512() {
                v.push(Isa::Avx512);
            }
        }
        v
    }

    /// The fastest available ISA, detected once and cached.
    pub fn best() -> Isa {
        static BEST: AtomicU8 = AtomicU8::new(u8::MAX);
        let code = BEST.load(Ordering::Relaxed);
        let all = [Isa::Scalar, Isa::Avx2, Isa::Avx2Vnni, Isa::Avx512];
        if let Some(&isa) = all.get(usize::from(code)) {
            return isa;
        }
        let isa = *Isa::available().last().unwrap_or(&Isa::Scalar);
        debug_assert!(isa.is_available());
        let idx = all.iter().position(|&i| i == isa).unwrap_or(0);
        BEST.store(idx as u8, Ordering::Relaxed);
        isa
    }

    pub const fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx2Vnni => "avx2-vnni",
            Isa::Avx512 => "avx512",
        }
    }

    fn is_available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        return x86::available(self);
        #[cfg(not(target_arch = "x86_64"))]
        return self == Isa::Scalar;
    }
}

/// Panics unless the shapes agree (a precondition: callers validate tensors at load).
fn check(
    format: Format,
    weights: &[u8],
    row_bytes: usize,
    rows: &Range<usize>,
    acts: &[QuantizedActs],
    out: &[f32],
) {
    assert!(rows.start <= rows.end, "gemm_rows: reversed row range");
    let need = rows.end.checked_mul(row_bytes);
    assert!(
        need.is_some_and(|n| n <= weights.len()),
        "gemm_rows: {} bytes do not hold rows up to {} of {row_bytes} bytes",
        weights.len(),
        rows.end
    );
    for a in acts {
        let expected = format.row_bytes(a.len());
        assert!(
            expected == Ok(row_bytes),
            "gemm_rows: {format} rows of {row_bytes} bytes do not hold {} values",
            a.len()
        );
    }
    assert_eq!(
        out.len(),
        rows.len() * acts.len(),
        "gemm_rows: output length is not rows × tokens"
    );
}

/// `out[(r − rows.start)·acts.len() + t] = (row r of weights) · acts[t]`, on the fastest ISA.
///
/// `weights` holds consecutive rows of `row_bytes` bytes each (a whole matrix, or any prefix that
/// covers `rows`); every activation vector has the row's value count.
///
/// # Panics
/// When the shapes disagree: `row_bytes` is not the byte size of `acts[t].len()` values of
/// `format`, `weights` is too short for `rows`, or `out.len() != rows.len()·acts.len()`.
pub fn gemm_rows(
    format: Format,
    weights: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[QuantizedActs],
    out: &mut [f32],
) {
    gemm_rows_with(Isa::best(), format, weights, row_bytes, rows, acts, out)
}

/// [`gemm_rows`] for one token: `out[r − rows.start] = row r · acts`.
pub fn gemv_rows(
    format: Format,
    weights: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &QuantizedActs,
    out: &mut [f32],
) {
    gemm_rows(
        format,
        weights,
        row_bytes,
        rows,
        std::slice::from_ref(acts),
        out,
    )
}

/// [`gemm_rows`] on a given ISA (for tests and benchmarks).
///
/// # Panics
/// As [`gemm_rows`], and when this CPU cannot run `isa`.
pub fn gemm_rows_with(
    isa: Isa,
    format: Format,
    weights: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[QuantizedActs],
    out: &mut [f32],
) {
    check(format, weights, row_bytes, &rows, acts, out);
    if rows.is_empty() || acts.is_empty() {
        return;
    }
    let weights = &weights[rows.start * row_bytes..rows.end * row_bytes];
    match isa {
        Isa::Scalar => scalar::gemm(format, weights, row_bytes, acts, out),
        #[cfg(target_arch = "x86_64")]
        _ => x86::gemm(isa, format, weights, row_bytes, acts, out),
        #[cfg(not(target_arch = "x86_64"))]
        _ => panic!("gemm_rows: {isa:?} is an x86-64 ISA"),
    }
}

/// The plain scalar twin of [`gemm_rows`]: the oracle the SIMD kernels are tested against (see
/// the module docs for the arithmetic it fixes).
///
/// # Panics
/// As [`gemm_rows`].
pub fn gemm_rows_scalar(
    format: Format,
    weights: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[QuantizedActs],
    out: &mut [f32],
) {
    gemm_rows_with(Isa::Scalar, format, weights, row_bytes, rows, acts, out)
}
