//! Kernel sources (kept in `kernels/`, embedded at build time), their run-time compilation by
//! NVRTC for the device's architecture (in parts side by side), and an on-disk cache of the
//! resulting PTX and device code.

use std::path::{Path, PathBuf};

use crate::error::{CudaError, Result};
use crate::plan::{self, Dims};

mod cache;
mod nvrtc;
mod program;
#[cfg(test)]
mod tests;

pub use cache::*;
pub use nvrtc::{gives_device_code, is_cubin, Compiled};
pub use program::*;

/// Whether the backend loads the device code NVRTC made with the PTX (`NIWAKI_CUDA_CUBIN`),
/// rather than the PTX for the driver to compile again at every start its own cache misses:
/// NVRTC assembles the device code anyway when compiling for a real architecture (`sm_90a`),
/// so keeping it costs nothing. On an H100 (driver 580.159.04, device code from NVRTC
/// 13.0.88), the 27B synthetic Q1_0 file's program loaded in 0.02 s against 4.72 s from its
/// PTX on a fresh host, and tg128 gave the same tokens at the same speed (433.3-433.5 against
/// 433.7 tok/s; Q2_0 295.8-296.1 against 296.0-296.2). A part whose device code the driver
/// refuses (one from a newer NVRTC) is loaded from its PTX, with a warning.
pub const LOAD_CUBIN: bool = true;

/// NVRTC options for an architecture (`sm_90`) and the model's shape defines.
pub fn options(arch: &str, defines: &[String]) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
    ];
    o.extend(defines.iter().cloned());
    o
}

/// The program's `-D` options for a model of `dims` on a device whose blocks may take
/// `smem_limit` bytes of shared memory: the model's shapes, the attention ring that fits, the
/// timeline records' capacity where asked (`trace_capacity`), the weights' L2 policy
/// (`NIWAKI_CUDA_WEIGHTS_L2`), the 1-bit GEMVs' ring order (`NIWAKI_CUDA_RING_LATE`,
/// [`plan::RING_LATE_Q1`]), the 2-bit GEMVs' MMA shape (`NIWAKI_CUDA_B2_K256`,
/// [`plan::B2_K256`]), the 1-bit GEMVs' MMA columns (`NIWAKI_CUDA_B1_GROUP_COLS`,
/// [`plan::B1_GROUP_COLS`]) and widths (`NIWAKI_CUDA_B1_CONST_CHUNKS`,
/// [`plan::B1_CONST_CHUNKS`]), the 2-bit GEMVs' scale pairs (`NIWAKI_CUDA_LANE_PAIRS`,
/// [`plan::LANE_PAIRS`]), the dp4a shared-lanes GEMVs' chunks a lane at a time
/// (`NIWAKI_CUDA_SHARE_UNROLL`, [`plan::SHARE_UNROLL`]), the split attention's grid order
/// (`NIWAKI_CUDA_ATTN_TOKEN_MAJOR`, [`plan::ATTN_TOKEN_MAJOR`]) and a measurement's ablation
/// (`NIWAKI_CUDA_ABLATE`). What the backend compiles at start and [`precompile`] ahead.
pub fn program_defines(dims: &Dims, smem_limit: usize, trace_capacity: usize) -> Vec<String> {
    let mut defines = dims.defines_for(attn_ring(dims, smem_limit));
    if let Some(late) = crate::knobs::flag_set("NIWAKI_CUDA_RING_LATE") {
        set_define(&mut defines, "RING_LATE_Q1", u8::from(late));
    }
    if let Some(n) = crate::knobs::word("NIWAKI_CUDA_SHARE_UNROLL") {
        set_define(&mut defines, "SHARE_UNROLL", n);
    }
    if trace_capacity > 0 {
        defines.push(format!("-DNIWAKI_TRACE={trace_capacity}"));
    }
    if plan::weights_evict_first(crate::knobs::word("NIWAKI_CUDA_WEIGHTS_L2").as_deref()) {
        defines.push("-DWEIGHTS_EVICT_FIRST=1".into());
    }
    if crate::knobs::flag("NIWAKI_CUDA_B2_K256", plan::B2_K256) {
        defines.push("-DB2_K256=1".into());
    }
    if crate::knobs::flag("NIWAKI_CUDA_B1_GROUP_COLS", plan::B1_GROUP_COLS) {
        defines.push("-DB1_GROUP_COLS=1".into());
    }
    if crate::knobs::flag("NIWAKI_CUDA_B1_CONST_CHUNKS", plan::B1_CONST_CHUNKS) {
        defines.push("-DB1_CONST_CHUNKS=1".into());
    }
    if crate::knobs::flag("NIWAKI_CUDA_LANE_PAIRS", plan::LANE_PAIRS) {
        defines.push(LANE_PAIRS_DEFINE.into());
    }
    if attn_token_major() {
        defines.push(ATTN_TOKEN_MAJOR_DEFINE.into());
    }
    if let Some(what) = ablation() {
        defines.push(format!("-DABLATE_{}=1", what.to_uppercase()));
    }
    defines
}

