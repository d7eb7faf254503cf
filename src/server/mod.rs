//! HTTP layers: the HTTPS admission webhook and the plain-HTTP admin port.

pub mod tls;

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tower::limit::ConcurrencyLimitLayer;
use tower_http::timeout::TimeoutLayer;

use crate::core::admission::{AdmissionPolicy, Outcome, decide, review_body};
use crate::metrics::{Metrics, TlsMetrics};

/// Largest AdmissionReview accepted, as controller-runtime does.
pub const MAX_BODY_BYTES: usize = 7 * 1024 * 1024;

/// Limits of the webhook endpoint.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Whole-request budget, well under the webhook's `timeoutSeconds`.
    pub request_timeout: Duration,
    /// Requests handled at once; more wait.
    pub max_concurrent: usize,
}

/// What the handlers share.
pub struct WebhookState {
    pub policy: AdmissionPolicy,
    pub metrics: Metrics,
}

/// The webhook's routes: `POST /mutate`, with body, time and concurrency
/// bounds. Other paths get 404, other methods 405.
pub fn webhook_router(state: Arc<WebhookState>, limits: Limits) -> Router {
    let body_budget = Arc::new(Semaphore::new(BODY_BUDGET_KIB));
    Router::new()
        .route("/mutate", post(mutate))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(body_budget, reserve_body))
        .layer(ConcurrencyLimitLayer::new(limits.max_concurrent))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            limits.request_timeout,
        ))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), record))
        .with_state(state)
}

/// The request bodies read at once, together, in KiB: four of the largest
/// (7 MiB), or thousands of real reviews (a Node's is about 6 KiB). Without it
/// `--max-concurrent-requests` bodies of 7 MiB (1.8 GB at the default) could
/// be read at once, far over the chart's memory limit.
const BODY_BUDGET_KIB: usize = 32 * 1024;

/// Refuses a body whose declared length is over the limit before anything
/// reads it when the client asked whether to send it (`Expect:
/// 100-continue`): hyper says `100 Continue` only once the body is read, so
/// the client gets its `413` instead of a `100 Continue` and then a closed
/// connection. (A client that sends the body straight away has it read up
/// to the limit, as before, so it is not cut off mid-write.) Otherwise
/// reserves the
/// body's size (its Content-Length, or the largest allowed when it has none)
/// from the body budget until the response is made; waits while the budget
/// is spent (within the request timeout).
async fn reserve_body(
    State(budget): State<Arc<Semaphore>>,
    request: Request,
    next: Next,
) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let asks_to_continue = request
        .headers()
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let over = declared.filter(|&l| l > MAX_BODY_BYTES as u64);
    if let Some(length) = over.filter(|_| asks_to_continue) {
        tracing::warn!(
            content_length = length,
            error = "body too large",
            "webhook request refused"
        );
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("a request body of {length} bytes is over the limit of {MAX_BODY_BYTES}\n"),
        )
            .into_response();
    }
    let declared = declared.map_or(MAX_BODY_BYTES, |l| {
        usize::try_from(l).unwrap_or(MAX_BODY_BYTES)
    });
    let kib = u32::try_from(declared.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
    let Ok(_reserved) = budget.acquire_many(kib).await else {
        // The semaphore is never closed.
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    next.run(request).await
}

async fn record(State(state): State<Arc<WebhookState>>, request: Request, next: Next) -> Response {
    let _in_flight = state.metrics.in_flight();
    let started = Instant::now();
    let response = next.run(request).await;
    state
        .metrics
        .observe(response.status().as_u16(), started.elapsed());
    response
}

async fn mutate(
    State(state): State<Arc<WebhookState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !content_type.starts_with("application/json") {
        tracing::warn!(content_type, error = "not JSON", "webhook request refused");
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("expected Content-Type application/json, got {content_type:?}\n"),
        )
            .into_response();
    }
    let decision = match decide(&body, &state.policy) {
        Ok(decision) => decision,
        Err(bad) => {
            tracing::warn!(error = %bad, "webhook request refused");
            return (StatusCode::BAD_REQUEST, format!("{bad}\n")).into_response();
        }
    };
    let r = &decision.request;
    let (patched, holds) = match &decision.outcome {
        Outcome::Held { added } => {
            state.metrics.mutation();
            (
                true,
                added
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            )
        }
        _ => (false, String::new()),
    };
    tracing::info!(
        target: "node_holder::audit",
        uid = %r.uid,
        kind = %r.kind,
        node = %r.name,
        operation = %r.operation,
        user = %r.user,
        dry_run = r.dry_run,
        decision = decision.outcome.label(),
        patched,
        holds = %holds,
        latency_us = started.elapsed().as_micros() as u64,
        "admission decision"
    );
    match review_body(decision.response) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(err) => {
            tracing::error!(error = %err, "serialising the AdmissionReview failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "could not serialise the response\n",
            )
                .into_response()
        }
    }
}

