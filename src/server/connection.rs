//! The webhook port's connections: accepted within a bound, TLS handshakes classified for the
//! metrics and logs, each driven until it ends, idles out or is closed at shutdown, then the drain.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_util::io::InspectReader;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::metrics::TlsMetrics;
use super::tls::ReloadingTls;

#[derive(Clone)]
pub struct TlsServing {
    /// Cancelled at SIGTERM, before `stop`: then each HTTP/1.1 response closes its connection,
    /// so the API server never writes a call into the close at `stop` (docs/architecture.md).
    pub closing: CancellationToken,
    /// After `stop`, how long in-flight requests may take ([`drain_time`]).
    pub drain: Duration,
    /// Connections open at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// Per source address; more are closed at accept, leaving the API server slots.
    pub max_per_source: usize,
    /// Idle this long, a connection is closed (h2: GOAWAY), so idlers keep no slot.
    pub idle_timeout: Duration,
    pub metrics: TlsMetrics,
}

/// A source address's share of `max_connections` (docs/reliability.md).
pub fn per_source(max_connections: usize) -> usize {
    (max_connections / 4).max(1)
}

/// The drain after `stop`: `request_timeout` for the answer, `CLOSE_GRACE`
/// for its connection to end or be dropped, one more `CLOSE_GRACE` of slack.
pub fn drain_time(request_timeout: Duration) -> Duration {
    request_timeout.saturating_add(2 * CLOSE_GRACE)
}

/// A connection's requests in flight, when the last one ended, and since when a next
/// request's head has been arriving (HTTP/1.1, from its first byte).
#[derive(Clone, Copy)]
struct Load {
    in_flight: usize,
    last: Instant,
    head_since: Option<Instant>,
}

/// A connection's [`Load`], and a wake-up for its task when a head starts arriving.
struct Activity(Mutex<Load>, Notify);

impl Activity {
    fn new() -> Arc<Self> {
        let load = Load {
            in_flight: 0,
            last: Instant::now(),
            head_since: None,
        };
        Arc::new(Activity(Mutex::new(load), Notify::new()))
    }

    fn get(&self) -> std::sync::MutexGuard<'_, Load> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes arrived between requests: a request's head, which has `HEADER_TIMEOUT` from them.
    fn head_arriving(&self) {
        let mut load = self.get();
        if load.in_flight == 0 && load.head_since.is_none() {
            load.head_since = Some(Instant::now());
            self.1.notify_one();
        }
    }

    /// When the connection is closed if nothing happens: `HEADER_TIMEOUT` after a head's first
    /// byte, `idle` after the last request ended, as in Go's servers (docs/architecture.md).
    fn close_at(&self, idle: Duration) -> Option<Instant> {
        let load = *self.get();
        match load.head_since {
            _ if load.in_flight > 0 => Instant::now().checked_add(idle),
            Some(since) => since.checked_add(HEADER_TIMEOUT),
            None => load.last.checked_add(idle),
        }
    }
}

/// A request in flight on its connection; dropping it ends it.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn begin(activity: &Arc<Activity>) -> Self {
        let mut load = activity.get();
        load.in_flight = load.in_flight.saturating_add(1);
        load.head_since = None;
        drop(load);
        InFlight(Arc::clone(activity))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut load = self.0.get();
        load.in_flight = load.in_flight.saturating_sub(1);
        load.last = Instant::now();
    }
}

/// Serves `router` over TLS on `listener` until `stop`, then drains and closes the connections.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<ReloadingTls>,
    router: Router,
    stop: CancellationToken,
    serving: TlsServing,
) -> Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // Without a timer for hyper's timeouts, the first HTTP/1.1 request panics the connection task.
    builder
        .http1()
        .timer(TokioTimer::new())
        .keep_alive(true)
        .header_read_timeout(None);
    builder.http2().timer(TokioTimer::new());
    let connection = Connection {
        tls,
        router,
        // The protocol comes from ALPN, as Go's servers do it: h2 only when the client asked for
        // it. Letting hyper sniff the first bytes instead would wait for them without any timeout.
        http1: Arc::new(builder.clone().http1_only()),
        http2: Arc::new(builder.http2_only()),
        stop: stop.clone(),
        serving: serving.clone(),
    };
    // A flood of connections waits in the kernel's backlog instead of costing
    // memory here; each connection holds a permit until it closes.
    let max_connections = serving.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let connections = Arc::new(Semaphore::new(max_connections));
    let sources = Arc::new(Sources {
        open: Mutex::default(),
        limit: serving.max_per_source.max(1),
        metrics: serving.metrics.clone(),
    });
    while let Some((permit, tcp, peer)) = accept(&listener, &connections, &stop).await? {
        // Without a slot, `tcp` closes here.
        let Some(slot) = sources.take(peer.ip()) else {
            continue;
        };
        let connection = connection.clone();
        tokio::spawn(async move {
            let (_permit, _slot) = (permit, slot);
            connection.serve(tcp, peer).await;
        });
    }
    drop(listener);
    // All the permits back means every connection has drained.
    let all = u32::try_from(max_connections).unwrap_or(u32::MAX);
    tokio::select! {
        _ = connections.acquire_many(all) => tracing::info!("all webhook connections drained"),
        _ = tokio::time::sleep(serving.drain) => tracing::warn!(drain = ?serving.drain, "webhook connections still open after the drain timeout"),
    }
    Ok(())
}

