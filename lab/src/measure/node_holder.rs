//! node-holder's own `/metrics` on its admin port, read whole: its samples
//! by name, and the wait for the window task's first pass.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use testsupport::Served;

/// node-holder's histogram of its passes' times (`_count`, `_sum`).
pub const PASS_SECONDS: &str = "node_holder_pass_duration_seconds";

/// node-holder's own `/metrics`.
pub struct NodeHolderMetrics(Vec<(String, BTreeMap<String, String>, f64)>);

impl NodeHolderMetrics {
    pub async fn scrape(served: &Served) -> Result<NodeHolderMetrics> {
        let (status, body) = testsupport::http_get(served.admin_port, "/metrics").await?;
        ensure!(status == 200, "node-holder /metrics: {status}");
        Ok(NodeHolderMetrics(
            body.lines()
                .filter_map(testenv::metrics::sample)
                .map(|s| (s.name.to_string(), s.labels, s.value))
                .collect(),
        ))
    }

    /// The unlabelled sample `name` (0 when absent).
    pub fn get(&self, name: &str) -> f64 {
        self.0
            .iter()
            .find(|(n, labels, _)| n == name && labels.is_empty())
            .map_or(0.0, |(_, _, v)| *v)
    }

    /// Every sample of `name`, summed over labels.
    pub fn sum(&self, name: &str) -> f64 {
        self.0
            .iter()
            .filter(|(n, _, _)| n == name)
            .fold(0.0, |sum, (_, _, v)| sum + v)
    }
}

/// Waits (up to `limit`, looking every `poll`) until the window task has
/// led and finished a pass; the instant it saw that.
pub async fn wait_first_pass(served: &Served, limit: Duration, poll: Duration) -> Result<Instant> {
    let deadline = Instant::now() + limit;
    loop {
        let metrics = NodeHolderMetrics::scrape(served).await?;
        if metrics.get("node_holder_leader") == 1.0
            && metrics.get(&format!("{PASS_SECONDS}_count")) >= 1.0
        {
            return Ok(Instant::now());
        }
        ensure!(
            Instant::now() < deadline,
            "no pass of the window task within {} s:\n{}",
            limit.as_secs(),
            served.log()
        );
        tokio::time::sleep(poll).await;
    }
}
