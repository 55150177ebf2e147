//! HTTP handlers: the router and its middleware here, each family of endpoints in a file of
//! its own.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;

use crate::error::ApiError;
use crate::AppState;

mod chat;
mod completions;
mod info;
mod relay;
mod request;
mod tokenize;

use chat::chat;
use completions::completions;
use info::{health, index, metrics, model_by_id, models, policy};
use tokenize::{detokenize, tokenize};

type St = State<Arc<AppState>>;

pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.config.max_body_bytes;
    Router::new()
        .route("/", get(index))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model_by_id))
        .route("/v1/policy", get(policy))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(state.clone(), count))
        .with_state(state)
}

/// Counts every answer by endpoint and status.
async fn count(State(st): St, req: Request, next: Next) -> Response {
    let path = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("other", |p| p.as_str())
        .to_string();
    let resp = next.run(req).await;
    st.metrics.count_request(&path, resp.status().as_u16());
    resp
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such endpoint")
}
