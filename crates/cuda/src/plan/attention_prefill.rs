//! The query-tiled attention of multi-token passes (`attn_prefill_mma`, `attn_prefill_q8_mma`,
//! kernels/attention_prefill.cu; the warpgroup form's entries `attn_prefill_wg_wide` and
//! `attn_prefill_wg`, kernels/attention_prefill_wg.cu): their launches, and their splits of the
//! context.

use super::*;

/// Whether multi-token passes over an f16 cache take the query-tiled attention (on devices
/// that run it) rather than the flash-decoding split a token at a time
/// (`NIWAKI_CUDA_ATTN_PREFILL`). Fifty-fifth session, an H100, 27B Q1_0, `niwaki bench -p 512
/// -n 16 -r 3 -d D`, pp512 tok/s off / on: 1,944 / 5,410 and 1,949 / 5,395 at 16,384 (two
/// rounds), 1,123 / 4,374 at 32,768, 7,026 / 7,115 at 0; in the harness a 256-token chunk
/// after 16,384 positions took 806 µs a layer against 6,047 (attn_split_t8, merge included).
pub const ATTN_PREFILL: bool = true;
/// The same for a q8_0 cache (`NIWAKI_CUDA_ATTN_PREFILL_Q8`). Same session and card, one run
/// each: pp512 at 16,384 positions 1,971 tok/s off, 4,119 on; in the harness a 256-token chunk
/// after 16,384 positions took 1,691 µs a layer against 5,884 (attn_split_q8_t8, merge
/// included).
pub const ATTN_PREFILL_Q8: bool = true;
/// Tokens of a block of the query-tiled attention (one m16 tile of the tensor cores; the
/// kernel's AP_TOKENS).
pub const ATTN_PREFILL_TOKENS: usize = 16;
/// Cache positions of a stage of its keys and values, and stages in flight (AP_TILE,
/// AP_STAGES): the queries take 99 KiB of a 27B block (16 tokens × 6 heads as f16 pairs), so a
/// multiprocessor holds one block, and the third stage costs no occupancy.
pub const ATTN_PREFILL_TILE: usize = 32;
pub const ATTN_PREFILL_STAGES: usize = 3;
/// How a query-tiled pass picks its split count ([`attn_prefill_splits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitRule {
    /// As many splits as fill the places once.
    OneWave,
    /// The count whose waves of blocks take least time, a wave costing its split's positions
    /// and [`ATTN_PREFILL_SPLIT_COST`].
    LeastTime,
}

