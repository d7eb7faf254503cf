//! The webhook loaded by oha, a well-kept HTTP load generator (installed
//! from crates.io at a pinned version by `testenv::ensure_oha_installed`):
//! one run's shape, oha on its own core, and its JSON report read, refused
//! unless every answer was a 200; then the server's own counters checked
//! against oha's.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use testsupport::Served;

/// What one oha run does.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub connections: usize,
    pub keep_alive: bool,
    /// oha's `-z`: `4s`.
    pub duration: &'static str,
}

/// What oha measured.
pub struct Measured {
    pub load: Load,
    pub per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    /// Answers with status 200.
    pub ok: u64,
}

/// oha, run on `core` (a `taskset` CPU list).
pub struct Oha {
    binary: PathBuf,
    core: &'static str,
}

impl Oha {
    pub fn installed(core: &'static str) -> Result<Oha> {
        let binary = testenv::ensure_oha_installed()?;
        Ok(Oha { binary, core })
    }

    /// Runs `load` against the webhook of `served`, POSTing `body` over
    /// HTTP/1.1 and TLS; any answer but 200 or any error is a failure of
    /// the bench. Prints what it measured.
    pub fn load(&self, served: &Served, body: &Path, load: Load) -> Result<Measured> {
        let mut command = self.command(served, body, load);
        let out = command.output().context("running oha")?;
        ensure!(
            out.status.success(),
            "oha: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report = serde_json::from_slice(&out.stdout).context("oha's JSON report")?;
        let measured = measured(load, &report)?;
        println!("{}", measured.describe());
        Ok(measured)
    }

    fn command(&self, served: &Served, body: &Path, load: Load) -> Command {
        let url = format!(
            "https://localhost:{}/mutate?timeout=5s",
            served.webhook_port
        );
        let mut command = Command::new("taskset");
        command
            .args(["--cpu-list", self.core])
            .arg(&self.binary)
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
            .arg(served.cert_dir().join("ca.crt"))
            .arg(&url);
        if !load.keep_alive {
            command.arg("--disable-keepalive");
        }
        command
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
    pub fn describe(&self) -> String {
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

/// The server's counters agree with oha: every review it answered 200 put
/// the hold on its node, and it answered nothing else.
pub async fn check_every_review_held<'a>(
    served: &Served,
    results: impl IntoIterator<Item = &'a Measured>,
) -> Result<()> {
    let answered: f64 = results.into_iter().map(|r| r.ok as f64).sum();
    let metric = |name| testsupport::window::metric(served, name);
    let ok = metric("node_holder_webhook_requests_total{code=\"200\"}").await;
    let held = metric("node_holder_webhook_mutations_total").await;
    ensure!(
        ok == Some(answered) && held == Some(answered),
        "oha saw {answered} answers of 200; the server counted {ok:?} and held {held:?}"
    );
    Ok(())
}

/// The runs as a Markdown table, one row a run.
pub fn table(runs: &[Measured]) -> String {
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
