//! The query-tiled attention of multi-token passes (`attn_prefill_mma`, `attn_prefill_q8_mma`,
//! and on sm_90 the warpgroup form `attn_prefill_wg`) and its merge against the f64 reference on
//! random caches of both formats, and its time against the flash-decoding split's (a token at a
//! time) on a prompt chunk at depth.

use niwaki_cuda::gpu::{Arg, DevBuf, Gpu};
use niwaki_cuda::plan::{self, AttnLaunch, Dims, PrefillLaunch};
use niwaki_cuda::{KvCache, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::attention::{error_vs_reference, random_cache, same_bits, store, Cache};
use crate::{Report, R};

/// A pass's device buffers: queries, caches (values, then scales where q8_0), the start
/// position, partial rows, gates (zero) and the merged output.
struct Pass {
    kv: KvCache,
    q: DevBuf,
    k: DevBuf,
    v: DevBuf,
    scales: Option<(DevBuf, DevBuf)>,
    pos: DevBuf,
    part: DevBuf,
    proj: DevBuf,
    out: DevBuf,
}

impl Pass {
    #[allow(clippy::too_many_arguments)]
    fn new(
        gpu: &Gpu,
        d: &Dims,
        kv: KvCache,
        q: &[f32],
        k: &Cache,
        v: &Cache,
        pos: usize,
        ntok: usize,
    ) -> R<Pass> {
        let (hd, nh) = (d.head_dim, d.n_head);
        let scales = match kv {
            KvCache::F16 => None,
            KvCache::Q8_0 => Some((
                gpu.upload(&k.scales, "k scales")?,
                gpu.upload(&v.scales, "v scales")?,
            )),
        };
        Ok(Pass {
            kv,
            q: gpu.upload(q, "q")?,
            k: gpu.upload(&k.values, "k cache")?,
            v: gpu.upload(&v.values, "v cache")?,
            scales,
            pos: gpu.upload(&[pos as u32, 0u32], "pos")?,
            part: gpu.alloc(4 * ntok * nh * plan::ATTN_SPLITS * (hd + 2), "partials")?,
            proj: gpu.alloc(4 * ntok * 2 * nh * hd, "gates")?,
            out: gpu.alloc(4 * ntok * nh * hd, "out")?,
        })
    }

    /// The query-tiled attention with `places` for its blocks, then the rows' merge; its split
    /// count.
    #[allow(clippy::too_many_arguments)]
    fn tiled(
        &self,
        gpu: &Gpu,
        d: &Dims,
        k: PrefillLaunch,
        pos: usize,
        ntok: usize,
        places: usize,
    ) -> Result<usize> {
        let rule = gpu.attn_prefill_rule();
        let (nsplit, len) = plan::attn_prefill_splits(pos + ntok, k.blocks(d, ntok), places, rule);
        let tail = [
            Arg::I32(ntok as i32),
            Arg::I32(nsplit as i32),
            Arg::I32(len as i32),
        ];
        self.attend(gpu, d, k.launch, k.grid(d, ntok, nsplit), &tail)?;
        self.merge(gpu, d, ntok, nsplit, len)?;
        Ok(nsplit)
    }

    /// The flash-decoding split a multi-token pass takes without it (the SIMT kernel, tiles of
    /// 8), then the rows' merge.
    fn split(&self, gpu: &Gpu, d: &Dims, pos: usize, ntok: usize) -> Result<()> {
        let (a, _) = gpu.attn_launch(d, self.kv, 8);
        let nsplit = plan::attn_splits(pos + ntok, ntok, 1);
        let grid = gpu.attn_split_grid(d.n_head_kv, nsplit, ntok);
        self.attend(gpu, d, a, grid, &[Arg::I32(nsplit as i32)])?;
        self.merge(gpu, d, ntok, nsplit, 0)
    }

    /// An attention launch over the pass's buffers: the arguments both kinds take (queries,
    /// caches and their scales, the position, the scale), `tail`, then the partial rows.
    fn attend(
        &self,
        gpu: &Gpu,
        d: &Dims,
        a: AttnLaunch,
        grid: (u32, u32, u32),
        tail: &[Arg],
    ) -> Result<()> {
        let [ks, vs] = match &self.scales {
            Some((k, v)) => [Arg::Ptr(k.ptr), Arg::Ptr(v.ptr)],
            None => [Arg::Ptr(0), Arg::Ptr(0)],
        };
        let head = [
            Arg::Ptr(self.q.ptr),
            Arg::Ptr(self.k.ptr),
            Arg::Ptr(self.v.ptr),
            ks,
            vs,
            Arg::Ptr(self.pos.ptr),
            Arg::F32(1.0 / (d.head_dim as f32).sqrt()),
        ];
        gpu.launch_smem(
            &gpu.stream,
            a.kernel,
            grid,
            (a.threads as u32, 1, 1),
            a.smem_bytes as u32,
            &[&head[..], tail, &[Arg::Ptr(self.part.ptr)]].concat(),
        )
    }

    fn merge(&self, gpu: &Gpu, d: &Dims, ntok: usize, nsplit: usize, len: usize) -> Result<()> {
        gpu.launch(
            &gpu.stream,
            "attn_combine_rows",
            (d.n_head as u32, ntok as u32, 1),
            (d.head_dim as u32, 1, 1),
            &[
                Arg::Ptr(self.part.ptr),
                Arg::I32(nsplit as i32),
                Arg::I32(len as i32),
                Arg::Ptr(self.pos.ptr),
                Arg::Ptr(self.proj.ptr),
                Arg::I32((2 * d.n_head * d.head_dim) as i32),
                Arg::Ptr(self.out.ptr),
            ],
        )
    }

    fn read(&self, gpu: &Gpu, n: usize) -> R<Vec<f32>> {
        let mut out = vec![0f32; n];
        gpu.read(&gpu.stream, self.out.ptr, &mut out)?;
        Ok(out)
    }
}

pub fn prefill_checks(rep: &mut Report, gpu: &Gpu, d: &Dims) -> R<()> {
    let [wg, wg_wide] = gpu.attn_prefill_wg_forms();
    let wg_needs = "the warpgroup form: sm_90, heads of whole 128 values";
    let kinds = [
        (
            KvCache::F16,
            gpu.attn_prefill_launch(KvCache::F16),
            "sm_80, its shared memory",
        ),
        (
            KvCache::Q8_0,
            gpu.attn_prefill_launch(KvCache::Q8_0),
            "sm_80, its shared memory, q8_0 heads of whole 128 values",
        ),
        (KvCache::F16, wg, wg_needs),
        (KvCache::F16, wg_wide, wg_needs),
    ];
    for (kv, launch, needs) in kinds {
        let Some((a, places)) = launch else {
            rep.line(format!(
                "| query-tiled attention ({kv:?} cache) | HD {} | — | SKIP | not run here ({needs}) |",
                d.head_dim
            ));
            continue;
        };
        let k = Tiled { kv, a, places };
        checks(rep, gpu, d, &k)?;
        chunk_at_depth(rep, gpu, d, &k)?;
    }
    Ok(())
}

/// A query-tiled kernel of a cache type: its launch, and the device's places for its blocks.
struct Tiled {
    kv: KvCache,
    a: PrefillLaunch,
    places: usize,
}

/// The checks' passes: cached positions before the pass, tokens in the pass, places for its
/// blocks (the device's, or many, for many splits), and whether keys and values take a magnitude
/// per 32-value block, so that q8_0 scales differ within a tile by up to 2^16.
fn cases(places: usize) -> [(usize, usize, usize, bool); 8] {
    [
        (0usize, 2usize, places, false),
        (0, 17, places, false),
        (7, 40, 4096, false),
        (100, 16, places, false),
        (290, 33, 4096, true),
        (3001, 50, places, true),
        (5000, 20, 4096, false),
        // Two splits of 160 positions: tokens 0-59 end before the second (their rows there are
        // not written and the merge reads one split), and of its blocks three have no token
        // reaching it.
        (100, 200, 4096, false),
    ]
}

/// A pass over random keys and values of `pos + ntok` positions (of one magnitude per 32-value
/// block where `wide`) and random queries, with its inputs for the reference.
fn random_pass(
    gpu: &Gpu,
    d: &Dims,
    kv: KvCache,
    rng: &mut ChaCha8Rng,
    pos: usize,
    ntok: usize,
    wide: bool,
) -> R<(Pass, Vec<f32>, Cache, Cache)> {
    let n = pos + ntok;
    let kc = store(&random_cache(rng, n, d, wide), kv);
    let vc = store(&random_cache(rng, n, d, wide), kv);
    let q: Vec<f32> = (0..ntok * d.n_head * d.head_dim)
        .map(|_| rng.gen_range(-3.0..3.0))
        .collect();
    let pass = Pass::new(gpu, d, kv, &q, &kc, &vc, pos, ntok)?;
    Ok((pass, q, kc, vc))
}

fn checks(rep: &mut Report, gpu: &Gpu, d: &Dims, k: &Tiled) -> R<()> {
    let (hd, nh, nkv) = (d.head_dim, d.n_head, d.n_head_kv);
    let (kv, a, places) = (k.kv, k.a, k.places);
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let (mut worst, mut worst_abs, mut repeat_ok) = (0f64, 0f32, true);
    let mut splits = Vec::new();
    for (pos, ntok, room, wide) in cases(places) {
        let (pass, q, kc, vc) = random_pass(gpu, d, kv, &mut rng, pos, ntok, wide)?;
        splits.push(pass.tiled(gpu, d, a, pos, ntok, room)?);
        let got = pass.read(gpu, ntok * nh * hd)?;
        pass.tiled(gpu, d, a, pos, ntok, room)?;
        let again = pass.read(gpu, ntok * nh * hd)?;
        repeat_ok &= same_bits(&got, &again);
        let (rel, abs) = error_vs_reference(d, &q, &kc, &vc, pos, &got);
        worst = worst.max(rel);
        worst_abs = worst_abs.max(abs);
    }
    let many = splits.iter().any(|&s| s > 1);
    let ok = worst < 2e-5 && repeat_ok && many;
    rep.line(format!(
        "| query-tiled attention + merge ({kv:?} cache) | contexts 2..5020, 2/16/17/20/33/40/50/200 tokens (splits {splits:?}), blocks of one magnitude and of 2^-12..2^4, HD {hd}, {nh}/{nkv} heads | {} | {} | rel L2 vs f64 {worst:.1e} (tol 2e-5), max abs {worst_abs:.1e}; repeated launch bit-identical: {repeat_ok}; several splits in a case: {many} |",
        a.launch.kernel,
        if ok { "PASS" } else { "FAIL" }
    ));
    rep.check(
        ok,
        format!("query-tiled attention {kv:?} ({})", a.launch.kernel),
    );
    Ok(())
}

/// The time of a 256-token chunk's attention after 16,384 cached positions (zeros: the reads
/// and the arithmetic are what count), query-tiled against a token at a time.
fn chunk_at_depth(rep: &mut Report, gpu: &Gpu, d: &Dims, k: &Tiled) -> R<()> {
    let (kv, a, places) = (k.kv, k.a, k.places);
    let (pos, ntok) = (16_384, plan::MAX_CHUNK);
    let (hd, nh, nkv) = (d.head_dim, d.n_head, d.n_head_kv);
    // Random keys, values and queries, not zeros: the softmax's work may depend on them.
    let mut rng = ChaCha8Rng::seed_from_u64(19);
    let (pass, ..) = random_pass(gpu, d, kv, &mut rng, pos, ntok, false)?;
    let tiled = gpu.time(&gpu.stream, 5, || {
        pass.tiled(gpu, d, a, pos, ntok, places).map(|_| ())
    })?;
    let split = gpu.time(&gpu.stream, 5, || pass.split(gpu, d, pos, ntok))?;
    rep.line(format!(
        "| query-tiled attention, time ({kv:?} cache) | {ntok} tokens after {pos} positions, HD {hd}, {nh}/{nkv} heads, merge included | {} | — | {:.0} µs a layer against {:.0} µs a token at a time ({}): {:.1}× |",
        a.launch.kernel,
        tiled * 1e6,
        split * 1e6,
        gpu.attn_launch(d, kv, 8).0.kernel,
        split / tiled.max(1e-12)
    ));
    Ok(())
}
