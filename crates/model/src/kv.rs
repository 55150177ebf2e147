//! The KV cache of an attention layer: every position's keys and values so far, in f32 (exact:
//! the reference) or f16 (half the memory, and half the bytes a decode step reads at depth).

use std::ops::Range;

use half::f16;

/// How a KV cache holds its values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvFormat {
    /// Exactly as the projections make them.
    #[default]
    F32,
    /// Rounded to the nearest f16; finite values past its range held at its largest (±65504)
    /// rather than turned into infinities, whose scores would be NaN. (The GPU's f16 cache
    /// rounds with the device's conversion, which overflows to infinity.)
    F16,
}

impl KvFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            KvFormat::F32 => "f32",
            KvFormat::F16 => "f16",
        }
    }

    /// Bytes a cached value takes.
    pub fn bytes(self) -> usize {
        match self {
            KvFormat::F32 => 4,
            KvFormat::F16 => 2,
        }
    }
}

/// Every kv head's rows of `head_dim` values, position after position.
#[derive(Clone, Debug, PartialEq)]
enum Heads {
    F32(Vec<Vec<f32>>),
    F16(Vec<Vec<f16>>),
}

/// Keys and values of every position so far: for each kv head its rows of `head_dim` values,
/// position after position (row `p` of head `h` at `p · head_dim`). A decode step's attention
/// reads one kv head's rows from first to last; with each position's heads side by side
/// instead, a 27B head's rows lay 4 KiB apart, each on a page of its own.
#[derive(Clone, Debug, PartialEq)]
pub struct KvCache {
    head_dim: usize,
    k: Heads,
    v: Heads,
}

/// One kv head's cached keys or values, as attention reads them.
#[derive(Clone, Copy, Debug)]
pub enum HeadRows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl<'a> HeadRows<'a> {
    /// Values `r` in f32: the cache's own where it holds f32, else converted into `buf` (at
    /// least `r.len()` long). Either way the same values, so the same arithmetic follows.
    #[inline]
    pub fn read<'b>(self, r: Range<usize>, buf: &'b mut [f32]) -> &'b [f32]
    where
        'a: 'b,
    {
        match self {
            HeadRows::F32(x) => &x[r],
            HeadRows::F16(x) => {
                let out = &mut buf[..r.len()];
                crate::ops::f16_to_f32(&x[r], out);
                out
            }
        }
    }

    /// Asks for the cache lines of values `r` (a hint).
    #[inline]
    pub fn prefetch(self, r: Range<usize>) {
        match self {
            HeadRows::F32(x) => crate::ops::prefetch(&x[r]),
            HeadRows::F16(x) => crate::ops::prefetch(&x[r]),
        }
    }
}

/// Fewest values a head's KV rows grow by: short caches then grow every few tokens, not every
/// one.
pub(crate) const KV_GROW_MIN: usize = 4096;

/// Appends the rows of every head `h` (`new` holds positions of `heads.len() · hd` values,
/// head after head) to `heads[h]`, converted by `conv`. A full head's rows grow by an eighth of
/// what they hold (or by what is appended, or by [`KV_GROW_MIN`] values, whichever is most)
/// instead of doubling: a doubling `Vec` could hold nearly twice the memory a long context
/// needs (a 27B model's 262,144 positions are 34 GB in f32).
fn append_rows<T: Copy>(heads: &mut [Vec<T>], new: &[f32], hd: usize, conv: impl Fn(f32) -> T) {
    let row = heads.len() * hd;
    let add = new.len() / row * hd;
    for (h, rows) in heads.iter_mut().enumerate() {
        if rows.capacity() - rows.len() < add {
            rows.reserve_exact(add.max(rows.len() / 8).max(KV_GROW_MIN));
        }
        for pos in new.chunks_exact(row) {
            rows.extend(pos[h * hd..(h + 1) * hd].iter().map(|&x| conv(x)));
        }
    }
}

