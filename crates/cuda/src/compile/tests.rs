//! The compilation's unit tests (NVRTC's only where it can be loaded).

use super::*;

#[test]
fn every_launched_kernel_is_defined_in_the_sources() {
    let src = source();
    // A name the 2-bit binary kernels' list pastes (`K(stem##SFX, …)` in `GEMV_B2_KERNELS`,
    // instantiated as `GEMV_B2_KERNELS(<macro>, sfx)`) counts too.
    let list = src
        .split("#define GEMV_B2_KERNELS(K, SFX)")
        .nth(1)
        .and_then(|rest| rest.split("\n#define").next())
        .unwrap_or("");
    let pasted = |k: &str| {
        (0..=k.len()).any(|i| {
            let (stem, sfx) = k.split_at(i);
            let instantiated = src.lines().any(|l| {
                l.starts_with("GEMV_B2_KERNELS(") && l.trim_end().ends_with(&format!(", {sfx})"))
            });
            list.contains(&format!("K({stem}##SFX,")) && instantiated
        })
    };
    for k in KERNELS {
        assert!(
            src.contains(&format!("{k}(")) || src.contains(&format!("KERNEL({k},")) || pasted(k),
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
        // Defines a switch may set (the 1-bit GEMVs' ring order, the shared-lanes GEMVs'
        // chunks a lane at a time): one each, the plan's unless the switch says otherwise.
        for (name, knob, plan_value) in [
            (
                "RING_LATE_Q1",
                "NIWAKI_CUDA_RING_LATE",
                usize::from(plan::RING_LATE_Q1),
            ),
            (
                "SHARE_UNROLL",
                "NIWAKI_CUDA_SHARE_UNROLL",
                plan::SHARE_UNROLL,
            ),
        ] {
            let prefix = format!("-D{name}=");
            let got: Vec<_> = defines.iter().filter(|x| x.starts_with(&prefix)).collect();
            assert_eq!(got.len(), 1, "{defines:?}");
            if std::env::var_os(knob).is_none() {
                assert_eq!(got[0], &format!("{prefix}{plan_value}"));
            }
        }
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

/// A compiled part of one kernel's PTX, with `cubin` as its device code.
fn part(cubin: Option<&[u8]>) -> Compiled {
    Compiled {
        ptx: ".version 8.0\n.entry k()\n".to_string(),
        cubin: cubin.map(<[u8]>::to_vec),
    }
}

/// Device code as far as the cache can tell (an ELF image's magic number).
const ELF: &[u8] = b"\x7fELF device code";

#[test]
fn compiled_ptx_is_cached_on_disk_and_reused() {
    let dir = std::env::temp_dir().join(format!("niwaki-cuda-test-{}", std::process::id()));
    let elf = ELF;
    // With device code: both come back from the cache.
    let (got, cached) = load_or_compile(Some(&dir), "k1", true, || Ok(part(Some(elf)))).unwrap();
    assert_eq!((got, cached), (part(Some(elf)), false));
    let (got, cached) = load_or_compile(Some(&dir), "k1", true, || {
        panic!("must come from the cache")
    })
    .unwrap();
    assert_eq!((got, cached), (part(Some(elf)), true));
    // Without (a virtual architecture): the PTX alone.
    load_or_compile(Some(&dir), "k2", false, || Ok(part(None))).unwrap();
    assert!(!dir.join("k2.cubin").exists());
    let (got, _) = load_or_compile(Some(&dir), "k2", false, || panic!("cached")).unwrap();
    assert_eq!(got, part(None));
    // A device-code file that is no ELF image is not taken for one.
    std::fs::write(dir.join("k2.cubin"), b"not device code").unwrap();
    let (got, _) = load_or_compile(Some(&dir), "k2", false, || panic!("cached")).unwrap();
    assert_eq!(got, part(None));
    // No temporary file is left behind.
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.contains(".tmp")), "{names:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_cached_ptx_without_device_code_is_refilled_only_when_asked_and_possible() {
    let dir = std::env::temp_dir().join(format!("niwaki-cuda-refill-{}", std::process::id()));
    let elf = ELF;
    // A cache written before the device code was kept: the PTX alone.
    load_or_compile(Some(&dir), "k", false, || Ok(part(None))).unwrap();
    // Not asked for: the PTX, without compiling.
    let (got, cached) = load_or_compile(Some(&dir), "k", false, || panic!("cached")).unwrap();
    assert_eq!((got, cached), (part(None), true));
    // Asked for where NVRTC is missing, or gives none: still the cached PTX.
    let (got, cached) = load_or_compile(Some(&dir), "k", true, || {
        Err(CudaError::NoNvrtc("libnvrtc.so not found".into()))
    })
    .unwrap();
    assert_eq!((got, cached), (part(None), true));
    let (got, cached) = load_or_compile(Some(&dir), "k", true, || Ok(part(None))).unwrap();
    assert_eq!((got, cached), (part(None), true));
    assert!(!dir.join("k.cubin").exists());
    // Asked for and made: compiled once, stored, and from the cache after.
    let (got, cached) = load_or_compile(Some(&dir), "k", true, || Ok(part(Some(elf)))).unwrap();
    assert_eq!((got, cached), (part(Some(elf)), false));
    let (got, cached) = load_or_compile(Some(&dir), "k", true, || panic!("cached")).unwrap();
    assert_eq!((got, cached), (part(Some(elf)), true));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_compile_is_announced_only_where_the_cache_does_not_give_the_part() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = std::env::temp_dir().join(format!("niwaki-cuda-announce-{}", std::process::id()));
    let (arch, opts) = ("sm_90a", options("sm_90a", &[]));
    let src = |k: &str| format!("extern \"C\" __global__ void {k}() {{}}\n");
    let (whole, ptx_only, missing) = (src("a"), src("b"), src("c"));
    let told = AtomicUsize::new(0);
    let announce = || {
        told.fetch_add(1, Ordering::Relaxed);
    };
    let run = |srcs: &[String], refill: bool| {
        told.store(0, Ordering::Relaxed);
        let got = compile_all(arch, srcs, &opts, Some(&dir), refill, &announce);
        (got, told.load(Ordering::Relaxed))
    };
    load_or_compile(Some(&dir), &cache_key(&whole, &opts), false, || {
        Ok(part(Some(ELF)))
    })
    .unwrap();
    load_or_compile(Some(&dir), &cache_key(&ptx_only, &opts), false, || {
        Ok(part(None))
    })
    .unwrap();
    // Cached parts, device code asked for where it is there and not asked for where it is not.
    let (got, told_n) = run(std::slice::from_ref(&whole), true);
    assert_eq!(told_n, 0);
    assert_eq!(got.unwrap(), vec![(part(Some(ELF)), true)]);
    let (got, told_n) = run(&[whole, ptx_only.clone()], false);
    assert_eq!(told_n, 0);
    assert!(got.unwrap().iter().all(|(_, cached)| *cached));
    // A part cached without the device code asked for is compiled again (or, without NVRTC,
    // served from the cache): announced either way, as is a part not cached at all.
    let (got, told_n) = run(&[ptx_only], true);
    assert_eq!(told_n, 1);
    assert!(got.is_ok());
    let (_, told_n) = run(&[missing], false);
    assert_eq!(told_n, 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_compile_error_is_passed_through_without_caching() {
    let dir = std::env::temp_dir().join(format!("niwaki-cuda-err-{}", std::process::id()));
    let err = load_or_compile(Some(&dir), "bad", true, || {
        Err(CudaError::Compile {
            arch: "sm_90".into(),
            log: "boom".into(),
        })
    })
    .unwrap_err();
    assert!(err.to_string().contains("boom"));
    assert!(!dir.join("bad.ptx").exists() && !dir.join("bad.cubin").exists());
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
    // tiny ones with and without the timeline records (`NIWAKI_CUDA_TRACE`), the weights'
    // evict-first copies (`NIWAKI_CUDA_WEIGHTS_L2`), the 2-bit GEMVs' two MMAs a chunk
    // (`NIWAKI_CUDA_B2_K256=0`), the 1-bit GEMVs' other MMA columns
    // (`NIWAKI_CUDA_B1_GROUP_COLS`) and known widths (`NIWAKI_CUDA_B1_CONST_CHUNKS`) and the
    // 2-bit ones' lane pairs (`NIWAKI_CUDA_LANE_PAIRS`), the others with the default policy and MMA shape; and
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
        let mut defines = d.defines_for(plan::AttnRing::simt(ring));
        if trace {
            defines.push("-DNIWAKI_TRACE=16".into());
        }
        // The default MMA shape untraced, the other one traced: both forms compiled; and the
        // split attention's other grid order in the traced form.
        if crate::plan::B2_K256 != trace {
            defines.push("-DB2_K256=1".into());
        }
        if crate::plan::B1_GROUP_COLS != trace {
            defines.push("-DB1_GROUP_COLS=1".into());
        }
        if crate::plan::B1_CONST_CHUNKS != trace {
            defines.push("-DB1_CONST_CHUNKS=1".into());
        }
        if crate::plan::LANE_PAIRS != trace {
            defines.push(super::LANE_PAIRS_DEFINE.into());
        }
        if crate::plan::ATTN_TOKEN_MAJOR != trace {
            defines.push(super::ATTN_TOKEN_MAJOR_DEFINE.into());
        }
        if evict_first {
            defines.push("-DWEIGHTS_EVICT_FIRST=1".into());
        }
        // sm_90a as an H100/H200 compiles them (with the warpgroup MMA of the f16 GEMM).
        // The 27B's first in parts, as the backend compiles it, the others whole.
        let split = p == Preset::B27 && ring == ATTN_RING_POSITIONS;
        let compiled: Vec<Compiled> = match compile_all(
            arch,
            &sources(split),
            &options(arch, &defines),
            None,
            false,
            &|| {},
        ) {
            Ok(c) => c.into_iter().map(|(part, _)| part).collect(),
            Err(e) => panic!("{p:?} {arch}: {e}"),
        };
        // A real architecture: NVRTC's device code beside each part's PTX.
        assert!(
            compiled
                .iter()
                .all(|c| c.cubin.as_deref().is_some_and(is_cubin)),
            "{p:?} {arch}: a part without device code"
        );
        let texts: Vec<String> = compiled.into_iter().map(|c| c.ptx).collect();
        for (i, text) in texts.iter().enumerate() {
            if let Some(dir) = std::env::var_os("NIWAKI_PTX_DUMP") {
                let _ = std::fs::write(
                    std::path::Path::new(&dir).join(format!("{p:?}-{ring}-{trace}-{arch}-{i}.ptx")),
                    text,
                );
            }
            assert_eq!(text.contains("niwaki_trace_n"), trace, "{p:?}: records");
        }
        // Every kernel emitted once.
        if let Err(e) = kernel_parts(&texts) {
            panic!("{p:?} {arch}: {e}");
        }
    }
}

#[test]
fn each_kernel_is_found_in_the_one_part_that_emits_it() {
    let entries = |ks: &[&str]| -> String {
        ks.iter()
            .map(|k| format!(".visible .entry {k}(\n\t.param .u64 p\n)\n{{\n}}\n"))
            .collect()
    };
    let (first, rest) = KERNELS.split_first().unwrap();
    let parts = [entries(rest), entries(&[first])];
    let found = kernel_parts(&parts).unwrap();
    assert_eq!(found[0], 1);
    assert!(found[1..].iter().all(|&p| p == 0));
    // A kernel in no part and one in two: both named.
    let (a, b) = (KERNELS[1], KERNELS[2]);
    let parts = [entries(&KERNELS[2..]), entries(&[KERNELS[0], b])];
    let e = kernel_parts(&parts).unwrap_err().to_string();
    assert!(e.contains(&format!("{a} in 0 parts")), "{e}");
    assert!(e.contains(&format!("{b} in 2 parts")), "{e}");
}

#[test]
fn the_q8_attention_kernel_has_the_warps_the_plan_launches() {
    // The q8_0 tensor-core split's warps are written in its source (a define there, where the
    // f16 one's come from the host): the plan's launch must match them.
    let define = format!("#define MW_WARPS {}\n", plan::ATTN_Q8_MMA_WARPS);
    assert!(source().contains(&define), "{define}");
}

/// NVRTC's device code is kept for a real architecture and absent for a virtual one; a
/// compile error comes back with NVRTC's log (skipped without NVRTC).
#[test]
fn nvrtc_gives_device_code_for_real_architectures_only() {
    // SAFETY: only checks whether the library can be opened.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        eprintln!("NVRTC not found: check skipped");
        return;
    }
    let src = "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }";
    let real = nvrtc::compile("sm_90a", src, &options("sm_90a", &[])).unwrap();
    assert!(real.ptx.contains(".entry k"));
    assert!(real.cubin.as_deref().is_some_and(is_cubin));
    let virt = nvrtc::compile("compute_90a", src, &options("compute_90a", &[])).unwrap();
    assert!(virt.ptx.contains(".entry k") && virt.cubin.is_none());
    let err = nvrtc::compile("sm_90a", "this is not C++", &options("sm_90a", &[])).unwrap_err();
    assert!(err.to_string().contains("niwaki.cu"), "{err}");
}
