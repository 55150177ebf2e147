//! Which repository and file a `pull` names, and the choice among a repository's files.

use anyhow::{bail, Result};

/// `REPO[:FILE]`, accepting a pasted `https://huggingface.co/` or `hf.co/` in front.
pub(super) fn parse_spec(spec: &str) -> Result<(String, Option<String>)> {
    let mut s = spec.trim();
    for prefix in ["https://huggingface.co/", "huggingface.co/", "hf.co/"] {
        if let Some(rest) = s.strip_prefix(prefix) {
            s = rest;
        }
    }
    let (repo, file) = match s.split_once(':') {
        Some((r, f)) => (r, Some(f.trim_start_matches('/').to_string())),
        None => (s, None),
    };
    let repo = repo.trim_end_matches('/');
    let valid = !repo.is_empty()
        && repo.split('/').count() <= 2
        && repo.split('/').all(|p| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        });
    if !valid {
        bail!("{spec:?} is not a Hugging Face repository: expected ORG/NAME or ORG/NAME:FILE");
    }
    if file.as_deref().is_some_and(|f| {
        f.is_empty() || f.split('/').any(|p| p.is_empty() || p == "." || p == "..")
    }) {
        bail!("{spec:?}: the file name after ':' is empty or not a plain path");
    }
    Ok((repo.to_string(), file))
}

/// A size for people: 512 B, 1.5 KiB, 3.2 MiB, 4.70 GiB.
pub(super) fn human(b: u64) -> String {
    const K: f64 = 1024.0;
    let f = b as f64;
    if f < K {
        format!("{b} B")
    } else if f < K * K {
        format!("{:.1} KiB", f / K)
    } else if f < K * K * K {
        format!("{:.1} MiB", f / (K * K))
    } else {
        format!("{:.2} GiB", f / (K * K * K))
    }
}

pub(super) fn listing(files: &[(String, Option<u64>)]) -> String {
    files
        .iter()
        .map(|(name, size)| match size {
            Some(s) => format!("\n  {name}  ({})", human(*s)),
            None => format!("\n  {name}"),
        })
        .collect()
}

/// Picks the file to download: the only model file, or the one whose name contains `want`.
pub(super) fn choose(
    repo: &str,
    files: &[(String, Option<u64>)],
    want: Option<&str>,
) -> Result<String> {
    if files.is_empty() {
        bail!("{repo} has no .gguf files");
    }
    let Some(want) = want else {
        // Vision projectors ride along in some repositories; they are not a model to run.
        let models: Vec<_> = files
            .iter()
            .filter(|(n, _)| !base_name(n).to_ascii_lowercase().starts_with("mmproj"))
            .cloned()
            .collect();
        let pool = if models.is_empty() { files } else { &models };
        if let [(name, _)] = pool {
            return Ok(name.clone());
        }
        bail!(
            "{repo} has {} .gguf files; choose one with `niwaki pull {repo}:FILE`:{}",
            pool.len(),
            listing(pool)
        );
    };
    let w = want.to_ascii_lowercase();
    if let Some((name, _)) = files.iter().find(|(n, _)| n.to_ascii_lowercase() == w) {
        return Ok(name.clone());
    }
    let hits: Vec<_> = files
        .iter()
        .filter(|(n, _)| base_name(n).to_ascii_lowercase().contains(&w))
        .cloned()
        .collect();
    match hits.as_slice() {
        [(name, _)] => Ok(name.clone()),
        [] => bail!(
            "no .gguf file in {repo} matches {want:?}; its .gguf files are:{}",
            listing(files)
        ),
        _ => bail!(
            "{want:?} matches {} files in {repo}; name one in full with `niwaki pull {repo}:FILE`:{}",
            hits.len(),
            listing(&hits)
        ),
    }
}

pub(super) fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}
