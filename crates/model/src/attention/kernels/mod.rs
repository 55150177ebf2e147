//! Attention's two inner loops over one kv head's cache, for the query heads of its group:
//! [`Kernels::scores`] (each query head against the key tiles) and [`Kernels::values`] (the
//! softmax weights times the cached values). The plain forms here define the arithmetic — one
//! fused multiply-add per term, in order of the head's values (a score) or of positions (an
//! output value), from zero — and the SIMD forms do exactly that, 16 positions or values a
//! vector: the same bits on every CPU, whatever the thread count or the split of a pass.

use std::ops::Range;

use crate::kv::{HeadRows, Layout, KEY_TILE, VALUE_CHUNK};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "aarch64")]
mod neon;
mod softmax;

/// Runs `$f::<G>(args)` for the number of heads `$g` (1 to 8) as a constant, so that a
/// kernel's sums live in registers.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
macro_rules! by_heads {
    ($g:expr, $m:ident :: $f:ident, ($($a:expr),* $(,)?)) => {
        match $g {
            1 => $m::$f::<1>($($a),*),
            2 => $m::$f::<2>($($a),*),
            3 => $m::$f::<3>($($a),*),
            4 => $m::$f::<4>($($a),*),
            5 => $m::$f::<5>($($a),*),
            6 => $m::$f::<6>($($a),*),
            7 => $m::$f::<7>($($a),*),
            8 => $m::$f::<8>($($a),*),
            g => unreachable!("{g} heads in one kernel call"),
        }
    };
}

/// Key tiles ahead of those being scored whose lines the SIMD kernels ask for: the hardware's
/// prefetch alone left the score kernels at about half of a thread's read bandwidth from
/// memory at 16k positions.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const AHEAD: usize = 4;

/// Asks for the cache lines of `n` values from `p` (a hint: nothing is read, nothing faults,
/// wherever `p` points).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch<T>(p: *const T, n: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    for off in (0..n * size_of::<T>()).step_by(64) {
        // SAFETY: a prefetch neither reads nor faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>().wrapping_add(off)) };
    }
}

/// As the x86 `prefetch`, by `prfm` (its intrinsic is not stable).
#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn prefetch<T>(p: *const T, n: usize) {
    for off in (0..n * size_of::<T>()).step_by(64) {
        // SAFETY: a prefetch neither reads nor faults.
        unsafe {
            std::arch::asm!(
                "prfm pldl1keep, [{0}]",
                in(reg) p.cast::<u8>().wrapping_add(off),
                options(nostack, preserves_flags, readonly)
            )
        };
    }
}

/// The SIMD form this CPU runs, if any, and how many query heads it takes a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Simd {
    Avx512,
    Avx2,
    Neon,
}

impl Simd {
    /// The fastest form this CPU has.
    fn detect() -> Option<Simd> {
        [Simd::Avx512, Simd::Avx2, Simd::Neon]
            .into_iter()
            .find(|s| s.supported())
    }

    /// Whether this CPU has the features the form needs.
    fn supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        return match self {
            Simd::Avx512 => {
                quant::simd::allows(quant::Simd::Avx512) && std::is_x86_feature_detected!("avx512f")
            }
            Simd::Avx2 => quant::simd::avx2(),
            Simd::Neon => false,
        };
        // NEON is part of AArch64: only the cap can leave it out.
        #[cfg(target_arch = "aarch64")]
        return self == Simd::Neon && quant::simd::allows(quant::Simd::Neon);
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        false
    }

    /// Query heads a call keeps in registers (32 vector registers, or 16); a group of more
    /// runs in parts, each head's arithmetic being its own.
    fn heads(self) -> usize {
        match self {
            Simd::Avx512 => 8,
            Simd::Avx2 => 6,
            // Four registers a head of 32, beside four of keys or values.
            Simd::Neon => 6,
        }
    }
}

/// A score kernel's operands: the query heads `q` (rows of `hd` values), a kv head's `keys`
/// (laid out as [`Layout::Keys`] says), the key tiles to score and the scale.
#[derive(Clone, Debug)]
pub(crate) struct Scores<'a> {
    pub q: &'a [f32],
    pub hd: usize,
    pub keys: HeadRows<'a>,
    pub tiles: Range<usize>,
    pub scale: f32,
}