impl SplitRule {
    pub const ALL: [SplitRule; 2] = [SplitRule::OneWave, SplitRule::LeastTime];
    /// Their words for `NIWAKI_CUDA_ATTN_PREFILL_SPLITS`, in the order of [`SplitRule::ALL`].
    pub const WORDS: [&'static str; 2] = ["wave", "time"];

    /// The rule a `NIWAKI_CUDA_ATTN_PREFILL_SPLITS` value names.
    pub fn named(word: &str) -> Option<SplitRule> {
        named_in(&Self::ALL, &Self::WORDS, word)
    }
}

/// The choice of `all` whose word in `words` (the same order) is `word`.
fn named_in<T: Copy>(all: &[T], words: &[&str], word: &str) -> Option<T> {
    let i = words.iter().position(|&w| w == word)?;
    all.get(i).copied()
}

/// The rule multi-token passes take (`NIWAKI_CUDA_ATTN_PREFILL_SPLITS=wave|time`). Fifty-eighth
/// session, an H100, 27B Q1_0, `niwaki bench -p 512 -n 2 -r 3 -d D`, pp512 tok/s one wave /
/// least time: 5,660 / 5,821 at 16,384 (+2.9%), 4,625 / 5,039 at 32,768 (+9.0%), the same
/// tokens; in the harness a 256-token chunk of `attn_prefill_wg` after 16,384 positions took
/// 572 µs a layer (11 splits) against 646 (2; the fifty-seventh session's, another H100), and
/// the other forms' times stood (their split counts the same either way; q8_0 pp512 at 32,768
/// 3,328 / 3,335). It costs room: 7,029 partial rows where one wave needs 704
/// ([`attn_part_rows`]), about 150 MiB more on the 27B.
pub const ATTN_PREFILL_SPLIT_RULE: SplitRule = SplitRule::LeastTime;
/// What a split costs a wave beyond its positions, in cache positions: its blocks stage their
/// queries before the first tile and write their partial rows after the last (about four
/// tiles of `attn_prefill_wg`).
pub const ATTN_PREFILL_SPLIT_COST: usize = 128;
/// Fewest cache positions per split of the query-tiled attention: a block stages its queries
/// (96 KiB of floats read for a 27B block) before its first tile.
pub const ATTN_PREFILL_MIN_SPLIT: usize = 256;
/// Whether multi-token passes over an f16 cache take the warpgroup-MMA form on sm_90
/// (kernels/attention_prefill_wg.cu, the entry [`ATTN_PREFILL_WG_ENTRY`] names;
/// `NIWAKI_CUDA_ATTN_PREFILL_WG`) rather
/// than `attn_prefill_mma`. Fifty-seventh session, an H100: in the harness a 256-token chunk
/// after 16,384 positions took 646 µs a layer against 775 (27B shapes; 109 against 135 with
/// heads of 128), both as close to the f64 reference; 27B Q1_0, `niwaki bench -p 512 -n 2 -r 3
/// -d D`, pp512 tok/s mma / wg: 5,408 / 5,629 at 16,384, 4,341 / 4,681 at 32,768, the same
/// tokens. Two entries beside it were bit-identical and slower (fifty-eighth session, an H100,
/// removed): each tile's successor's scores issued before its softmax (the 27B chunk 686 µs
/// against 646; pp512 −1.4% at 16,384, −0.9% at 32,768), and the outputs left unscaled where
/// no row's max moved (587 µs against 551 on random data; pp512 −0.8% at 16,384 and −2.8% at
/// 32,768 even over the bench's zeros, whose maxima never move).
pub const ATTN_PREFILL_WG: bool = true;
/// The warpgroup form's entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WgEntry {
    /// Tiles of 32 positions.
    Plain,
    /// Tiles of 64 positions: m64n64k16 scores, reading the queries once for 64 positions.
    Wide,
}

impl WgEntry {
    pub const ALL: [WgEntry; 2] = [WgEntry::Plain, WgEntry::Wide];
    /// Their words for `NIWAKI_CUDA_ATTN_PREFILL_WG_ENTRY`, in the order of [`WgEntry::ALL`].
    pub const WORDS: [&'static str; 2] = ["plain", "wide"];

    pub fn kernel(self) -> &'static str {
        match self {
            WgEntry::Plain => "attn_prefill_wg",
            WgEntry::Wide => "attn_prefill_wg_wide",
        }
    }

    /// The entry a `NIWAKI_CUDA_ATTN_PREFILL_WG_ENTRY` value names.
    pub fn named(word: &str) -> Option<WgEntry> {
        named_in(&Self::ALL, &Self::WORDS, word)
    }
}

/// The entry multi-token passes take (`NIWAKI_CUDA_ATTN_PREFILL_WG_ENTRY=plain|wide`).
/// Fifty-ninth session, an H100, 27B shapes: in the harness a 256-token chunk after 16,384
/// positions took 520 µs a layer wide against 543 plain (random data; 103 against 117 with
/// heads of 128), both as close to the f64 reference; 27B Q1_0, `niwaki bench -p 512 -n 2 -r 3
/// -d D`, pp512 tok/s plain / wide: 5,889.5 / 5,916.2 at 16,384 (+0.5%), 5,117.8 / 5,169.8 at
/// 32,768 (+1.0%), the same tokens; 6,692.7 / 6,721.3 at 4,096 (+0.4%, the depth filled by a
/// prefill, the same tokens). An entry of 32-position tiles whose second warpgroup issued
/// its scores once the first had issued its own (so that one's softmax ran under the other's
/// MMAs) was bit-identical and no faster (545 µs; pp512 5,876.7 and 5,126.2): removed.
pub const ATTN_PREFILL_WG_ENTRY: WgEntry = WgEntry::Wide;
/// Query rows ((token, head) pairs of a kv head) of a block of the warpgroup form: two
/// warpgroups of 64.
pub const ATTN_PREFILL_WG_ROWS: usize = 128;
/// Its stage length and stages in flight (AW_TILE, AW_STAGES): the queries take 128 KiB (128
/// rows of 256 values as f16 pairs), three stages of 32 key and value rows 96 KiB.
pub const ATTN_PREFILL_WG_TILE: usize = 32;
pub const ATTN_PREFILL_WG_STAGES: usize = 3;

