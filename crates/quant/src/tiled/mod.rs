//! Weights re-tiled at load for the AVX-512, AVX2 and NEON kernels: 16 rows interleaved per
//! panel, so one 32-bit lane of a 512-bit register (or of one of two 256-bit halves, or of four
//! 128-bit quarters) is one row.
//!
//! Why: with rows side by side, a `vpdpbusd` multiplies 4 values of 16 rows against the same 4
//! activation codes (a broadcast from memory), the int→float conversion and activation scale are
//! paid once per activation group and 16 rows instead of once per group and row, and no horizontal
//! sum is needed at the end of a row. The native-layout kernels (`gemm`) spend most of their
//! instructions on exactly those steps. See [`layout`](self::layout) for the bytes.
//!
//! # The arithmetic
//! Per row, block and activation group `g` (in order), the exact integer sum `S_g = Σ (c − 1)·q`,
//! then `blk = fma(S_g, d_g, blk)` from zero and `total = fma(blk, d_w, total)` per block: the
//! scalar twin of the native layout ([`gemm_rows_scalar`](crate::gemm_rows_scalar)) computes the
//! same steps in the same order, so every path — native twin, tiled twin, AVX-512 — returns the
//! same bits.

#[cfg(target_arch = "x86_64")]
mod avx2;
mod buffer;
mod layout;
#[cfg(target_arch = "aarch64")]
mod neon;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::ops::Range;

pub use layout::{Q1Bits, PANEL};

use crate::{Format, QuantError, QuantizedActs};

/// How PTQ1_0 (ternary, base-3) rows are held once tiled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Ternary {
    /// Five trits a byte, as in the file: the tiled copy is exactly as large as the file's
    /// rows; its chunks are decoded by table lookups (four vector operations per 64 weights).
    #[default]
    Packed,
    /// Widened to 2-bit codes in the legacy Q2_0 g128 layout (the same values and scales): 23%
    /// more bytes, decoded like the 2-bit formats (two operations per 64 weights). On a 2-core
    /// AVX-512 machine, a 27B PTQ1_0 file decoded at 2.2–2.6 tok/s instead of 2.0–2.1 and
    /// prefilled at 5.8–6.1 instead of 3.2–3.6, for 1.2 GB more resident memory.
    Wide,
}

impl Q1Bits {
    /// The order this CPU's kernels read fastest: spread where the AVX-512 kernels run, else
    /// nibbles (the AVX2 lookups read only those).
    ///
    /// On a 2-core Zen 4 (EPYC) the spread kernel multiplied 16.0–18.9 GB/s of L2-resident Q1_0
    /// weights with one thread against 12.7–13.7 for the masked moves, streamed 14.5–17.2
    /// against 11.6–13.2 from memory (`examples/gemv_bandwidth --tiled 1 --q1 …`), and decoded
    /// the 27B Q1_0 file at a median 4.67 tok/s against 4.44 over seven alternated runs each
    /// (3.8–5.3 all told: the machine's read bandwidth moved between 29 and 53 GB/s), prefill
    /// level (pp64 6.43–7.35 against 6.75–7.14). On a 2-core Xeon (AVX-512 VNNI, AMX) it
    /// multiplied 25.2 GB/s from L2 against 18.4, and with the block-wise scaling back and the
    /// four-panel passes the 27B file decoded at 5.77 / 5.88 tok/s against 5.59 / 5.60 and
    /// prefilled (pp32) at 12.1 / 12.5 against 11.1 / 11.3, alternated (the masked moves had
    /// been level in decode and 20% faster in prefill there before those two changes).
    ///
    /// The NEON kernels read spread words only (one `cmtst` a quarter of a chunk).
    pub fn preferred() -> Q1Bits {
        #[cfg(target_arch = "x86_64")]
        if x86::available() {
            return Q1Bits::Spread;
        }
        #[cfg(target_arch = "aarch64")]
        if neon::available() {
            return Q1Bits::Spread;
        }
        Q1Bits::Nibbles
    }
}

impl Ternary {
    /// How this CPU's kernels hold PTQ1_0 by default: packed where the kernels decode the
    /// base-3 bytes (AVX-512, NEON: the file's size in memory), widened where only the AVX2
    /// kernels run (they have no base-3 decode).
    pub fn preferred() -> Ternary {
        #[cfg(target_arch = "x86_64")]
        if !x86::available() && avx2::available() {
            return Ternary::Wide;
        }
        Ternary::Packed
    }
}

