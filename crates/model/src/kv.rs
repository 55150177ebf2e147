//! The KV cache of an attention layer: every position's keys and values so far, in f32 (exact:
//! the reference) or f16 (half the memory, and half the bytes a decode step reads at depth).
//! Both are held in tiles of positions laid out for attention's kernels ([`Layout`]): keys so
//! that a vector holds one value of 16 positions (scores), values so that a pass over 32 of a
//! head's values reads memory in order (outputs).

use std::ops::Range;

use half::f16;
use half::slice::HalfFloatSliceExt;

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

/// Positions a key tile holds.
pub const KEY_TILE: usize = 16;
/// Positions a value tile holds.
pub const VALUE_TILE: usize = 64;
/// A head's values a value chunk holds (the last chunk of a head may hold fewer).
pub const VALUE_CHUNK: usize = 32;

/// Where a kv head's cached value `d` of position `p` lies. Positions are held in tiles, one
/// after another, each `tile · head_dim` values; the last tile's positions past the cache's are
/// zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Keys: within a tile of [`KEY_TILE`] positions, value `d` of each position side by side
    /// (`d · KEY_TILE + lane`): a score kernel multiplies one query value into 16 positions'
    /// keys at once, with no sums across a vector.
    Keys,
    /// Values: within a tile of [`VALUE_TILE`] positions, chunk after chunk of
    /// [`VALUE_CHUNK`] values, and within a chunk its values of each position in turn
    /// (`lane · width + j`): the output kernel's pass over a chunk reads one run of memory
    /// instead of a line of every row, a stride the hardware does not run ahead of.
    Values,
}

impl Layout {
    /// Positions a tile holds.
    pub fn tile(self) -> usize {
        match self {
            Layout::Keys => KEY_TILE,
            Layout::Values => VALUE_TILE,
        }
    }

    /// Values held for the first `positions` positions of a head of `hd` values (whole tiles).
    pub fn len(self, positions: usize, hd: usize) -> usize {
        positions.div_ceil(self.tile()) * self.tile() * hd
    }

    /// Index of position `p`'s value `d` in a head of `hd` values.
    #[inline]
    pub fn index(self, hd: usize, p: usize, d: usize) -> usize {
        let (tile, lane) = (p / self.tile(), p % self.tile());
        let base = tile * self.tile() * hd;
        match self {
            Layout::Keys => base + d * KEY_TILE + lane,
            Layout::Values => {
                let c0 = d / VALUE_CHUNK * VALUE_CHUNK;
                let width = VALUE_CHUNK.min(hd - c0);
                base + VALUE_TILE * c0 + lane * width + (d - c0)
            }
        }
    }
}

/// Every kv head's keys or values, as [`Layout`] says.
#[derive(Clone, Debug, PartialEq)]
enum Heads {
    F32(Vec<Vec<f32>>),
    F16(Vec<Vec<f16>>),
}

/// Keys and values of every position so far, each kv head's apart, as `Layout` says. A
/// decode step's attention reads one kv head's keys and values from first to last; with each
/// position's heads side by side instead, a 27B head's rows lay 4 KiB apart, each on a page of
/// its own.
#[derive(Clone, Debug, PartialEq)]
pub struct KvCache {
    head_dim: usize,
    positions: usize,
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
    /// Values held.
    pub fn len(self) -> usize {
        match self {
            HeadRows::F32(x) => x.len(),
            HeadRows::F16(x) => x.len(),
        }
    }

    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// Value `i`, in f32 (exactly).
    #[inline]
    pub fn get(self, i: usize) -> f32 {
        match self {
            HeadRows::F32(x) => x[i],
            HeadRows::F16(x) => x[i].to_f32(),
        }
    }