/// Readiness of the process: the certificate is loaded (it is, once serving
/// starts), the API is reachable, and no shutdown has begun.
#[derive(Debug, Default)]
pub struct Readiness {
    pub api_reachable: AtomicBool,
    pub shutting_down: AtomicBool,
}

impl Readiness {
    pub fn ready(&self) -> bool {
        self.api_reachable.load(Ordering::Relaxed) && !self.shutting_down.load(Ordering::Relaxed)
    }
}

/// The admin routes: `/healthz`, `/readyz`, `/metrics`.
pub fn admin_router(readiness: Arc<Readiness>, state: Arc<WebhookState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let ready = readiness.ready();
                async move {
                    if ready {
                        (StatusCode::OK, "ok\n")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let text = state.metrics.encode();
                async move {
                    match text {
                        Ok(text) => (
                            [(
                                header::CONTENT_TYPE,
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            )],
                            text,
                        )
                            .into_response(),
                        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                    }
                }
            }),
        )
}

/// How the TLS port serves: its drain time, connection bound and metrics.
#[derive(Clone)]
pub struct TlsServing {
    /// After `stop`, how long in-flight requests may take.
    pub drain: Duration,
    /// Connections open at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// A connection with no request in flight for this long is closed
    /// (gracefully: h2 gets a GOAWAY), so idle clients cannot keep the
    /// `max_connections` slots.
    pub idle_timeout: Duration,
    pub metrics: TlsMetrics,
}

/// One connection's requests: how many are in flight, and when the last one
/// ended (or the connection opened).
struct Activity {
    in_flight: AtomicUsize,
    last: Mutex<Instant>,
}

impl Activity {
    fn new() -> Arc<Self> {
        Arc::new(Activity {
            in_flight: AtomicUsize::new(0),
            last: Mutex::new(Instant::now()),
        })
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(Arc::clone(self))
    }

    /// When the connection counts as idle if nothing happens meanwhile.
    fn idle_at(&self, timeout: Duration) -> Instant {
        let last = *self.last.lock().unwrap_or_else(|e| e.into_inner());
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            Instant::now() + timeout
        } else {
            last + timeout
        }
    }
}

