//! Opening the device: the kernels compiled (or taken from the cache) and loaded, their
//! shared-memory limits raised, and every switch read from the environment.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize};
use std::sync::Mutex;

use cudarc::driver::{sys, CudaFunction};

use super::decode_gemv::{X_COPY_ALL, X_COPY_OFF, X_COPY_PLAN};
use super::device::{device_info, open_context};
use super::launch::occupancy;
use super::settings::{attn_tile_runs, ATTN_TILE_BY_CACHE, PREFETCH_BY_MATRIX};
use super::{trace, Gpu, ImageUse};
use crate::compile;
use crate::error::{Context, CudaError, Result};
use crate::knobs;
use crate::plan::{self, Dims};

/// Lets kernel `name` use `bytes` of dynamic shared memory per block (above the 48 KiB every
/// kernel may use without asking).
fn raise_dynamic_smem(f: &CudaFunction, name: &str, bytes: usize) -> Result<()> {
    // SAFETY: a function handle of this context and a documented attribute.
    unsafe {
        sys::cuFuncSetAttribute(
            f.cu_function(),
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        )
    }
    .result()
    .ctx(|| format!("raising the shared memory limit of {name} to {bytes} bytes"))
}

impl Gpu {
    /// Opens GPU 0 and compiles the kernels for `dims`.
    pub fn new(dims: &Dims) -> Result<Gpu> {
        knobs::check_env()?;
        if let Some(what) = compile::ablation() {
            // A measurement switch left set would otherwise serve wrong outputs (or, with
            // `watch`, slower ones) without a word.
            let effect = if what == "watch" {
                "makes traced binary GEMVs watch their first tile before their wait"
            } else {
                "takes part of the kernels' work out: outputs are wrong"
            };
            eprintln!("warning: NIWAKI_CUDA_ABLATE={what} {effect} (for measuring only)");
        }
        let skip = knobs::word("NIWAKI_CUDA_SKIP").and_then(|w| plan::Skip::parse(&w));
        if let Some(what) = skip {
            eprintln!(
                "warning: NIWAKI_CUDA_SKIP={what:?} leaves kernels out of one-token passes: outputs are wrong (for measuring only)"
            );
        }
        let ctx = open_context()?;
        let info = device_info(&ctx)?;
        let smem_limit = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .ctx(|| "shared memory limit".into())?
            .max(0) as usize;
        let attn_ring = compile::attn_ring(dims, smem_limit);
        let t = std::time::Instant::now();
        let trace_capacity = trace::capacity_from_env();
        let defines = compile::program_defines(dims, smem_limit, trace_capacity);
        // In parts side by side, but whole where the kernels keep timeline records: the
        // timeline reads them from one module's symbols.
        let device_code = knobs::flag("NIWAKI_CUDA_CUBIN", compile::LOAD_CUBIN);
        let arch = info.arch();
        // A compile takes seconds (25 s for the 27B program on two cores): said once, before
        // the first part the cache does not give.
        let told = std::sync::Once::new();
        let announce = || {
            told.call_once(|| {
                eprintln!(
                    "compiling the CUDA kernels for {arch} (once for these shapes; `niwaki \
                     kernels` fills the cache ahead)…"
                )
            })
        };
        let (program, from_cache) =
            compile::nvrtc_compile(&arch, &defines, trace_capacity == 0, device_code, &announce)?;
        let compile_secs = t.elapsed().as_secs_f64();
        let t = std::time::Instant::now();
        let super::modules::Loaded {
            modules,
            funcs,
            from_device_code: device_code_parts,
        } = super::modules::load_parts(&ctx, program, device_code)?;
        let load_secs = t.elapsed().as_secs_f64();
        let stream = ctx.new_stream().ctx(|| "creating a stream".into())?;
        let hopper = info.sm90();
        let ampere = info.compute_capability.0 >= 8;
        let wgmma = info.wgmma();
        // The chunked recurrence's preparation needs more shared memory than devices before
        // Volta's successors offer; where it does not fit, the recurrence stays token by token.
        let gdn_chunks_fit = plan::gdn_prep_smem(dims) <= smem_limit;
        if gdn_chunks_fit {
            raise_dynamic_smem(
                &funcs["gdn_chunk_prep"],
                "gdn_chunk_prep",
                plan::gdn_prep_smem(dims),
            )?;
        }
        if ampere {
            for (k, kernel) in compile::KERNELS
                .iter()
                .filter_map(|k| plan::GemmKernel::of_name(k).map(|g| (k, g)))
                .filter(|(_, g)| wgmma || matches!(g, plan::GemmKernel::Int8 { .. }))
            {
                raise_dynamic_smem(&funcs[*k], k, kernel.smem_bytes())?;
            }
        }
        // Blocks of an attention launch a multiprocessor holds, its shared-memory limit raised
        // where it needs more than the default; `None` where a block passes the device's limit.
        let attn_blocks = |a: &plan::AttnLaunch| -> Result<Option<usize>> {
            let k = a.kernel;
            if a.smem_bytes + plan::ATTN_STATIC_SMEM > smem_limit.max(48 << 10) {
                return Ok(None);
            }
            if a.smem_bytes > 48 << 10 {
                raise_dynamic_smem(&funcs[k], k, a.smem_bytes)?;
            }
            occupancy(&funcs[k], k, a.threads, a.smem_bytes).map(Some)
        };
        // The attention-split variants this device can run (the tensor-core one from sm_80, each
        // within the per-block shared memory), their limits raised, and their blocks per SM.
        let mut attn_blocks_per_sm = HashMap::new();
        for (kv, tile) in [plan::KvCache::F16, plan::KvCache::Q8_0]
            .into_iter()
            .flat_map(|kv| plan::ATTN_TILES.map(|t| (kv, t)))
        {
            let a = plan::attn_split_launch(dims, kv, tile, attn_ring);
            if a.kernel.ends_with("_mma") && !ampere {
                continue;
            }
            if let Some(per_sm) = attn_blocks(&a)? {
                attn_blocks_per_sm.insert(a.kernel, per_sm);
            } else if a.kernel == "attn_split_mma" && attn_ring != plan::attn_ring(dims, smem_limit)
            {
                // A measured shape must run as asked, not as the SIMT split it would fall back to.
                return Err(CudaError::Unsupported(format!(
                    "the f16 tensor-core split with {} warps of {} stages needs {} bytes of shared \
                     memory a block, past this device's {smem_limit}",
                    attn_ring.mma_warps, attn_ring.mma_stages, a.smem_bytes
                )));
            }
        }
        // The query-tiled attention of multi-token passes (sm_80+) for each cache type whose
        // block fits, and how many of its blocks the device holds at once.
        let mut attn_prefill = Vec::new();
        let sms = info.multiprocessors.max(1) as usize;
        for kv in [plan::KvCache::F16, plan::KvCache::Q8_0] {
            let Some(a) = plan::attn_prefill_launch(dims, kv).filter(|_| ampere) else {
                continue;
            };
            if let Some(per_sm) = attn_blocks(&a.launch)? {
                attn_prefill.push((kv, a, per_sm * sms));
            }
        }
        // Every warpgroup entry's limits raised (the harness checks them all); passes take the
        // one `NIWAKI_CUDA_ATTN_PREFILL_WG_ENTRY` names.
        let mut attn_prefill_wg_forms = [None; plan::WgEntry::ALL.len()];
        for (form, entry) in attn_prefill_wg_forms.iter_mut().zip(plan::WgEntry::ALL) {
            if let Some(a) = plan::attn_prefill_wg_launch(dims, entry).filter(|_| wgmma) {
                *form = attn_blocks(&a.launch)?.map(|per_sm| (a, per_sm * sms));
            }
        }
        let mut attn_short = Vec::new();
        for kv in [plan::KvCache::F16, plan::KvCache::Q8_0] {
            if let Some(a) = plan::attn_short_launch(dims, kv, smem_limit.max(48 << 10)) {
                for k in [a.kernel.to_string(), format!("{}_p", a.kernel)] {
                    if a.smem_bytes > 48 << 10 {
                        raise_dynamic_smem(&funcs[k.as_str()], &k, a.smem_bytes)?;
                    }
                }
                attn_short.push((kv, a));
            }
        }
        if hopper {
            // The bulk-copy kernels: all the shared memory their static part leaves.
            for k in compile::KERNELS {
                let fixed = if k.starts_with("gemv_b1_") || k.starts_with("gemv_b2") {
                    plan::GEMV_B1_STATIC_SMEM
                } else if k.starts_with("gemv1_") || k.starts_with("gemv_chain_") {
                    plan::GEMV1_STATIC_SMEM
                } else if k == "pdl_copy" {
                    // The probe's blocks may take a decode GEMV's shared memory; its barrier
                    // is all it has beside.
                    1 << 10
                } else {
                    continue;
                };
                raise_dynamic_smem(&funcs[k], k, smem_limit.saturating_sub(fixed))?;
            }
        }
        let gemm_min_switch = knobs::number_set("NIWAKI_CUDA_GEMM_MIN_TOKENS");
        Ok(Gpu {
            ctx,
            stream,
            modules,
            trace_capacity,
            funcs,
            info,
            compile_secs,
            load_secs,
            device_code_parts,
            from_cache,
            pdl: AtomicBool::new(hopper && knobs::flag("NIWAKI_CUDA_PDL", true)),
            gemv1: AtomicBool::new(hopper && knobs::flag("NIWAKI_CUDA_GEMV1", true)),
            gemv1_nodot: AtomicBool::new(false),
            x_copy_launches: AtomicUsize::new(0),
            image_launches: AtomicUsize::new(0),
            fold_launches: AtomicUsize::new(0),
            swiglu_launches: AtomicUsize::new(0),
            cluster_fold_launches: AtomicUsize::new(0),
            skip,
            planes_launches: AtomicUsize::new(0),
            attn_short_launches: AtomicUsize::new(0),
            x_copy: AtomicUsize::new(match knobs::word("NIWAKI_CUDA_X_COPY").as_deref() {
                Some("0") => X_COPY_OFF,
                Some("all") => X_COPY_ALL,
                _ => X_COPY_PLAN,
            }),
            b1: AtomicBool::new(hopper && knobs::flag("NIWAKI_CUDA_B1", true)),
            b2: AtomicBool::new(hopper && knobs::flag("NIWAKI_CUDA_B2", true)),
            mma: AtomicBool::new(ampere && knobs::flag("NIWAKI_CUDA_MMA", true)),
            gemm_kernel: Mutex::new(None),
            gdn_chunked: AtomicBool::new(
                gdn_chunks_fit && knobs::flag("NIWAKI_CUDA_GDN_CHUNK", false),
            ),
            gdn_chunks_fit,
            gdn_rows: AtomicUsize::new(
                knobs::word("NIWAKI_CUDA_GDN_ROWS")
                    .and_then(|v| v.parse().ok())
                    .filter(|r| plan::GDN_STEP_ROWS.contains(r))
                    .unwrap_or(plan::GDN_STEP_DEFAULT_ROWS),
            ),
            swiglu_warps: knobs::word("NIWAKI_CUDA_SWIGLU_WARPS")
                .and_then(|v| v.parse().ok())
                .filter(|w| plan::SWIGLU_WARPS.contains(w))
                .unwrap_or(plan::SWIGLU_DECODE_WARPS),
            norm_fusion: Mutex::new(plan::NormFusion::from_setting(
                knobs::word("NIWAKI_CUDA_FUSE_NORM").as_deref(),
            )),
            fuse_gdn: AtomicBool::new(knobs::flag("NIWAKI_CUDA_FUSE_GDN", true)),
            fuse_attn: AtomicBool::new(knobs::flag("NIWAKI_CUDA_FUSE_ATTN", true)),
            fold_norm: AtomicBool::new(hopper && knobs::flag("NIWAKI_CUDA_FOLD_NORM", true)),
            fold_swiglu: AtomicBool::new(hopper && knobs::flag("NIWAKI_CUDA_FOLD_SWIGLU", false)),
            fold_cluster: AtomicU8::new(
                if hopper {
                    plan::ClusterFold::from_setting(knobs::flag_set("NIWAKI_CUDA_FOLD_CLUSTER"))
                } else {
                    plan::ClusterFold::Off
                }
                .code(),
            ),
            b1_planes: AtomicBool::new(
                hopper && knobs::flag("NIWAKI_CUDA_B1_PLANES", plan::B1_PLANES),
            ),
            topk: AtomicBool::new(knobs::flag("NIWAKI_CUDA_TOPK", true)),
            topk_sums: AtomicBool::new(knobs::flag("NIWAKI_CUDA_TOPK_SUMS", true)),
            attn_tile: AtomicUsize::new(
                knobs::word("NIWAKI_CUDA_ATTN_TILE")
                    .and_then(|v| v.parse().ok())
                    .filter(|&t| attn_tile_runs(t, ampere))
                    .unwrap_or(ATTN_TILE_BY_CACHE),
            ),
            attn_blocks_per_sm,
            attn_ring,
            attn_token_major: defines
                .iter()
                .any(|d| d == compile::ATTN_TOKEN_MAJOR_DEFINE),
            lane_pairs: defines.iter().any(|d| d == compile::LANE_PAIRS_DEFINE),
            attn_short,
            attn_prefill,
            attn_prefill_on: [
                knobs::flag("NIWAKI_CUDA_ATTN_PREFILL", plan::ATTN_PREFILL),
                knobs::flag("NIWAKI_CUDA_ATTN_PREFILL_Q8", plan::ATTN_PREFILL_Q8),
            ],
            attn_prefill_waves: knobs::number("NIWAKI_CUDA_ATTN_PREFILL_WAVES", 1).max(1),
            attn_prefill_rule: knobs::word("NIWAKI_CUDA_ATTN_PREFILL_SPLITS")
                .as_deref()
                .and_then(plan::SplitRule::named)
                .unwrap_or(plan::ATTN_PREFILL_SPLIT_RULE),
            attn_prefill_wg_forms,
            attn_prefill_wg_entry: knobs::word("NIWAKI_CUDA_ATTN_PREFILL_WG_ENTRY")
                .as_deref()
                .and_then(plan::WgEntry::named)
                .unwrap_or(plan::ATTN_PREFILL_WG_ENTRY),
            attn_prefill_wg_on: knobs::flag("NIWAKI_CUDA_ATTN_PREFILL_WG", plan::ATTN_PREFILL_WG),
            attn_decode_splits: knobs::number_set("NIWAKI_CUDA_ATTN_SPLITS"),
            gemm_splits: AtomicUsize::new(knobs::number("NIWAKI_CUDA_GEMM_SPLITS", 0)),
            // Measured on the H200 only: elsewhere off unless asked for.
            attn_short_max: AtomicUsize::new(knobs::number(
                "NIWAKI_CUDA_ATTN_SHORT",
                if hopper { plan::ATTN_SHORT_MAX } else { 0 },
            )),
            prefetch_bytes: AtomicUsize::new(if hopper {
                knobs::number_set("NIWAKI_CUDA_PREFETCH_MB").map_or(PREFETCH_BY_MATRIX, |mb| {
                    mb.saturating_mul(1 << 20).min(PREFETCH_BY_MATRIX - 1)
                })
            } else {
                0
            }),
            blocks_per_sm: AtomicUsize::new(0),
            gemv1_share: AtomicBool::new(knobs::flag(
                "NIWAKI_CUDA_GEMV1_SHARE",
                plan::SHARED_WIDE_ROWS,
            )),
            smem_budget: AtomicUsize::new(0),
            b1_knobs: (
                knobs::number("NIWAKI_CUDA_B1_BLOCKS", 0),
                knobs::number("NIWAKI_CUDA_B1_SMEM_KIB", 0) << 10,
            ),
            b1_min_tiles: knobs::number("NIWAKI_CUDA_B1_MIN_TILES", plan::B1_MIN_TILES_PER_SM),
            b1_tile_rows: AtomicUsize::new(
                match knobs::word("NIWAKI_CUDA_B1_TILE_ROWS").as_deref() {
                    Some("32") => 32,
                    Some("16") => 16,
                    _ => plan::B1_TILE_ROWS,
                },
            ),
            b1_x_stage: AtomicBool::new(knobs::flag("NIWAKI_CUDA_B1_X_STAGE", plan::B1_X_STAGE)),
            image_use: if hopper && knobs::flag("NIWAKI_CUDA_B1_IMAGE", true) {
                ImageUse::Taken
            } else {
                ImageUse::Off
            }
            .atomic(),
            early_tiles: AtomicUsize::new(knobs::number(
                "NIWAKI_CUDA_EARLY_TILES",
                plan::EARLY_TILES,
            )),
            short_pass_splits: knobs::flag(
                "NIWAKI_CUDA_SHORT_PASS_SPLITS",
                plan::SHORT_PASS_SPLITS_ON,
            ),
            hgemm_narrow: AtomicBool::new(knobs::flag(
                "NIWAKI_CUDA_HGEMM_NARROW",
                plan::HGEMM_NARROW,
            )),
            pdl_tokens: AtomicUsize::new(
                knobs::number("NIWAKI_CUDA_PDL_TOKENS", plan::PDL_TOKENS).max(1),
            ),
            gemm_min_tokens: AtomicUsize::new(
                gemm_min_switch.unwrap_or(plan::GEMM_MIN_TOKENS).max(2),
            ),
            gemm_min_tokens_switched: gemm_min_switch.is_some(),
            smem_limit,
        })
    }
}
