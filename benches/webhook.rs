//! The admission webhook over TLS under load: `cargo bench --bench webhook`.
//!
//! Starts the release `node-holder serve` with one tokio worker pinned to
//! core 0, with development certificates and no API server behind it (the
//! webhook port does not need one), and loads it from core 1 with oha, a
//! well-kept HTTP load generator (installed from crates.io at a pinned
//! version by `testenv::ensure_oha_installed`). Every request is the 5.6 KB
//! Node CREATE AdmissionReview of `benches/fixtures/node-create-review.json`
//! over HTTP/1.1 and TLS, the client trusting only the development CA.
//!
//! Measures, against the targets of docs/benchmarks.md:
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
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use testsupport as common;

use common::Served;

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
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> Result<()> {
    let oha = Oha::installed()?;
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
        keep_alive.push(oha.load(&warn, &body, Load::keep_alive(connections))?);
    }
    let handshakes = oha.load(&warn, &body, Load::new_connections())?;
    let after = warn.rss_mib()?;
    warn.check_every_review_held(keep_alive.iter().chain([&handshakes]))
        .await?;
    drop(warn);

    println!("\n== serve (info, JSON log lines to a file) ==");
    let info = Server::start(&[]).await?;
    let idle_info = info.rss_mib()?;
    let logged = oha.load(&info, &body, Load::keep_alive(HEADLINE_CONNECTIONS))?;
    let after_info = info.rss_mib()?;
    info.check_every_review_held([&logged]).await?;

    let headline = keep_alive
        .iter()
        .find(|r| r.load.connections == HEADLINE_CONNECTIONS)
        .context("the headline run")?;
    println!("\n{}", keep_alive_table(&keep_alive));
    println!(
        "{}",
        summary(
            headline,
            &logged,
            &handshakes,
            [idle, idle_info],
            [after, after_info]
        )
    );
    Ok(())
}

/// The review as the API server sends it (compact JSON), in a file for oha.
fn write_body(dir: &Path) -> Result<PathBuf> {
    let pretty = include_str!("fixtures/node-create-review.json");
    let review: Value = serde_json::from_str(pretty)?;
    let path = dir.join("node-create-review.json");
    std::fs::write(&path, serde_json::to_vec(&review)?)?;
    Ok(path)
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
        let pid = served.child.id().to_string();
        let pinned = Command::new("taskset")
            .args(["--all-tasks", "--cpu-list", "--pid", SERVER_CORE, &pid])
            .output()
            .context("running taskset")?;
        ensure!(
            pinned.status.success(),
            "taskset: {}",
            String::from_utf8_lossy(&pinned.stderr)
        );
        // Idle: let start-up's allocations settle before the first reading.
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        Ok(Server(served))
    }

    /// Resident memory now.
    fn rss_mib(&self) -> Result<f64> {
        let pid = i32::try_from(self.0.child.id())?;
        let status = procfs::process::Process::new(pid)?.status()?;
        Ok(status.vmrss.context("VmRSS")? as f64 / 1024.0)
    }

    /// The server's counters agree with oha: every review it answered 200
    /// put the hold on its node, and it answered nothing else.
    async fn check_every_review_held<'a>(
        &self,
        results: impl IntoIterator<Item = &'a Measured>,
    ) -> Result<()> {
        let answered: f64 = results.into_iter().map(|r| r.ok as f64).sum();
        let metric = |name| common::window::metric(&self.0, name);
        let ok = metric("node_holder_webhook_requests_total{code=\"200\"}").await;
        let held = metric("node_holder_webhook_mutations_total").await;
        ensure!(
            ok == Some(answered) && held == Some(answered),
            "oha saw {answered} answers of 200; the server counted {ok:?} and held {held:?}"
        );
        Ok(())
    }
}

/// What one oha run does.
#[derive(Debug, Clone, Copy)]
struct Load {
    connections: usize,
    keep_alive: bool,
    duration: &'static str,
}

impl Load {
    fn keep_alive(connections: usize) -> Load {
        Load {
            connections,
            keep_alive: true,
            duration: KEEP_ALIVE_RUN,
        }
    }

    /// A new connection, with a full handshake, for every review.
    fn new_connections() -> Load {
        Load {
            connections: HANDSHAKE_CONNECTIONS,
            keep_alive: false,
            duration: HANDSHAKE_RUN,
        }
    }
}

/// What oha measured.
struct Measured {
    load: Load,
    per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    max_ms: f64,
    /// Answers with status 200.
    ok: u64,
}

struct Oha(PathBuf);

impl Oha {
    fn installed() -> Result<Oha> {
        Ok(Oha(testenv::ensure_oha_installed()?))
    }