/// A request in flight on its connection; dropping it ends it.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.0.last.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves `router` over TLS on `listener` until `stop` is cancelled, then
/// stops accepting, lets in-flight requests finish (up to `drain`) and closes
/// keep-alive connections.
pub async fn serve_tls(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    router: Router,
    stop: CancellationToken,
    serving: TlsServing,
) -> Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // hyper's timeouts need a timer; without one the first HTTP/1.1 request
    // panics the connection task.
    builder
        .http1()
        .timer(TokioTimer::new())
        .keep_alive(true)
        .header_read_timeout(Some(HEADER_TIMEOUT));
    builder.http2().timer(TokioTimer::new());
    // The protocol comes from ALPN, as Go's servers do it: h2 only when the
    // client asked for it. Letting hyper sniff the first bytes instead would
    // wait for them without any timeout.
    let http1 = Arc::new(builder.clone().http1_only());
    let http2 = Arc::new(builder.http2_only());
    // A flood of connections waits in the kernel's backlog instead of costing
    // memory here; each connection holds a permit until it closes.
    let max_connections = serving.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let connections = Arc::new(Semaphore::new(max_connections));
    loop {
        let permit = tokio::select! {
            _ = stop.cancelled() => break,
            permit = Arc::clone(&connections).acquire_owned() => permit.context("connection limit")?,
        };
        let (mut tcp, peer) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(err) => {
                    // Out of file descriptors and the like: pause, go on.
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Without it, Nagle's algorithm and delayed ACKs hold a response
        // written in pieces for ~40 ms on a fresh connection.
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::debug!(%peer, error = %err, "TCP_NODELAY not set");
        }
        let acceptor = acceptor.clone();
        let router = router.clone();
        let (http1, http2) = (Arc::clone(&http1), Arc::clone(&http2));
        let stop = stop.clone();
        let metrics = serving.metrics.clone();
        let idle_timeout = serving.idle_timeout;
        tokio::spawn(async move {
            let _permit = permit;
            let handshake = async {
                if refused_plain_http(&mut tcp).await? {
                    return Ok(None);
                }
                acceptor.accept(tcp).await.map(Some)
            };
            let handshake = tokio::select! {
                _ = stop.cancelled() => return,
                handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake) => handshake,
            };
            let tls = match handshake {
                Ok(Ok(Some(tls))) => tls,
                Ok(Ok(None)) => {
                    metrics.handshake_error(HandshakeFailure::PlainHttp);
                    tracing::debug!(%peer, "plain HTTP on the TLS port refused");
                    return;
                }
                Ok(Err(err)) => {
                    let reason = handshake_failure(&err);
                    metrics.handshake_error(reason);
                    match reason {
                        // The API server refusing our certificate: expired, or
                        // not signed by its caBundle. Worth an operator's eye.
                        HandshakeFailure::CertificateRejected => {
                            tracing::warn!(%peer, error = %err, "a client rejected the serving certificate (expired, or not trusted by the webhook's caBundle?)")
                        }
                        // With --client-ca-file, the API server's own calls
                        // fail this way when its admission kubeconfig does not
                        // match this webhook or its certificate expired or
                        // was rotated: every node then registers unheld.
                        HandshakeFailure::NoClientCertificate => {
                            tracing::warn!(%peer, error = %err, "a client sent no client certificate (if it is the API server: is a user of its admission kubeconfig named for this webhook's host:port?)")
                        }
                        HandshakeFailure::ClientCertificateRejected => {
                            tracing::warn!(%peer, error = %err, "a client certificate was refused (not signed by the --client-ca-file CA, or expired?)")
                        }
                        _ => tracing::debug!(%peer, error = %err, "TLS handshake failed"),
                    }
                    return;
                }
                Err(_) => {
                    metrics.handshake_error(HandshakeFailure::Timeout);
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
            let builder = if h2 { http2 } else { http1 };
            let activity = Activity::new();
            let service = {
                let activity = Arc::clone(&activity);
                TowerToHyperService::new(tower::service_fn(move |request: Request<Incoming>| {
                    let in_flight = activity.begin();
                    let response = router.clone().oneshot(request);
                    async move {
                        let response = response.await;
                        drop(in_flight);
                        response
                    }
                }))
            };
            let connection = builder.serve_connection(TokioIo::new(tls), service);
            futures::pin_mut!(connection);
            // Since when the connection is being closed (after `stop` or
            // when idle): it gets `CLOSE_GRACE` to end by itself; after that
            // it is dropped as soon as no request is in flight. An h2 client
            // that never sent its preface would otherwise never let go.
            let mut closing_since: Option<Instant> = None;
            loop {
                let idle_at = activity.idle_at(idle_timeout);
                let give_up_at = closing_since.map_or(idle_at, |since| since + CLOSE_GRACE);
                tokio::select! {
                    ended = connection.as_mut() => {
                        if let Err(err) = ended {
                            tracing::debug!(%peer, error = %err, "connection ended with an error");
                        }
                        break;
                    }
                    _ = stop.cancelled(), if closing_since.is_none() => {
                        connection.as_mut().graceful_shutdown();
                        closing_since = Some(Instant::now());
                    }
                    _ = tokio::time::sleep_until(idle_at.into()), if closing_since.is_none() => {
                        if activity.idle_at(idle_timeout) <= Instant::now() {
                            tracing::debug!(%peer, ?idle_timeout, "closing an idle connection");
                            connection.as_mut().graceful_shutdown();
                            closing_since = Some(Instant::now());
                        }
                    }
                    _ = tokio::time::sleep_until(give_up_at.into()), if closing_since.is_some() => {
                        if activity.in_flight.load(Ordering::SeqCst) == 0 {
                            tracing::debug!(%peer, "connection dropped: it did not close by itself");
                            break;
                        }
                        closing_since = Some(Instant::now());
                    }
                }
            }
        });
    }
    drop(listener);
    // Every connection task gives its permit back when it ends: all of them
    // back means every connection has drained.
    let drain = serving.drain;
    let all = u32::try_from(max_connections).unwrap_or(u32::MAX);
    tokio::select! {
        _ = connections.acquire_many(all) => tracing::info!("all webhook connections drained"),
        _ = tokio::time::sleep(drain) => tracing::warn!(?drain, "webhook connections still open after the drain timeout"),
    }
    Ok(())
}

