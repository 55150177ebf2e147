//! The Hub's HTTP side: the endpoint and token from the environment, the file list, one file's
//! metadata, and errors that say what to do.

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use reqwest::header::{HeaderMap, AUTHORIZATION, CONTENT_LENGTH, LOCATION};
use reqwest::{Client, StatusCode, Url};

const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Where to ask, with what credentials: read from the environment like the Python hub client does.
pub(super) struct Hub {
    pub(super) endpoint: String,
    token: Option<String>,
    /// Follows redirects (to the CDN); drops the token when the host changes.
    pub(super) client: Client,
    /// Sees the Hub's own redirect response, which carries the file's metadata.
    no_redirect: Client,
}

impl Hub {
    pub(super) fn from_env() -> Result<Hub> {
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

    pub(super) fn get(&self, client: &Client, url: Url) -> reqwest::RequestBuilder {
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
    pub(super) async fn gguf_files(
        &self,
        repo: &str,
        revision: &str,
    ) -> Result<Vec<(String, Option<u64>)>> {
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

pub(super) fn env_nonempty(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.trim().is_empty())
}

pub(super) fn hf_home() -> Option<PathBuf> {
    if let Some(h) = env_nonempty("HF_HOME") {
        return Some(PathBuf::from(h));
    }
    let cache = env_nonempty("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| env_nonempty("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("huggingface"))
}

fn header_str(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

pub(super) fn header_u64(
    headers: &HeaderMap,
    name: impl reqwest::header::AsHeaderName,
) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// What the Hub says about one file before it is downloaded.
pub(super) struct Remote {
    /// The Hub URL to GET (after any redirect within the Hub, e.g. for a renamed repository).
    pub(super) url: Url,
    pub(super) size: Option<u64>,
    /// `X-Linked-Etag` (the sha256, for LFS files) or `ETag`, without quotes.
    pub(super) etag: Option<String>,
    pub(super) commit: Option<String>,
}

impl Remote {
    pub(super) fn sha256(&self) -> Option<&str> {
        self.etag
            .as_deref()
            .filter(|e| e.len() == 64 && e.bytes().all(|b| b.is_ascii_hexdigit()))
    }
}

/// HEAD on the resolve URL without following the redirect to the CDN: the Hub's own answer carries
/// the commit, the etag and the size.
pub(super) async fn metadata(hub: &Hub, repo: &str, revision: &str, file: &str) -> Result<Remote> {
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
