//! What the server reports about the device it generates on, and what a slot's kept sequence
//! gives, checked through the router on the tiny oracle model (CPU). The GPU case swaps in a CUDA device description: what `/v1/policy` and
//! the memory metric say depends only on that description, so no GPU is needed to check it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use model::Model;
use serde_json::{json, Value};
use server::{AppState, Device, DeviceKind, Runner, ServerConfig};
use tokenizer::{ChatTemplate, Tokenizer};
use tower::ServiceExt;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/oracle/tiny-exact-q1.Q1_0.gguf")
}

fn config(slots: usize) -> ServerConfig {
    ServerConfig {
        model_id: "tiny".into(),
        slots,
        queue: 2,
        request_timeout: Duration::from_secs(30),
        max_body_bytes: 1 << 20,
        threads: 1,
        threads_rule: "test".into(),
        context_rule: "test".into(),
        script: Vec::new(),
        model_path: fixture(),
        lookup: false,
        conversation_cache: true,
    }
}

fn model() -> (Model, Tokenizer) {
    let model = Model::open(fixture()).unwrap();
    let spec = tokenizer::spec_from_metadata(model.file().metadata()).unwrap();
    (model, Tokenizer::new(&spec).unwrap())
}

/// The CPU model served as if it ran on a GPU called `name` whose sequences take `bytes`,
/// each slot keeping its sequence between requests where `kept`.
fn gpu_like(name: &str, bytes: usize, kept: bool) -> Arc<AppState> {
    gpu_like_with(name, bytes, kept, config(1))
}

fn gpu_like_with(name: &str, bytes: usize, kept: bool, c: ServerConfig) -> Arc<AppState> {
    let (model, tok) = model();
    let mut runner = Runner::cpu(model);
    runner.device = Device::cuda(name.into(), bytes, "f16", kept, 10);
    runner.keep_states = kept;
    AppState::with_runner(c, runner, tok, ChatTemplate::builtin_qwen35())
}

