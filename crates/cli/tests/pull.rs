//! `niwaki pull` against a mock Hugging Face Hub on loopback: the model-info API, the resolve URL
//! that redirects to a "CDN" with the file's metadata in headers, byte ranges, dropped connections,
//! private repositories and missing files.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use assert_cmd::Command;
use sha2::{Digest, Sha256};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// One request the mock saw.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    path: String,
    range: Option<String>,
    auth: Option<String>,
}

#[derive(Clone, Default)]
struct Repo {
    files: Vec<(String, Arc<Vec<u8>>)>,
    /// Private: every request needs `Authorization: Bearer TOKEN`.
    token: Option<String>,
    /// Announce a wrong sha256.
    wrong_sha: bool,
}

#[derive(Default)]
struct Behaviour {
    repos: HashMap<String, Repo>,
    /// Close the connection after this many body bytes, on the first download only.
    cut_after: Option<usize>,
    /// Answer every download with the whole file (200), as a server without range support would.
    ignore_range: bool,
}

struct Mock {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Mock {
    fn start(b: Behaviour) -> Mock {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let b = Arc::new(b);
        let cut_done = Arc::new(AtomicBool::new(false));
        let (seen2, url2) = (seen.clone(), url.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (b, seen, cut_done, url) =
                    (b.clone(), seen2.clone(), cut_done.clone(), url2.clone());
                std::thread::spawn(move || {
                    let _ = serve(stream, &b, &seen, &cut_done, &url);
                });
            }
        });
        Mock { url, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The GETs of file bytes (after the Hub's redirect), with their Range headers.
    fn downloads(&self) -> Vec<Option<String>> {
        self.seen()
            .into_iter()
            .filter(|s| s.method == "GET" && s.path.starts_with("/cdn/"))
            .map(|s| s.range)
            .collect()
    }
}

fn sha256(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn respond(
    s: &mut TcpStream,
    status: &str,
    headers: &[(&str, String)],
    body: &[u8],
    head: bool,
) -> std::io::Result<()> {
    let mut out = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    for (k, v) in headers {
        out += &format!("{k}: {v}\r\n");
    }
    if !headers.iter().any(|(k, _)| *k == "Content-Length") {
        out += &format!("Content-Length: {}\r\n", body.len());
    }
    out += "\r\n";
    s.write_all(out.as_bytes())?;
    if !head {
        s.write_all(body)?;
    }
    s.flush()
}

fn error(
    s: &mut TcpStream,
    status: &str,
    code: &str,
    msg: &str,
    head: bool,
) -> std::io::Result<()> {
    let body = format!("{{\"error\":\"{msg}\"}}");
    let h = [
        ("X-Error-Code", code.to_string()),
        ("X-Error-Message", msg.to_string()),
        ("Content-Type", "application/json".to_string()),
    ];
    respond(s, status, &h, body.as_bytes(), head)
}

fn serve(
    mut s: TcpStream,
    b: &Behaviour,
    seen: &Mutex<Vec<Seen>>,
    cut_done: &AtomicBool,
    base: &str,
) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut r = BufReader::new(s.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let target = parts.next().unwrap_or_default().to_string();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let path = target.split('?').next().unwrap_or_default().to_string();
    seen.lock().unwrap().push(Seen {
        method: method.clone(),
        path: path.clone(),
        range: headers.get("range").cloned(),
        auth: headers.get("authorization").cloned(),
    });
    let head = method == "HEAD";
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let allowed = |repo: &Repo| match &repo.token {
        None => true,
        Some(t) => headers.get("authorization") == Some(&format!("Bearer {t}")),
    };

    // The bytes of a file, by sha256, with ranges.
    if segs[0] == "cdn" {
        let data = b
            .repos
            .values()
            .flat_map(|r| r.files.iter())
            .find(|(_, d)| sha256(d) == segs[1])
            .map(|(_, d)| d.clone())
            .unwrap();
        let len = data.len();
        let start = headers
            .get("range")
            .filter(|_| !b.ignore_range)
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.strip_suffix('-'))
            .map(|n| n.parse::<usize>().unwrap());
        let (status, body, mut h) = match start {
            Some(n) if n >= len => {
                let h = vec![("Content-Range", format!("bytes */{len}"))];
                return respond(&mut s, "416 Range Not Satisfiable", &h, b"", head);
            }
            Some(n) => (
                "206 Partial Content",
                &data[n..],
                vec![("Content-Range", format!("bytes {n}-{}/{len}", len - 1))],
            ),
            None => ("200 OK", &data[..], vec![]),
        };
        h.push(("Content-Length", body.len().to_string()));
        let cut = b
            .cut_after
            .filter(|_| !head && !cut_done.swap(true, Ordering::SeqCst));
        if let Some(n) = cut {
            // Promise the whole body, send part of it, hang up.
            respond(&mut s, status, &h, b"", true)?;
            s.write_all(&body[..n.min(body.len())])?;
            s.flush()?;
            return s.shutdown(Shutdown::Both);
        }
        return respond(&mut s, status, &h, body, head);
    }

    // /api/models/ORG/NAME: the model info with its file list.
    if segs.len() == 4 && segs[0] == "api" && segs[1] == "models" {
        let id = format!("{}/{}", segs[2], segs[3]);
        let Some(repo) = b.repos.get(&id).filter(|r| allowed(r)) else {
            return error(
                &mut s,
                "401 Unauthorized",
                "RepoNotFound",
                "Repository not found",
                head,
            );
        };
        let mut siblings = vec![serde_json::json!({"rfilename": "README.md", "size": 12})];
        for (name, data) in &repo.files {
            siblings.push(serde_json::json!({
                "rfilename": name,
                "size": data.len(),
                "lfs": {"sha256": sha256(data), "size": data.len()},
            }));
        }
        let body = serde_json::json!({"id": id, "sha": COMMIT, "siblings": siblings}).to_string();
        let h = [("Content-Type", "application/json".to_string())];
        return respond(&mut s, "200 OK", &h, body.as_bytes(), head);
    }

    // /ORG/NAME/resolve/main/FILE: a redirect to the bytes, carrying the file's metadata.
    if segs.len() >= 5 && segs[2] == "resolve" {
        let id = format!("{}/{}", segs[0], segs[1]);
        let file = segs[4..].join("/");
        let Some(repo) = b.repos.get(&id).filter(|r| allowed(r)) else {
            return error(
                &mut s,
                "401 Unauthorized",
                "RepoNotFound",
                "Repository not found",
                head,
            );
        };
        let Some((_, data)) = repo.files.iter().find(|(n, _)| *n == file) else {
            return error(
                &mut s,
                "404 Not Found",
                "EntryNotFound",
                "Entry not found",
                head,
            );
        };
        let sha = sha256(data);
        let announced = if repo.wrong_sha {
            sha256(b"something else")
        } else {
            sha.clone()
        };
        let h = [
            ("Location", format!("{base}/cdn/{sha}")),
            ("X-Linked-Etag", format!("\"{announced}\"")),
            ("X-Linked-Size", data.len().to_string()),
            ("X-Repo-Commit", COMMIT.to_string()),
            ("ETag", "\"0abc\"".to_string()),
        ];
        return respond(&mut s, "302 Found", &h, b"", head);
    }
    error(&mut s, "404 Not Found", "", "no route", head)
}

/// Deterministic bytes that no compression or pattern would pass off as right.
fn content(len: usize, seed: u64) -> Arc<Vec<u8>> {
    let mut x = seed | 1;
    Arc::new(
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect(),
    )
}

fn repo(files: &[(&str, &Arc<Vec<u8>>)]) -> Repo {
    Repo {
        files: files
            .iter()
            .map(|(n, d)| (n.to_string(), (*d).clone()))
            .collect(),
        ..Repo::default()
    }
}

fn behaviour(repos: Vec<(&str, Repo)>) -> Behaviour {
    Behaviour {
        repos: repos.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        ..Behaviour::default()
    }
}

/// `niwaki pull` pointed at the mock, with its cache in `home`, and nothing from the environment
/// that could send it elsewhere or lend it a token.
fn pull(mock: &Mock, home: &Path) -> Command {
    let mut c = Command::cargo_bin("niwaki").unwrap();
    c.arg("pull")
        .env("HF_ENDPOINT", &mock.url)
        .env("HF_HOME", home)
        .timeout(Duration::from_secs(120));
    for k in [
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_TOKEN_PATH",
        "HF_HUB_CACHE",
        "http_proxy",
        "HTTP_PROXY",
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
    ] {
        c.env_remove(k);
    }
    c
}

fn succeed(c: &mut Command) -> (PathBuf, String) {
    let out = c.assert().success().get_output().clone();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    (PathBuf::from(stdout.trim()), stderr)
}

fn fail(c: &mut Command) -> String {
    let out = c.assert().failure().get_output().clone();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing on stdout when it fails");
    stderr
}

#[test]
fn the_only_gguf_lands_in_the_hf_cache_byte_identical() {
    let data = content(3_000_123, 1);
    let projector = content(1000, 10);
    let mock = Mock::start(behaviour(vec![(
        "prism/Bonsai-tiny",
        // A vision projector beside the model is not a candidate.
        repo(&[
            ("mmproj-F16.gguf", &projector),
            ("Bonsai-tiny-Q1_0.gguf", &data),
        ]),
    )]));
    let home = tempfile::tempdir().unwrap();
    let (path, err) = succeed(pull(&mock, home.path()).arg("prism/Bonsai-tiny"));

    let repo_dir = home.path().join("hub/models--prism--Bonsai-tiny");
    assert_eq!(
        path,
        repo_dir
            .join("snapshots")
            .join(COMMIT)
            .join("Bonsai-tiny-Q1_0.gguf")
    );
    assert_eq!(std::fs::read(&path).unwrap(), *data, "byte-identical");
    assert!(std::fs::symlink_metadata(&path).unwrap().is_symlink());
    let blob = repo_dir.join("blobs").join(sha256(&data));
    assert_eq!(
        std::fs::canonicalize(&path).unwrap(),
        std::fs::canonicalize(&blob).unwrap()
    );
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(),
        COMMIT
    );
    assert!(!repo_dir
        .join("blobs")
        .join(format!("{}.part", sha256(&data)))
        .exists());
    assert!(err.contains("sha256 verified"), "{err}");
    assert_eq!(mock.downloads(), vec![None], "one plain GET for the bytes");

    // Again: found in the cache, not downloaded twice, same path.
    let (again, err) = succeed(pull(&mock, home.path()).arg("hf.co/prism/Bonsai-tiny:Q1_0"));
    assert_eq!(again, path);
    assert!(err.contains("already downloaded"), "{err}");
    assert_eq!(mock.downloads().len(), 1);
}

#[test]
fn an_interrupted_download_resumes_with_a_range_request() {
    let data = content(2_500_000, 2);
    let mut b = behaviour(vec![("org/m", repo(&[("m.gguf", &data)]))]);
    b.cut_after = Some(1_000_000);
    let mock = Mock::start(b);
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("models");

    let err = fail(
        pull(&mock, home.path())
            .args(["org/m:m.gguf", "--retries", "0", "--dir"])
            .arg(&dir),
    );
    assert!(
        err.contains("interrupted") && err.contains("run the same command again to resume"),
        "{err}"
    );
    let part = dir.join("m.gguf.part");
    let kept = std::fs::metadata(&part).unwrap().len();
    assert!(kept > 0 && kept <= 1_000_000, "{kept} bytes kept");
    assert_eq!(std::fs::read(&part).unwrap(), data[..kept as usize]);
    assert!(!dir.join("m.gguf").exists());

    let (path, err) = succeed(
        pull(&mock, home.path())
            .args(["org/m:m.gguf", "--dir"])
            .arg(&dir),
    );
    assert_eq!(path, dir.join("m.gguf"));
    assert_eq!(std::fs::read(&path).unwrap(), *data);
    assert!(!part.exists());
    assert!(err.contains("resuming"), "{err}");
    // The second run asked only for the rest.
    assert_eq!(mock.downloads(), vec![None, Some(format!("bytes={kept}-"))]);
}

#[test]
fn a_dropped_connection_is_retried_in_the_same_run() {
    let data = content(1_500_000, 3);
    let mut b = behaviour(vec![("org/m", repo(&[("m.gguf", &data)]))]);
    b.cut_after = Some(400_000);
    let mock = Mock::start(b);
    let home = tempfile::tempdir().unwrap();
    let (path, err) = succeed(pull(&mock, home.path()).arg("org/m"));
    assert_eq!(std::fs::read(&path).unwrap(), *data);
    assert!(err.contains("retry 1/3"), "{err}");
    let d = mock.downloads();
    assert_eq!(d.len(), 2, "{d:?}");
    let from: usize = d[1].as_deref().unwrap()["bytes=".len()..]
        .trim_end_matches('-')
        .parse()
        .unwrap();
    assert!(from > 0 && from <= 400_000, "{d:?}");
}

#[test]
fn a_server_without_ranges_is_restarted_from_zero() {
    let data = content(1_200_000, 4);
    let mut b = behaviour(vec![("org/m", repo(&[("m.gguf", &data)]))]);
    b.cut_after = Some(300_000);
    b.ignore_range = true;
    let mock = Mock::start(b);
    let home = tempfile::tempdir().unwrap();
    let (path, err) = succeed(pull(&mock, home.path()).arg("org/m"));
    assert_eq!(std::fs::read(&path).unwrap(), *data);
    assert!(err.contains("starting over"), "{err}");
}

#[test]
fn missing_repositories_and_files_are_clear_errors() {
    let data = content(1000, 5);
    let mock = Mock::start(behaviour(vec![("org/m", repo(&[("m-Q1_0.gguf", &data)]))]));
    let home = tempfile::tempdir().unwrap();

    let err = fail(pull(&mock, home.path()).arg("org/nothing"));
    assert!(err.contains("repository org/nothing not found"), "{err}");
    let err = fail(pull(&mock, home.path()).arg("org/nothing:x.gguf"));
    assert!(err.contains("repository org/nothing not found"), "{err}");

    let err = fail(pull(&mock, home.path()).arg("org/m:m-Q2_0.gguf"));
    assert!(
        err.contains("m-Q2_0.gguf not found in org/m") && err.contains("m-Q1_0.gguf"),
        "the error names the missing file and lists the ones there are: {err}"
    );
    let err = fail(pull(&mock, home.path()).arg("org/m:Q4_K"));
    assert!(
        err.contains("no .gguf file in org/m matches") && err.contains("m-Q1_0.gguf"),
        "{err}"
    );

    let err = fail(pull(&mock, home.path()).arg("not a repo"));
    assert!(err.contains("is not a Hugging Face repository"), "{err}");

    // Nothing listening: a network error, not a panic.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let err = fail(
        pull(&mock, home.path())
            .env("HF_ENDPOINT", &dead)
            .arg("org/m"),
    );
    assert!(err.contains("cannot reach the Hub"), "{err}");
}

