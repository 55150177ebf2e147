//! `niwaki pull`: download a GGUF from the Hugging Face Hub.
//!
//! The download is resumable: bytes go to a `.part` file beside the destination, and a later run
//! (or a retry after a dropped connection) asks only for the rest with `Range: bytes=N-`. The result
//! is checked against the size the Hub announces and, for LFS files, the sha256 it publishes as the
//! file's `X-Linked-Etag`. Files land in the standard Hugging Face cache layout
//! (`models--ORG--NAME/{blobs,snapshots,refs}`, shared with the Python tools) or in `--dir`.
//!
//! Environment: `HF_ENDPOINT` (a mirror or a local server instead of huggingface.co), `HF_TOKEN`
//! (sent as `Authorization: Bearer`; else the token file `huggingface-cli login` writes),
//! `HF_HUB_CACHE` / `HF_HOME` (where the cache is).

mod cache;
mod choose;
mod download;
mod hub;

use std::fs;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};

use cache::{destination, link_snapshot};
use choose::{choose, human, listing, parse_spec};
use download::{already_complete, download};
use hub::{metadata, Hub};

#[derive(clap::Args)]
pub struct Args {
    /// REPO or REPO:FILE, e.g. `ORG/NAME:model-Q1_0.gguf`. Without FILE, the repository's only
    /// .gguf file is taken; FILE may also be a part of a file name that picks one file, such as
    /// `Q1_0`.
    pub spec: String,
    /// Branch, tag or commit to download from.
    #[arg(long, default_value = "main")]
    pub revision: String,
    /// Save the file in this folder instead of the Hugging Face cache.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// How many times a dropped connection is retried (each retry resumes) before giving up.
    #[arg(long, default_value_t = 3)]
    pub retries: u32,
}

pub fn main(a: Args) -> Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let path = rt.block_on(pull(&a))?;
    eprintln!("use it with: niwaki run --model {}", path.display());
    println!("{}", path.display());
    Ok(ExitCode::SUCCESS)
}

async fn pull(a: &Args) -> Result<PathBuf> {
    let (repo, want) = parse_spec(&a.spec)?;
    let hub = Hub::from_env()?;
    let exact = want
        .as_deref()
        .filter(|f| f.to_ascii_lowercase().ends_with(".gguf") || f.contains('/'));
    let file = match exact {
        Some(f) => f.to_string(),
        None => {
            let files = hub.gguf_files(&repo, &a.revision).await?;
            choose(&repo, &files, want.as_deref())?
        }
    };
    let remote = match metadata(&hub, &repo, &a.revision, &file).await {
        Ok(r) => r,
        Err(e) if exact.is_some() => {
            // A mistyped name: say which files there are, if the listing works.
            match hub.gguf_files(&repo, &a.revision).await {
                Ok(files) if !files.iter().any(|(n, _)| *n == file) && !files.is_empty() => {
                    bail!("{e:#}; its .gguf files are:{}", listing(&files))
                }
                _ => return Err(e),
            }
        }
        Err(e) => return Err(e),
    };
    let dest = destination(a, &repo, &file, &remote)?;
    let shown = format!("{repo}:{file}");
    // A cache blob is named by its etag, so its presence says it is complete.
    if dest.done.exists() && (dest.snapshot.is_some() || already_complete(&dest.done, &remote)?) {
        eprintln!("{shown} is already downloaded");
    } else {
        if let Some(parent) = dest.part.parent() {
            fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        eprintln!(
            "downloading {shown}{} from {}",
            remote
                .size
                .map(|s| format!(" ({})", human(s)))
                .unwrap_or_default(),
            hub.endpoint
        );
        download(&hub, &remote, &dest.part, a.retries, &shown).await?;
        fs::rename(&dest.part, &dest.done).with_context(|| {
            format!("moving {} to {}", dest.part.display(), dest.done.display())
        })?;
    }
    match &dest.snapshot {
        Some(s) => {
            link_snapshot(s, &dest.done)?;
            Ok(s.link.clone())
        }
        None => Ok(dest.done),
    }
}