/// The metric reason of a failed handshake: the client's alert about our
/// certificate, the client's own certificate missing or refused (with
/// `--client-ca-file`), a client the server cannot speak with, garbage, or
/// anything else.
fn handshake_failure(err: &std::io::Error) -> HandshakeFailure {
    use rustls::{AlertDescription, Error as TlsError};
    match err.get_ref().and_then(|e| e.downcast_ref::<TlsError>()) {
        Some(TlsError::NoCertificatesPresented) => HandshakeFailure::NoClientCertificate,
        // The server verifies no other certificate than the client's: an
        // unknown issuer, an expired or a malformed client certificate.
        Some(TlsError::InvalidCertificate(_)) => HandshakeFailure::ClientCertificateRejected,
        Some(TlsError::AlertReceived(
            AlertDescription::BadCertificate
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnknownCA
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateRevoked,
        )) => HandshakeFailure::CertificateRejected,
        // TLS 1.0/1.1 and SSL clients, or no cipher suite or signature
        // scheme in common.
        Some(TlsError::PeerIncompatible(_)) => HandshakeFailure::IncompatibleClient,
        Some(TlsError::InvalidMessage(_)) => HandshakeFailure::NotTls,
        _ => HandshakeFailure::Other,
    }
}

/// Why a connection to the webhook port never completed its TLS handshake:
/// the `reason` label of `node_holder_tls_handshake_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeFailure {
    PlainHttp,
    Timeout,
    NoClientCertificate,
    ClientCertificateRejected,
    CertificateRejected,
    IncompatibleClient,
    NotTls,
    Other,
}

impl HandshakeFailure {
    /// Every reason, so the metric shows each at 0 from the start.
    pub const ALL: [HandshakeFailure; 8] = [
        Self::PlainHttp,
        Self::Timeout,
        Self::NoClientCertificate,
        Self::ClientCertificateRejected,
        Self::CertificateRejected,
        Self::IncompatibleClient,
        Self::NotTls,
        Self::Other,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::PlainHttp => "plain-http",
            Self::Timeout => "timeout",
            Self::NoClientCertificate => "no-client-certificate",
            Self::ClientCertificateRejected => "client-certificate-rejected",
            Self::CertificateRejected => "certificate-rejected",
            Self::IncompatibleClient => "incompatible-client",
            Self::NotTls => "not-tls",
            Self::Other => "other",
        }
    }
}

/// How long a client may take to send its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection being closed may take to end by itself.
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// How long an HTTP/1.1 client may take to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// A TLS connection opens with a handshake record (content type 0x16); a
/// plain-HTTP request opens with the letters of its method. Such a client gets
/// a readable 400, as Go's servers answer it, instead of a TLS alert it cannot
/// read. Returns whether the connection was refused.
async fn refused_plain_http(tcp: &mut TcpStream) -> std::io::Result<bool> {
    let mut first = [0u8; 1];
    if tcp.peek(&mut first).await? == 0 || !first[0].is_ascii_uppercase() {
        return Ok(false);
    }
    tcp.write_all(PLAIN_HTTP_REFUSAL).await?;
    tcp.shutdown().await?;
    Ok(true)
}

const PLAIN_HTTP_REFUSAL: &[u8] = b"HTTP/1.0 400 Bad Request\r\n\
Content-Type: text/plain; charset=utf-8\r\n\
Connection: close\r\n\r\n\
Client sent an HTTP request to an HTTPS server.\n";

/// Serves the admin router over plain HTTP until `stop` is cancelled.
pub async fn serve_admin(
    listener: TcpListener,
    router: Router,
    stop: CancellationToken,
) -> Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
        .context("admin server")
}
