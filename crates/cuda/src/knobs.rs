//! The backend's switches (`NIWAKI_CUDA_*` in the environment), each with the values it takes.
//! Most exist to measure one kernel choice against another; a misspelt name or a value a switch
//! does not take would otherwise run the default without a word, and a measurement would then
//! compare a build with itself. [`check`] refuses both when the backend starts.

use crate::error::{CudaError, Result};
use crate::plan;

/// What a switch takes.
#[derive(Clone, Copy, Debug)]
enum Takes {
    /// `0` or `1`.
    OnOff,
    /// A whole number.
    Number,
    /// One of these words.
    OneOf(&'static [&'static str]),
    /// A folder.
    Path,
}

/// [`crate::plan::GDN_STEP_ROWS`], [`crate::plan::ATTN_TILES`] and [`crate::plan::SWIGLU_WARPS`]
/// as words (a test keeps them so).
const GDN_ROWS: [&str; 3] = ["32", "16", "8"];
const ATTN_TILES: [&str; 3] = ["4", "8", "16"];
const SWIGLU_WARPS: [&str; 4] = ["1", "2", "4", "8"];
/// [`crate::plan::ATTN_MMA_WARPS_CHOICES`], [`crate::plan::ATTN_MMA_STAGES_CHOICES`] and
/// [`crate::plan::ATTN_MMA_PREFETCH_CHOICES`] as words (a test keeps them so).
const ATTN_MMA_WARPS: [&str; 4] = ["1", "2", "3", "4"];
const ATTN_MMA_STAGES: [&str; 3] = ["2", "3", "4"];
const ATTN_MMA_PREFETCH: [&str; 4] = ["0", "1", "2", "4"];
/// Chunks a lane of the dp4a GEMV's shared-lanes kernels takes at a time (`SHARE_UNROLL` in
/// `kernels/gemv.cu`).
const SHARE_UNROLL: [&str; 4] = ["1", "2", "3", "4"];

