//! Kernel sources (kept in `kernels/`, embedded at build time), their run-time compilation by
//! NVRTC for the device's architecture (in parts side by side), and an on-disk cache of the
//! resulting PTX.

use std::path::{Path, PathBuf};

use crate::error::{CudaError, Result};
use crate::plan::{self, Dims};

/// The kernel sources in the order they are concatenated, each with the part of the program
/// whose compilation emits its kernels ([`PARTS`]).
pub const SOURCES: [(&str, &str, usize); 15] = [
    ("common.cuh", include_str!("../kernels/common.cuh"), 0),
    ("quant.cu", include_str!("../kernels/quant.cu"), 0),
    // After quant.cu (the inverse rotation).
    ("embed.cu", include_str!("../kernels/embed.cu"), 0),
    ("gemv.cu", include_str!("../kernels/gemv.cu"), 1),
    // After gemv.cu (the fused norm, the L2 prefetch).
    ("gemv_b1.cu", include_str!("../kernels/gemv_b1.cu"), 2),
    ("gemm.cu", include_str!("../kernels/gemm.cu"), 3),
    ("hgemm.cu", include_str!("../kernels/hgemm.cu"), 3),
    ("gdn.cu", include_str!("../kernels/gdn.cu"), 0),
    ("gdn_chunk.cu", include_str!("../kernels/gdn_chunk.cu"), 4),
    ("sync.cu", include_str!("../kernels/sync.cu"), 0),
    ("topk.cu", include_str!("../kernels/topk.cu"), 0),
    ("bandwidth.cu", include_str!("../kernels/bandwidth.cu"), 0),
    // After gemv.cu (its chunk dot and staging) and sync.cu (the grid barrier).
    ("gemv_chain.cu", include_str!("../kernels/gemv_chain.cu"), 1),
    ("attention.cu", include_str!("../kernels/attention.cu"), 0),
    (
        "attention_mma.cu",
        include_str!("../kernels/attention_mma.cu"),
        0,
    ),
];

/// Parts in which the program is compiled, one NVRTC call each, side by side on threads of
/// their own. Every part parses the whole program, so that each file's helpers stay where they
/// are, but emits only the kernels of its own files: the others' entries (`ENTRY`) are function
/// templates never instantiated. NVRTC took 23.7 s for the whole 27B program on one core of the
/// development machine: 6.3 s of it for gemv.cu's kernels, 6.6 for gemv_b1.cu's, 4.6 for the
/// GEMMs', 3.7 for the chunked recurrence's and 3.3 for the rest, which are the parts.
pub const PARTS: usize = 5;

