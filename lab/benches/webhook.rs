//! The admission webhook over TLS under load:
//! `cargo bench -p node-holder-lab --bench webhook`.
//!
//! Starts the release `node-holder serve` with one tokio worker pinned to
//! core 0, with development certificates and no API server behind it (the
//! webhook port does not need one), and loads it from core 1 with oha, a
//! well-kept HTTP load generator (installed from crates.io at a pinned
//! version by `testenv::ensure_oha_installed`). Every request is the 5.6 KB
//! Node CREATE AdmissionReview of `benches/fixtures/node-create-review.json`
//! over HTTP/1.1 and TLS, the client trusting only the development CA.
//!
//! Measures, against the targets of lab/REPORT.md:
//! 1. keep-alive throughput and latency with 1, 8 and 32 connections at
//!    `--log-level warn` (no line per review), and with 8 at the production
//!    logging (info, JSON lines to a file, one audit line per review);
//! 2. new TLS connections per second: oha without keep-alive, a full
//!    handshake (ECDSA P-256) and one review per connection;
//! 3. the server's resident memory idle after start-up and after the load.
//!
//! The handler's CPU per review is `cargo bench --bench handler`. Every answer
//! is checked: oha must see only 200s, and the server's own counters must say
//! that each of them put the hold on its node. About 40 seconds; loopback
//! only; nothing outlives the bench.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};

use testsupport as common;

use common::Served;
use node_holder_lab::measure::oha::{self, Load, Measured, Oha};
use node_holder_lab::measure::process::{self, ProcMemory, mib};

/// The server's core and the load generator's.
const SERVER_CORE: &str = "0";
const CLIENT_CORE: &str = "1";

const KEEP_ALIVE_CONNECTIONS: [usize; 3] = [1, 8, 32];
const HEADLINE_CONNECTIONS: usize = 8;
const KEEP_ALIVE_RUN: &str = "4s";
const HANDSHAKE_CONNECTIONS: usize = 8;
const HANDSHAKE_RUN: &str = "3s";

const TARGET_RPS: f64 = 10_000.0;
const TARGET_P99_MS: f64 = 2.0;
const TARGET_HANDSHAKES: f64 = 2_000.0;
const TARGET_IDLE_RSS_MIB: f64 = 20.0 * 1e6 / 1_048_576.0;

