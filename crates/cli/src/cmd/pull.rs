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

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use reqwest::header::{HeaderMap, AUTHORIZATION, CONTENT_LENGTH, CONTENT_RANGE, LOCATION, RANGE};
use reqwest::{Client, StatusCode, Url};
use sha2::{Digest, Sha256};

use crate::progress;

const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

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

/// Where to ask, with what credentials: read from the environment like the Python hub client does.
struct Hub {
    endpoint: String,
    token: Option<String>,
    /// Follows redirects (to the CDN); drops the token when the host changes.
    client: Client,
    /// Sees the Hub's own redirect response, which carries the file's metadata.
    no_redirect: Client,
}

impl Hub {
    fn from_env() -> Result<Hub> {
        let endpoint = env_nonempty("HF_ENDPOINT")
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string())
            .trim_end_matches('/')
            .to_string();
        Url::parse(&endpoint).with_context(|| format!("HF_ENDPOINT {endpoint:?} is not a URL"))?;
        let token = env_nonempty("HF_TOKEN")
            .or_else(|| env_nonempty("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| {
                let path = env_nonempty("HF_TOKEN_PATH")
                    .map(PathBuf::from)
                    .or_else(|| hf_home().map(|h| h.join("token")))?;
                let t = fs::read_to_string(path).ok()?;
                let t = t.trim();
                (!t.is_empty()).then(|| t.to_string())
            });
        let builder = || {
            Client::builder()
                .user_agent(concat!("niwaki/", env!("CARGO_PKG_VERSION")))
                .connect_timeout(Duration::from_secs(30))
                .read_timeout(Duration::from_secs(120))
        };
        Ok(Hub {
            endpoint,
            token,
            client: builder()
                .redirect(reqwest::redirect::Policy::limited(10))
                .build()
                .context("building the HTTP client")?,
            no_redirect: builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .context("building the HTTP client")?,
        })
    }

    fn url(&self, segments: &[&str]) -> Result<Url> {
        let mut url = Url::parse(&self.endpoint)?;
        url.path_segments_mut()
            .map_err(|_| anyhow!("HF_ENDPOINT {} cannot take a path", self.endpoint))?
            .pop_if_empty()
            .extend(segments);
        Ok(url)
    }

    fn resolve_url(&self, repo: &str, revision: &str, file: &str) -> Result<Url> {
        let mut segs: Vec<&str> = repo.split('/').collect();
        segs.push("resolve");
        segs.push(revision);
        segs.extend(file.split('/'));
        self.url(&segs)
    }

    fn get(&self, client: &Client, url: Url) -> reqwest::RequestBuilder {
        let req = client.get(url);
        match &self.token {
            Some(t) => req.header(AUTHORIZATION, format!("Bearer {t}")),
            None => req,
        }
    }

    fn head(&self, url: Url) -> reqwest::RequestBuilder {
        let req = self.no_redirect.head(url);
        match &self.token {
            Some(t) => req.header(AUTHORIZATION, format!("Bearer {t}")),
            None => req,
        }
    }

    /// The `.gguf` files of a repository with their sizes (when the Hub gives them).
    async fn gguf_files(&self, repo: &str, revision: &str) -> Result<Vec<(String, Option<u64>)>> {
        let mut segs = vec!["api", "models"];
        segs.extend(repo.split('/'));
        if revision != "main" {
            segs.extend(["revision", revision]);
        }
        let mut url = self.url(&segs)?;
        url.set_query(Some("blobs=true"));
        let resp = self
            .get(&self.client, url.clone())
            .send()
            .await
            .with_context(|| format!("cannot reach the Hub at {}", self.endpoint))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(self.status_error(status, resp.headers(), repo, revision, None));
        }
        let body = resp
            .bytes()
            .await
            .with_context(|| format!("reading the file list of {repo}"))?;
        let info: serde_json::Value = serde_json::from_slice(&body)
            .with_context(|| format!("the Hub's answer for {url} is not JSON"))?;
        let siblings = info["siblings"]
            .as_array()
            .ok_or_else(|| anyhow!("the Hub's answer for {url} has no file list (`siblings`)"))?;
        Ok(siblings
            .iter()
            .filter_map(|s| {
                let name = s["rfilename"].as_str()?;
                let size = s["lfs"]["size"].as_u64().or_else(|| s["size"].as_u64());
                name.to_ascii_lowercase()
                    .ends_with(".gguf")
                    .then(|| (name.to_string(), size))
            })
            .collect())
    }

    /// An error for a status the Hub answered with, in words that say what to do.
    fn status_error(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        repo: &str,
        revision: &str,
        file: Option<&str>,
    ) -> anyhow::Error {
        let code = header_str(headers, "x-error-code").unwrap_or_default();
        let detail = header_str(headers, "x-error-message")
            .map(|m| format!(" ({m})"))
            .unwrap_or_default();
        let what = match file {
            Some(f) => format!("{repo}:{f}"),
            None => repo.to_string(),
        };
        let on = &self.endpoint;
        match (status.as_u16(), code.as_str()) {
            (401, _) | (404, "RepoNotFound") if self.token.is_none() => anyhow!(
                "repository {repo} not found on {on}, or it is private or gated and needs a token: \
                 set HF_TOKEN to a token with read access (HTTP {status}){detail}"
            ),
            (401, _) => anyhow!(
                "the Hub refused the token in HF_TOKEN for {what} (HTTP {status}): check that it is \
                 valid and can read this repository{detail}"
            ),
            (403, _) => anyhow!(
                "access to {what} is forbidden (HTTP {status}): if the model is gated, accept its \
                 conditions on its page and use a token from that account in HF_TOKEN{detail}"
            ),
            (404, "RepoNotFound") => anyhow!(
                "repository {repo} not found on {on} (or the token cannot see it){detail}"
            ),
            (404, "RevisionNotFound") => {
                anyhow!("revision {revision:?} not found in {repo}{detail}")
            }
            (404, _) if file.is_some() => anyhow!(
                "{} not found in {repo} at revision {revision:?}{detail}",
                file.unwrap_or_default()
            ),
            (404, _) => anyhow!("repository {repo} not found on {on}{detail}"),
            (429, _) => anyhow!("the Hub is rate-limiting requests (HTTP 429): try again later"),
            _ => anyhow!("the Hub answered HTTP {status} for {what}{detail}"),
        }
    }
}