/// Waits (up to a second) for the scheduler to count no request in flight.
async fn settled(st: &Arc<AppState>) {
    for _ in 0..100 {
        if st.scheduler.in_flight() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn get(st: &Arc<AppState>, path: &str) -> (StatusCode, String) {
    let resp = server::router(st.clone())
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// A `/v1/completions` request's JSON reply (which must be 200).
async fn complete(st: &Arc<AppState>, body: &Value) -> Value {
    post(st, "/v1/completions", body).await
}

/// A POST's JSON reply (which must be 200).
async fn post(st: &Arc<AppState>, path: &str, body: &Value) -> Value {
    let resp = server::router(st.clone())
        .oneshot(
            Request::post(path)
                .header("content-type", "application/json")
                .body(Body::from(body.to_string()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

async fn policy(st: &Arc<AppState>) -> Value {
    let (status, body) = get(st, "/v1/policy").await;
    assert_eq!(status, StatusCode::OK);
    serde_json::from_str(&body).unwrap()
}

#[tokio::test]
async fn policy_reports_the_cpu_by_default() {
    let (model, tok) = model();
    let c = model.config.clone();
    let st = AppState::new(config(2), model, tok, ChatTemplate::builtin_qwen35());
    let p = policy(&st).await;
    assert_eq!(p["device"]["value"], "cpu");
    assert_eq!(p["device"]["name"], Value::Null);
    assert_eq!(p["backend"]["value"], "cpu");
    assert_eq!(p["slots"]["value"], 2);
    assert_eq!(p["conversation_cache"]["value"], "on");
    assert!(p["slots"]["measured_decode_step_s"].as_f64().unwrap() > 0.0);
    assert!(p["slots"]["measured_new_state_s"].as_f64().unwrap() >= 0.0);
    // Unchanged from before devices were reported: recurrent state + f32 KV for the context.
    assert_eq!(
        p["sequence_state_bytes_max"]["value"],
        json!(c.recurrent_state_bytes() + c.kv_bytes_per_token() * c.context_length)
    );
}

#[tokio::test]
async fn policy_reports_a_gpu_with_its_name_and_one_slot() {
    let st = gpu_like("NVIDIA H200 (sm_90)", 12345, false);
    let p = policy(&st).await;
    assert_eq!(p["device"]["value"], "cuda");
    assert_eq!(p["device"]["name"], "NVIDIA H200 (sm_90)");
    assert_eq!(p["backend"]["value"], "cuda");
    assert_eq!(p["slots"]["value"], 1);
    assert!(p["slots"]["rule"].as_str().unwrap().contains("one request"));
    // The GPU allocates a whole context up front: the figure does not grow with tokens.
    assert_eq!(p["sequence_state_bytes_max"]["value"], 12345);
}

#[test]
fn a_gpu_sequence_holds_the_same_bytes_at_any_length() {
    let d = Device::cuda("gpu".into(), 1000, "q8_0", false, 10);
    assert_eq!(d.kind, DeviceKind::Cuda);
    assert_eq!(d.state_bytes(0), 1000);
    assert_eq!(d.state_bytes(4096), 1000);
    assert!(d.state_rule.contains("q8_0 KV cache"), "{}", d.state_rule);
    assert!(
        d.state_rule.contains("when a request starts"),
        "{}",
        d.state_rule
    );
    let kept = Device::cuda("gpu".into(), 1000, "q8_0", true, 10);
    assert!(kept.state_rule.contains("kept"), "{}", kept.state_rule);
}

#[tokio::test]
async fn a_kept_sequence_gives_what_a_fresh_one_gives() {
    // Greedy requests of different lengths, each after others have left the kept sequence
    // longer or shorter than it, and one again at the end.
    let bodies: Vec<Value> = [
        "The",
        "Once upon a time there was",
        "The",
        "A b c d e f g h",
    ]
    .iter()
    .map(|p| json!({"model": "tiny", "prompt": p, "max_tokens": 12, "temperature": 0}))
    .collect();
    let texts = |st: Arc<AppState>| {
        let bodies = bodies.clone();
        async move {
            let mut out = Vec::new();
            for b in &bodies {
                out.push(complete(&st, b).await["choices"][0]["text"].clone());
            }
            out
        }
    };
    for lookup in [false, true] {
        let mut c = config(1);
        c.lookup = lookup;
        let fresh = texts(gpu_like_with("gpu", 1000, false, c.clone())).await;
        let kept_st = gpu_like_with("gpu", 1000, true, c);
        let kept = texts(kept_st.clone()).await;
        assert_eq!(kept, fresh, "lookup {lookup}");
        assert_eq!(kept[0], kept[2], "the same request, the same reply");
        assert!(fresh
            .iter()
            .all(|t| t.as_str().is_some_and(|s| !s.is_empty())));
        // The idle slot holds its sequence's bytes and its empty start's checkpoint (text
        // completions mark no conversation).
        settled(&kept_st).await;
        assert_eq!(kept_st.scheduler.state_bytes(), 1010);
    }
}

#[test]
fn a_cpu_sequence_grows_by_its_kv_cache_per_token() {
    let (model, _) = model();
    let c = &model.config;
    let d = Device::cpu(c, model::KvFormat::F32);
    assert_eq!(d.kind, DeviceKind::Cpu);
    assert_eq!(d.state_bytes(0), c.recurrent_state_bytes());
    assert_eq!(d.state_bytes(10) - d.state_bytes(9), c.kv_bytes_per_token());
    assert!(d.state_rule.contains("(f32)"), "{}", d.state_rule);
    // An f16 cache grows by half as much.
    let h = Device::cpu(c, model::KvFormat::F16);
    assert_eq!(
        2 * (h.state_bytes(10) - h.state_bytes(9)),
        c.kv_bytes_per_token()
    );
    assert!(h.state_rule.contains("(f16)"), "{}", h.state_rule);
}

#[tokio::test]
async fn a_request_runs_through_the_runner_and_releases_its_state() {
    // One generation through the whole path (scheduler, the runner's state maker, backend, JSON
    // reply); afterwards the memory metric is back to zero.
    let st = gpu_like("gpu", 777, false);
    let body = json!({"model": "tiny", "prompt": "hello", "max_tokens": 3, "temperature": 0});
    let v = complete(&st, &body).await;
    let n = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=3).contains(&n), "{v}");
    settled(&st).await;
    assert_eq!(st.scheduler.state_bytes(), 0);
}

/// A greedy completion's text and the policy's speculation entry, with `serve --lookup` or not.
async fn greedy_reply(lookup: bool) -> (Value, String) {
    let (model, tok) = model();
    let mut c = config(1);
    c.lookup = lookup;
    let st = AppState::new(c, model, tok, ChatTemplate::builtin_qwen35());
    let p = policy(&st).await;
    let body = json!({"model": "tiny", "prompt": "a b a b a b a b a b", "max_tokens": 24, "temperature": 0});
    let v = complete(&st, &body).await;
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    (p["speculation"]["value"].clone(), text)
}

#[tokio::test]
async fn lookup_drafting_leaves_greedy_replies_as_they_were_and_the_policy_says_so() {
    let (off_policy, off) = greedy_reply(false).await;
    let (on_policy, on) = greedy_reply(true).await;
    assert_eq!(off_policy, "off");
    assert_eq!(on_policy, "prompt lookup");
    assert!(!off.is_empty());
    assert_eq!(off, on);
}

/// A conversation's turns through `/v1/chat/completions`, each with the replies before it:
/// every reply's text and its usage.
async fn conversation(st: &Arc<AppState>, system: &str, users: &[&str]) -> Vec<(Value, Value)> {
    let mut messages = vec![json!({"role": "system", "content": system})];
    let mut out = Vec::new();
    for u in users {
        messages.push(json!({"role": "user", "content": u}));
        let body = json!({
            "model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0,
            "repetition_penalty": 1.3, "chat_template_kwargs": {"enable_thinking": false},
        });
        let v = post(st, "/v1/chat/completions", &body).await;
        let text = v["choices"][0]["message"]["content"].clone();
        messages.push(json!({"role": "assistant", "content": text}));
        out.push((text, v["usage"].clone()));
    }
    out
}

/// Three turns of one conversation, one of another, then the first's three again: each
/// reply's text and usage.
async fn two_conversations(st: &Arc<AppState>) -> Vec<(Value, Value)> {
    let turns = ["Hello there", "Tell me more", "And then?"];
    let a = conversation(st, "You are terse.", &turns).await;
    let b = conversation(st, "You are kind.", &["Something else"]).await;
    let c = conversation(st, "You are terse.", &turns).await;
    [a, b, c].concat()
}

#[tokio::test]
async fn a_conversation_goes_on_from_the_kept_sequence_with_the_replies_of_a_fresh_one() {
    let cached = |turns: &[(Value, Value)], i: usize| {
        turns[i].1["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    let fresh = two_conversations(&gpu_like("gpu", 1000, false)).await;
    assert!(
        (0..fresh.len()).all(|i| cached(&fresh, i) == 0),
        "{fresh:?}"
    );
    let st = gpu_like("gpu", 1000, true);
    assert_eq!(policy(&st).await["conversation_cache"]["value"], "on");
    let kept = two_conversations(&st).await;
    let texts = |t: &[(Value, Value)]| t.iter().map(|(x, _)| x.clone()).collect::<Vec<_>>();
    assert_eq!(texts(&kept), texts(&fresh));
    assert!(
        texts(&kept).iter().all(|t| t.as_str().is_some()),
        "{kept:?}"
    );
    // A conversation's later turns start from the turn before's messages; its first turn,
    // and the first conversation's again after the second took the slot's mark, from empty.
    let mut total = 0;
    for i in [1, 2, 5, 6] {
        let n = cached(&kept, i);
        assert!(
            n > 0 && n < kept[i].1["prompt_tokens"].as_u64().unwrap(),
            "{kept:?}"
        );
        total += n;
    }
    for i in [0, 3, 4] {
        assert_eq!(cached(&kept, i), 0, "turn {i}: {kept:?}");
    }
    let (_, metrics) = get(&st, "/metrics").await;
    let line = format!("niwaki_cached_prompt_tokens_total {total}");
    assert!(metrics.contains(&line), "{metrics}");
}

#[tokio::test]
async fn interleaved_conversations_each_go_on_in_the_slot_that_keeps_them() {
    // Two CPU slots and two conversations taking turns: each turn after the first goes to
    // the slot keeping its conversation, whichever slot wakes first.
    let (model, tok) = model();
    let st = AppState::new(config(2), model, tok, ChatTemplate::builtin_qwen35());
    let mut a = vec![json!({"role": "system", "content": "You are terse."})];
    let mut b = vec![json!({"role": "system", "content": "You are kind."})];
    for turn in 0..3 {
        for messages in [&mut a, &mut b] {
            messages.push(json!({"role": "user", "content": format!("turn {turn}")}));
            let body =
                json!({"model": "tiny", "messages": messages, "max_tokens": 4, "temperature": 0});
            let v = post(&st, "/v1/chat/completions", &body).await;
            let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
            assert_eq!(cached > Some(0), turn > 0, "turn {turn}: {v}");
            messages.push(
                json!({"role": "assistant", "content": v["choices"][0]["message"]["content"]}),
            );
        }
    }
}

#[tokio::test]
async fn a_request_off_the_kept_conversation_lets_it_go_and_the_next_turn_starts_afresh() {
    // Another request rewinds the slot before the kept conversation's mark, which it can then
    // no longer go back to: the conversation's next turn prefills it all, and answers.
    let st = gpu_like("gpu", 1000, true);
    let turns = ["Hello there", "Tell me more"];
    let first = conversation(&st, "You are terse.", &turns[..1]).await;
    let body = json!({"model": "tiny", "prompt": "unrelated", "max_tokens": 3, "temperature": 0});
    complete(&st, &body).await;
    let again = conversation(&st, "You are terse.", &turns).await;
    let cached = |t: &(Value, Value)| t.1["prompt_tokens_details"]["cached_tokens"].as_u64();
    assert_eq!(again[0], first[0]);
    assert_eq!(cached(&again[0]), Some(0));
    assert!(cached(&again[1]) > Some(0), "{again:?}");
}