/// A weight matrix in the panel layout (see the module docs). Built from the native rows with
/// [`TiledMatrix::new`]; [`TiledMatrix::to_native`] gives them back.
#[derive(Clone, Debug)]
pub struct TiledMatrix {
    /// The rows' format (the file's).
    format: Format,
    /// The format whose panel layout holds them: `format`, or Q2_0 g128 for widened PTQ1_0.
    layout: Format,
    /// The bit order of Q1_0 chunk words (`Nibbles` for every other format).
    q1: Q1Bits,
    rows: usize,
    cols: usize,
    data: buffer::Buffer,
}

/// Raw pointers into one token's activation tables, as the SIMD tiled kernels read them.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[derive(Clone, Copy)]
struct Act {
    /// Codes as 32-bit chunks of 4 (not necessarily 4-byte aligned).
    q: *const i32,
    scale: *const f32,
    neg: *const i32,
    /// Per span, the 1-bit kernels' float term (`QuantizedActs::neg_span_terms`).
    span_neg: *const f32,
    /// Per group, the 2-bit quads' scale and start (`QuantizedActs::field_scales`).
    field_scale: *const f32,
    field_neg: *const i32,
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
impl Act {
    fn all(acts: &[QuantizedActs]) -> Vec<Act> {
        acts.iter()
            .map(|a| Act {
                q: a.codes().as_ptr() as *const i32,
                scale: a.scales().as_ptr(),
                neg: a.neg_group_sums().as_ptr(),
                span_neg: a.neg_span_terms().as_ptr(),
                field_scale: a.field_scales().as_ptr(),
                field_neg: a.field_neg_sums().as_ptr(),
            })
            .collect()
    }
}

/// Bytes ahead of the current panel block each panel of the SIMD kernels prefetches. 27B
/// files on 2 Zen 4 cores, decode steps alternated in one process against 4096: Q1_0 2048
/// 0.5-4.1% faster (three pairs), 3072 3.1%, 1024 0.8%, 8192 and 16384 8-10% slower; PTQ1_0
/// 2048 0.3-2.8% faster.
#[cfg(target_arch = "x86_64")]
const PREFETCH: usize = 2048;

/// Asks for the `bytes` that lie [`PREFETCH`] bytes past `block` (a panel block about to be
/// read), one cache line at a time.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_ahead(block: *const u8, bytes: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let next = block.wrapping_add(PREFETCH);
    for off in (0..bytes).step_by(64) {
        // SAFETY: a prefetch never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(off) as *const i8) };
    }
}

/// Writes lane `l` of a panel's results for the rows of panel `p` that lie in `rows`, token `t`
/// of `nt`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline(always)]
fn scatter(
    lanes: &[f32; PANEL],
    p: usize,
    t: usize,
    nt: usize,
    rows: &Range<usize>,
    out: &mut [f32],
) {
    for (l, &x) in lanes.iter().enumerate() {
        let r = p * PANEL + l;
        if rows.contains(&r) {
            out[(r - rows.start) * nt + t] = x;
        }
    }
}

/// The reasons a matrix cannot be tiled.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TileError {
    #[error("{0} has no tiled layout (Q1_0, Q2_0, Q2_0_g128, PQ2_0 and PTQ1_0 do)")]
    Unsupported(Format),
    #[error(transparent)]
    Shape(#[from] QuantError),
    #[error("allocating {0} bytes for the tiled copy: {1}")]
    Alloc(usize, String),
}

impl TiledMatrix {
    /// Whether `format` has a panel layout.
    pub const fn supports(format: Format) -> bool {
        layout::supports(format)
    }

    /// Whether this CPU runs the tiled kernels natively (AVX-512 with VNNI and VBMI, AVX2 with
    /// FMA and F16C, or NEON with the dot-product extension). On other CPUs [`gemm_tiled`] runs
    /// the scalar twin, so callers keep the native layout there.
    pub fn fast() -> bool {
        #[cfg(target_arch = "x86_64")]
        return x86::available() || avx2::available();
        #[cfg(target_arch = "aarch64")]
        return neon::available();
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        return false;
    }