/// Every kernel the backend launches.
pub const KERNELS: [&str; 96] = [
    "read_sum",
    "quant_rms",
    "quant_swiglu",
    "quant_gated",
    "quant_plain",
    "fill_u64",
    "gemv_q1_t1",
    "gemv_q1_t8",
    "gemv_q2g64_t1",
    "gemv_q2g64_t8",
    "gemv_q2g128_t1",
    "gemv_q2g128_t8",
    "gemv1_q1_r1",
    "gemv1_q1_r2",
    "gemv1_q2g64_r1",
    "gemv1_q2g64_r2",
    "gemv1_q2g128_r1",
    "gemv1_q2g128_r2",
    "gemv1_q1_r1_x",
    "gemv1_q1_r2_x",
    "gemv1_q2g64_r1_x",
    "gemv1_q2g64_r2_x",
    "gemv1_q2g128_r1_x",
    "gemv1_q2g128_r2_x",
    "gemv1_q1_r1_nodot",
    "gemv1_q1_r2_nodot",
    "gemv1_q2g64_r1_nodot",
    "gemv1_q2g64_r2_nodot",
    "gemv_b1_j5x",
    "gemv_b1_j6x",
    "gemv_b1_j6",
    "gemv_b1_j17x",
    "gemv_b1_j17",
    "gemv_b1_j5x_r32",
    "gemv_b1_j6x_r32",
    "gemv_b1_j5x_n",
    "gemv_b1_j6x_n",
    "gemv_b1_j6_n",
    "gemv_b1_j5x_r32_n",
    "gemv_b1_j6x_r32_n",
    "gemv_b2g64_j10x",
    "gemv_b2g64_j12x",
    "gemv_b2g64_j12",
    "gemv_b2g128_j10x",
    "gemv_b2g128_j12x",
    "gemv_b2g128_j12",
    "gemv_b2g64_j34x_h2",
    "gemv_b2g128_j34x_h2",
    "gemv_b1_j6x_c",
    "gemv_b1_j6_c",
    "gemv_b2g64_j12x_c",
    "gemv_b2g64_j12_c",
    "gemv_b2g128_j12x_c",
    "gemv_b2g128_j12_c",
    "gemv_chain_q1",
    "gemv_chain_q2g64",
    "gemv_chain_q1_nodot",
    "gemv_chain_q2g64_nodot",
    "gemm_q1_m1",
    "gemm_q1_m2",
    "gemm_q2g64_m1",
    "gemm_q2g64_m2",
    "gemm_q2g128_m1",
    "gemm_q2g128_m2",
    "gemm_reduce",
    "hgemm_q1_w3",
    "hgemm_q1_w4",
    "hgemm_q2g64_w3",
    "hgemm_q2g64_w4",
    "hgemm_q2g128_w3",
    "hgemm_q2g128_w4",
    "embed_row",
    "gdn_conv",
    "gdn_prep",
    "gdn_chunk_prep",
    "gdn_chunk_scan",
    "gdn_step_r32",
    "gdn_step_r16",
    "gdn_step_r8",
    "gdn_decode",
    "grid_barrier_rounds",
    "topk_logits",
    "topk_keys",
    "weight_chunks",
    "weight_total",
    "attn_prep",
    "attn_prep_q8",
    "attn_split_t4",
    "attn_split_q8_t4",
    "attn_split_t8",
    "attn_split_q8_t8",
    "attn_split_mma",
    "attn_split_q8_mma",
    "attn_combine",
    "attn_combine_quant",
    "attn_combine_rows",
];

/// The whole program as one translation unit, every kernel emitted.
pub fn source() -> String {
    assemble(None)
}

/// The program with only the kernels of part `part`'s files emitted.
pub fn source_part(part: usize) -> String {
    assemble(Some(part))
}

/// Each file after the definition of its kernels' entry: `extern "C"` where they are emitted, a
/// template parameter list (parsed, never instantiated) where they are not.
fn assemble(part: Option<usize>) -> String {
    let mut s = String::new();
    for (name, text, p) in SOURCES {
        let entry = if part.is_none_or(|k| k == p) {
            "extern \"C\""
        } else {
            "template <int>"
        };
        s.push_str(&format!(
            "// ---- {name}\n#undef ENTRY\n#define ENTRY {entry}\n"
        ));
        s.push_str(text);
        s.push('\n');
    }
    s
}

/// NVRTC options for an architecture (`sm_90`) and the model's shape defines.
pub fn options(arch: &str, defines: &[String]) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
    ];
    o.extend(defines.iter().cloned());
    o
}

/// FNV-1a of the source and options: the cache file name.
pub fn cache_key(src: &str, opts: &[String]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in src
        .bytes()
        .chain(opts.iter().flat_map(|o| o.bytes().chain([0u8])))
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    format!("{h:016x}")
}

/// `$NIWAKI_CUDA_CACHE`, else `$XDG_CACHE_HOME/niwaki/cuda`, else `~/.cache/niwaki/cuda`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("NIWAKI_CUDA_CACHE") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("niwaki/cuda"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/niwaki/cuda"))
}

/// Returns the cached PTX for `key` or compiles it and stores it (a cache that cannot be written
/// is not an error). The flag says whether it came from the cache.
pub fn load_or_compile(
    dir: Option<&Path>,
    key: &str,
    compile: impl FnOnce() -> Result<String>,
) -> Result<(String, bool)> {
    let path = dir.map(|d| d.join(format!("{key}.ptx")));
    if let Some(p) = &path {
        if let Ok(ptx) = std::fs::read_to_string(p) {
            if ptx.contains(".entry") {
                return Ok((ptx, true));
            }
        }
    }
    let ptx = compile()?;
    if let Some(p) = &path {
        if let Some(parent) = p.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &ptx).is_ok() {
            let _ = std::fs::rename(&tmp, p);
        }
    }
    Ok((ptx, false))
}

