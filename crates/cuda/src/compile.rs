//! Kernel sources (kept in `kernels/`, embedded at build time), their run-time compilation by
//! NVRTC for the device's architecture, and an on-disk cache of the resulting PTX.

use std::path::{Path, PathBuf};

use crate::error::{CudaError, Result};

/// The kernel sources in the order they are concatenated.
pub const SOURCES: [(&str, &str); 15] = [
    ("common.cuh", include_str!("../kernels/common.cuh")),
    ("quant.cu", include_str!("../kernels/quant.cu")),
    // After quant.cu (the inverse rotation).
    ("embed.cu", include_str!("../kernels/embed.cu")),
    ("gemv.cu", include_str!("../kernels/gemv.cu")),
    // After gemv.cu (the fused norm, the L2 prefetch).
    ("gemv_b1.cu", include_str!("../kernels/gemv_b1.cu")),
    ("gemm.cu", include_str!("../kernels/gemm.cu")),
    ("hgemm.cu", include_str!("../kernels/hgemm.cu")),
    ("gdn.cu", include_str!("../kernels/gdn.cu")),
    ("gdn_chunk.cu", include_str!("../kernels/gdn_chunk.cu")),
    ("sync.cu", include_str!("../kernels/sync.cu")),
    ("topk.cu", include_str!("../kernels/topk.cu")),
    ("bandwidth.cu", include_str!("../kernels/bandwidth.cu")),
    // After gemv.cu (its chunk dot and staging) and sync.cu (the grid barrier).
    ("gemv_chain.cu", include_str!("../kernels/gemv_chain.cu")),
    ("attention.cu", include_str!("../kernels/attention.cu")),
    (
        "attention_mma.cu",
        include_str!("../kernels/attention_mma.cu"),
    ),
];

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

/// The whole program as one translation unit.
pub fn source() -> String {
    let mut s = String::new();
    for (name, text) in SOURCES {
        s.push_str(&format!("// ---- {name}\n"));
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

/// Compiles the program with NVRTC.
pub fn nvrtc_compile(arch: &str, defines: &[String]) -> Result<(String, bool)> {
    let src = source();
    let opts = options(arch, defines);
    let key = cache_key(&src, &opts);
    load_or_compile(cache_dir().as_deref(), &key, || {
        // SAFETY: only checks whether the shared library can be opened.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(CudaError::NoNvrtc("libnvrtc.so not found".into()));
        }
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(
            &src,
            cudarc::nvrtc::CompileOptions {
                options: opts.clone(),
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
    })
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
            let src = source();
            let mut defines = d.defines_for(ring);
            if trace {
                defines.push("-DNIWAKI_TRACE=16".into());
            }
            if evict_first {
                defines.push("-DWEIGHTS_EVICT_FIRST=1".into());
            }
            // sm_90a as an H100/H200 compiles them (with the warpgroup MMA of the f16 GEMM).
            let opts = options(arch, &defines);
            let ptx = cudarc::nvrtc::compile_ptx_with_opts(
                &src,
                cudarc::nvrtc::CompileOptions {
                    options: opts,
                    ..Default::default()
                },
            );
            match ptx {
                Ok(ptx) => {
                    let text = ptx.to_src();
                    if let Some(dir) = std::env::var_os("NIWAKI_PTX_DUMP") {
                        let _ = std::fs::write(
                            std::path::Path::new(&dir)
                                .join(format!("{p:?}-{ring}-{trace}-{arch}.ptx")),
                            &text,
                        );
                    }
                    for k in KERNELS {
                        assert!(
                            text.contains(&format!(".entry {k}(")),
                            "{k} missing from PTX"
                        );
                    }
                    assert_eq!(text.contains("niwaki_trace_n"), trace, "{p:?}: records");
                }
                Err(cudarc::nvrtc::CompileError::CompileError { log, .. }) => {
                    panic!("{p:?} {arch}: {}", log.to_string_lossy())
                }
                Err(e) => panic!("{e:?}"),
            }
        }
    }
}