/// Every switch the backend reads, and what it takes.
const KNOBS: &[(&str, Takes)] = &[
    // A measurement only: the binary decode GEMVs without a part of their work (their plane
    // words' bit gathering; their tiles' arithmetic; of the 1-bit consumers' arithmetic, the
    // MMAs alone or the counts' scaling alone) or every residual GEMV without its norm's fold.
    // The f16 tensor-core split attention without its arithmetic (its copies and waits alone) or
    // without its copies (its arithmetic on zeroed rings). (Its rows read as per-head runs,
    // `attnrows`, measured slower in the sixtieth session, is at commit 86d31ce.) The f16 GEMM
    // without its weight scales (neither copied nor loaded: every scale 1) or without its
    // weight codes' copies (its MMAs on whatever its ring holds).
    // The results are wrong; the time says what that part costs. `watch` takes nothing out: in
    // traced builds a binary GEMV's producer watches its ring's first tile before its wait.
    (
        "NIWAKI_CUDA_ABLATE",
        Takes::OneOf(&[
            "planes", "mma", "mmaop", "fp", "fold", "watch", "attnmath", "attncopy", "hgscales",
            "hgcodes",
        ]),
    ),
    // A measurement: the f16 tensor-core split's warps a block, tiles a warp's ring and tiles
    // whose rows it asks the L2 cache for ahead of its ring.
    (
        "NIWAKI_CUDA_ATTN_MMA_PREFETCH",
        Takes::OneOf(&ATTN_MMA_PREFETCH),
    ),
    (
        "NIWAKI_CUDA_ATTN_MMA_STAGES",
        Takes::OneOf(&ATTN_MMA_STAGES),
    ),
    ("NIWAKI_CUDA_ATTN_MMA_WARPS", Takes::OneOf(&ATTN_MMA_WARPS)),
    ("NIWAKI_CUDA_ATTN_PREFILL", Takes::OnOff),
    ("NIWAKI_CUDA_ATTN_PREFILL_Q8", Takes::OnOff),
    (
        "NIWAKI_CUDA_ATTN_PREFILL_SPLITS",
        Takes::OneOf(&plan::SplitRule::WORDS),
    ),
    ("NIWAKI_CUDA_ATTN_PREFILL_WAVES", Takes::Number),
    ("NIWAKI_CUDA_ATTN_PREFILL_WG", Takes::OnOff),
    (
        "NIWAKI_CUDA_ATTN_PREFILL_WG_ENTRY",
        Takes::OneOf(&plan::WgEntry::WORDS),
    ),
    ("NIWAKI_CUDA_ATTN_SHORT", Takes::Number),
    // A measurement: a one-token pass's splits per kv head in place of one wave's.
    ("NIWAKI_CUDA_ATTN_SPLITS", Takes::Number),
    ("NIWAKI_CUDA_ATTN_TILE", Takes::OneOf(&ATTN_TILES)),
    ("NIWAKI_CUDA_ATTN_TOKEN_MAJOR", Takes::OnOff),
    ("NIWAKI_CUDA_B1", Takes::OnOff),
    ("NIWAKI_CUDA_B1_BLOCKS", Takes::Number),
    ("NIWAKI_CUDA_B1_CONST_CHUNKS", Takes::OnOff),
    ("NIWAKI_CUDA_B1_GROUP_COLS", Takes::OnOff),
    ("NIWAKI_CUDA_B1_IMAGE", Takes::OnOff),
    ("NIWAKI_CUDA_B1_MIN_TILES", Takes::Number),
    ("NIWAKI_CUDA_B1_PLANES", Takes::OnOff),
    ("NIWAKI_CUDA_B1_SMEM_KIB", Takes::Number),
    ("NIWAKI_CUDA_B1_TILE_ROWS", Takes::OneOf(&["16", "32"])),
    ("NIWAKI_CUDA_B1_X_STAGE", Takes::OnOff),
    ("NIWAKI_CUDA_B2", Takes::OnOff),
    ("NIWAKI_CUDA_B2_K256", Takes::OnOff),
    ("NIWAKI_CUDA_CACHE", Takes::Path),
    ("NIWAKI_CUDA_CHECKPOINTS", Takes::OnOff),
    // The program loaded from NVRTC's device code rather than its PTX (`compile::LOAD_CUBIN`).
    ("NIWAKI_CUDA_CUBIN", Takes::OnOff),
    ("NIWAKI_CUDA_DEVICE_EMBED", Takes::OnOff),
    ("NIWAKI_CUDA_EARLY_TILES", Takes::Number),
    ("NIWAKI_CUDA_FOLD_CLUSTER", Takes::OnOff),
    ("NIWAKI_CUDA_FOLD_NORM", Takes::OnOff),
    ("NIWAKI_CUDA_FOLD_SWIGLU", Takes::OnOff),
    ("NIWAKI_CUDA_FUSE_ATTN", Takes::OnOff),
    ("NIWAKI_CUDA_FUSE_GDN", Takes::OnOff),
    (
        "NIWAKI_CUDA_FUSE_NORM",
        Takes::OneOf(&["0", "binary", "1", "all"]),
    ),
    ("NIWAKI_CUDA_GDN_CHUNK", Takes::OnOff),
    ("NIWAKI_CUDA_GDN_ROWS", Takes::OneOf(&GDN_ROWS)),
    // The fewest tokens a pass multiplies on the tensor cores (default: `plan::short_passes`).
    ("NIWAKI_CUDA_GEMM_MIN_TOKENS", Takes::Number),
    // A measurement: this many K splits for every multi-token GEMM they fit, in place of
    // `plan::gemm_splits`'s.
    ("NIWAKI_CUDA_GEMM_SPLITS", Takes::Number),
    ("NIWAKI_CUDA_GEMV1", Takes::OnOff),
    ("NIWAKI_CUDA_GEMV1_SHARE", Takes::OnOff),
    // The f16 GEMM's narrower tiles for short passes (on by default).
    ("NIWAKI_CUDA_HGEMM_NARROW", Takes::OnOff),
    ("NIWAKI_CUDA_LANE_PAIRS", Takes::OnOff),
    ("NIWAKI_CUDA_MMA", Takes::OnOff),
    ("NIWAKI_CUDA_PDL", Takes::OnOff),
    // Passes of up to this many tokens launch with PDL (default `plan::PDL_TOKENS`).
    ("NIWAKI_CUDA_PDL_TOKENS", Takes::Number),
    ("NIWAKI_CUDA_PREFETCH_MB", Takes::Number),
    ("NIWAKI_CUDA_RING_LATE", Takes::OnOff),
    ("NIWAKI_CUDA_RUN_AHEAD", Takes::OnOff),
    ("NIWAKI_CUDA_SHARE_UNROLL", Takes::OneOf(&SHARE_UNROLL)),
    // Short passes' f16 GEMMs in `plan::SHORT_PASS_SPLITS` K splits (`plan::SHORT_PASS_SPLITS_ON`).
    ("NIWAKI_CUDA_SHORT_PASS_SPLITS", Takes::OnOff),
    // A measurement only: kernels a one-token pass leaves out (`plan::Skip`).
    ("NIWAKI_CUDA_SKIP", Takes::OneOf(&crate::plan::Skip::WORDS)),
    // Passes of up to this many tokens run token by token (default: `plan::short_passes`).
    ("NIWAKI_CUDA_STEP_TOKENS", Takes::Number),
    ("NIWAKI_CUDA_SWIGLU_WARPS", Takes::OneOf(&SWIGLU_WARPS)),
    ("NIWAKI_CUDA_TOPK", Takes::OnOff),
    ("NIWAKI_CUDA_TOPK_SUMS", Takes::OnOff),
    ("NIWAKI_CUDA_TRACE", Takes::Number),
    ("NIWAKI_CUDA_WEIGHTS_L2", Takes::OneOf(&["first", "normal"])),
    ("NIWAKI_CUDA_X_COPY", Takes::OneOf(&["0", "1", "all"])),
];

