//! The on-disk cache of compiled PTX, keyed by source and options.

use std::path::{Path, PathBuf};

use crate::error::Result;

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
    if let Some(d) = crate::knobs::path("NIWAKI_CUDA_CACHE") {
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
