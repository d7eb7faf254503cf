//! The webhook port under a flood: several times `--max-connections` of
//! connections at once, of three kinds — TCP connects that never start TLS,
//! TLS connections that dribble their request headers a byte a second
//! (slowloris) and TLS connections that send whole headers and then dribble a
//! body of a few MiB (slow POST). Memory and the process's connections stay
//! bounded, every slow client is cut off by its timeout, a well-behaved client
//! is served within the bound those timeouts give, and once the flood is gone
//! the process is back where it started.

use testsupport as common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::window::{eventually, metric};
use common::{Served, https, node_create, node_object, review, serve_offline};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Small, so the flood is several times the limit without needing thousands
/// of sockets in the test process.
const MAX_CONNECTIONS: usize = 64;
/// What one source address may hold of [`MAX_CONNECTIONS`]: a quarter
/// (`per_source` in `src/server/connection.rs`); more are closed at accept.
const PER_SOURCE: usize = MAX_CONNECTIONS / 4;
/// Four times the limit: more than the limit plus the listen backlog (128,
/// what tokio's `TcpListener::bind` asks for), so the last connects find the
/// backlog full and retry their SYN, as in a real flood. The well-behaved
/// client queues behind the flood (the backlog is FIFO) and each slot holds
/// a flood connection for up to one timeout, so its wait grows with the
/// flood; this size keeps the test near half a minute.
const FLOOD: usize = 4 * MAX_CONNECTIONS;
/// `--request-timeout`, short so slow bodies cycle through the slots quickly.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Declared by the slow POSTs: a few MiB, under the 7 MiB body limit, so only
/// the request timeout can end them.
const SLOW_BODY_LENGTH: usize = 3 * 1024 * 1024;

/// Measured: a connection the server holds costs about 23 KiB (64 held
/// ones: +1.4-1.5 MiB of VmRSS). Eight MiB leaves room for the allocator on a
/// loaded machine, while an unbounded buffer would not fit: the slow POSTs in
/// the slots alone declare over 60 MiB of bodies.
const RSS_GROWTH_KIB: u64 = 8 * 1024;
/// Webhook descriptors beyond the baseline and the held connections.
const FD_SLACK: usize = 8;
/// Scheduling delay allowed on top of a timeout on a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(3);
/// A slowloris gets the 10 s a request's head has from its first byte
/// (`HEADER_TIMEOUT`, `src/server/connection.rs`, not a flag), the second
/// after which a closed connection is dropped, plus `SLACK`.
const SLOWLORIS_BOUND: Duration = Duration::from_secs(1 + 10 + 3);
/// See where the good client connects.
const GOOD_CLIENT_BOUND: Duration = Duration::from_secs(60);

/// One request on a fresh connection; its status.
async fn post_review(served: &Served, name: &str) -> u16 {
    https(
        served,
        "POST",
        "/mutate",
        Some("application/json"),
        node_create(name),
    )
    .await
    .status
}

/// What `/proc` says about the serve process.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    rss_kib: u64,
    /// Entries of `/proc/<pid>/fd`, for the report.
    fds: usize,
    /// The descriptors the flood can reach: everything but sockets, plus the
    /// sockets on the webhook port (the listener and accepted connections).
    /// The Kubernetes client's connections to the API server (Lease renewals,
    /// the node watch, Events) and admin-port scrapes come and go with the
    /// machine's load and are not the webhook's to bound.
    webhook_fds: usize,
    /// Of those, connected (not listening) TCP sockets on the webhook port:
    /// connections the process has accepted. Ones still in the listen backlog
    /// belong to no process yet.
    webhook_connections: usize,
}