/// An output kernel's operands: the softmax weights `wts` (a row per query head, `wstride`
/// apart, indexed by position), a kv head's values (`rows`, `hd` a position, laid out as
/// [`Layout::Values`] says), the head's values `d` to take (whole chunks) and the positions.
#[derive(Clone, Debug)]
pub(crate) struct Values<'a> {
    pub wts: &'a [f32],
    pub wstride: usize,
    pub rows: HeadRows<'a>,
    pub hd: usize,
    pub d: Range<usize>,
    pub pos: Range<usize>,
}

/// Which form of the kernels runs: the fastest this CPU has, or the plain one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Kernels {
    simd: Option<Simd>,
}

impl Kernels {
    /// The plain form: the definition the SIMD forms are tested against.
    #[cfg(test)]
    const PLAIN: Kernels = Kernels { simd: None };

    /// The fastest form this CPU has.
    pub(crate) fn detect() -> Kernels {
        Kernels {
            simd: Simd::detect(),
        }
    }

    /// `out[g · stride + i]`, for the `i`-th position from the first tile's first, is
    /// `scale · Σ_d q[g][d] · k[d]`, the sum one fused multiply-add per `d` from 0 up. Every
    /// position of a tile is scored, the last tile's unused ones (zeros) too.
    pub(crate) fn scores(self, s: &Scores<'_>, out: &mut [f32], stride: usize) {
        let (hd, n) = (s.hd, s.tiles.len() * KEY_TILE);
        let heads = s.q.len() / hd.max(1);
        assert!(
            hd > 0 && s.q.len() == heads * hd,
            "scores: queries of {hd} values"
        );
        let keys = Layout::Keys.len(s.tiles.end * KEY_TILE, hd);
        assert!(s.keys.len() >= keys, "scores: keys short");
        assert!(
            stride >= n && out.len() >= heads.saturating_sub(1) * stride + n,
            "scores: output short"
        );
        match self.simd {
            #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
            Some(simd) => {
                let m = simd.heads();
                for (c, q) in s.q.chunks(m * hd).enumerate() {
                    let part = Scores { q, ..s.clone() };
                    let out = &mut out[c * m * stride..];
                    // SAFETY: the CPU has the features `simd` names (detected), and the
                    // bounds the kernels rely on were asserted above.
                    unsafe {
                        match simd {
                            #[cfg(target_arch = "x86_64")]
                            Simd::Avx512 => {
                                by_heads!(q.len() / hd, avx512::scores, (&part, out, stride))
                            }
                            #[cfg(target_arch = "x86_64")]
                            Simd::Avx2 => {
                                by_heads!(q.len() / hd, avx2::scores, (&part, out, stride))
                            }
                            #[cfg(target_arch = "aarch64")]
                            Simd::Neon => {
                                by_heads!(q.len() / hd, neon::scores, (&part, out, stride))
                            }
                            #[allow(unreachable_patterns)] // no other form is detected here
                            _ => unreachable!("{simd:?} on this architecture"),
                        }
                    }
                }
            }
            _ => scores_plain(s, out, stride),
        }
    }

