//! Where a download lands: the Hugging Face cache's layout (`models--ORG--NAME/{blobs,snapshots,
//! refs}`, shared with the Python tools) or a folder of the user's.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};

use super::hub::{env_nonempty, hf_home, Remote};
use super::Args;

/// Where the file goes, and where its bytes gather until they are checked.
pub(super) struct Dest {
    pub(super) part: PathBuf,
    pub(super) done: PathBuf,
    /// In the cache: the snapshot path to link to the blob, and the ref to record.
    pub(super) snapshot: Option<Snapshot>,
}

pub(super) struct Snapshot {
    pub(super) link: PathBuf,
    /// `../..` back up to the repository folder from the link's folder, then `blobs/ETAG`.
    target: PathBuf,
    refs: Option<(PathBuf, String)>,
}

pub(super) fn destination(a: &Args, repo: &str, file: &str, remote: &Remote) -> Result<Dest> {
    if let Some(dir) = &a.dir {
        let done = file.split('/').fold(dir.clone(), |p, s| p.join(s));
        let mut part = done.clone().into_os_string();
        part.push(".part");
        return Ok(Dest {
            part: part.into(),
            done,
            snapshot: None,
        });
    }
    let etag = remote.etag.as_deref().ok_or_else(|| {
        anyhow!(
            "the Hub gave no ETag for {repo}:{file}, so it cannot be stored in the cache; \
             pass --dir to save it in a folder"
        )
    })?;
    let repo_dir = hub_cache()?.join(format!("models--{}", repo.replace('/', "--")));
    let blob = repo_dir.join("blobs").join(etag);
    let commit = remote.commit.clone().unwrap_or_else(|| a.revision.clone());
    let link = file
        .split('/')
        .fold(repo_dir.join("snapshots").join(&commit), |p, s| p.join(s));
    let depth = file.split('/').count() - 1;
    let mut target = PathBuf::from("../..");
    for _ in 0..depth {
        target.push("..");
    }
    target.push("blobs");
    target.push(etag);
    let refs = (a.revision != commit).then(|| {
        let r = a
            .revision
            .split('/')
            .fold(repo_dir.join("refs"), |p, s| p.join(s));
        (r, commit.clone())
    });
    Ok(Dest {
        part: repo_dir.join("blobs").join(format!("{etag}.part")),
        done: blob,
        snapshot: Some(Snapshot { link, target, refs }),
    })
}

fn hub_cache() -> Result<PathBuf> {
    if let Some(c) = env_nonempty("HF_HUB_CACHE") {
        return Ok(PathBuf::from(c));
    }
    hf_home()
        .map(|h| h.join("hub"))
        .ok_or_else(|| anyhow!("no cache folder: set HF_HOME or HOME, or pass --dir"))
}

/// `snapshots/COMMIT/FILE` → `../../blobs/ETAG`, and `refs/REVISION` → COMMIT, as the Python
/// client lays them out.
pub(super) fn link_snapshot(s: &Snapshot, blob: &Path) -> Result<()> {
    if let Some(parent) = s.link.parent() {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    if fs::symlink_metadata(&s.link).is_ok() {
        fs::remove_file(&s.link).with_context(|| format!("replacing {}", s.link.display()))?;
    }
    #[cfg(unix)]
    std::os::unix::fs::symlink(&s.target, &s.link)
        .with_context(|| format!("linking {}", s.link.display()))?;
    #[cfg(not(unix))]
    fs::hard_link(blob, &s.link)
        .or_else(|_| fs::copy(blob, &s.link).map(|_| ()))
        .with_context(|| format!("linking {}", s.link.display()))?;
    #[cfg(unix)]
    let _ = blob; // only needed where a symlink cannot be made
    if let Some((path, commit)) = &s.refs {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(path, commit).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
