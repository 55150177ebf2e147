//! `niwaki serve`: the OpenAI-compatible HTTP server, on the CPU or (`--device cuda`) the GPU.
//!
//! On the GPU one request generates at a time: each sequence state holds an f16 KV cache for the
//! whole served context on the device, and the backend is driven from one thread. Further
//! requests wait in the queue (`--queue`) in arrival order; past it they get 503 with
//! `Retry-After`, as on the CPU.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use server::{AppState, Runner, ScriptedReply, ServerConfig};

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
    #[command(flatten)]
    pub place: load::Placement,
    /// The model name clients use (default: the file name without .gguf).
    #[arg(long)]
    pub model_name: Option<String>,
    /// Requests generating at once, each with its own sequence state [default: 4 on the CPU;
    /// the GPU serves one at a time].
    #[arg(long)]
    pub parallel: Option<usize>,
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
    /// Greedy requests (temperature 0, no logprobs or grammar) draft tokens by prompt lookup
    /// and verify them several a pass: the same replies, in fewer passes where they repeat the
    /// conversation. On the CPU only.
    #[arg(long)]
    pub lookup: bool,
    /// Each slot forgets a request's conversation when it ends: every request prefills its
    /// whole prompt, and on the CPU an idle slot holds no sequence (by default a slot keeps
    /// the last chat conversation's state for its next turn).
    #[arg(long)]
    pub no_conversation_cache: bool,
}

/// Requests generating at once on the CPU unless `--parallel` says otherwise.
const CPU_SLOTS: usize = 4;

/// Generation slots for `device`: `--parallel` on the CPU; exactly one on the GPU, where a
/// larger figure is refused rather than quietly lowered.
fn slots(device: load::DeviceArg, parallel: Option<usize>) -> Result<usize> {
    match (device, parallel) {
        (_, Some(0)) => bail!("--parallel must be at least 1"),
        (load::DeviceArg::Cpu, n) => Ok(n.unwrap_or(CPU_SLOTS)),
        (load::DeviceArg::Cuda, None | Some(1)) => Ok(1),
        (load::DeviceArg::Cuda, Some(n)) => bail!(
            "--parallel {n} with --device cuda: the GPU serves one request at a time (the others \
             wait in the queue, --queue); leave --parallel out or set it to 1"
        ),
    }
}

pub fn main(a: Args) -> Result<ExitCode> {
    let slots = slots(a.place.device, a.parallel)?;
    let kv = a.place.kv()?;
    // Before the model is loaded: a binary without the GPU backend says so at once.
    #[cfg(not(feature = "cuda"))]
    if a.place.device == load::DeviceArg::Cuda {
        return Err(load::no_cuda());
    }
    load::init_threads(a.threads)?;
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mut model = a.place.open(&a.model, None, kv)?;
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
        slots,
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
        lookup: a.lookup && super::lookup_device_unused(&a.place.device).is_none(),
        conversation_cache: !a.no_conversation_cache,
    };
    if let Some(why) = super::lookup_device_unused(&a.place.device).filter(|_| a.lookup) {
        eprintln!("warning: --lookup is ignored: {why}");
    }
    let state = match a.place.device {
        load::DeviceArg::Cpu => {
            let mut runner = Runner::cpu(model);
            runner.keep_states = !a.no_conversation_cache;
            AppState::with_runner(config, runner, tok, template)
        }
        #[cfg(feature = "cuda")]
        load::DeviceArg::Cuda => {
            AppState::with_runner(config, cuda_runner(model, kv)?, tok, template)
        }
        #[cfg(not(feature = "cuda"))]
        load::DeviceArg::Cuda => return Err(load::no_cuda()),
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
        eprintln!(
            "serving {model_id} ({}, context {ctx}, {slots} slots, queue {}) on http://{addr}",
            state.device.kind.as_str(),
            a.queue
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

/// Uploads the model to the GPU and sizes one sequence there (the figure `/v1/policy` and the
/// memory metric report); a slot's first request then makes a state of that size, and its
/// next ones rewind it to empty where the device's checkpoints are on (otherwise each makes
/// a fresh one).
#[cfg(feature = "cuda")]
fn cuda_runner(
    model: model::Model,
    kv: load::KvCacheArg,
) -> Result<Runner<niwaki_cuda::CudaModel>> {
    let gpu = load::cuda_model(&model, kv)?;
    let ctx = model.config.context_length;
    let probe = gpu
        .new_state(ctx)
        .with_context(|| format!("allocating a sequence of {ctx} tokens on the GPU"))?;
    let keep_states = gpu.checkpoints_on();
    let device = server::Device::cuda(
        gpu.device().to_string(),
        probe.device_bytes(),
        kv.as_str(),
        keep_states,
        model.config.recurrent_state_bytes(),
    );
    drop(probe);
    Ok(Runner {
        config: model.config.clone(),
        device,
        keep_states,
        new_state: Box::new(move |g: &niwaki_cuda::CudaModel| {
            g.new_state(ctx)
                .map_err(|e| engine::EngineError::Backend(e.to_string()))
        }),
        backend: gpu,
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use load::DeviceArg::{Cpu, Cuda};

    #[test]
    fn the_cpu_runs_as_many_slots_as_asked_four_by_default() {
        assert_eq!(slots(Cpu, None).unwrap(), CPU_SLOTS);
        assert_eq!(slots(Cpu, Some(7)).unwrap(), 7);
    }

    #[test]
    fn the_gpu_serves_one_request_at_a_time_and_refuses_more() {
        assert_eq!(slots(Cuda, None).unwrap(), 1);
        assert_eq!(slots(Cuda, Some(1)).unwrap(), 1);
        let e = slots(Cuda, Some(4)).unwrap_err().to_string();
        assert!(e.contains("one request at a time"), "{e}");
    }

    #[test]
    fn zero_slots_are_refused_on_either_device() {
        assert!(slots(Cpu, Some(0)).is_err());
        assert!(slots(Cuda, Some(0)).is_err());
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn without_the_cuda_feature_device_cuda_is_refused_before_loading() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        use clap::Parser;
        // The model does not exist: the refusal must come first, naming the missing feature.
        let cli = Cli::try_parse_from([
            "serve",
            "--model",
            "/nonexistent/model.gguf",
            "--device",
            "cuda",
        ])
        .unwrap();
        let e = main(cli.args).unwrap_err().to_string();
        assert!(e.contains("without the cuda feature"), "{e}");
    }
}