fn env_nonempty(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.trim().is_empty())
}

fn hf_home() -> Option<PathBuf> {
    if let Some(h) = env_nonempty("HF_HOME") {
        return Some(PathBuf::from(h));
    }
    let cache = env_nonempty("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| env_nonempty("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("huggingface"))
}

fn hub_cache() -> Result<PathBuf> {
    if let Some(c) = env_nonempty("HF_HUB_CACHE") {
        return Ok(PathBuf::from(c));
    }
    hf_home()
        .map(|h| h.join("hub"))
        .ok_or_else(|| anyhow!("no cache folder: set HF_HOME or HOME, or pass --dir"))
}

fn header_str(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

fn header_u64(headers: &HeaderMap, name: impl reqwest::header::AsHeaderName) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// `REPO[:FILE]`, accepting a pasted `https://huggingface.co/` or `hf.co/` in front.
fn parse_spec(spec: &str) -> Result<(String, Option<String>)> {
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
fn human(b: u64) -> String {
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

fn listing(files: &[(String, Option<u64>)]) -> String {
    files
        .iter()
        .map(|(name, size)| match size {
            Some(s) => format!("\n  {name}  ({})", human(*s)),
            None => format!("\n  {name}"),
        })
        .collect()
}

/// Picks the file to download: the only model file, or the one whose name contains `want`.
fn choose(repo: &str, files: &[(String, Option<u64>)], want: Option<&str>) -> Result<String> {
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

fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// What the Hub says about one file before it is downloaded.
struct Remote {
    /// The Hub URL to GET (after any redirect within the Hub, e.g. for a renamed repository).
    url: Url,
    size: Option<u64>,
    /// `X-Linked-Etag` (the sha256, for LFS files) or `ETag`, without quotes.
    etag: Option<String>,
    commit: Option<String>,
}

impl Remote {
    fn sha256(&self) -> Option<&str> {
        self.etag
            .as_deref()
            .filter(|e| e.len() == 64 && e.bytes().all(|b| b.is_ascii_hexdigit()))
    }
}

/// HEAD on the resolve URL without following the redirect to the CDN: the Hub's own answer carries
/// the commit, the etag and the size.
async fn metadata(hub: &Hub, repo: &str, revision: &str, file: &str) -> Result<Remote> {
    let mut url = hub.resolve_url(repo, revision, file)?;
    for _ in 0..10 {
        let resp = hub
            .head(url.clone())
            .send()
            .await
            .with_context(|| format!("cannot reach the Hub at {}", hub.endpoint))?;
        let status = resp.status();
        let h = resp.headers();
        let linked = header_str(h, "x-linked-etag");
        let commit = header_str(h, "x-repo-commit");
        if status.is_redirection() && linked.is_none() && commit.is_none() {
            // A redirect inside the Hub (a renamed repository): follow it and ask again.
            let loc = header_str(h, LOCATION.as_str())
                .ok_or_else(|| anyhow!("the Hub answered {status} without a Location"))?;
            url = url
                .join(&loc)
                .with_context(|| format!("bad redirect {loc:?}"))?;
            continue;
        }
        if !status.is_success() && !status.is_redirection() {
            return Err(hub.status_error(status, h, repo, revision, Some(file)));
        }
        let etag = linked
            .or_else(|| header_str(h, "etag"))
            .map(|e| e.trim_start_matches("W/").trim_matches('"').to_string())
            .filter(|e| !e.is_empty());
        let mut size = header_u64(h, "x-linked-size");
        if size.is_none() && status.is_success() {
            size = header_u64(h, CONTENT_LENGTH);
        }
        return Ok(Remote {
            url,
            size,
            etag,
            commit,
        });
    }
    bail!("too many redirects resolving {repo}:{file}")
}

/// Where the file goes, and where its bytes gather until they are checked.
struct Dest {
    part: PathBuf,
    done: PathBuf,
    /// In the cache: the snapshot path to link to the blob, and the ref to record.
    snapshot: Option<Snapshot>,
}

struct Snapshot {
    link: PathBuf,
    /// `../..` back up to the repository folder from the link's folder, then `blobs/ETAG`.
    target: PathBuf,
    refs: Option<(PathBuf, String)>,
}

fn destination(a: &Args, repo: &str, file: &str, remote: &Remote) -> Result<Dest> {
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

/// Whether a file already in `--dir` is the one on the Hub: its size and sha256 are checked.
fn already_complete(done: &Path, remote: &Remote) -> Result<bool> {
    let len = fs::metadata(done)?.len();
    if remote.size.is_some_and(|s| s != len) {
        eprintln!(
            "{} differs in size from the Hub's file; downloading it again",
            done.display()
        );
        return Ok(false);
    }
    if let Some(sha) = remote.sha256() {
        let pb = progress::bytes(len, "verifying");
        let mut h = Sha256::new();
        hash_prefix(done, len, &mut h, &pb)?;
        pb.finish_and_clear();
        if hex(&h.finalize()) != sha {
            eprintln!(
                "{} differs from the Hub's file; downloading it again",
                done.display()
            );
            return Ok(false);
        }
    }
    Ok(true)
}

fn hash_prefix(path: &Path, len: u64, h: &mut Sha256, pb: &indicatif::ProgressBar) -> Result<()> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let want = left.min(buf.len() as u64) as usize;
        let n = f
            .read(&mut buf[..want])
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            bail!("{} is shorter than expected", path.display());
        }
        h.update(&buf[..n]);
        pb.inc(n as u64);
        left -= n as u64;
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `bytes START-END/TOTAL` → (START, TOTAL); `bytes */TOTAL` → (None, TOTAL).
fn content_range(h: &HeaderMap) -> Option<(Option<u64>, Option<u64>)> {
    let v = h.get(CONTENT_RANGE)?.to_str().ok()?.trim();
    let rest = v.strip_prefix("bytes")?.trim();
    let (range, total) = rest.split_once('/')?;
    let start = range
        .split_once('-')
        .and_then(|(s, _)| s.trim().parse().ok());
    Some((start, total.trim().parse().ok()))
}

/// Why one attempt stopped short.
enum Stop {
    /// The connection dropped or stalled: worth resuming.
    Interrupted(anyhow::Error),
    /// Anything else: give up at once.
    Fatal(anyhow::Error),
}

/// Fills `part` up to the remote file's size, resuming from what it holds, then checks it.
async fn download(
    hub: &Hub,
    remote: &Remote,
    part: &Path,
    retries: u32,
    shown: &str,
) -> Result<()> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(part)
        .with_context(|| format!("opening {}", part.display()))?;
    let mut have = file.metadata()?.len();
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut size = remote.size;
    if size.is_some_and(|s| have > s) {
        out.get_mut().set_len(0)?;
        have = 0;
    }
    let pb = progress::bytes(size.unwrap_or(0), base_name(shown));
    let mut hasher = Sha256::new();
    if have > 0 {
        eprintln!(
            "resuming from {} already in {}",
            human(have),
            part.display()
        );
        if remote.sha256().is_some() {
            hash_prefix(part, have, &mut hasher, &indicatif::ProgressBar::hidden())?;
        }
    }
    pb.set_position(have);
    let mut failures = 0u32;
    loop {
        if size.is_some_and(|s| have == s) {
            break;
        }
        let r = attempt(
            hub,
            remote,
            &mut out,
            &mut hasher,
            &mut have,
            &mut size,
            &pb,
        )
        .await;
        out.flush()
            .with_context(|| format!("writing {}", part.display()))?;
        match r {
            Ok(()) => break,
            Err(Stop::Fatal(e)) => {
                pb.abandon();
                return Err(e);
            }
            Err(Stop::Interrupted(e)) if failures < retries => {
                failures += 1;
                let wait = Duration::from_millis(500 << failures.min(5));
                pb.suspend(|| {
                    eprintln!(
                        "connection lost at {} ({e:#}); retry {failures}/{retries} in {:.1} s",
                        progress_of(have, size),
                        wait.as_secs_f64()
                    )
                });
                tokio::time::sleep(wait).await;
            }
            Err(Stop::Interrupted(e)) => {
                pb.abandon();
                bail!(
                    "download interrupted at {}: {e:#}\nthe partial file {} is kept: run the same \
                     command again to resume",
                    progress_of(have, size),
                    part.display()
                );
            }
        }
    }
    pb.finish_and_clear();
    drop(out);
    if let Some(s) = size {
        if have != s {
            bail!("downloaded {have} bytes but the Hub announced {s}");
        }
    }
    if let Some(expected) = remote.sha256() {
        let got = hex(&hasher.finalize());
        if got != expected {
            let _ = fs::remove_file(part);
            bail!(
                "sha256 mismatch for {shown}: the Hub says {expected}, the download is {got}; \
                 the partial file was removed, run the command again"
            );
        }
        eprintln!("sha256 verified: {got}");
    }
    Ok(())
}

fn progress_of(have: u64, size: Option<u64>) -> String {
    match size {
        Some(s) if s > 0 => format!(
            "{} of {} ({:.0}%)",
            human(have),
            human(s),
            have as f64 * 100.0 / s as f64
        ),
        _ => human(have),
    }
}

/// One GET from `have` onwards, appending to `out` until the body ends or the connection fails.
async fn attempt(
    hub: &Hub,
    remote: &Remote,
    out: &mut BufWriter<File>,
    hasher: &mut Sha256,
    have: &mut u64,
    size: &mut Option<u64>,
    pb: &indicatif::ProgressBar,
) -> Result<(), Stop> {
    let mut req = hub.get(&hub.client, remote.url.clone());
    if *have > 0 {
        req = req.header(RANGE, format!("bytes={have}-"));
    }
    let mut resp = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            return Err(Stop::Interrupted(
                anyhow!(e).context(format!("cannot reach {}", hub.endpoint)),
            ))
        }
    };
    let status = resp.status();
    let io = |e: std::io::Error| Stop::Fatal(anyhow!(e).context("writing the downloaded file"));
    match status {
        StatusCode::PARTIAL_CONTENT => {
            let (start, total) = content_range(resp.headers()).unwrap_or((None, None));
            if start != Some(*have) {
                return Err(Stop::Fatal(anyhow!(
                    "asked for bytes from {have} and the server sent a range starting at {start:?}"
                )));
            }
            match (*size, total) {
                (Some(s), Some(t)) if s != t => {
                    return Err(Stop::Fatal(anyhow!(
                        "the file changed on the Hub while downloading ({s} then {t} bytes): \
                         run the command again"
                    )))
                }
                (None, Some(t)) => {
                    *size = Some(t);
                    pb.set_length(t);
                }
                _ => {}
            }
        }
        StatusCode::OK => {
            if *have > 0 {
                // The server ignored the range: start over, the file from byte 0 follows.
                pb.suspend(|| eprintln!("the server does not resume downloads; starting over"));
                out.flush().map_err(io)?;
                out.get_mut().set_len(0).map_err(io)?;
                *hasher = Sha256::new();
                *have = 0;
                pb.set_position(0);
            }
            if size.is_none() {
                *size = header_u64(resp.headers(), CONTENT_LENGTH);
                if let Some(t) = *size {
                    pb.set_length(t);
                }
            }
        }
        StatusCode::RANGE_NOT_SATISFIABLE => {
            let total = content_range(resp.headers()).and_then(|(_, t)| t);
            return match total {
                Some(t) if t == *have => {
                    *size = Some(t);
                    Ok(())
                }
                _ => {
                    // What is on disk does not fit the remote file: drop it and start over.
                    out.flush().map_err(io)?;
                    out.get_mut().set_len(0).map_err(io)?;
                    *hasher = Sha256::new();
                    *have = 0;
                    pb.set_position(0);
                    Err(Stop::Interrupted(anyhow!(
                        "the partial file did not match the remote one; starting over"
                    )))
                }
            };
        }
        s if s.is_server_error() => {
            return Err(Stop::Interrupted(anyhow!("the server answered HTTP {s}")))
        }
        s => return Err(Stop::Fatal(anyhow!("the download answered HTTP {s}"))),
    }
    loop {
        match resp.chunk().await {
            Ok(Some(bytes)) => {
                if size.is_some_and(|s| *have + bytes.len() as u64 > s) {
                    return Err(Stop::Fatal(anyhow!(
                        "the server sent more than the {} bytes announced",
                        size.unwrap_or_default()
                    )));
                }
                out.write_all(&bytes).map_err(io)?;
                hasher.update(&bytes);
                *have += bytes.len() as u64;
                pb.inc(bytes.len() as u64);
            }
            Ok(None) => {
                return match *size {
                    Some(s) if *have < s => {
                        Err(Stop::Interrupted(anyhow!("the connection closed early")))
                    }
                    _ => Ok(()),
                }
            }
            Err(e) => return Err(Stop::Interrupted(anyhow!(e))),
        }
    }
}

/// `snapshots/COMMIT/FILE` → `../../blobs/ETAG`, and `refs/REVISION` → COMMIT, as the Python
/// client lays them out.
fn link_snapshot(s: &Snapshot, blob: &Path) -> Result<()> {
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