/// The split attention's staging on a device with `smem_limit` bytes of shared memory a
/// block: the plan's for it ([`plan::attn_ring`]), the f16 tensor-core split's warps, stages
/// and prefetch distance as a measurement sets them (`NIWAKI_CUDA_ATTN_MMA_WARPS`, `_STAGES`,
/// `_PREFETCH`). What the program is compiled for and the backend launches with.
pub fn attn_ring(dims: &Dims, smem_limit: usize) -> plan::AttnRing {
    let mut ring = plan::attn_ring(dims, smem_limit);
    let number = |name| crate::knobs::word(name).and_then(|w| w.parse::<usize>().ok());
    if let Some(w) = number("NIWAKI_CUDA_ATTN_MMA_WARPS") {
        ring.mma_warps = w;
    }
    if let Some(s) = number("NIWAKI_CUDA_ATTN_MMA_STAGES") {
        ring.mma_stages = s;
    }
    if let Some(p) = number("NIWAKI_CUDA_ATTN_MMA_PREFETCH") {
        ring.mma_prefetch = p;
    }
    ring
}

/// A switch's value in place of the plan's for the define `name` ([`Dims::defines_for`]).
fn set_define(defines: &mut [String], name: &str, value: impl std::fmt::Display) {
    let prefix = format!("-D{name}=");
    for d in defines.iter_mut().filter(|d| d.starts_with(&prefix)) {
        *d = format!("{prefix}{value}");
    }
}

/// The define of a program whose split kernels take their tokens before their splits: the
/// backend launches them so where its program has it.
pub const ATTN_TOKEN_MAJOR_DEFINE: &str = "-DATTN_TOKEN_MAJOR=1";

/// The define of a program whose 2-bit binary GEMVs read their scale pairs by lane
/// ([`plan::LANE_PAIRS`]): the backend plans their shared memory so where its program has it
/// ([`plan::lane_paired`]).
pub const LANE_PAIRS_DEFINE: &str = "-DLANE_PAIRS=1";

/// Whether the split kernels are compiled with their tokens before their splits
/// (`NIWAKI_CUDA_ATTN_TOKEN_MAJOR`, [`plan::ATTN_TOKEN_MAJOR`]).
fn attn_token_major() -> bool {
    crate::knobs::flag("NIWAKI_CUDA_ATTN_TOKEN_MAJOR", plan::ATTN_TOKEN_MAJOR)
}

/// The part of the kernels' work a measurement takes out (`NIWAKI_CUDA_ABLATE`), where set.
pub fn ablation() -> Option<String> {
    crate::knobs::word("NIWAKI_CUDA_ABLATE").filter(|w| !w.is_empty())
}

/// The most shared memory a block may opt into on the devices of architecture `arch`, as the
/// backend names it ([`crate::DeviceInfo::arch`]: `sm_90a` for the H100 and H200), from the
/// CUDA programming guide's table of compute capabilities; `None` for one it does not list.
pub fn smem_limit_of(arch: &str) -> Option<usize> {
    let kib = match arch.trim_end_matches('a') {
        "sm_70" | "sm_72" => 96,
        "sm_75" => 64,
        "sm_80" | "sm_87" => 163,
        "sm_86" | "sm_89" | "sm_120" | "sm_121" => 99,
        "sm_90" | "sm_100" | "sm_103" => 227,
        _ => return None,
    };
    Some(kib << 10)
}

/// What [`precompile`] left: the cache folder, the parts, how many of them hold device code
/// (for a real architecture, all but those cached before it was kept) and whether every one
/// was already there.
#[derive(Debug)]
pub struct Precompiled {
    pub dir: PathBuf,
    pub parts: usize,
    pub device_code: usize,
    pub cached: bool,
}