    /// Re-tiles `rows` native rows of `cols` values each (PTQ1_0 packed).
    pub fn new(
        format: Format,
        native: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<TiledMatrix, TileError> {
        Self::with_ternary(format, native, rows, cols, Ternary::Packed)
    }

    /// Re-tiles `rows` native rows of `cols` values each, PTQ1_0 rows held as `ternary` says
    /// (other formats ignore it), Q1_0 chunk words in the order this CPU's kernels prefer.
    pub fn with_ternary(
        format: Format,
        native: &[u8],
        rows: usize,
        cols: usize,
        ternary: Ternary,
    ) -> Result<TiledMatrix, TileError> {
        Self::with_layout(format, native, rows, cols, ternary, Q1Bits::preferred())
    }

    /// [`TiledMatrix::with_ternary`] with Q1_0 chunk words in order `q1` (other formats ignore
    /// it): for testing and measuring each kernel on either order.
    #[doc(hidden)]
    pub fn with_layout(
        format: Format,
        native: &[u8],
        rows: usize,
        cols: usize,
        ternary: Ternary,
        q1: Q1Bits,
    ) -> Result<TiledMatrix, TileError> {
        if !Self::supports(format) {
            return Err(TileError::Unsupported(format));
        }
        let row_bytes = format.row_bytes(cols)?;
        let need = row_bytes
            .checked_mul(rows)
            .ok_or(QuantError::TooLarge { format, len: cols })?;
        if native.len() != need {
            return Err(QuantError::ByteLength {
                format,
                values: rows * cols,
                expected: need,
                got: native.len(),
            }
            .into());
        }
        let layout = match (format, ternary) {
            (Format::PTQ1_0, Ternary::Wide) => Format::Q2_0G128,
            _ => format,
        };
        let q1 = if format == Format::Q1_0 {
            q1
        } else {
            Q1Bits::Nibbles
        };
        debug_assert_eq!(layout.block_len(), format.block_len());
        let blocks = cols / format.block_len();
        let pbb = layout::panel_block_bytes(layout);
        let panels = rows.div_ceil(PANEL);
        let bytes = panels * blocks * pbb;
        let mut data =
            buffer::Buffer::zeroed(bytes).map_err(|e| TileError::Alloc(bytes, e.to_string()))?;
        let bb = format.block_bytes();
        let tile_panels = |first: usize, out: &mut [u8]| {
            for (k, panel) in out.chunks_exact_mut(blocks * pbb).enumerate() {
                let p = first + k;
                for (b, out) in panel.chunks_exact_mut(pbb).enumerate() {
                    let mut src = [None; PANEL];
                    for (l, s) in src.iter_mut().enumerate() {
                        let r = p * PANEL + l;
                        if r < rows {
                            let at = r * row_bytes + b * bb;
                            *s = Some(&native[at..at + bb]);
                        }
                    }
                    layout::tile_block(format, layout, q1, &src, out);
                }
            }
        };
        // Re-tiling a 27B model is seconds of work: spread the panels over the cores.
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let per = panels.div_ceil(threads).max(1);
        if blocks > 0 {
            std::thread::scope(|s| {
                for (i, part) in data.chunks_mut(per * blocks * pbb).enumerate() {
                    let tile_panels = &tile_panels;
                    s.spawn(move || tile_panels(i * per, part));
                }
            });
        }
        Ok(TiledMatrix {
            format,
            layout,
            q1,
            rows,
            cols,
            data,
        })
    }

    /// The native rows this was built from (PTQ1_0 bytes come back canonical).
    pub fn to_native(&self) -> Vec<u8> {
        let f = self.format;
        let (bb, blocks) = (f.block_bytes(), self.blocks());
        let mut out = vec![0u8; self.rows * blocks * bb];
        let mut codes = [0u8; 128];
        for r in 0..self.rows {
            for b in 0..blocks {
                let scale = self.row_codes(r, b, &mut codes);
                let at = (r * blocks + b) * bb;
                layout::native_block(f, &codes[..f.block_len()], scale, &mut out[at..at + bb]);
            }
        }
        out
    }

    /// Codes and scale bits of row `r`, block `b`.
    fn row_codes(&self, r: usize, b: usize, codes: &mut [u8; 128]) -> u16 {
        let pb = self.panel_block(r / PANEL, b);
        let l = r % PANEL;
        let mut half = [[0u8; layout::HALF]; PANEL];
        let hb = layout::half_bytes(self.layout);
        for h in 0..layout::halves(self.layout) {
            let at = layout::SCALES + h * hb;
            layout::decode_half(self.layout, self.q1, &pb[at..at + hb], &mut half);
            codes[layout::HALF * h..layout::HALF * (h + 1)].copy_from_slice(&half[l]);
        }
        u16::from_le_bytes([pb[2 * l], pb[2 * l + 1]])
    }

    fn panel_block(&self, p: usize, b: usize) -> &[u8] {
        let pbb = layout::panel_block_bytes(self.layout);
        let at = (p * self.blocks() + b) * pbb;
        &self.data[at..at + pbb]
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// How PTQ1_0 rows are held (`Packed` for every other format).
    pub fn ternary(&self) -> Ternary {
        if self.layout == self.format {
            Ternary::Packed
        } else {
            Ternary::Wide
        }
    }

    /// The bit order of Q1_0 chunk words (`Nibbles` for every other format).
    pub fn q1_bits(&self) -> Q1Bits {
        self.q1
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Panels (groups of [`PANEL`] rows, the last possibly partial).
    pub fn panels(&self) -> usize {
        self.rows.div_ceil(PANEL)
    }

    /// Heap bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    fn blocks(&self) -> usize {
        self.cols / self.format.block_len()
    }

    /// Rows of `panels` that exist (the last panel may be partial).
    fn row_range(&self, panels: &Range<usize>) -> Range<usize> {
        (panels.start * PANEL).min(self.rows)..(panels.end * PANEL).min(self.rows)
    }

    /// Panics unless the shapes agree.
    fn check(&self, panels: &Range<usize>, acts: &[QuantizedActs], out: &[f32]) {
        assert!(
            panels.start <= panels.end && panels.end <= self.panels(),
            "gemm_tiled: panels {panels:?} of {}",
            self.panels()
        );
        for a in acts {
            assert_eq!(a.len(), self.cols, "gemm_tiled: activation length");
        }
        assert_eq!(
            out.len(),
            self.row_range(panels).len() * acts.len(),
            "gemm_tiled: output length is not rows × tokens"
        );
    }
}

/// `out[(r − r0)·T + t] = row r · acts[t]` for the rows `r0..` of `panels` (rows past the
/// matrix's end are not written), on AVX-512 where the CPU has it, else on AVX2 (packed PTQ1_0
/// aside), on AArch64 on NEON (nibble-ordered Q1_0 aside), else the scalar twin.
///
/// # Panics
/// When the panels are out of range, an activation vector's length is not the column count, or
/// `out.len()` is not rows × tokens.
pub fn gemm_tiled(m: &TiledMatrix, panels: Range<usize>, acts: &[QuantizedActs], out: &mut [f32]) {
    m.check(&panels, acts, out);
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        // SAFETY: `available` confirmed the CPU features; shapes were checked above.
        unsafe { x86::gemm(m, panels, acts, out) };
        return;
    }
    if gemm_tiled_avx2_checked(m, panels.clone(), acts, out) {
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if neon::available() && neon::takes(m.layout, m.q1) {
        // SAFETY: `available` confirmed the CPU features, `takes` the layout; shapes were
        // checked above.
        unsafe { neon::gemm(m, panels, acts, out) };
        return;
    }
    scalar::gemm(m, panels, acts, out)
}

/// [`gemm_tiled`] on the AVX2 kernels whatever else the CPU has (for their tests on AVX-512
/// machines); `false`, with nothing written, where the CPU lacks AVX2 or the kernels do not
/// take the matrix's layout (packed PTQ1_0, spread Q1_0).
///
/// # Panics
/// As [`gemm_tiled`].
#[doc(hidden)]
pub fn gemm_tiled_avx2(
    m: &TiledMatrix,
    panels: Range<usize>,
    acts: &[QuantizedActs],
    out: &mut [f32],
) -> bool {
    m.check(&panels, acts, out);
    gemm_tiled_avx2_checked(m, panels, acts, out)
}

fn gemm_tiled_avx2_checked(
    m: &TiledMatrix,
    panels: Range<usize>,
    acts: &[QuantizedActs],
    out: &mut [f32],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if avx2::available() && avx2::takes(m.layout, m.q1) {
        // SAFETY: `available` confirmed the CPU features, `takes` the layout; the caller
        // checked the shapes.
        unsafe { avx2::gemm(m, panels, acts, out) };
        return true;
    }
    let _ = (m, panels, acts, out);
    false
}

/// The scalar twin of [`gemm_tiled`] (the oracle its kernels are tested against).
///
/// # Panics
/// As [`gemm_tiled`].
pub fn gemm_tiled_scalar(
    m: &TiledMatrix,
    panels: Range<usize>,
    acts: &[QuantizedActs],
    out: &mut [f32],
) {
    m.check(&panels, acts, out);
    scalar::gemm(m, panels, acts, out)
}