/// A query-tiled kernel's launch, and how many query rows ((token, head) pairs of one kv
/// head, heads fastest) each of its blocks takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillLaunch {
    pub launch: AttnLaunch,
    pub rows: usize,
}

impl PrefillLaunch {
    /// Blocks of one split of an `ntok`-token pass: row tiles times kv heads.
    pub fn blocks(&self, d: &Dims, ntok: usize) -> usize {
        self.row_tiles(d, ntok) * d.n_head_kv.max(1)
    }

    /// The grid of a pass: row tiles, kv heads, splits (the row tiles first, so that blocks
    /// reading the same cache rows run together).
    pub fn grid(&self, d: &Dims, ntok: usize, nsplit: usize) -> (u32, u32, u32) {
        (
            self.row_tiles(d, ntok) as u32,
            d.n_head_kv as u32,
            nsplit as u32,
        )
    }

    fn row_tiles(&self, d: &Dims, ntok: usize) -> usize {
        (ntok * (d.n_head / d.n_head_kv.max(1))).div_ceil(self.rows.max(1))
    }
}

/// The query-tiled attention's launch for a cache type: a warp per query head of a kv head, the
/// queries' f16 pairs and the stages in dynamic shared memory (f16: stages of f16 rows; q8_0:
/// one f16 tile the codes are turned into, its scales as floats and the value blocks' factors,
/// then stages as cached). `None` for a q8_0 cache with heads not whole 128-value pieces (its
/// scale rows are copied in 8-byte pieces).
pub fn attn_prefill_launch(d: &Dims, kv: KvCache) -> Option<PrefillLaunch> {
    let (gqa, hd) = (d.n_head / d.n_head_kv, d.head_dim);
    let row = 2 * (hd + 8);
    let queries = 2 * gqa * ATTN_PREFILL_TOKENS * row;
    let tile16 = 2 * ATTN_PREFILL_TILE * row;
    let (kernel, rest) = match kv {
        KvCache::F16 => ("attn_prefill_mma", ATTN_PREFILL_STAGES * tile16),
        KvCache::Q8_0 => {
            if !hd.is_multiple_of(128) {
                return None;
            }
            let nb = hd / 32;
            let floats = (4 * (2 * ATTN_PREFILL_TILE * nb + nb + gqa * nb)).next_multiple_of(16);
            let stage = 2 * ATTN_PREFILL_TILE * (hd + 2 * nb);
            (
                "attn_prefill_q8_mma",
                tile16 + floats + ATTN_PREFILL_STAGES * stage,
            )
        }
    };
    Some(PrefillLaunch {
        launch: AttnLaunch {
            kernel,
            threads: 32 * gqa,
            smem_bytes: queries + rest,
        },
        rows: ATTN_PREFILL_TOKENS * gqa,
    })
}

/// The warpgroup-MMA form's launch (f16 cache, heads of whole 128 values; sm_90 only, which the
/// device start checks): two warpgroups, the queries' f16 pairs and the stages in the 128-byte
/// swizzle, and 1 KiB to align them to its 1,024-byte atoms. Every entry takes the same block
/// (the wide one's ring three halves, keys or values, of 64 positions).
pub fn attn_prefill_wg_launch(d: &Dims, entry: WgEntry) -> Option<PrefillLaunch> {
    let hd = d.head_dim;
    if !hd.is_multiple_of(128) {
        return None;
    }
    let queries = 2 * ATTN_PREFILL_WG_ROWS * hd * 2;
    let stages = ATTN_PREFILL_WG_STAGES * 2 * ATTN_PREFILL_WG_TILE * hd * 2;
    Some(PrefillLaunch {
        launch: AttnLaunch {
            kernel: entry.kernel(),
            threads: 256,
            smem_bytes: queries + stages + 1024,
        },
        rows: ATTN_PREFILL_WG_ROWS,
    })
}

