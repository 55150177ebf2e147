//! The on-disk cache of compiled programs (their PTX and device code), keyed by source and
//! options.

use std::path::{Path, PathBuf};

use super::nvrtc::{is_cubin, Compiled};
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

/// Returns the cached program for `key` or compiles it and stores it (a cache that cannot be
/// written is not an error): `{key}.ptx`, and `{key}.cubin` beside it where there is device
/// code. The flag says whether it came from the cache as it is returned.
///
/// A cached PTX without its device code (a cache written before the device code was kept)
/// comes back as it is unless `refill`: then it is compiled again for the device code, once,
/// and stored with it. Where that compilation fails (a GPU host without NVRTC, which the cache
/// is there to spare) or gives no device code, the cached PTX still serves.
pub fn load_or_compile(
    dir: Option<&Path>,
    key: &str,
    refill: bool,
    compile: impl FnOnce() -> Result<Compiled>,
) -> Result<(Compiled, bool)> {
    let path = |ext: &str| dir.map(|d| d.join(format!("{key}.{ext}")));
    let cached = path("ptx")
        .and_then(|p| std::fs::read_to_string(p).ok())
        .filter(|ptx| ptx.contains(".entry"))
        .map(|ptx| Compiled {
            ptx,
            cubin: path("cubin")
                .and_then(|c| std::fs::read(c).ok())
                .filter(|b| is_cubin(b)),
        });
    let compiled = match cached {
        Some(c) if c.cubin.is_some() || !refill => return Ok((c, true)),
        Some(c) => match compile() {
            Ok(fresh) if fresh.cubin.is_some() => fresh,
            _ => return Ok((c, true)),
        },
        None => compile()?,
    };
    // The device code first: a reader that finds the PTX finds it too.
    if let Some(bin) = &compiled.cubin {
        store(path("cubin"), bin);
    }
    store(path("ptx"), compiled.ptx.as_bytes());
    Ok((compiled, false))
}

/// Writes `bytes` to `path` through a temporary file, so no reader sees it half written.
fn store(path: Option<PathBuf>, bytes: &[u8]) {
    let Some(p) = path else { return };
    if let Some(parent) = p.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let ext = p
        .extension()
        .map(|e| e.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = p.with_extension(format!("{ext}.tmp{}", std::process::id()));
    if std::fs::write(&tmp, bytes).is_ok() {
        let _ = std::fs::rename(&tmp, &p);
    }
}