    /// Adds the weighted values to `acc` (`[heads][d.len()]`): `acc[g][j] += Σ_p
    /// wts[g · wstride + p] · v[p][d.start + j]`, one fused multiply-add per position in
    /// order.
    pub(crate) fn values(self, v: &Values<'_>, acc: &mut [f32]) {
        let (hd, d, w) = (v.hd, v.d.clone(), v.d.len());
        let heads = acc.len().checked_div(w).unwrap_or(0);
        if heads == 0 {
            return;
        }
        assert!(
            acc.len() == heads * w && d.end <= hd,
            "values: a slice of the head"
        );
        assert!(
            d.start.is_multiple_of(VALUE_CHUNK)
                && (d.end == hd || d.end.is_multiple_of(VALUE_CHUNK)),
            "values: whole chunks"
        );
        let end = v.pos.end;
        assert!(
            v.rows.len() >= Layout::Values.len(end, hd),
            "values: rows short"
        );
        assert!(
            v.wstride >= end && v.wts.len() >= (heads - 1) * v.wstride + end,
            "values: weights short"
        );
        // The kernels take chunks of VALUE_CHUNK values; a head's narrower last one goes the
        // plain way.
        let whole = (hd / VALUE_CHUNK * VALUE_CHUNK)
            .saturating_sub(d.start)
            .min(w);
        let mut done = 0;
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        if let Some(simd) = self.simd.filter(|_| whole > 0) {
            let m = simd.heads();
            done = whole;
            for (c, acc) in acc.chunks_mut(m * w).enumerate() {
                let part = Values {
                    wts: &v.wts[c * m * v.wstride..],
                    d: d.start..d.start + whole,
                    ..v.clone()
                };
                // SAFETY: the CPU has the features `simd` names (detected), and the bounds the
                // kernels rely on were asserted above.
                unsafe {
                    match simd {
                        #[cfg(target_arch = "x86_64")]
                        Simd::Avx512 => by_heads!(acc.len() / w, avx512::values, (&part, acc, w)),
                        #[cfg(target_arch = "x86_64")]
                        Simd::Avx2 => by_heads!(acc.len() / w, avx2::values, (&part, acc, w)),
                        #[cfg(target_arch = "aarch64")]
                        Simd::Neon => by_heads!(acc.len() / w, neon::values, (&part, acc, w)),
                        #[allow(unreachable_patterns)] // no other form is detected here
                        _ => unreachable!("{simd:?} on this architecture"),
                    }
                }
            }
        }
        values_plain(v, done..w, acc);
    }

    /// A score row's softmax in place: `exp(s − max)` (the kernels' own `exp`, within a few
    /// ulp), summed in 16 lanes of positions added pairwise at the end, each then divided by
    /// the sum.
    pub(crate) fn softmax(self, row: &mut [f32]) {
        match self.simd {
            // SAFETY: the CPU has the features the form names (detected).
            #[cfg(target_arch = "x86_64")]
            Some(Simd::Avx512) => unsafe { softmax::avx512::softmax(row) },
            // SAFETY: as above (AVX2 with FMA and F16C).
            #[cfg(target_arch = "x86_64")]
            Some(Simd::Avx2) => unsafe { softmax::avx2::softmax(row) },
            // SAFETY: NEON is part of AArch64.
            #[cfg(target_arch = "aarch64")]
            Some(Simd::Neon) => unsafe { softmax::neon::softmax(row) },
            _ => softmax::softmax_plain(row),
        }
    }
}

/// [`Kernels::scores`], one term at a time.
fn scores_plain(s: &Scores<'_>, out: &mut [f32], stride: usize) {
    let hd = s.hd;
    let mut buf = vec![0f32; KEY_TILE * hd];
    for (i, t) in s.tiles.clone().enumerate() {
        let k = s
            .keys
            .read(t * KEY_TILE * hd..(t + 1) * KEY_TILE * hd, &mut buf);
        for (g, qg) in s.q.chunks_exact(hd).enumerate() {
            for lane in 0..KEY_TILE {
                let dot = qg
                    .iter()
                    .enumerate()
                    .fold(0f32, |acc, (d, &x)| x.mul_add(k[d * KEY_TILE + lane], acc));
                out[g * stride + i * KEY_TILE + lane] = dot * s.scale;
            }
        }
    }
}

/// [`Kernels::values`] for the columns `cols` of `v.d` only, one term at a time.
fn values_plain(v: &Values<'_>, cols: Range<usize>, acc: &mut [f32]) {
    let w = v.d.len();
    for p in v.pos.clone() {
        for (g, a) in acc.chunks_exact_mut(w).enumerate() {
            let x = v.wts[g * v.wstride + p];
            for j in cols.clone() {
                let y = v.rows.get(Layout::Values.index(v.hd, p, v.d.start + j));
                a[j] = x.mul_add(y, a[j]);
            }
        }
    }
}

#[cfg(test)]
mod tests;