/// The splits of a query-tiled pass ending at context `n_ctx` whose splits launch `blocks`
/// blocks each ([`PrefillLaunch::blocks`]), on a device holding `places` of them at once: how
/// many, and the positions each covers (a whole number of stages), none shorter than
/// [`ATTN_PREFILL_MIN_SPLIT`], at most [`attn_prefill_most_splits`]. By `rule`: as many as fill
/// the places once, or the count whose waves of blocks take least time (the fewest of equals).
/// A 256-token chunk after 16,384 positions on 132 places: `attn_prefill_mma`'s 64 blocks a
/// split take 2 splits either way (one wave, 97% of the places); `attn_prefill_wg`'s 48 fill
/// 73% with the 2 of one wave, and take 11 by least time (four waves, all places). The split
/// length is a multiple of both kernels' stages.
pub fn attn_prefill_splits(
    n_ctx: usize,
    blocks: usize,
    places: usize,
    rule: SplitRule,
) -> (usize, usize) {
    let n_ctx = n_ctx.max(1);
    let (blocks, places) = (blocks.max(1), places.max(1));
    let most = n_ctx.div_ceil(ATTN_PREFILL_MIN_SPLIT).max(1);
    let want = match rule {
        SplitRule::OneWave => attn_prefill_most_splits(blocks, places, rule).min(most),
        SplitRule::LeastTime => {
            let time = |s: usize| {
                (blocks * s).div_ceil(places) * (n_ctx.div_ceil(s) + ATTN_PREFILL_SPLIT_COST)
            };
            (1..=most.min(attn_prefill_most_splits(blocks, places, rule)))
                .min_by_key(|&s| time(s))
                .unwrap_or(1)
        }
    };
    let len = n_ctx
        .div_ceil(want)
        .next_multiple_of(ATTN_PREFILL_TILE.max(ATTN_PREFILL_WG_TILE));
    (n_ctx.div_ceil(len), len)
}

/// The most splits a query-tiled pass of `blocks` blocks a split takes on `places` places by
/// `rule` (at most [`ATTN_SPLITS`]): those that fill the places once, or by least time those
/// that fill their waves of places best, the fewest of equals. Over a long context the
/// least-time rule tends to them and never takes more: any more fill their waves no better, so
/// they cost at least as many waves a position and more waves.
pub fn attn_prefill_most_splits(blocks: usize, places: usize, rule: SplitRule) -> usize {
    let (blocks, places) = (blocks.max(1), places.max(1));
    match rule {
        SplitRule::OneWave => (places / blocks).clamp(1, ATTN_SPLITS),
        SplitRule::LeastTime => {
            // The share of its waves' places a count's blocks fill, a fraction compared
            // exactly: blocks · s out of places · waves.
            let fill = |s: usize| (blocks * s, places * (blocks * s).div_ceil(places));
            (1..=ATTN_SPLITS)
                .reduce(|best, s| {
                    let ((a, b), (c, e)) = (fill(best), fill(s));
                    if c * b > a * e {
                        s
                    } else {
                        best
                    }
                })
                .unwrap_or(1)
        }
    }
}

/// The most partial rows (a token's split, per query head) an attention pass of up to `tokens`
/// tokens writes: [`ATTN_SPLITS`] for a one-token pass (the split kernels); for longer passes,
/// where a query-tiled kernel takes them (`query_tiled`: its launch and its places on the
/// device) and `rule`, a token count times the most splits it takes
/// ([`attn_prefill_most_splits`]; for the 27B on 132 places, one wave: 528 rows for
/// `attn_prefill_mma` (16 tokens in 33 splits), 704 for `attn_prefill_wg` (64 in 11); least
/// time: 8,448 (256 in 33) and 7,029 (213 in 33)), against 32,768 for 256 tokens of the split
/// kernels, which take them otherwise: `tokens` × [`ATTN_SPLITS`].
pub fn attn_part_rows(
    d: &Dims,
    tokens: usize,
    query_tiled: Option<(PrefillLaunch, usize)>,
    rule: SplitRule,
) -> usize {
    let passes = match query_tiled {
        Some((k, places)) => (2..=tokens)
            .map(|t| t * attn_prefill_most_splits(k.blocks(d, t), places, rule))
            .max()
            .unwrap_or(0),
        None => tokens * ATTN_SPLITS,
    };
    passes.max(ATTN_SPLITS)
}