/// Refuses a `NIWAKI_CUDA_*` variable among `vars` that names no switch, or gives a switch a
/// value it does not take.
pub fn check<I: IntoIterator<Item = (String, String)>>(vars: I) -> Result<()> {
    for (name, value) in vars {
        if !name.starts_with("NIWAKI_CUDA_") {
            continue;
        }
        let refuse = |why: String| {
            Err(CudaError::Setting {
                name: name.clone(),
                value: value.clone(),
                why,
            })
        };
        let Some(takes) = takes(&name) else {
            let names: Vec<&str> = KNOBS.iter().map(|(n, _)| *n).collect();
            return refuse(format!(
                "no such setting (the backend reads {})",
                names.join(", ")
            ));
        };
        let ok = match takes {
            Takes::OnOff => value == "0" || value == "1",
            Takes::Number => value.parse::<u64>().is_ok(),
            Takes::OneOf(words) => words.contains(&value.as_str()),
            Takes::Path => !value.is_empty(),
        };
        if !ok {
            return refuse(match takes {
                Takes::OnOff => "takes 0 or 1".into(),
                Takes::Number => "takes a whole number".into(),
                Takes::OneOf(words) => format!("takes one of {}", words.join(", ")),
                Takes::Path => "takes a folder".into(),
            });
        }
    }
    Ok(())
}

/// What switch `name` takes, or `None` for a name not listed.
fn takes(name: &str) -> Option<Takes> {
    KNOBS.iter().find(|(n, _)| *n == name).map(|&(_, t)| t)
}

/// Switch `name`'s value in the environment, where set: every switch is read through here and
/// the readers below (debug builds assert that the name is listed and takes what the reader
/// parses), so the names the backend reads and [`KNOBS`] cannot drift apart. Values a switch
/// does not take were refused by [`check_env`] when the backend started.
fn value(name: &str, reader: fn(Takes) -> bool) -> Option<String> {
    value_os(name, reader).and_then(|v| v.into_string().ok())
}

