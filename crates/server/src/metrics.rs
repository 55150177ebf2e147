//! Prometheus metrics: requests by endpoint and status, tokens in (and of them cached) and out, time to first token,
//! inter-token latency, queue depth and wait, and memory (sequence state, process).

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

pub struct Metrics {
    registry: Registry,
    pub requests: Family<Labels, Counter>,
    pub finished: Family<Labels, Counter>,
    pub prompt_tokens: Counter,
    pub cached_prompt_tokens: Counter,
    pub generated_tokens: Counter,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub queue_wait: Histogram,
    pub queue_depth: Gauge,
    pub in_flight: Gauge,
    pub state_bytes: Gauge,
    pub resident_bytes: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("niwaki");
        let requests = Family::<Labels, Counter>::default();
        let finished = Family::<Labels, Counter>::default();
        let prompt_tokens = Counter::default();
        let cached_prompt_tokens = Counter::default();
        let generated_tokens = Counter::default();
        let ttft = Histogram::new(exponential_buckets(0.001, 2.0, 18));
        let itl = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        let queue_wait = Histogram::new(exponential_buckets(0.001, 2.0, 18));
        let queue_depth = Gauge::default();
        let in_flight = Gauge::default();
        let state_bytes = Gauge::default();
        let resident_bytes = Gauge::default();
        registry.register(
            "requests",
            "HTTP requests answered, by endpoint and status code",
            requests.clone(),
        );
        registry.register(
            "generations",
            "Generations ended, by how they ended (stop, length, cancelled, failed)",
            finished.clone(),
        );
        registry.register(
            "prompt_tokens",
            "Prompt tokens of accepted generations",
            prompt_tokens.clone(),
        );
        registry.register(
            "cached_prompt_tokens",
            "Prompt tokens of finished generations taken from a slot's kept conversation, not fed again",
            cached_prompt_tokens.clone(),
        );
        registry.register(
            "generated_tokens",
            "Tokens generated",
            generated_tokens.clone(),
        );
        registry.register(
            "time_to_first_token_seconds",
            "From the start of a generation (prefill included) to its first sampled token",
            ttft.clone(),
        );
        registry.register(
            "inter_token_latency_seconds",
            "Time between consecutive sampled tokens of one generation",
            itl.clone(),
        );
        registry.register(
            "queue_wait_seconds",
            "Time a request waited for a generation slot",
            queue_wait.clone(),
        );
        registry.register(
            "queue_depth",
            "Requests waiting for a generation slot",
            queue_depth.clone(),
        );
        registry.register(
            "requests_in_flight",
            "Generations accepted and not finished (running or queued)",
            in_flight.clone(),
        );
        registry.register(
            "sequence_state_bytes",
            "Memory held by the sequence state (recurrent state and KV cache) of running generations",
            state_bytes.clone(),
        );
        registry.register(
            "process_resident_bytes",
            "Resident memory of the server process",
            resident_bytes.clone(),
        );
        Metrics {
            registry,
            requests,
            finished,
            prompt_tokens,
            cached_prompt_tokens,
            generated_tokens,
            ttft,
            itl,
            queue_wait,
            queue_depth,
            in_flight,
            state_bytes,
            resident_bytes,
        }
    }

    pub fn count_request(&self, endpoint: &str, status: u16) {
        self.requests
            .get_or_create(&vec![
                ("endpoint".to_string(), endpoint.to_string()),
                ("status".to_string(), status.to_string()),
            ])
            .inc();
    }

    pub fn count_finish(&self, how: &str) {
        self.finished
            .get_or_create(&vec![("finish".to_string(), how.to_string())])
            .inc();
    }

    pub fn render(&self) -> String {
        if let Some(rss) = resident_bytes() {
            self.resident_bytes.set(rss as i64);
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Resident set size from /proc (Linux); `None` elsewhere.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}