impl Usage {
    fn read(pid: u32, webhook_port: u16) -> Usage {
        let rss_kib = status_kib(pid, "VmRSS");
        let mut fds = 0usize;
        let mut sockets = HashSet::new();
        for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
            let Ok(entry) = entry else { continue };
            fds += 1;
            // An fd closed between the listing and the readlink is skipped.
            if let Ok(target) = std::fs::read_link(entry.path())
                && let Some(inode) = target
                    .to_str()
                    .and_then(|t| t.strip_prefix("socket:["))
                    .and_then(|t| t.strip_suffix(']'))
            {
                sockets.insert(inode.to_string());
            }
        }
        let port = format!(":{webhook_port:04X}");
        // local_address, state (0A is LISTEN), inode
        let on_webhook_port: Vec<Vec<String>> = ["/proc/net/tcp", "/proc/net/tcp6"]
            .iter()
            .filter_map(|table| std::fs::read_to_string(table).ok())
            .flat_map(|table| {
                table
                    .lines()
                    .skip(1)
                    .map(|line| line.split_whitespace().map(String::from).collect())
                    .collect::<Vec<Vec<String>>>()
            })
            .filter(|f: &Vec<String>| {
                f.len() > 9 && f[1].ends_with(&port) && sockets.contains(&f[9])
            })
            .collect();
        // The kernel writes these tables a page at a time, so a table that
        // changes while it is read can list a socket twice.
        let distinct = |listening: Option<bool>| {
            on_webhook_port
                .iter()
                .filter(|f| listening.is_none_or(|l| (f[3] == "0A") == l))
                .map(|f| f[9].as_str())
                .collect::<HashSet<_>>()
                .len()
        };
        let webhook_connections = distinct(Some(false));
        let webhook_fds = fds.saturating_sub(sockets.len()) + distinct(None);
        Usage {
            rss_kib,
            fds,
            webhook_fds,
            webhook_connections,
        }
    }

    fn max(self, other: Usage) -> Usage {
        Usage {
            rss_kib: self.rss_kib.max(other.rss_kib),
            fds: self.fds.max(other.fds),
            webhook_fds: self.webhook_fds.max(other.webhook_fds),
            webhook_connections: self.webhook_connections.max(other.webhook_connections),
        }
    }
}

/// A `kB` figure of `/proc/<pid>/status` (`VmRSS`, `VmHWM`).
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/<pid>/status"))
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Samples the process every 50 ms on a thread of its own (the test's
/// runtime is busy with hundreds of clients) until stopped; the peak of each.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Usage>,
}