/// Adds `values` zeros to every head's rows, with room for `room` more.
fn seek_rows<T: Copy + Default>(heads: &mut [Vec<T>], values: usize, room: usize) {
    for r in heads {
        r.reserve_exact(values + room);
        r.resize(r.len() + values, T::default());
    }
}

/// `x` as the f16 cache holds it: finite values past the f16 range at ±65504 (NaN stays NaN).
fn to_f16(x: f32) -> f16 {
    f16::from_f32(if x.is_finite() {
        x.clamp(-65504.0, 65504.0)
    } else {
        x
    })
}

impl Heads {
    fn new(format: KvFormat, n: usize) -> Heads {
        match format {
            KvFormat::F32 => Heads::F32(vec![Vec::new(); n]),
            KvFormat::F16 => Heads::F16(vec![Vec::new(); n]),
        }
    }

    fn len(&self) -> usize {
        match self {
            Heads::F32(h) => h.len(),
            Heads::F16(h) => h.len(),
        }
    }

    fn head(&self, h: usize) -> HeadRows<'_> {
        match self {
            Heads::F32(x) => HeadRows::F32(&x[h]),
            Heads::F16(x) => HeadRows::F16(&x[h]),
        }
    }

    /// Values held (every head), and the values there is room for.
    fn values(&self) -> (usize, usize) {
        let sum = |lens: &mut dyn Iterator<Item = (usize, usize)>| {
            lens.fold((0, 0), |(a, b), (l, c)| (a + l, b + c))
        };
        match self {
            Heads::F32(x) => sum(&mut x.iter().map(|r| (r.len(), r.capacity()))),
            Heads::F16(x) => sum(&mut x.iter().map(|r| (r.len(), r.capacity()))),
        }
    }

    fn append(&mut self, new: &[f32], hd: usize) {
        match self {
            Heads::F32(x) => append_rows(x, new, hd, |v| v),
            Heads::F16(x) => append_rows(x, new, hd, to_f16),
        }
    }

    fn seek(&mut self, values: usize, room: usize) {
        match self {
            Heads::F32(x) => seek_rows(x, values, room),
            Heads::F16(x) => seek_rows(x, values, room),
        }
    }
}

impl KvCache {
    pub fn new(n_head_kv: usize, head_dim: usize) -> KvCache {
        Self::with_format(n_head_kv, head_dim, KvFormat::F32)
    }

    pub fn with_format(n_head_kv: usize, head_dim: usize, format: KvFormat) -> KvCache {
        KvCache {
            head_dim,
            k: Heads::new(format, n_head_kv),
            v: Heads::new(format, n_head_kv),
        }
    }

    pub fn format(&self) -> KvFormat {
        match self.k {
            Heads::F32(_) => KvFormat::F32,
            Heads::F16(_) => KvFormat::F16,
        }
    }

    pub fn n_head_kv(&self) -> usize {
        self.k.len()
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Positions cached.
    pub fn positions(&self) -> usize {
        let per = self.n_head_kv() * self.head_dim;
        self.k.values().0.checked_div(per).unwrap_or(0)
    }

    /// Head `h`'s keys.
    pub fn k(&self, h: usize) -> HeadRows<'_> {
        self.k.head(h)
    }

