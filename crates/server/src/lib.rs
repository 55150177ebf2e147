//! `niwaki serve`: an OpenAI-compatible HTTP server over the engine.
//!
//! * `POST /v1/chat/completions`, `POST /v1/completions` — streaming (SSE, as OpenAI sends it)
//!   and not; reasoning, tool calls and JSON-constrained output for chat.
//! * `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus), `GET /v1/policy`,
//!   `POST /tokenize`, `POST /detokenize`, and a web chat page at `/`.
//!
//! Generation runs on dedicated worker threads ([`scheduler`]), one sequence state per request,
//! behind a bounded queue: past it a request gets 503 with `Retry-After`. The workers are generic
//! over the engine's [`engine::Backend`], so the same server runs on the CPU model or on a GPU
//! backend; a [`Runner`] says how to start a sequence on it and where it runs ([`Device`]).

pub mod api;
pub mod constraint;
pub mod error;
pub mod metrics;
pub mod output;
mod routes;
pub mod scheduler;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use engine::Backend;
use model::{Config, KvFormat, Model};
use tokenizer::{ChatTemplate, Tokenizer};

pub use error::ApiError;
pub use routes::router;

/// A test-only canned reply: when the last user message (or the prompt) contains `matches`,
/// the model is made to produce `text` token by token.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedReply {
    #[serde(rename = "match")]
    pub matches: String,
    pub text: String,
    /// Milliseconds to wait before each token, to stand in for a slower model.
    #[serde(default)]
    pub delay_ms: u64,
}

/// Settings fixed at start-up.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The name clients use in `model`.
    pub model_id: String,
    /// Generation slots (requests generating at once).
    pub slots: usize,
    /// Requests that may wait for a slot; past `slots + queue`, 503.
    pub queue: usize,
    pub request_timeout: Duration,
    pub max_body_bytes: usize,
    pub threads: usize,
    /// Why `threads` and `slots` are what they are, for `/v1/policy`.
    pub threads_rule: String,
    pub context_rule: String,
    /// Test-only scripted replies (`--script-responses`).
    pub script: Vec<ScriptedReply>,
    pub model_path: PathBuf,
    /// Greedy requests draft tokens by prompt lookup and verify them several a pass
    /// (`serve --lookup`): the same replies, where the device verifies drafts losslessly (the
    /// CPU).
    pub lookup: bool,
    /// Slots that keep their sequence also keep the last chat request's conversation for its
    /// next turn (`serve --no-conversation-cache` turns it off).
    pub conversation_cache: bool,
}

/// The kind of device generation runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    Cuda,
}

impl DeviceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        }
    }
}

/// Where generation runs, as `/v1/policy` and the memory metric report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    pub kind: DeviceKind,
    /// The accelerator (name, architecture, memory, driver), when there is one.
    pub name: Option<String>,
    /// Why generation runs here.
    pub rule: String,
    /// Bytes a sequence holds from its start, whatever its length.
    pub state_fixed_bytes: usize,
    /// Bytes a sequence adds per token it holds.
    pub state_bytes_per_token: usize,
    /// How the two figures above come about.
    pub state_rule: String,
    /// Bytes of a saved point of a sequence (its recurrent state), which a slot keeping its
    /// sequence holds one or two of.
    pub checkpoint_bytes: usize,
}

impl Device {
    /// The CPU: a sequence holds its recurrent state and a KV cache (in the `kv` format) that
    /// grows per token.
    pub fn cpu(config: &Config, kv: KvFormat) -> Device {
        Device {
            kind: DeviceKind::Cpu,
            name: None,
            rule: "--device cpu (the default)".into(),
            state_fixed_bytes: config.recurrent_state_bytes(),
            // kv_bytes_per_token counts f32 values.
            state_bytes_per_token: config.kv_bytes_per_token() / 4 * kv.bytes(),
            state_rule: format!(
                "recurrent state + KV cache for a full context ({})",
                kv.as_str()
            ),
            checkpoint_bytes: config.recurrent_state_bytes(),
        }
    }

    /// A CUDA GPU: a sequence allocates its recurrent state, its KV cache (in the `kv_cache`
    /// format) for the whole context and its scratch on the device (`state_bytes` in all), when
    /// a request starts or, where `kept`, at a slot's first request, kept for its next ones; a
    /// checkpoint of it takes `checkpoint_bytes`.
    pub fn cuda(
        name: String,
        state_bytes: usize,
        kv_cache: &str,
        kept: bool,
        checkpoint_bytes: usize,
    ) -> Device {
        let when = if kept {
            "allocated on the GPU by a slot's first request and kept, rewound to empty or to its kept conversation, for its next ones"
        } else {
            "allocated on the GPU when a request starts"
        };
        Device {
            kind: DeviceKind::Cuda,
            name: Some(name),
            rule: "--device cuda".into(),
            state_fixed_bytes: state_bytes,
            state_bytes_per_token: 0,
            state_rule: format!(
                "recurrent state + {kv_cache} KV cache for the whole context + scratch, {when}"
            ),
            checkpoint_bytes,
        }
    }

    /// Bytes a slot holds between requests keeping a sequence that has held up to `peak`
    /// tokens (a cut cache keeps its room) and `checkpoints` saved points of it.
    pub fn kept_bytes(&self, peak: usize, checkpoints: usize) -> usize {
        self.state_bytes(peak) + checkpoints * self.checkpoint_bytes
    }

    /// Bytes of a sequence holding `tokens` tokens.
    pub fn state_bytes(&self, tokens: usize) -> usize {
        self.state_fixed_bytes + self.state_bytes_per_token * tokens
    }
}