#[test]
fn several_ggufs_need_a_choice() {
    let (a, b) = (content(1000, 6), content(2000, 7));
    let mock = Mock::start(behaviour(vec![(
        "org/two",
        repo(&[("two-Q1_0.gguf", &a), ("two-Q2_0.gguf", &b)]),
    )]));
    let home = tempfile::tempdir().unwrap();
    let err = fail(pull(&mock, home.path()).arg("org/two"));
    assert!(
        err.contains("2 .gguf files")
            && err.contains("two-Q1_0.gguf")
            && err.contains("two-Q2_0.gguf")
            && err.contains("niwaki pull org/two:FILE"),
        "{err}"
    );
    let (path, _) = succeed(pull(&mock, home.path()).arg("org/two:q2_0"));
    assert!(path.ends_with("two-Q2_0.gguf"));
    assert_eq!(std::fs::read(&path).unwrap(), *b);
}

#[test]
fn a_token_is_sent_as_a_bearer_header() {
    let data = content(10_000, 8);
    let mut private = repo(&[("p.gguf", &data)]);
    private.token = Some("hf_secret123".into());
    let mock = Mock::start(behaviour(vec![("org/private", private)]));
    let home = tempfile::tempdir().unwrap();

    let err = fail(pull(&mock, home.path()).arg("org/private"));
    assert!(
        err.contains("HF_TOKEN"),
        "the error says how to authenticate: {err}"
    );
    let err = fail(
        pull(&mock, home.path())
            .env("HF_TOKEN", "hf_wrong")
            .arg("org/private"),
    );
    assert!(err.contains("refused the token"), "{err}");

    let (path, _) = succeed(
        pull(&mock, home.path())
            .env("HF_TOKEN", "hf_secret123")
            .arg("org/private"),
    );
    assert_eq!(std::fs::read(&path).unwrap(), *data);
    let hub: Vec<Seen> = mock
        .seen()
        .into_iter()
        .filter(|s| !s.path.starts_with("/cdn/"))
        .collect();
    let with_token: Vec<&Seen> = hub
        .iter()
        .filter(|s| s.auth.as_deref() == Some("Bearer hf_secret123"))
        .collect();
    assert!(
        with_token
            .iter()
            .any(|s| s.path == "/api/models/org/private")
            && with_token
                .iter()
                .any(|s| s.method == "HEAD" && s.path == "/org/private/resolve/main/p.gguf"),
        "{hub:?}"
    );
}

#[test]
fn a_wrong_checksum_is_refused_and_the_bytes_dropped() {
    let data = content(50_000, 9);
    let mut r = repo(&[("m.gguf", &data)]);
    r.wrong_sha = true;
    let mock = Mock::start(behaviour(vec![("org/m", r)]));
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("out");
    let err = fail(pull(&mock, home.path()).args(["org/m", "--dir"]).arg(&dir));
    assert!(err.contains("sha256 mismatch"), "{err}");
    assert!(!dir.join("m.gguf").exists() && !dir.join("m.gguf.part").exists());
}