    /// Head `h`'s values.
    pub fn v(&self, h: usize) -> HeadRows<'_> {
        self.v.head(h)
    }

    /// Bytes of the cached keys and values.
    pub fn bytes(&self) -> usize {
        self.format().bytes() * (self.k.values().0 + self.v.values().0)
    }

    /// Appends positions' keys and values, `[position][kv head][head_dim]` as the projections
    /// make them.
    pub fn append(&mut self, k: &[f32], v: &[f32]) {
        let row = self.n_head_kv() * self.head_dim;
        assert!(
            row > 0 && k.len().is_multiple_of(row) && v.len() == k.len(),
            "KV rows of {} values expected, got {} keys and {} values",
            row,
            k.len(),
            v.len()
        );
        self.k.append(k, self.head_dim);
        self.v.append(v, self.head_dim);
    }

    /// Adds `positions` positions of zeros, with room for `room` more.
    pub(crate) fn seek(&mut self, positions: usize, room: usize) {
        let hd = self.head_dim;
        self.k.seek(positions * hd, room * hd);
        self.v.seek(positions * hd, room * hd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Head `h`'s row `p` of `rows`, in f32.
    fn row(rows: HeadRows<'_>, p: usize, hd: usize) -> Vec<f32> {
        let mut buf = vec![0f32; hd];
        rows.read(p * hd..(p + 1) * hd, &mut buf).to_vec()
    }

    #[test]
    fn a_growing_kv_cache_keeps_each_heads_rows_in_order_with_at_most_an_eighth_more_room() {
        let (heads, hd) = (4, 256);
        let row_len = heads * hd;
        for format in [KvFormat::F32, KvFormat::F16] {
            let mut kv = KvCache::with_format(heads, hd, format);
            let (mut k_all, mut v_all) = (Vec::new(), Vec::new());
            for pos in 0..3000usize {
                // Mostly single positions, now and then a prompt chunk; values exact in f16.
                let n = if pos % 500 == 0 { 37 } else { 1 };
                let k: Vec<f32> = (0..n * row_len)
                    .map(|i| ((pos * 7 + i) % 2000) as f32)
                    .collect();
                let v: Vec<f32> = k.iter().map(|x| -x).collect();
                kv.append(&k, &v);
                k_all.extend_from_slice(&k);
                v_all.extend_from_slice(&v);
                let (len, cap) = kv.k.values();
                let bound = len + heads * (len / heads / 8).max(n * hd).max(KV_GROW_MIN);
                assert!(cap <= bound, "{format:?}: {cap} > {bound}");
            }
            let positions = k_all.len() / row_len;
            assert_eq!(kv.positions(), positions);
            assert_eq!(kv.bytes(), format.bytes() * 2 * k_all.len());
            for h in 0..heads {
                for p in [0, 1, 499, 500, 536, positions - 1] {
                    let at = p * row_len + h * hd;
                    assert_eq!(row(kv.k(h), p, hd), k_all[at..at + hd], "k {h} {p}");
                    assert_eq!(row(kv.v(h), p, hd), v_all[at..at + hd], "v {h} {p}");
                }
            }
        }
    }

    #[test]
    fn the_f16_cache_rounds_to_nearest_and_holds_the_largest_finite_value_past_its_range() {
        let mut kv = KvCache::with_format(1, 8, KvFormat::F16);
        // 65520 is the first value f16 rounding takes to infinity.
        let k = [
            1.0 / 3.0,
            -1e6,
            1e6,
            65520.0,
            f32::INFINITY,
            1e-8,
            -2.5,
            0.1,
        ];
        kv.append(&k, &k);
        let got = row(kv.k(0), 0, 8);
        assert_eq!(half::f16::from_f32(65520.0).to_f32(), f32::INFINITY);
        assert_eq!(&got[1..5], &[-65504.0, 65504.0, 65504.0, f32::INFINITY]);
        // Within range: the nearest f16.
        for i in [0, 5, 6, 7] {
            assert_eq!(got[i], half::f16::from_f32(k[i]).to_f32(), "value {i}");
        }
        assert!((got[0] - 1.0 / 3.0).abs() < 1e-3 && got[0] != 1.0 / 3.0);
        assert_eq!(kv.bytes(), 2 * 2 * 8);
    }

    #[test]
    #[should_panic(expected = "KV rows of 1024 values")]
    fn a_kv_cache_refuses_rows_of_another_width() {
        KvCache::new(4, 256).append(&[0.0; 1000], &[0.0; 1000]);
    }
}