/// [`value`] as the environment holds it (not necessarily Unicode).
fn value_os(name: &str, reader: fn(Takes) -> bool) -> Option<std::ffi::OsString> {
    debug_assert!(
        takes(name).is_some_and(reader),
        "{name}: not listed as read"
    );
    std::env::var_os(name)
}

fn is_on_off(t: Takes) -> bool {
    matches!(t, Takes::OnOff)
}

/// An on-or-off switch: `default` where unset, else on with `1` and off with `0`.
pub(crate) fn flag(name: &str, default: bool) -> bool {
    flag_set(name).unwrap_or(default)
}

/// An on-or-off switch, where set.
pub(crate) fn flag_set(name: &str) -> Option<bool> {
    match value(name, is_on_off).as_deref() {
        Some("1") => Some(true),
        Some("0") => Some(false),
        _ => None,
    }
}

/// A whole-number switch, where set.
pub(crate) fn number_set(name: &str) -> Option<usize> {
    value(name, |t| matches!(t, Takes::Number)).and_then(|v| v.parse().ok())
}

/// A whole-number switch, `default` where unset.
pub(crate) fn number(name: &str, default: usize) -> usize {
    number_set(name).unwrap_or(default)
}

/// A switch that takes one of a list of words, as given (`None` where unset).
pub(crate) fn word(name: &str) -> Option<String> {
    value(name, |t| matches!(t, Takes::OneOf(_)))
}

/// A folder switch, as given (not necessarily Unicode; `None` where unset).
pub(crate) fn path(name: &str) -> Option<std::ffi::OsString> {
    value_os(name, |t| matches!(t, Takes::Path))
}