/// Compiles the program for a model of `dims` on devices of architecture `arch` with
/// `smem_limit` bytes of shared memory a block into the on-disk cache, as the backend would at
/// its start there (no GPU needed, NVRTC is): a GPU host whose cache holds it then starts
/// without compiling, and without NVRTC. With `NIWAKI_CUDA_TRACE` set, the program with the
/// timeline records the backend then compiles (whole, one part).
pub fn precompile(dims: &Dims, arch: &str, smem_limit: usize) -> Result<Precompiled> {
    let dir = cache_dir().ok_or_else(|| {
        CudaError::Unsupported("no cache folder: set NIWAKI_CUDA_CACHE or HOME".into())
    })?;
    let trace = crate::gpu::trace_capacity_from_env();
    // The cache is filled for a GPU host to load as it is: with the device code.
    // Its caller says what it compiles (`niwaki kernels`): nothing to announce.
    let (parts, cached) = nvrtc_compile(
        arch,
        &program_defines(dims, smem_limit, trace),
        trace == 0,
        true,
        &|| {},
    )?;
    Ok(Precompiled {
        dir,
        parts: parts.len(),
        device_code: parts.iter().filter(|p| p.cubin.is_some()).count(),
        cached,
    })
}

/// Compiles the program with NVRTC for `arch`, in [`PARTS`] side by side where `split` (else
/// whole), each through the on-disk cache: the parts, and whether every one came from the
/// cache. With `device_code`, a cached part without its device code is compiled again for it
/// where NVRTC can make it ([`load_or_compile`]'s `refill`). `announce` as [`compile_all`]'s.
pub fn nvrtc_compile(
    arch: &str,
    defines: &[String],
    split: bool,
    device_code: bool,
    announce: &(dyn Fn() + Sync),
) -> Result<(Vec<Compiled>, bool)> {
    let compiled = compile_all(
        arch,
        &sources(split),
        &options(arch, defines),
        cache_dir().as_deref(),
        device_code && gives_device_code(arch),
        announce,
    )?;
    let cached = compiled.iter().all(|(_, c)| *c);
    Ok((compiled.into_iter().map(|(p, _)| p).collect(), cached))
}

/// The program's sources: its [`PARTS`] where `split`, else the whole.
fn sources(split: bool) -> Vec<String> {
    if split {
        (0..PARTS).map(source_part).collect()
    } else {
        vec![source()]
    }
}

/// For each of [`KERNELS`], the index of the one PTX of `ptxs` (a program's parts) that emits
/// it; an error naming every kernel that none or several emit.
pub fn kernel_parts<S: AsRef<str>>(ptxs: &[S]) -> Result<Vec<usize>> {
    let mut parts: std::collections::HashMap<&str, Vec<usize>> = Default::default();
    for (i, ptx) in ptxs.iter().enumerate() {
        let ptx = ptx.as_ref();
        for (at, entry) in ptx.match_indices(".entry ") {
            if let Some((name, _)) = ptx[at + entry.len()..].split_once('(') {
                parts.entry(name).or_default().push(i);
            }
        }
    }
    let mut misplaced = Vec::new();
    let found = KERNELS
        .iter()
        .filter_map(|k| match parts.get(k).map(Vec::as_slice) {
            Some(&[i]) => Some(i),
            other => {
                misplaced.push(format!("{k} in {} parts", other.map_or(0, <[usize]>::len)));
                None
            }
        })
        .collect();
    if misplaced.is_empty() {
        Ok(found)
    } else {
        Err(CudaError::Unsupported(format!(
            "the compiled program's parts do not hold each kernel once: {}",
            misplaced.join(", ")
        )))
    }
}

/// Compiles `sources` with `opts` side by side, each through the cache in `dir` (none: no
/// cache; `refill` as [`load_or_compile`]'s): each compiled and whether it came from the
/// cache, in order. `announce` is called before each part the cache does not give (a compile
/// takes seconds), from the compiling threads.
pub fn compile_all(
    arch: &str,
    sources: &[String],
    opts: &[String],
    dir: Option<&Path>,
    refill: bool,
    announce: &(dyn Fn() + Sync),
) -> Result<Vec<(Compiled, bool)>> {
    std::thread::scope(|scope| {
        let running: Vec<_> = sources
            .iter()
            .map(|src| {
                scope.spawn(move || {
                    load_or_compile(dir, &cache_key(src, opts), refill, || {
                        announce();
                        nvrtc::compile(arch, src, opts)
                    })
                })
            })
            .collect();
        running
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}