impl Sampler {
    fn start(pid: u32, webhook_port: u16) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = Arc::clone(&stop);
            move || {
                let mut peak = Usage::default();
                while !stop.load(Ordering::Relaxed) {
                    peak = peak.max(Usage::read(pid, webhook_port));
                    std::thread::sleep(Duration::from_millis(50));
                }
                peak.max(Usage::read(pid, webhook_port))
            }
        });
        Sampler { stop, thread }
    }

    fn peak(self) -> Usage {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// How a flood connection ended, from the client's side.
#[derive(Debug)]
enum Ended {
    /// The server closed it; how long after it was up (connected for a
    /// silent client, TLS up for a slowloris, headers sent for a slow POST),
    /// and the first bytes it answered, if any.
    Closed { after: Duration, answer: Vec<u8> },
    /// Still open when the flood was called off.
    Open,
    /// The TLS handshake failed (or was cut off by the end of the flood).
    NoTls,
}

/// Reads until the server closes the connection; the first bytes it sent.
async fn until_closed(mut read: impl AsyncReadExt + Unpin) -> Vec<u8> {
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    while let Ok(n) = read.read(&mut buf).await
        && n > 0
    {
        if answer.len() < 1024 {
            answer.extend_from_slice(&buf[..n]);
        }
    }
    answer
}

/// A TCP connection that never sends a byte.
async fn silent(mut tcp: TcpStream, flood: CancellationToken) -> Ended {
    let up = Instant::now();
    let mut buf = [0u8; 16];
    tokio::select! {
        _ = tcp.read(&mut buf) => Ended::Closed { after: up.elapsed(), answer: Vec::new() },
        _ = flood.cancelled() => Ended::Open,
    }
}

/// Completes TLS, writes `head` at once, then `rest` in pieces of `chunk`
/// bytes, one each `every`, over and over, until the server closes the
/// connection or the flood is called off. The time of a close counts from
/// TLS up (`head` goes out at once).
async fn dribbling(
    tcp: TcpStream,
    connector: tokio_rustls::TlsConnector,
    head: Vec<u8>,
    (rest, chunk, every): (Vec<u8>, usize, Duration),
    flood: CancellationToken,
) -> Ended {
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    // The handshake waits while the connection sits in the listen backlog.
    let tls = tokio::select! {
        tls = connector.connect(name, tcp) => match tls {
            Ok(tls) => tls,
            Err(_) => return Ended::NoTls,
        },
        _ = flood.cancelled() => return Ended::NoTls,
    };
    let (read, mut write) = tokio::io::split(tls);
    let up = Instant::now();
    let writer = async {
        if write.write_all(&head).await.is_ok() && write.flush().await.is_ok() {
            for piece in rest.chunks(chunk).cycle() {
                tokio::time::sleep(every).await;
                if write.write_all(piece).await.is_err() || write.flush().await.is_err() {
                    break;
                }
            }
        }
        // A refused write means the server is closing; the reader sees it.
        std::future::pending::<()>().await;
    };
    tokio::select! {
        answer = until_closed(read) => Ended::Closed { after: up.elapsed(), answer },
        _ = writer => unreachable!("the writer never ends"),
        _ = flood.cancelled() => Ended::Open,
    }
}

/// Slowloris: request headers a byte a second, never finished (they take
/// over a minute and a half).
async fn slow_headers(
    tcp: TcpStream,
    connector: tokio_rustls::TlsConnector,
    flood: CancellationToken,
) -> Ended {
    let head = b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n\
        Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
    let (first, rest) = head.split_at(1);
    let dribble = (rest.to_vec(), 1, Duration::from_secs(1));
    dribbling(tcp, connector, first.to_vec(), dribble, flood).await
}

/// Slow POST: whole headers declaring a body of `SLOW_BODY_LENGTH`, then the
/// body at 640 bytes a second (it would take over an hour).
async fn slow_body(
    tcp: TcpStream,
    connector: tokio_rustls::TlsConnector,
    flood: CancellationToken,
) -> Ended {
    let head = format!(
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {SLOW_BODY_LENGTH}\r\n\r\n{{\"apiVersion\":"
    )
    .into_bytes();
    let dribble = (vec![b' '; 64], 64, Duration::from_millis(100));
    dribbling(tcp, connector, head, dribble, flood).await
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Silent,
    SlowHeaders,
    SlowBody,
}

fn status_of(answer: &[u8]) -> Option<u16> {
    std::str::from_utf8(answer.get(..12)?)
        .ok()?
        .strip_prefix("HTTP/1.1 ")?
        .parse()
        .ok()
}

#[tokio::test]
async fn a_flood_of_idle_and_slow_connections_stays_bounded_serves_a_good_client_and_recovers() {
    let served = serve_offline(&[
        &format!("--max-connections={MAX_CONNECTIONS}"),
        &format!("--request-timeout={}s", REQUEST_TIMEOUT.as_secs()),
    ])
    .await;
    let pid = served.child.id();
    let port = served.webhook_port;
    let connections = || Usage::read(pid, port).webhook_connections;

    // The baseline after some requests, so the TLS and HTTP paths' one-time
    // allocations are in it, and once their connections are gone.
    for n in 0..8 {
        assert_eq!(post_review(&served, &format!("warm-{n}")).await, 200);
    }
    eventually(
        "warm-up connections closed",
        Duration::from_secs(30),
        || std::future::ready(connections() == 0),
    )
    .await;
    let baseline = Usage::read(pid, port);

    // The flood: connects one after another, so the backlog's order is known
    // (silent, slowloris, slow POST, silent, ...); each client then goes on
    // by itself. Beyond the listen backlog the kernel drops SYNs and connect
    // retries after 1 s, 2 s, ...: counted as `retried`. It comes from
    // loopback addresses of its own, each with the share one source may hold
    // (a quarter of MAX_CONNECTIONS), so that the bound on all connections is
    // what holds it, and the good client's address has none open.
    let sampler = Sampler::start(pid, port);
    let flood = CancellationToken::new();
    let connector = common::tls_connector(&served.ca_pem(), &["http/1.1"]);
    let started = Instant::now();
    let mut retried = 0;
    let mut clients = Vec::new();
    for n in 0..FLOOD {
        let connecting = Instant::now();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        let source = u8::try_from(2 + n / PER_SOURCE).unwrap();
        socket
            .bind(std::net::SocketAddr::from(([127, 0, 0, source], 0)))
            .unwrap();
        let tcp = socket.connect(([127, 0, 0, 1], port).into()).await.unwrap();
        if connecting.elapsed() > Duration::from_millis(500) {
            retried += 1;
        }
        let kind = [Kind::Silent, Kind::SlowHeaders, Kind::SlowBody][n % 3];
        let (connector, flood) = (connector.clone(), flood.clone());
        clients.push((
            kind,
            tokio::spawn(async move {
                match kind {
                    Kind::Silent => silent(tcp, flood).await,
                    Kind::SlowHeaders => slow_headers(tcp, connector, flood).await,
                    Kind::SlowBody => slow_body(tcp, connector, flood).await,
                }
            }),
        ));
    }
    let connected = started.elapsed();

    // A well-behaved client on a fresh connection, behind the flood. At most
    // MAX_CONNECTIONS + the backlog (128) flood connections are ahead of it,
    // about three rounds of the slots; each slot lets a flood connection go
    // within its longest timeout (a slowloris: the 10 s header timeout from
    // its first byte, plus its TLS handshake). Its
    // own dropped SYNs retry at 1, 3, 7, 15 s. One minute covers both with
    // room for a loaded machine; the flood's mix takes about 15 s.
    let waiting = Instant::now();
    let good = tokio::time::timeout(GOOD_CLIENT_BOUND, post_review(&served, "good"))
        .await
        .unwrap_or_else(|_| panic!("the good client was not served within {GOOD_CLIENT_BOUND:?}"));
    let waited = waiting.elapsed();
    assert_eq!(good, 200);

    flood.cancel();
    let mut ended = Vec::new();
    for (kind, client) in clients {
        ended.push((kind, client.await.unwrap()));
    }
    // Each counter is bumped before its connection closes, so, read once
    // every client has ended, it is at least what the clients saw. (Read
    // before the flood was called off, a close between the read and the
    // call counted in the clients' tally but not in the metric: the test
    // failed under load, 59 silent clients closed and 58 timeouts counted.)
    let timeouts = metric(
        &served,
        "node_holder_tls_handshake_errors_total{reason=\"timeout\"}",
    )
    .await
    .unwrap_or(0.0) as usize;
    let answered_408 = metric(&served, "node_holder_webhook_requests_total{code=\"408\"}")
        .await
        .unwrap_or(0.0) as usize;
    let peak = sampler.peak();
    let closed = |kind: Kind| -> Vec<(Duration, Option<u16>)> {
        ended
            .iter()
            .filter(|(k, _)| *k == kind)
            .filter_map(|(_, e)| match e {
                Ended::Closed { after, answer } => Some((*after, status_of(answer))),
                _ => None,
            })
            .collect()
    };
    let (silent, slowloris, slow_posts) = (
        closed(Kind::Silent),
        closed(Kind::SlowHeaders),
        closed(Kind::SlowBody),
    );
    let longest = |c: &[(Duration, Option<u16>)]| c.iter().map(|(d, _)| *d).max();
    let report = format!(
        "{FLOOD} connections ({retried} retried their SYN) in {connected:?}; good client \
         served after {waited:?}; baseline {baseline:?} ({:.1} MiB); peak {peak:?} \
         (+{:.1} MiB); closed by the server: {} silent, {} slowloris (longest {:?}), \
         {} slow POSTs (longest {:?}); metrics: {timeouts} handshake timeouts, \
         {answered_408} 408s",
        mib(baseline.rss_kib),
        mib(peak.rss_kib.saturating_sub(baseline.rss_kib)),
        silent.len(),
        slowloris.len(),
        longest(&slowloris),
        slow_posts.len(),
        longest(&slow_posts),
    );
    eprintln!("{report}");

    // Bounded while the flood was on: no more connections than the limit;
    // besides them only the baseline's descriptors and a few passing ones.
    assert!(peak.webhook_connections <= MAX_CONNECTIONS, "{report}");
    assert!(
        peak.webhook_fds <= baseline.webhook_fds + MAX_CONNECTIONS + FD_SLACK,
        "{report}"
    );
    assert!(
        peak.rss_kib <= baseline.rss_kib + RSS_GROWTH_KIB,
        "{report}"
    );

    // Every slow client ahead of the good one was cut off by its timeout,
    // and the metrics counted them.
    assert!(!silent.is_empty() && timeouts >= silent.len(), "{report}");
    assert!(
        timeouts <= FLOOD / 3 + 1,
        "only silent clients time out in the handshake: {report}"
    );
    assert!(!slowloris.is_empty(), "{report}");
    for (after, status) in &slowloris {
        assert!(*after <= SLOWLORIS_BOUND, "{report}");
        assert_ne!(*status, Some(200), "{report}");
    }
    assert!(
        !slow_posts.is_empty() && answered_408 >= slow_posts.len(),
        "{report}"
    );
    for (after, status) in &slow_posts {
        assert_eq!(*status, Some(408), "{report}");
        assert!(*after <= REQUEST_TIMEOUT + SLACK, "{report}");
    }

    // Recovered: the flood's connections close once their clients are gone,
    // the webhook's descriptors are back to the baseline's, memory is near
    // it, and requests are served. (The limits are for a loaded machine: the
    // conditions are what is asserted, not how fast they come.)
    eventually(
        "every flood connection closed",
        Duration::from_secs(30),
        || std::future::ready(connections() == 0),
    )
    .await;
    eventually(
        "the webhook's descriptors back to the baseline",
        Duration::from_secs(30),
        || std::future::ready(Usage::read(pid, port).webhook_fds <= baseline.webhook_fds),
    )
    .await;
    let after = Usage::read(pid, port);
    assert!(
        after.rss_kib <= baseline.rss_kib + RSS_GROWTH_KIB,
        "after {after:?}; {report}"
    );
    // Served without queueing behind anything: within one request timeout
    // (the flood kept the good client waiting for many of them).
    let again = Instant::now();
    assert_eq!(post_review(&served, "after").await, 200);
    assert!(
        again.elapsed() < REQUEST_TIMEOUT + SLACK,
        "{:?}",
        again.elapsed()
    );
}

/// Bodies of the largest size the webhook accepts.
const LARGE_BODY: usize = 7 * 1024 * 1024 - 4096;
/// How many of them are sent at once: 224 MiB of bodies together.
const LARGE_AT_ONCE: usize = 32;
/// Peak RSS growth allowed while they are read. The webhook reads at most
/// 32 MiB of bodies at once, plus connection buffers: measured +42 to +48 MiB
/// (without the budget +104 MiB for 32 bodies).
const LARGE_GROWTH_KIB: u64 = 72 * 1024;

#[tokio::test]
async fn many_of_the_largest_bodies_at_once_are_read_within_a_memory_budget() {
    let served = serve_offline(&["--request-timeout=20s"]).await;
    let pid = served.child.id();
    assert_eq!(post_review(&served, "warm-up").await, 200);
    let before = status_kib(pid, "VmRSS");

    let mut requests = Vec::new();
    for i in 0..LARGE_AT_ONCE {
        // A real review with a large field the webhook ignores.
        let mut body = review("Node", "CREATE", node_object(&format!("large-{i}")));
        body["padding"] = serde_json::Value::String(String::new());
        let base = serde_json::to_vec(&body).unwrap().len();
        body["padding"] = serde_json::Value::String("x".repeat(LARGE_BODY - base));
        let bytes = serde_json::to_vec(&body).unwrap();
        assert_eq!(bytes.len(), LARGE_BODY);
        let served = &served;
        requests.push(async move {
            https(served, "POST", "/mutate", Some("application/json"), bytes)
                .await
                .status
        });
    }
    let statuses = futures::future::join_all(requests).await;
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    let peak = status_kib(pid, "VmHWM");
    eprintln!(
        "RSS before {:.1} MiB, peak {:.1} MiB: +{:.1} MiB for {LARGE_AT_ONCE} bodies of {:.1} MiB",
        mib(before),
        mib(peak),
        mib(peak.saturating_sub(before)),
        LARGE_BODY as f64 / 1048576.0
    );
    assert!(
        peak.saturating_sub(before) < LARGE_GROWTH_KIB,
        "peak RSS grew by {:.1} MiB",
        mib(peak.saturating_sub(before))
    );
    // Still serving.
    assert_eq!(post_review(&served, "after").await, 200);
}

/// The API server's calls, under a flood from another address: the API
/// server gets its own slots. Served within the chart's webhook
/// `timeoutSeconds` (5 s) however long the flood lasts, where behind a flood
/// from its own address it waits its turn in the backlog.
const TIMEOUT_SECONDS: Duration = Duration::from_secs(5);

#[tokio::test]
async fn a_flood_from_another_address_leaves_the_api_server_its_connections() {
    let served = serve_offline(&[
        &format!("--max-connections={MAX_CONNECTIONS}"),
        &format!("--request-timeout={}s", REQUEST_TIMEOUT.as_secs()),
    ])
    .await;
    let port = served.webhook_port;
    let flood = CancellationToken::new();
    let connector = common::tls_connector(&served.ca_pem(), &["http/1.1"]);
    let mut clients = Vec::new();
    for n in 0..FLOOD {
        // The flood's source: another loopback address.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let tcp = socket.connect(([127, 0, 0, 1], port).into()).await.unwrap();
        let kind = [Kind::Silent, Kind::SlowHeaders, Kind::SlowBody][n % 3];
        let (connector, flood) = (connector.clone(), flood.clone());
        clients.push(tokio::spawn(async move {
            match kind {
                Kind::Silent => silent(tcp, flood).await,
                Kind::SlowHeaders => slow_headers(tcp, connector, flood).await,
                Kind::SlowBody => slow_body(tcp, connector, flood).await,
            }
        }));
    }

    // The API server (127.0.0.1), on fresh connections, while the flood
    // holds its slots: three requests, each within the webhook's timeout.
    let mut waits = Vec::new();
    for n in 0..3 {
        let waiting = Instant::now();
        let status =
            tokio::time::timeout(TIMEOUT_SECONDS, post_review(&served, &format!("api-{n}")))
                .await
                .unwrap_or_else(|_| panic!("request {n} not served within {TIMEOUT_SECONDS:?}"));
        assert_eq!(status, 200);
        waits.push(waiting.elapsed());
    }
    let limited = metric(
        &served,
        "node_holder_webhook_connections_source_limited_total",
    )
    .await
    .unwrap_or(0.0);
    flood.cancel();
    for client in clients {
        client.await.unwrap();
    }
    eprintln!(
        "{FLOOD} flood connections from 127.0.0.2 ({PER_SOURCE} at a time); the API server's \
         requests served after {waits:?}; {limited} flood connections closed at accept"
    );
    assert!(limited >= (FLOOD - PER_SOURCE) as f64 / 2.0, "{limited}");
}
