//! HTTP layers: the HTTPS admission webhook and the plain-HTTP admin port.

mod connection;
mod error;
pub mod metrics;
pub mod tls;

pub use connection::{HandshakeFailure, TlsServing, drain_time, per_source, serve_tls};
use error::WebhookError;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::limit::ConcurrencyLimitLayer;
use tower_http::timeout::TimeoutLayer;

use crate::core::admission::{Decision, Outcome, decide, review_body};
use crate::core::holds::Holding;
use crate::metrics::Exposition;
use metrics::WebhookMetrics;

/// Largest AdmissionReview accepted, as controller-runtime does.
pub const MAX_BODY_BYTES: usize = 7 * 1024 * 1024;

/// Webhook requests handled at once; more wait (within the request timeout). It never limits
/// a real load (docs/comparison.md): it keeps a flood's requests from all running at once.
const MAX_CONCURRENT_REQUESTS: usize = 256;

pub struct WebhookState {
    pub holding: Holding,
    pub metrics: WebhookMetrics,
    /// Every subsystem's metrics, for `/metrics`.
    pub exposition: Exposition,
}

/// The webhook's routes: `POST /mutate`, with body, time (`request_timeout`, well under the
/// webhook's `timeoutSeconds`) and concurrency bounds. Other paths get 404, other methods 405.
pub fn webhook_router(state: Arc<WebhookState>, request_timeout: Duration) -> Router {
    let body_allowance = Arc::new(Semaphore::new(BODY_ALLOWANCE_KIB));
    let timeout = TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, request_timeout);
    let counted = middleware::from_fn_with_state(Arc::clone(&state), count_request);
    Router::new()
        .route("/mutate", post(mutate))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(body_allowance, reserve_body))
        .layer(ConcurrencyLimitLayer::new(MAX_CONCURRENT_REQUESTS))
        .layer(timeout)
        .layer(counted)
        .with_state(state)
}

/// Request bodies read at once, in KiB: four of the largest, or thousands of real (6 KiB)
/// reviews; not 256 of 7 MiB (1.8 GB), far over the chart's memory limit.
const BODY_ALLOWANCE_KIB: usize = 32 * 1024;

/// Answers `413` at once to a body declared over the limit (before any `100 Continue`; a size
/// over the whole allowance would wait for permits that never come). Otherwise reserves the
/// body's size (its Content-Length, else the largest allowed) until the response is made.
async fn reserve_body(
    State(allowance): State<Arc<Semaphore>>,
    request: Request,
    next: Next,
) -> Response {
    let declared = request.headers().get(header::CONTENT_LENGTH);
    let declared = declared.and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if let Some(length) = declared.filter(|&l| l > MAX_BODY_BYTES as u64) {
        return WebhookError::BodyTooLarge { length }.into_response();
    }
    let bytes = declared.unwrap_or(MAX_BODY_BYTES as u64);
    let kib = u32::try_from(bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
    let Ok(_reserved) = allowance.acquire_many(kib).await else {
        // The semaphore is never closed.
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    next.run(request).await
}

async fn count_request(
    State(state): State<Arc<WebhookState>>,
    request: Request,
    next: Next,
) -> Response {
    let _in_flight = state.metrics.in_flight();
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16();
    state.metrics.observe(status, started.elapsed());
    response
}

async fn mutate(
    State(state): State<Arc<WebhookState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, WebhookError> {
    let started = Instant::now();
    let content_type = headers.get(header::CONTENT_TYPE);
    let content_type = content_type.and_then(|v| v.to_str().ok()).unwrap_or("");
    if !content_type.starts_with("application/json") {
        let content_type = content_type.to_string();
        return Err(WebhookError::NotJson { content_type });
    }
    let decision = decide(&body, &state.holding)?;
    match &decision.outcome {
        Outcome::Held { .. } => state.metrics.mutation(),
        Outcome::Unpatched { reason } => {
            tracing::error!(error = %reason, node = %decision.request.name, "a new node is allowed unheld");
        }
        _ => {}
    }
    audit(&decision, started);
    let body = review_body(decision.response).map_err(WebhookError::Serialise)?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// The admission decision's line in node-holder's audit log.
fn audit(decision: &Decision, started: Instant) {
    let r = &decision.request;
    let added = match &decision.outcome {
        Outcome::Held { added } => Some(added),
        _ => None,
    };
    let holds: Vec<String> = added
        .into_iter()
        .flatten()
        .map(ToString::to_string)
        .collect();
    tracing::info!(
        target: "node_holder::audit",
        uid = %r.uid,
        kind = %r.kind,
        node = %r.name,
        operation = %r.operation,
        user = %r.user,
        dry_run = r.dry_run,
        decision = <&str>::from(&decision.outcome),
        patched = added.is_some(),
        holds = %holds.join(","),
        latency_us = started.elapsed().as_micros() as u64,
        "admission decision"
    );
}

/// Readiness of the process: the certificate is loaded (it is, once serving
/// starts), the API is reachable, and no shutdown has begun.
#[derive(Debug, Default)]
pub struct Readiness {
    pub api_reachable: AtomicBool,
    /// Cancelled at SIGTERM; the webhook's connections close after each answer from then on.
    pub shutting_down: CancellationToken,
}

impl Readiness {
    fn ready(&self) -> bool {
        self.api_reachable.load(Ordering::Relaxed) && !self.shutting_down.is_cancelled()
    }
}

/// The admin routes: `/healthz`, `/readyz`, `/metrics`.
pub fn admin_router(readiness: Arc<Readiness>, state: Arc<WebhookState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(async move || match readiness.ready() {
                true => (StatusCode::OK, "ok\n"),
                false => (StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
            }),
        )
        .route(
            "/metrics",
            get(async move || {
                let text = state.exposition.encode();
                let text = text.map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
                Ok::<_, StatusCode>(([(header::CONTENT_TYPE, OPENMETRICS)], text))
            }),
        )
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests;