/// Connections open by source address, within [`per_source`].
struct Sources {
    open: Mutex<HashMap<IpAddr, usize>>,
    limit: usize,
    metrics: TlsMetrics,
}

impl Sources {
    /// A slot for one more connection from `ip`; `None` (counted) at the limit.
    fn take(self: &Arc<Self>, ip: IpAddr) -> Option<SourceSlot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(ip).or_insert(0);
        if *count >= self.limit {
            drop(open);
            self.metrics.source_limited.inc();
            tracing::debug!(%ip, limit = self.limit, "connection closed: its source has the limit open");
            return None;
        }
        *count = count.saturating_add(1);
        Some(SourceSlot {
            sources: Arc::clone(self),
            ip,
        })
    }
}

/// One connection's place in its source's count.
struct SourceSlot {
    sources: Arc<Sources>,
    ip: IpAddr,
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut open = self.sources.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.ip) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// The next connection, within the bound; `None` once `stop` is cancelled.
async fn accept(
    listener: &TcpListener,
    connections: &Arc<Semaphore>,
    stop: &CancellationToken,
) -> Result<Option<(OwnedSemaphorePermit, TcpStream, SocketAddr)>> {
    let next = async {
        let permit = Arc::clone(connections).acquire_owned().await;
        let permit = permit.context("connection limit")?;
        loop {
            match listener.accept().await {
                Ok((tcp, peer)) => {
                    // Without it, Nagle's algorithm and delayed ACKs hold a
                    // response written in pieces for ~40 ms on a fresh connection.
                    if let Err(err) = tcp.set_nodelay(true) {
                        tracing::debug!(%peer, error = %err, "TCP_NODELAY not set");
                    }
                    return anyhow::Ok((permit, tcp, peer));
                }
                Err(err) => {
                    // Out of file descriptors and the like: pause, go on.
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    };
    stop.run_until_cancelled(next).await.transpose()
}

/// What serving one connection needs; cloned for each.
#[derive(Clone)]
struct Connection {
    tls: Arc<ReloadingTls>,
    router: Router,
    http1: Arc<auto::Builder<TokioExecutor>>,
    http2: Arc<auto::Builder<TokioExecutor>>,
    stop: CancellationToken,
    serving: TlsServing,
}

impl Connection {
    /// The TLS handshake (plain HTTP gets a 400), then requests. A failed handshake is counted
    /// and logged before its socket closes, so a client that saw it end finds it on `/metrics`.
    async fn serve(self, mut tcp: TcpStream, peer: SocketAddr) {
        let acceptor = self.tls.acceptor();
        let attempt = async move {
            let failed =
                |err: std::io::Error, tcp: TcpStream| (handshake_failure(&err), Some(err), tcp);
            match refused_plain_http(&mut tcp).await {
                Ok(false) => acceptor.accept(tcp).into_fallible().await,
                Ok(true) => return Err((HandshakeFailure::PlainHttp, None, tcp)),
                Err(err) => return Err(failed(err, tcp)),
            }
            .map_err(|(err, tcp)| failed(err, tcp))
        };
        // Pinned here, not moved into the timeout: a handshake that times out
        // keeps its socket until the timeout is counted below.
        tokio::pin!(attempt);
        let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, &mut attempt);
        let Some(ended) = self.stop.run_until_cancelled(handshake).await else {
            return;
        };
        match ended {
            Ok(Ok(tls)) => self.drive(tls, peer).await,
            // `_socket` closes at the end of the arm, after the count.
            Ok(Err((reason, error, _socket))) => {
                log_handshake_failure(reason, peer, error.as_ref());
                self.serving.metrics.handshake_error(reason);
            }
            Err(_) => {
                tracing::debug!(%peer, "TLS handshake timed out");
                self.serving
                    .metrics
                    .handshake_error(HandshakeFailure::Timeout);
            }
        }
    }

    /// Serves the connection's requests until it ends. Closed (after `stop`, or idle), it gets
    /// `CLOSE_GRACE` to end by itself, then is dropped once no request is in flight: an h2
    /// client that never sent its preface would otherwise never let go.
    async fn drive(&self, tls: TlsStream<TcpStream>, peer: SocketAddr) {
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
        let builder = if h2 { &self.http2 } else { &self.http1 };
        let activity = Activity::new();
        let (counted, router) = (Arc::clone(&activity), self.router.clone());
        let closing = (!h2).then(|| self.serving.closing.clone());
        let service = tower::service_fn(move |request: Request<Incoming>| {
            let close = closing.as_ref().is_some_and(|c| c.is_cancelled());
            respond(router.clone(), request, InFlight::begin(&counted), close)
        });
        let service = TowerToHyperService::new(service);
        let reading = Arc::clone(&activity);
        let tls = InspectReader::new(tls, move |bytes: &[u8]| {
            if !h2 && !bytes.is_empty() {
                reading.head_arriving();
            }
        });
        let connection = builder.serve_connection(TokioIo::new(tls), service);
        futures::pin_mut!(connection);
        let mut closing_since: Option<Instant> = None;
        loop {
            let give_up_at = match closing_since {
                Some(since) => since.checked_add(CLOSE_GRACE),
                None => activity.close_at(self.serving.idle_timeout),
            };
            tokio::select! {
                ended = connection.as_mut() => {
                    if let Err(err) = ended {
                        tracing::debug!(%peer, error = %err, "connection ended with an error");
                    }
                    return;
                }
                // A head started arriving: its deadline comes before the idle one.
                () = activity.1.notified(), if closing_since.is_none() => {}
                _ = self.stop.cancelled(), if closing_since.is_none() => {
                    connection.as_mut().graceful_shutdown();
                    closing_since = Some(Instant::now());
                }
                () = sleep_until(give_up_at) => {
                    if closing_since.is_none() {
                        if activity.close_at(self.serving.idle_timeout).is_some_and(|at| at <= Instant::now()) {
                            tracing::debug!(%peer, idle_timeout = ?self.serving.idle_timeout, "closing a connection idle too long, or slow to send a request's head");
                            connection.as_mut().graceful_shutdown();
                            closing_since = Some(Instant::now());
                        }
                    } else if activity.get().in_flight == 0 {
                        tracing::debug!(%peer, "connection dropped: it did not close by itself");
                        return;
                    } else {
                        closing_since = Some(Instant::now());
                    }
                }
            }
        }
    }
}

/// One request, in flight until its response is made; `close` (HTTP/1.1 from SIGTERM on) makes
/// hyper close the connection once the response is written.
async fn respond(
    router: Router,
    request: Request<Incoming>,
    _in_flight: InFlight,
    close: bool,
) -> Result<Response, Infallible> {
    let mut response = router.oneshot(request).await?;
    if close {
        let value = HeaderValue::from_static("close");
        response.headers_mut().insert(header::CONNECTION, value);
    }
    Ok(response)
}

/// Sleeps until `at`; for ever when there is no such time.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Logs a failed handshake (`err`: `None` for plain HTTP), loud when an operator should look.
fn log_handshake_failure(reason: HandshakeFailure, peer: SocketAddr, err: Option<&std::io::Error>) {
    let Some(err) = err else {
        return tracing::debug!(%peer, "plain HTTP on the TLS port refused");
    };
    let warning = match reason {
        HandshakeFailure::CertificateRejected => {
            "a client rejected the serving certificate (expired, or not trusted by the webhook's caBundle?)"
        }
        // With --client-ca-file, the API server's calls fail so when its admission
        // kubeconfig is wrong or its certificate expired: every node registers unheld.
        HandshakeFailure::NoClientCertificate => {
            "a client sent no client certificate (if it is the API server: is a user of its admission kubeconfig named for this webhook's host:port?)"
        }
        HandshakeFailure::ClientCertificateRejected => {
            "a client certificate was refused (not signed by the --client-ca-file CA, or expired?)"
        }
        _ => return tracing::debug!(%peer, error = %err, "TLS handshake failed"),
    };
    tracing::warn!(%peer, error = %err, "{warning}");
}

/// The metric reason of a failed handshake.
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
        // TLS 1.0/1.1 and SSL clients, or no cipher suite or signature scheme in common.
        Some(TlsError::PeerIncompatible(_)) => HandshakeFailure::IncompatibleClient,
        Some(TlsError::InvalidMessage(_)) => HandshakeFailure::NotTls,
        _ => HandshakeFailure::Other,
    }
}

/// Why a connection never completed its TLS handshake: the `reason` label of
/// `node_holder_tls_handshake_errors_total`, each shown at 0 from the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
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

/// How long a client may take to send its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection being closed may take to end by itself.
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// How long an HTTP/1.1 client may take to send a request's head, from its first byte.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether the connection opens with a method's letters (TLS opens with 0x16) and was refused: a
/// readable 400, as Go's servers answer, instead of a TLS alert a plain-HTTP client cannot read.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_source_gets_a_quarter_of_the_connections_and_the_drain_outlasts_a_request() {
        assert_eq!(per_source(1024), 256);
        assert_eq!(per_source(64), 16);
        assert_eq!(per_source(1), 1);
        assert_eq!(per_source(0), 1);
        assert_eq!(drain_time(Duration::from_secs(2)), Duration::from_secs(4));
        assert_eq!(drain_time(Duration::MAX), Duration::MAX);
    }
}
