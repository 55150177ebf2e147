//! `niwaki serve`: the OpenAI-compatible HTTP server.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use server::{AppState, ScriptedReply, ServerConfig};

use crate::load;

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF model to serve.
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// 0 picks a free port (printed on start).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Context limit in tokens per request (default: the model's).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Worker threads for the model (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Dot kernels.
    #[arg(long, value_enum, default_value_t)]
    pub kernels: load::KernelsArg,
    /// The model name clients use (default: the file name without .gguf).
    #[arg(long)]
    pub model_name: Option<String>,
    /// Requests generating at once, each with its own sequence state.
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Requests that may wait for a free slot; beyond that, 503 with Retry-After.
    #[arg(long, default_value_t = 16)]
    pub queue: usize,
    /// Seconds a generation may run; then it ends with finish_reason "length".
    #[arg(long, default_value_t = 600)]
    pub request_timeout: u64,
    /// Largest request body in bytes (larger: 413).
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body: usize,
    /// Seconds running requests get to finish on SIGINT/SIGTERM before they are ended.
    #[arg(long, default_value_t = 10)]
    pub shutdown_grace: u64,
    /// TEST ONLY: a JSON list of {"match": TEXT, "text": REPLY}; a request whose last user
    /// message (or prompt) contains TEXT gets REPLY, forced token by token through the real
    /// sampling, parsing and streaming path. For deterministic tests on random models.
    #[arg(long, hide = true)]
    pub script_responses: Option<PathBuf>,
}

pub fn main(a: Args) -> Result<ExitCode> {
    if a.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    load::init_threads(a.threads)?;
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mut model = load::open_model(&a.model, None, a.kernels)?;
    let trained = model.config.context_length;
    if let Some(n) = a.ctx {
        model.limit_context(n);
    }
    let tok = load::tokenizer(model.file())?;
    let template = load::chat_template(&tok)?;
    let script: Vec<ScriptedReply> = match &a.script_responses {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))?
        }
        None => Vec::new(),
    };
    if !script.is_empty() {
        eprintln!(
            "TEST MODE: {} scripted replies loaded; matching requests get canned text",
            script.len()
        );
    }
    let model_id = a.model_name.clone().unwrap_or_else(|| {
        a.model
            .file_stem()
            .map_or("model".into(), |s| s.to_string_lossy().into_owned())
    });
    let ctx = model.config.context_length;
    let config = ServerConfig {
        model_id: model_id.clone(),
        slots: a.parallel,
        queue: a.queue,
        request_timeout: Duration::from_secs(a.request_timeout),
        max_body_bytes: a.max_body,
        threads,
        threads_rule: match a.threads {
            Some(_) => "--threads".into(),
            None => "all cores (available_parallelism)".into(),
        },
        context_rule: match a.ctx {
            Some(n) if n < trained => format!("--ctx {n} (the model was trained for {trained})"),
            _ => format!("the model's trained context ({trained})"),
        },
        script,
        model_path: a.model.clone(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
            .await
            .with_context(|| format!("listening on {}:{}", a.host, a.port))?;
        let addr = listener.local_addr()?;
        let state = AppState::new(config, model, tok, template);
        eprintln!(
            "serving {model_id} (context {ctx}, {} slots, queue {}) on http://{addr}",
            a.parallel, a.queue
        );
        server::serve(
            state,
            listener,
            shutdown_signal(),
            Duration::from_secs(a.shutdown_grace),
        )
        .await
        .context("serving")?;
        eprintln!("server stopped");
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    eprintln!("shutting down: finishing running requests");
}
