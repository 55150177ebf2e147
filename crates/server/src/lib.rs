//! `niwaki serve`: an OpenAI-compatible HTTP server over the engine.
//!
//! * `POST /v1/chat/completions`, `POST /v1/completions` — streaming (SSE, as OpenAI sends it)
//!   and not; reasoning, tool calls and JSON-constrained output for chat.
//! * `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus), `GET /v1/policy`,
//!   `POST /tokenize`, `POST /detokenize`, and a web chat page at `/`.
//!
//! Generation runs on dedicated worker threads ([`scheduler`]), one sequence state per request,
//! behind a bounded queue: past it a request gets 503 with `Retry-After`.

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

use model::Model;
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
}

/// Everything the handlers share.
pub struct AppState {
    pub config: ServerConfig,
    pub model: Arc<Model>,
    pub tok: Arc<Tokenizer>,
    pub template: ChatTemplate,
    pub scheduler: scheduler::Scheduler,
    pub metrics: Arc<metrics::Metrics>,
    pub grammars: OnceLock<Result<constraint::GrammarFactory, String>>,
    pub created: u64,
    pub started: Instant,
    /// Measured at start-up: one decode step of one sequence, seconds.
    pub decode_step_s: f64,
    pub ready: std::sync::atomic::AtomicBool,
}

impl AppState {
    pub fn new(
        config: ServerConfig,
        model: Model,
        tok: Tokenizer,
        template: ChatTemplate,
    ) -> Arc<AppState> {
        let model = Arc::new(model);
        let tok = Arc::new(tok);
        let metrics = Arc::new(metrics::Metrics::new());
        let decode_step_s = measure_decode_step(&model);
        let scheduler = scheduler::Scheduler::start(
            model.clone(),
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
            model,
            tok,
            template,
            scheduler,
            metrics,
            grammars: OnceLock::new(),
            created,
            started: Instant::now(),
            decode_step_s,
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

/// Times one single-token step on a fresh state (the figure behind the slot policy).
fn measure_decode_step(model: &Model) -> f64 {
    let mut state = model.new_state();
    let t = Instant::now();
    let ok = model.forward(&mut state, &[0], model::Logits::Last).is_ok();
    if ok {
        t.elapsed().as_secs_f64()
    } else {
        f64::NAN
    }
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