/// The program's `-D` options for a model of `dims` on a device whose blocks may take
/// `smem_limit` bytes of shared memory: the model's shapes, the attention ring that fits, the
/// timeline records' capacity where asked (`trace_capacity`), and the weights' L2 policy
/// (`NIWAKI_CUDA_WEIGHTS_L2`). What the backend compiles at start and [`precompile`] ahead.
pub fn program_defines(dims: &Dims, smem_limit: usize, trace_capacity: usize) -> Vec<String> {
    let mut defines = dims.defines_for(plan::attn_ring_positions(dims, smem_limit));
    if trace_capacity > 0 {
        defines.push(format!("-DNIWAKI_TRACE={trace_capacity}"));
    }
    if plan::weights_evict_first(std::env::var("NIWAKI_CUDA_WEIGHTS_L2").ok().as_deref()) {
        defines.push("-DWEIGHTS_EVICT_FIRST=1".into());
    }
    defines
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

/// What [`precompile`] left: the cache folder, the parts and whether every one was already there.
#[derive(Debug)]
pub struct Precompiled {
    pub dir: PathBuf,
    pub parts: usize,
    pub cached: bool,
}

/// Compiles the program for a model of `dims` on devices of architecture `arch` with
/// `smem_limit` bytes of shared memory a block into the on-disk cache, as the backend would at
/// its start there (no GPU needed, NVRTC is): a GPU host whose cache holds it then starts
/// without compiling, and without NVRTC.
pub fn precompile(dims: &Dims, arch: &str, smem_limit: usize) -> Result<Precompiled> {
    let dir = cache_dir().ok_or_else(|| {
        CudaError::Unsupported("no cache folder: set NIWAKI_CUDA_CACHE or HOME".into())
    })?;
    let (ptx, cached) = nvrtc_compile(arch, &program_defines(dims, smem_limit, 0), true)?;
    Ok(Precompiled {
        dir,
        parts: ptx.len(),
        cached,
    })
}

/// Compiles the program with NVRTC for `arch`, in [`PARTS`] side by side where `split` (else
/// whole), each through the on-disk cache: the parts' PTX, and whether every one came from the
/// cache.
pub fn nvrtc_compile(arch: &str, defines: &[String], split: bool) -> Result<(Vec<String>, bool)> {
    let sources: Vec<String> = if split {
        (0..PARTS).map(source_part).collect()
    } else {
        vec![source()]
    };
    let compiled = compile_all(
        arch,
        &sources,
        &options(arch, defines),
        cache_dir().as_deref(),
    )?;
    let cached = compiled.iter().all(|(_, c)| *c);
    Ok((compiled.into_iter().map(|(p, _)| p).collect(), cached))
}

/// Whether `ptx` emits kernel `k`.
pub fn emits(ptx: &str, k: &str) -> bool {
    ptx.contains(&format!(".entry {k}("))
}

/// Compiles `sources` with `opts` side by side, each through the cache in `dir` (none: no
/// cache): their PTX and whether each came from the cache, in order.
pub fn compile_all(
    arch: &str,
    sources: &[String],
    opts: &[String],
    dir: Option<&Path>,
) -> Result<Vec<(String, bool)>> {
    std::thread::scope(|scope| {
        let running: Vec<_> = sources
            .iter()
            .map(|src| {
                scope.spawn(move || {
                    load_or_compile(dir, &cache_key(src, opts), || compile_ptx(arch, src, opts))
                })
            })
            .collect();
        running
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// One NVRTC compilation of `src` to PTX.
fn compile_ptx(arch: &str, src: &str, opts: &[String]) -> Result<String> {
    // SAFETY: only checks whether the shared library can be opened.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaError::NoNvrtc("libnvrtc.so not found".into()));
    }
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(
        src,
        cudarc::nvrtc::CompileOptions {
            options: opts.to_vec(),
            name: Some("niwaki.cu".into()),
            ..Default::default()
        },
    )
    .map_err(|e| CudaError::Compile {
        arch: arch.to_string(),
        log: match e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                log.to_string_lossy().into_owned()
            }
            other => format!("{other:?}"),
        },
    })?;
    Ok(ptx.to_src())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_launched_kernel_is_defined_in_the_sources() {
        let src = source();
        for k in KERNELS {
            assert!(
                src.contains(&format!("{k}(")) || src.contains(&format!("KERNEL({k},")),
                "{k}"
            );
        }
        assert!(!src.contains("#include"), "NVRTC gets no system headers");
    }

    #[test]
    fn each_part_emits_the_kernels_of_its_own_files() {
        for k in 0..PARTS {
            assert!(SOURCES.iter().any(|(_, _, p)| *p == k), "part {k} is empty");
            let src = source_part(k);
            for (name, _, p) in SOURCES {
                let head = format!("// ---- {name}\n#undef ENTRY\n#define ENTRY ");
                let at = src.find(&head).expect("every file is in every part") + head.len();
                let emitted = src[at..].starts_with("extern \"C\"\n");
                assert_eq!(emitted, p == k, "{name} in part {k}");
                assert!(emitted || src[at..].starts_with("template <int>\n"));
            }
            assert_ne!(cache_key(&src, &[]), cache_key(&source(), &[]));
        }
        assert!(SOURCES.iter().all(|(_, _, p)| *p < PARTS));
        // Entries are only ever spelled through ENTRY.
        assert!(SOURCES
            .iter()
            .all(|(_, text, _)| !text.contains("extern \"C\" __global__")));
        assert_eq!(
            source().matches("#define ENTRY extern \"C\"\n").count(),
            SOURCES.len()
        );
    }

    #[test]
    fn an_architecture_gives_its_blocks_shared_memory_and_the_defines_follow_it() {
        assert_eq!(smem_limit_of("sm_90a"), Some(227 << 10));
        assert_eq!(smem_limit_of("sm_90"), Some(227 << 10));
        assert_eq!(smem_limit_of("sm_80"), Some(163 << 10));
        assert_eq!(smem_limit_of("sm_89"), Some(99 << 10));
        assert_eq!(smem_limit_of("sm_77"), None);
        let d = crate::plan::tests::dims(model::synth::Preset::B27);
        let ring = |smem| format!("-DARING={}", plan::attn_ring_positions(&d, smem));
        for smem in [227 << 10, 64 << 10] {
            let defines = program_defines(&d, smem, 0);
            assert!(defines.contains(&ring(smem)), "{defines:?}");
            assert!(!defines.iter().any(|x| x.starts_with("-DNIWAKI_TRACE")));
        }
        assert_ne!(ring(227 << 10), ring(64 << 10));
        assert!(program_defines(&d, 227 << 10, 16).contains(&"-DNIWAKI_TRACE=16".to_string()));
    }

    #[test]
    fn the_cache_key_follows_source_and_options() {
        let a = cache_key("x", &options("sm_90", &["-DHD=256".into()]));
        let b = cache_key("x", &options("sm_90", &["-DHD=128".into()]));
        let c = cache_key("y", &options("sm_90", &["-DHD=256".into()]));
        let d = cache_key("x", &options("sm_80", &["-DHD=256".into()]));
        assert!(a != b && a != c && a != d);
        assert_eq!(a, cache_key("x", &options("sm_90", &["-DHD=256".into()])));
    }

    #[test]
    fn compiled_ptx_is_cached_on_disk_and_reused() {
        let dir = std::env::temp_dir().join(format!("niwaki-cuda-test-{}", std::process::id()));
        let ptx = ".version 8.0\n.entry k()\n".to_string();
        let (got, cached) = load_or_compile(Some(&dir), "k1", || Ok(ptx.clone())).unwrap();
        assert_eq!((got.as_str(), cached), (ptx.as_str(), false));
        let (got, cached) =
            load_or_compile(Some(&dir), "k1", || panic!("must come from the cache")).unwrap();
        assert_eq!((got.as_str(), cached), (ptx.as_str(), true));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_compile_error_is_passed_through_without_caching() {
        let dir = std::env::temp_dir().join(format!("niwaki-cuda-err-{}", std::process::id()));
        let err = load_or_compile(Some(&dir), "bad", || {
            Err(CudaError::Compile {
                arch: "sm_90".into(),
                log: "boom".into(),
            })
        })
        .unwrap_err();
        assert!(err.to_string().contains("boom"));
        assert!(!dir.join("bad.ptx").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Compiles the real sources when NVRTC can be loaded (no GPU needed); skipped otherwise.
    #[test]
    fn the_kernels_compile_for_hopper_when_nvrtc_is_present() {
        // SAFETY: only checks whether the library can be opened.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("NVRTC not found: compile check skipped");
            return;
        }
        use crate::plan::{ATTN_RING_POSITIONS, ATTN_RING_POSITIONS_SMALL, WEIGHTS_EVICT_FIRST};
        use model::synth::Preset;
        // The 27B shapes also with the small attention ring (devices of 64 KiB per block); the
        // tiny ones with and without the timeline records (`NIWAKI_CUDA_TRACE`) and the weights'
        // evict-first copies (`NIWAKI_CUDA_WEIGHTS_L2`), the others with the default policy; and
        // the 27B's for an sm_80 device (no Hopper instructions, no clusters), where the
        // backend runs too.
        let policy = WEIGHTS_EVICT_FIRST;
        for (p, ring, trace, evict_first, arch) in [
            (Preset::Tiny, ATTN_RING_POSITIONS, false, false, "sm_90a"),
            (Preset::Tiny, ATTN_RING_POSITIONS, true, true, "sm_90a"),
            (Preset::Small, ATTN_RING_POSITIONS, false, policy, "sm_90a"),
            (Preset::B27, ATTN_RING_POSITIONS, false, policy, "sm_90a"),
            (
                Preset::B27,
                ATTN_RING_POSITIONS_SMALL,
                false,
                policy,
                "sm_90a",
            ),
            (
                Preset::B27,
                ATTN_RING_POSITIONS_SMALL,
                false,
                policy,
                "sm_80",
            ),
        ] {
            let d = crate::plan::tests::dims(p);
            let mut defines = d.defines_for(ring);
            if trace {
                defines.push("-DNIWAKI_TRACE=16".into());
            }
            if evict_first {
                defines.push("-DWEIGHTS_EVICT_FIRST=1".into());
            }
            // sm_90a as an H100/H200 compiles them (with the warpgroup MMA of the f16 GEMM).
            // The 27B's first in parts, as the backend compiles it, the others whole.
            let split = p == Preset::B27 && ring == ATTN_RING_POSITIONS;
            let sources: Vec<String> = if split {
                (0..PARTS).map(source_part).collect()
            } else {
                vec![source()]
            };
            let texts: Vec<String> =
                match compile_all(arch, &sources, &options(arch, &defines), None) {
                    Ok(c) => c.into_iter().map(|(text, _)| text).collect(),
                    Err(e) => panic!("{p:?} {arch}: {e}"),
                };
            for (i, text) in texts.iter().enumerate() {
                if let Some(dir) = std::env::var_os("NIWAKI_PTX_DUMP") {
                    let _ = std::fs::write(
                        std::path::Path::new(&dir)
                            .join(format!("{p:?}-{ring}-{trace}-{arch}-{i}.ptx")),
                        text,
                    );
                }
                assert_eq!(text.contains("niwaki_trace_n"), trace, "{p:?}: records");
            }
            // Every kernel emitted once.
            for k in KERNELS {
                let n = texts.iter().filter(|t| emits(t, k)).count();
                assert_eq!(n, 1, "{k} in {n} of {p:?}'s {} parts", texts.len());
            }
        }
    }
}