    /// Values `r` in f32: the cache's own where it holds f32, else converted into `buf` (at
    /// least `r.len()` long). Either way the same values, so the same arithmetic follows. (Only
    /// the plain score kernel reads a range; the SIMD kernels convert in registers.)
    #[inline]
    pub fn read<'b>(self, r: Range<usize>, buf: &'b mut [f32]) -> &'b [f32]
    where
        'a: 'b,
    {
        match self {
            HeadRows::F32(x) => &x[r],
            HeadRows::F16(x) => {
                let out = &mut buf[..r.len()];
                x[r].convert_to_f32_slice(out);
                out
            }
        }
    }
}

/// Fewest values a head's buffer grows by: short caches then grow every few tokens, not every
/// one.
pub(crate) const KV_GROW_MIN: usize = 4096;

/// Grows a head's buffer to `len` values (zeros) by an eighth of what it holds (or by what is
/// needed, or by [`KV_GROW_MIN`] values, whichever is most) instead of doubling: a doubling
/// `Vec` could hold nearly twice the memory a long context needs (a 27B model's 262,144
/// positions are 34 GB in f32).
fn grow_to<T: Copy + Default>(buf: &mut Vec<T>, len: usize) {
    if len <= buf.len() {
        return;
    }
    let add = len - buf.len();
    if buf.capacity() < len {
        buf.reserve_exact(add.max(buf.len() / 8).max(KV_GROW_MIN));
    }
    buf.resize(len, T::default());
}

/// Writes positions `pos0..` into every head `h`'s buffer as `layout` says, converted by `conv`,
/// adding tiles (zeros) as needed. `new` holds positions of `heads.len() · hd` values, head
/// after head, as the projections make them.
fn append_at<T: Copy + Default>(
    heads: &mut [Vec<T>],
    layout: Layout,
    new: &[f32],
    hd: usize,
    pos0: usize,
    conv: impl Fn(f32) -> T,
) {
    let row = heads.len() * hd;
    let end = pos0 + new.len() / row;
    for (h, buf) in heads.iter_mut().enumerate() {
        grow_to(buf, layout.len(end, hd));
        for (p, pos) in (pos0..).zip(new.chunks_exact(row)) {
            for (d, &x) in pos[h * hd..(h + 1) * hd].iter().enumerate() {
                buf[layout.index(hd, p, d)] = conv(x);
            }
        }
    }
}

