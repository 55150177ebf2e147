//! The bytes: a resumable download into a `.part` file, retried where the connection drops, and
//! checked against the size and sha256 the Hub announces.

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use reqwest::header::{HeaderMap, CONTENT_LENGTH, CONTENT_RANGE, RANGE};
use reqwest::StatusCode;
use sha2::{Digest, Sha256};

use super::choose::{base_name, human};
use super::hub::{header_u64, Hub, Remote};
use crate::progress;

/// Whether a file already in `--dir` is the one on the Hub: its size and sha256 are checked.
pub(super) fn already_complete(done: &Path, remote: &Remote) -> Result<bool> {
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
pub(super) async fn download(
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