fn main() -> Result<()> {
    // `cargo bench` passes `--bench`; there are no options to read.
    node_holder_lab::build_node_holder()?;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> Result<()> {
    let oha = Oha::installed(CLIENT_CORE)?;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    ensure!(
        cores >= 2,
        "one core for the server and one for oha: {cores} available"
    );
    let dir = tempfile::tempdir()?;
    let body = write_body(dir.path())?;
    println!(
        "node-holder webhook benchmark, {cores} cores, oha {}",
        testenv::OHA_VERSION
    );

    println!("\n== serve --log-level warn ==");
    let warn = Server::start(&["--log-level", "warn"]).await?;
    let idle = warn.rss_mib()?;
    let mut keep_alive = Vec::new();
    for connections in KEEP_ALIVE_CONNECTIONS {
        keep_alive.push(oha.load(&warn.0, &body, keep_alive_load(connections))?);
    }
    let handshakes = oha.load(&warn.0, &body, new_connections_load())?;
    let after = warn.rss_mib()?;
    oha::check_every_review_held(&warn.0, keep_alive.iter().chain([&handshakes])).await?;
    drop(warn);

    println!("\n== serve (info, JSON log lines to a file) ==");
    let info = Server::start(&[]).await?;
    let idle_info = info.rss_mib()?;
    let logged = oha.load(&info.0, &body, keep_alive_load(HEADLINE_CONNECTIONS))?;
    let after_info = info.rss_mib()?;
    oha::check_every_review_held(&info.0, [&logged]).await?;

    let headline = keep_alive
        .iter()
        .find(|r| r.load.connections == HEADLINE_CONNECTIONS)
        .context("the headline run")?;
    println!("\n{}", oha::table(&keep_alive));
    let rss = Rss {
        idle: [idle, idle_info],
        after: [after, after_info],
    };
    println!("{}", summary(headline, &logged, &handshakes, &rss));
    Ok(())
}

/// The review as the API server sends it (compact JSON), in a file for oha.
fn write_body(dir: &Path) -> Result<PathBuf> {
    let path = dir.join("node-create-review.json");
    std::fs::write(&path, common::node_create_fixture()?)?;
    Ok(path)
}

/// A keep-alive run with `connections`.
fn keep_alive_load(connections: usize) -> Load {
    Load {
        connections,
        keep_alive: true,
        duration: KEEP_ALIVE_RUN,
    }
}

/// A new connection, with a full handshake, for every review.
fn new_connections_load() -> Load {
    Load {
        connections: HANDSHAKE_CONNECTIONS,
        keep_alive: false,
        duration: HANDSHAKE_RUN,
    }
}

/// `node-holder serve` with one tokio worker, all its threads on
/// [`SERVER_CORE`].
struct Server(Served);

impl Server {
    async fn start(extra: &[&str]) -> Result<Server> {
        let served = common::serve_offline_with(extra, |command| {
            command.env("TOKIO_WORKER_THREADS", "1");
        })
        .await;
        process::pin(served.child.id(), SERVER_CORE)?;
        // Idle: let start-up's allocations settle before the first reading.
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        Ok(Server(served))
    }

    /// Resident memory now.
    fn rss_mib(&self) -> Result<f64> {
        Ok(mib(ProcMemory::read(self.0.child.id())?.rss_kb))
    }
}

/// The server's resident memory (MiB) idle after start-up and after the
/// load, at warn and at info.
struct Rss {
    idle: [f64; 2],
    after: [f64; 2],
}

/// The figures lab/REPORT.md records, against their targets.
fn summary(warn: &Measured, info: &Measured, handshakes: &Measured, rss: &Rss) -> String {
    let verdict = |met: bool| if met { "met" } else { "MISSED" };
    let latency = |m: &Measured| format!("{:.2} ms ({:.2})", m.p99_ms, m.p50_ms);
    let throughput = |what, m: &Measured, target| {
        let result = format!("{:.0}", m.per_second);
        (
            what,
            format!("≥ {target:.0}"),
            result,
            verdict(m.per_second >= target),
        )
    };
    let p99 = |what, m: &Measured| {
        let target = format!("≤ {TARGET_P99_MS} ms");
        (what, target, latency(m), verdict(m.p99_ms <= TARGET_P99_MS))
    };
    let (idle, after) = (rss.idle, rss.after);
    let rows = [
        throughput(
            "keep-alive reviews/s, 8 connections, warn",
            warn,
            TARGET_RPS,
        ),
        p99("keep-alive p99 (p50), 8 connections, warn", warn),
        throughput(
            "keep-alive reviews/s, 8 connections, info (JSON)",
            info,
            TARGET_RPS,
        ),
        p99("keep-alive p99 (p50), info (JSON)", info),
        throughput(
            "new TLS connections/s (handshake + 1 review)",
            handshakes,
            TARGET_HANDSHAKES,
        ),
        (
            "idle RSS after start-up, warn / info",
            format!("< {TARGET_IDLE_RSS_MIB:.1} MiB"),
            format!("{:.1} / {:.1} MiB", idle[0], idle[1]),
            verdict(idle.iter().all(|&m| m < TARGET_IDLE_RSS_MIB)),
        ),
        (
            "RSS after the load, warn / info",
            "–".to_string(),
            format!("{:.1} / {:.1} MiB", after[0], after[1]),
            "",
        ),
    ];
    let mut table =
        String::from("| measure | target | result | verdict |\n| --- | --- | --- | --- |\n");
    for (measure, target, result, verdict) in rows {
        table.push_str(&format!(
            "| {measure} | {target} | {result} | {verdict} |\n"
        ));
    }
    table
}