/// Grows every head's buffer to `len` values (zeros), with room for `cap` in all.
fn seek_to<T: Copy + Default>(heads: &mut [Vec<T>], len: usize, cap: usize) {
    for r in heads {
        r.reserve_exact(cap.saturating_sub(r.len()));
        r.resize(len.max(r.len()), T::default());
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

    fn append(&mut self, layout: Layout, new: &[f32], hd: usize, pos0: usize) {
        match self {
            Heads::F32(x) => append_at(x, layout, new, hd, pos0, |v| v),
            Heads::F16(x) => append_at(x, layout, new, hd, pos0, to_f16),
        }
    }

    fn seek_to(&mut self, len: usize, cap: usize) {
        match self {
            Heads::F32(x) => seek_to(x, len, cap),
            Heads::F16(x) => seek_to(x, len, cap),
        }
    }

    fn truncate(&mut self, layout: Layout, hd: usize, positions: usize) {
        match self {
            Heads::F32(x) => truncate_to(x, layout, hd, positions),
            Heads::F16(x) => truncate_to(x, layout, hd, positions),
        }
    }
}

/// Cuts every head's buffer back to its first `positions` positions: whole tiles, the last
/// one's later positions zeroed again (as a cache that never held them has them), the
/// allocation kept for the positions that follow.
fn truncate_to<T: Copy + Default>(
    heads: &mut [Vec<T>],
    layout: Layout,
    hd: usize,
    positions: usize,
) {
    let end = layout.len(positions, hd);
    for buf in heads {
        buf.truncate(end);
        let held = buf.len() / hd.max(1);
        for p in positions..held {
            for d in 0..hd {
                buf[layout.index(hd, p, d)] = T::default();
            }
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
            positions: 0,
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
        self.positions
    }

    /// Head `h`'s keys, as `Layout::Keys` says.
    pub fn k(&self, h: usize) -> HeadRows<'_> {
        self.k.head(h)
    }

    /// Head `h`'s values, as `Layout::Values` says.
    pub fn v(&self, h: usize) -> HeadRows<'_> {
        self.v.head(h)
    }

    /// Bytes of the cached keys and values (the last tiles' unused positions included).
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
        let (hd, pos0) = (self.head_dim, self.positions);
        self.k.append(Layout::Keys, k, hd, pos0);
        self.v.append(Layout::Values, v, hd, pos0);
        self.positions += k.len() / row;
    }

    /// Forgets every position from `positions` on (none where it holds no more): the cache is
    /// then as if it had only ever held the first `positions`.
    pub fn truncate(&mut self, positions: usize) {
        if positions >= self.positions {
            return;
        }
        let hd = self.head_dim;
        self.k.truncate(Layout::Keys, hd, positions);
        self.v.truncate(Layout::Values, hd, positions);
        self.positions = positions;
    }

    /// Adds `positions` positions of zeros, with room for `room` more (and the tiles they
    /// start).
    pub(crate) fn seek(&mut self, positions: usize, room: usize) {
        let hd = self.head_dim;
        let end = self.positions + positions;
        for (heads, layout) in [(&mut self.k, Layout::Keys), (&mut self.v, Layout::Values)] {
            heads.seek_to(layout.len(end, hd), layout.len(end + room, hd));
        }
        self.positions = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Position `p`'s values of a head, gathered, in f32.
    fn row(rows: HeadRows<'_>, p: usize, hd: usize) -> Vec<f32> {
        (0..hd)
            .map(|d| rows.get(Layout::Values.index(hd, p, d)))
            .collect()
    }

    /// Position `p`'s keys of a head, gathered, in f32.
    fn key(tiles: HeadRows<'_>, p: usize, hd: usize) -> Vec<f32> {
        (0..hd)
            .map(|d| tiles.get(Layout::Keys.index(hd, p, d)))
            .collect()
    }

    #[test]
    fn each_layout_puts_every_value_of_its_tiles_in_a_place_of_its_own() {
        for layout in [Layout::Keys, Layout::Values] {
            for hd in [256, 40, 8, 32, 33] {
                let n = 2 * layout.tile() + 5;
                let len = layout.len(n, hd);
                assert_eq!(len, 3 * layout.tile() * hd);
                let mut seen = vec![false; len];
                for p in 0..3 * layout.tile() {
                    for d in 0..hd {
                        let i = layout.index(hd, p, d);
                        assert!(!seen[i], "{layout:?} {hd}: {p} {d} lands on another");
                        seen[i] = true;
                    }
                }
                assert!(seen.iter().all(|&s| s), "{layout:?} {hd}");
            }
        }
        // A value chunk's values of one position lie side by side, the chunk's next position
        // right after; keys of one value of a tile, likewise.
        let hd = 256;
        assert_eq!(
            Layout::Values.index(hd, 0, 31) + 1,
            Layout::Values.index(hd, 1, 0)
        );
        assert_eq!(
            Layout::Values.index(hd, 63, 31) + 1,
            Layout::Values.index(hd, 0, 32)
        );
        assert_eq!(
            Layout::Keys.index(hd, 15, 0) + 1,
            Layout::Keys.index(hd, 0, 1)
        );
        assert_eq!(Layout::Keys.index(hd, 16, 0), KEY_TILE * hd);
    }

    #[test]
    fn a_growing_kv_cache_keeps_each_heads_positions_in_order_with_at_most_an_eighth_more_room() {
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
                // Either may need a tile more than the positions appended.
                for (heads_of, what, add) in
                    [(&kv.k, "k", n + KEY_TILE), (&kv.v, "v", n + VALUE_TILE)]
                {
                    let (len, cap) = heads_of.values();
                    let bound = len + heads * (len / heads / 8).max(add * hd).max(KV_GROW_MIN);
                    assert!(cap <= bound, "{format:?} {what}: {cap} > {bound}");
                }
            }
            let positions = k_all.len() / row_len;
            assert_eq!(kv.positions(), positions);
            // The last tiles are whole.
            let tiles = |t: usize| positions.div_ceil(t) * t * row_len;
            assert_eq!(
                kv.bytes(),
                format.bytes() * (tiles(KEY_TILE) + tiles(VALUE_TILE))
            );
            for h in 0..heads {
                for p in [0, 1, 15, 16, 499, 500, 536, positions - 1] {
                    let at = p * row_len + h * hd;
                    assert_eq!(key(kv.k(h), p, hd), k_all[at..at + hd], "k {h} {p}");
                    assert_eq!(row(kv.v(h), p, hd), v_all[at..at + hd], "v {h} {p}");
                }
                // Past the last position, the tiles hold zeros.
                if positions % KEY_TILE != 0 {
                    assert!(key(kv.k(h), positions, hd).iter().all(|&x| x == 0.0));
                }
                if positions % VALUE_TILE != 0 {
                    assert!(row(kv.v(h), positions, hd).iter().all(|&x| x == 0.0));
                }
            }
        }
    }

    #[test]
    fn a_seek_adds_positions_of_zeros_after_those_cached() {
        let (heads, hd) = (2, 32);
        let mut kv = KvCache::new(heads, hd);
        let k: Vec<f32> = (0..3 * heads * hd).map(|i| i as f32 + 1.0).collect();
        kv.append(&k, &k);
        // To the end of a value tile, with room for 8 more positions: the next tile's.
        kv.seek(61, 8);
        assert_eq!(kv.positions(), 64);
        let at = |kv: &KvCache| match (&kv.k, &kv.v) {
            (Heads::F32(k), Heads::F32(v)) => (k[0].as_ptr(), v[0].as_ptr()),
            _ => unreachable!("an f32 cache"),
        };
        let before = at(&kv);
        let k2: Vec<f32> = (0..heads * hd).map(|i| -(i as f32) - 1.0).collect();
        kv.append(&k2, &k2);
        assert_eq!(kv.positions(), 65);
        for h in 0..heads {
            assert_eq!(key(kv.k(h), 2, hd), k[2 * heads * hd + h * hd..][..hd]);
            assert!(key(kv.k(h), 22, hd).iter().all(|&x| x == 0.0));
            assert!(row(kv.v(h), 3, hd).iter().all(|&x| x == 0.0));
            assert_eq!(key(kv.k(h), 64, hd), k2[h * hd..(h + 1) * hd]);
            assert_eq!(row(kv.v(h), 64, hd), k2[h * hd..(h + 1) * hd]);
        }
        // Appending the room's positions moves nothing.
        for _ in 0..7 {
            kv.append(&k2, &k2);
        }
        assert_eq!(at(&kv), before);
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
        let got = row(kv.v(0), 0, 8);
        assert_eq!(key(kv.k(0), 0, 8), got);
        assert_eq!(half::f16::from_f32(65520.0).to_f32(), f32::INFINITY);
        assert_eq!(&got[1..5], &[-65504.0, 65504.0, 65504.0, f32::INFINITY]);
        // Within range: the nearest f16.
        for i in [0, 5, 6, 7] {
            assert_eq!(got[i], half::f16::from_f32(k[i]).to_f32(), "value {i}");
        }
        assert!((got[0] - 1.0 / 3.0).abs() < 1e-3 && got[0] != 1.0 / 3.0);
        // A whole tile of keys and one of values.
        assert_eq!(kv.bytes(), 2 * (KEY_TILE + VALUE_TILE) * 8);
    }

    #[test]
    #[should_panic(expected = "KV rows of 1024 values")]
    fn a_kv_cache_refuses_rows_of_another_width() {
        KvCache::new(4, 256).append(&[0.0; 1000], &[0.0; 1000]);
    }
}