/// [`check`] on this process's environment. A name that is not Unicode is not the backend's;
/// a switch's value that is not Unicode is refused (shown lossily).
pub fn check_env() -> Result<()> {
    check(std::env::vars_os().filter_map(|(n, v)| {
        let name = n.into_string().ok()?;
        let value = v
            .into_string()
            .unwrap_or_else(|v| format!("{} (not Unicode)", v.to_string_lossy()));
        Some((name, value))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(name: &str, value: &str) -> Result<()> {
        check([(name.to_string(), value.to_string())])
    }

    #[test]
    fn the_switches_take_their_values_and_refuse_others() {
        assert!(one("NIWAKI_CUDA_PDL", "0").is_ok());
        assert!(one("NIWAKI_CUDA_PDL", "1").is_ok());
        assert!(one("NIWAKI_CUDA_PDL", "yes").is_err());
        assert!(one("NIWAKI_CUDA_B1_TILE_ROWS", "32").is_ok());
        assert!(one("NIWAKI_CUDA_B1_TILE_ROWS", "24").is_err());
        assert!(one("NIWAKI_CUDA_SWIGLU_WARPS", "4").is_ok());
        assert!(one("NIWAKI_CUDA_SWIGLU_WARPS", "3").is_err());
        assert!(one("NIWAKI_CUDA_EARLY_TILES", "2").is_ok());
        assert!(one("NIWAKI_CUDA_ABLATE", "mma").is_ok());
        assert!(one("NIWAKI_CUDA_ABLATE", "watch").is_ok());
        assert!(one("NIWAKI_CUDA_ABLATE", "").is_err());
        assert!(one("NIWAKI_CUDA_ABLATE", "norm").is_err());
        assert!(one("NIWAKI_CUDA_SKIP", "gdn+swiglu").is_ok());
        assert!(one("NIWAKI_CUDA_SKIP", "swiglu,gdn").is_err());
        assert!(one("NIWAKI_CUDA_EARLY_TILES", "-1").is_err());
        assert!(one("NIWAKI_CUDA_FUSE_NORM", "binary").is_ok());
        assert!(one("NIWAKI_CUDA_CACHE", "kc").is_ok());
        assert!(one("NIWAKI_CUDA_CACHE", "").is_err());
        // Other programs' variables are not the backend's business.
        assert!(one("NIWAKI_SIMD", "whatever").is_ok());
        assert!(one("PATH", "/bin").is_ok());
    }

    #[test]
    fn a_misspelt_switch_is_refused_with_the_names_it_could_be() {
        let e = one("NIWAKI_CUDA_B1_IMAGES", "0").unwrap_err().to_string();
        assert!(e.contains("NIWAKI_CUDA_B1_IMAGES=0"), "{e}");
        assert!(e.contains("NIWAKI_CUDA_B1_IMAGE,"), "{e}");
    }

    #[test]
    fn the_word_lists_are_the_plans_counts() {
        let n = |w: &[&str]| -> Vec<usize> { w.iter().map(|r| r.parse().unwrap()).collect() };
        assert_eq!(n(&GDN_ROWS), plan::GDN_STEP_ROWS);
        assert_eq!(n(&ATTN_TILES), plan::ATTN_TILES);
        assert_eq!(n(&SWIGLU_WARPS), plan::SWIGLU_WARPS);
        assert_eq!(n(&ATTN_MMA_WARPS), plan::ATTN_MMA_WARPS_CHOICES);
        assert_eq!(n(&ATTN_MMA_STAGES), plan::ATTN_MMA_STAGES_CHOICES);
        assert_eq!(n(&ATTN_MMA_PREFETCH), plan::ATTN_MMA_PREFETCH_CHOICES);
    }

    /// The names the sources hold as string literals (`"NIWAKI_CUDA_…"`), in `dir` and below
    /// (this list's own file apart).
    fn names_read(dir: &std::path::Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                names_read(&path, out);
            } else if path.extension().is_some_and(|x| x == "rs") && !path.ends_with("knobs.rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for part in text.split("\"NIWAKI_CUDA_").skip(1) {
                    let tail: String = part
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    if part[tail.len()..].starts_with('"') {
                        out.push(format!("NIWAKI_CUDA_{tail}"));
                    }
                }
            }
        }
    }

    #[test]
    fn every_switch_the_sources_read_is_listed_and_every_listed_one_is_read() {
        let mut read = Vec::new();
        names_read(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut read,
        );
        for n in &read {
            assert!(
                KNOBS.iter().any(|(k, _)| k == n),
                "{n} is read but not listed"
            );
        }
        for (k, _) in KNOBS {
            assert!(read.iter().any(|n| n == k), "{k} is listed but never read");
        }
    }

    #[test]
    fn each_reader_parses_what_its_switch_takes() {
        // Unset in the test's environment: the defaults.
        assert!(flag("NIWAKI_CUDA_PDL", true));
        assert!(!flag("NIWAKI_CUDA_FOLD_CLUSTER", false));
        assert_eq!(number("NIWAKI_CUDA_EARLY_TILES", 3), 3);
        assert_eq!(word("NIWAKI_CUDA_X_COPY"), None);
        assert_eq!(
            path("NIWAKI_CUDA_CACHE").is_some(),
            std::env::var_os("NIWAKI_CUDA_CACHE").is_some()
        );
        // Every listed switch has a reader for what it takes.
        for (name, t) in KNOBS {
            let fits = [
                is_on_off(*t),
                matches!(t, Takes::Number),
                matches!(t, Takes::OneOf(_)),
                matches!(t, Takes::Path),
            ];
            assert_eq!(fits.iter().filter(|&&f| f).count(), 1, "{name}");
        }
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "not listed as read")]
    fn a_reader_refuses_a_switch_of_another_kind() {
        // NIWAKI_CUDA_EARLY_TILES takes a number, not 0 or 1.
        flag("NIWAKI_CUDA_EARLY_TILES", false);
    }

    #[test]
    fn the_names_are_sorted_and_unique() {
        assert!(KNOBS.windows(2).all(|w| w[0].0 < w[1].0));
    }
}