    /// Runs `load` on [`CLIENT_CORE`]; any answer but 200 or any error is a
    /// failure of the bench.
    fn load(&self, server: &Server, body: &Path, load: Load) -> Result<Measured> {
        let url = format!(
            "https://localhost:{}/mutate?timeout=5s",
            server.0.webhook_port
        );
        let mut command = Command::new("taskset");
        command
            .args(["--cpu-list", CLIENT_CORE])
            .arg(&self.0)
            .args([
                "--no-tui",
                "--output-format",
                "json",
                "--worker-threads",
                "1",
            ])
            .args([
                "--http-version",
                "1.1",
                "-m",
                "POST",
                "-T",
                "application/json",
            ])
            .args([
                "-w",
                "-z",
                load.duration,
                "-c",
                &load.connections.to_string(),
            ])
            .arg("-D")
            .arg(body)
            .arg("--cacert")
            .arg(server.0.cert_dir().join("ca.crt"))
            .arg(&url);
        if !load.keep_alive {
            command.arg("--disable-keepalive");
        }
        let out = command.output().context("running oha")?;
        ensure!(
            out.status.success(),
            "oha: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let measured = measured(load, &serde_json::from_slice(&out.stdout)?)?;
        println!("{}", measured.describe());
        Ok(measured)
    }
}

/// oha's JSON report, read; refused unless every answer was a 200.
fn measured(load: Load, report: &Value) -> Result<Measured> {
    let errors = &report["errorDistribution"];
    if errors.as_object().is_some_and(|e| !e.is_empty()) {
        bail!("oha saw errors: {errors}");
    }
    let statuses = report["statusCodeDistribution"]
        .as_object()
        .context("oha's status codes")?;
    if let Some((code, _)) = statuses.iter().find(|(code, _)| *code != "200") {
        bail!("oha saw status {code}: {statuses:?}");
    }
    let seconds = |value: &Value| value.as_f64().context("a number in oha's report");
    let ms = |value: &Value| seconds(value).map(|s| s * 1e3);
    let percentiles = &report["latencyPercentiles"];
    Ok(Measured {
        load,
        per_second: seconds(&report["summary"]["requestsPerSec"])?,
        p50_ms: ms(&percentiles["p50"])?,
        p99_ms: ms(&percentiles["p99"])?,
        p999_ms: ms(&percentiles["p99.9"])?,
        max_ms: ms(&report["summary"]["slowest"])?,
        ok: statuses.get("200").and_then(Value::as_u64).unwrap_or(0),
    })
}

impl Measured {
    fn describe(&self) -> String {
        let kind = if self.load.keep_alive {
            "keep-alive"
        } else {
            "new connection per review"
        };
        format!(
            "{kind}, {} connections, {}: {:.0} reviews/s, p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.1} ms ({} answers, all 200)",
            self.load.connections,
            self.load.duration,
            self.per_second,
            self.p50_ms,
            self.p99_ms,
            self.p999_ms,
            self.max_ms,
            self.ok
        )
    }
}

fn keep_alive_table(runs: &[Measured]) -> String {
    let mut table = String::from(
        "| connections | reviews/s | p50 | p99 | p99.9 | max |\n| --- | --- | --- | --- | --- | --- |\n",
    );
    for r in runs {
        table.push_str(&format!(
            "| {} | {:.0} | {:.2} ms | {:.2} ms | {:.2} ms | {:.1} ms |\n",
            r.load.connections, r.per_second, r.p50_ms, r.p99_ms, r.p999_ms, r.max_ms
        ));
    }
    table
}

/// The figures docs/benchmarks.md records, against their targets.
fn summary(
    warn: &Measured,
    info: &Measured,
    handshakes: &Measured,
    idle: [f64; 2],
    after: [f64; 2],
) -> String {
    let verdict = |met: bool| if met { "met" } else { "MISSED" };
    let latency = |m: &Measured| format!("{:.2} ms ({:.2})", m.p99_ms, m.p50_ms);
    let rows = [
        (
            "keep-alive reviews/s, 8 connections, warn",
            format!("≥ {TARGET_RPS:.0}"),
            format!("{:.0}", warn.per_second),
            verdict(warn.per_second >= TARGET_RPS),
        ),
        (
            "keep-alive p99 (p50), 8 connections, warn",
            format!("≤ {TARGET_P99_MS} ms"),
            latency(warn),
            verdict(warn.p99_ms <= TARGET_P99_MS),
        ),
        (
            "keep-alive reviews/s, 8 connections, info (JSON)",
            format!("≥ {TARGET_RPS:.0}"),
            format!("{:.0}", info.per_second),
            verdict(info.per_second >= TARGET_RPS),
        ),
        (
            "keep-alive p99 (p50), info (JSON)",
            format!("≤ {TARGET_P99_MS} ms"),
            latency(info),
            verdict(info.p99_ms <= TARGET_P99_MS),
        ),
        (
            "new TLS connections/s (handshake + 1 review)",
            format!("≥ {TARGET_HANDSHAKES:.0}"),
            format!("{:.0}", handshakes.per_second),
            verdict(handshakes.per_second >= TARGET_HANDSHAKES),
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