/// Makes a fresh sequence state on a backend.
pub type NewState<B> = Box<dyn Fn(&B) -> engine::Result<<B as Backend>::State> + Send + Sync>;

/// What generates the replies: a backend, how a request's sequence state is made on it, and
/// what the API reports about it.
pub struct Runner<B: Backend> {
    pub backend: B,
    /// A fresh sequence with room for the served context.
    pub new_state: NewState<B>,
    /// The model's configuration, its context limited to what is served.
    pub config: Config,
    pub device: Device,
    /// Each slot keeps its sequence after a request and rewinds it to empty for the next
    /// (where the backend can rewind), rather than making a fresh one: on the GPU a fresh one
    /// allocates and zeroes its whole context's cache and captures its decode graphs again.
    pub keep_states: bool,
}

impl Runner<Model> {
    /// The CPU model, one heap-allocated state per request.
    pub fn cpu(model: Model) -> Runner<Model> {
        Runner {
            config: model.config.clone(),
            device: Device::cpu(&model.config, model.kv_format()),
            new_state: Box::new(|m: &Model| Ok(m.new_state())),
            backend: model,
            // A kept CPU sequence holds its last conversation's cache while idle: the price
            // of going on from it (`serve --no-conversation-cache` does not keep it).
            keep_states: true,
        }
    }
}

/// Everything the handlers share.
pub struct AppState {
    pub config: ServerConfig,
    /// The served model's configuration (context limited to what is served).
    pub model_config: Config,
    pub device: Device,
    pub tok: Arc<Tokenizer>,
    pub template: ChatTemplate,
    pub scheduler: scheduler::Scheduler,
    pub metrics: Arc<metrics::Metrics>,
    pub grammars: OnceLock<Result<constraint::GrammarFactory, String>>,
    pub created: u64,
    pub started: Instant,
    /// Measured at start-up: one decode step of one sequence, seconds.
    pub decode_step_s: f64,
    /// Measured at start-up: making a fresh sequence state, seconds.
    pub new_state_s: f64,
    /// Each slot keeps its sequence, and with it the last conversation's messages so far for
    /// that conversation's next request ([`scheduler::Job::history`]).
    pub keeps_conversations: bool,
    pub ready: std::sync::atomic::AtomicBool,
}

impl AppState {
    /// Serves `model` on the CPU.
    pub fn new(
        config: ServerConfig,
        model: Model,
        tok: Tokenizer,
        template: ChatTemplate,
    ) -> Arc<AppState> {
        AppState::with_runner(config, Runner::cpu(model), tok, template)
    }

    /// Serves on any backend.
    pub fn with_runner<B>(
        config: ServerConfig,
        runner: Runner<B>,
        tok: Tokenizer,
        template: ChatTemplate,
    ) -> Arc<AppState>
    where
        B: Backend + Send + Sync + 'static,
    {
        let keeps_conversations =
            config.conversation_cache && runner.keep_states && runner.backend.can_rewind();
        let runner = Arc::new(runner);
        let tok = Arc::new(tok);
        let metrics = Arc::new(metrics::Metrics::new());
        let (new_state_s, decode_step_s) = measure_decode_step(&runner);
        let scheduler = scheduler::Scheduler::start(
            runner.clone(),
            tok.clone(),
            config.slots,
            config.queue,
            metrics.clone(),
        );
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Arc::new(AppState {
            config,
            model_config: runner.config.clone(),
            device: runner.device.clone(),
            tok,
            template,
            scheduler,
            metrics,
            grammars: OnceLock::new(),
            created,
            started: Instant::now(),
            decode_step_s,
            new_state_s,
            keeps_conversations,
            ready: std::sync::atomic::AtomicBool::new(true),
        })
    }

    /// The end-of-turn token: what a finished reply ends with.
    pub fn end_of_turn(&self) -> u32 {
        self.tok
            .token_to_id("<|im_end|>")
            .or(self.tok.eos_id())
            .or(self.tok.end_of_generation_ids().first().copied())
            .unwrap_or(0)
    }

    /// The JSON grammar factory, built on first use (it walks the whole vocabulary).
    pub fn grammars(&self) -> Result<&constraint::GrammarFactory, ApiError> {
        self.grammars
            .get_or_init(|| constraint::GrammarFactory::new(self.tok.clone(), self.end_of_turn()))
            .as_ref()
            .map_err(|e| ApiError::internal(format!("constrained decoding is unavailable: {e}")))
    }
}

/// Times making a fresh state and one single-token step on it (the figures behind the slot
/// policy); NaN for what failed.
fn measure_decode_step<B: Backend>(runner: &Runner<B>) -> (f64, f64) {
    let t = Instant::now();
    let Ok(mut state) = (runner.new_state)(&runner.backend) else {
        return (f64::NAN, f64::NAN);
    };
    let new_state_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let ok = runner
        .backend
        .forward(&mut state, &[0], model::Logits::Last)
        .is_ok();
    (
        new_state_s,
        if ok {
            t.elapsed().as_secs_f64()
        } else {
            f64::NAN
        },
    )
}

/// Serves until `shutdown` resolves; then stops accepting connections, lets running requests
/// finish for up to `grace`, and ends the rest with an error.
pub async fn serve(
    state: Arc<AppState>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    let app = router(state.clone());
    let st = state.clone();
    let signal = async move {
        shutdown.await;
        st.ready.store(false, std::sync::atomic::Ordering::Release);
        let st2 = st.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            while st2.scheduler.in_flight() > 0 && t.elapsed() < grace {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            st2.scheduler.close();
        });
    };
    axum::serve(listener, app)
        .with_graceful_shutdown(signal)
        .await
}
