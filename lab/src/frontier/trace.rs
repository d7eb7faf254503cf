//! What one run of one day recorded (its raw trace, saved as JSON), and what
//! each arm cost on it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::measure::stats::percentile;

/// One NodeClaim as the bench's watch saw it, in seconds since the day began.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Claim {
    pub pool: String,
    pub created: f64,
    pub gone: Option<f64>,
    pub node: Option<String>,
}

/// One pod as the bench's watch saw it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PodSeen {
    pub arm: String,
    pub seen: f64,
    pub bound: Option<f64>,
    pub node: Option<String>,
    /// The day's CronJob whose run it is (`every-15m`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cronjob: Option<String>,
}

/// Everything one run of one day recorded: its raw trace.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Trace {
    pub day: String,
    pub seed: u64,
    pub claims: BTreeMap<String, Claim>,
    pub pods: BTreeMap<String, PodSeen>,
    /// Job pods that failed (evicted while running) per arm.
    pub interrupted: BTreeMap<String, i32>,
    /// (seconds, 1-minute load average), every 10 s.
    pub load: Vec<(f64, f64)>,
    /// When the day's work was over and the steady pods were let go.
    pub end: f64,
    /// node-holder's record (ConfigMap `node-holder-window`'s data) as each
    /// cluster's install left it when its last node was gone, by the
    /// cluster's arms (`nh-2m,nh-5m`): each group's window.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub records: BTreeMap<String, BTreeMap<String, String>>,
}

impl Trace {
    /// Writes the trace into `out` as `<day>-seed<N>.json`: where, and
    /// whether it could.
    pub fn save(&self, out: &Path) -> (PathBuf, anyhow::Result<()>) {
        let path = out.join(format!("{}-seed{}.json", self.day, self.seed));
        let saved = serde_json::to_vec_pretty(self)
            .map_err(anyhow::Error::from)
            .and_then(|bytes| Ok(std::fs::write(&path, bytes)?));
        (path, saved)
    }

    /// The traces of the clusters that played one day side by side, as one.
    pub fn merge(day: &str, seed: u64, parts: Vec<Trace>) -> Trace {
        let mut trace = Trace {
            day: day.to_string(),
            seed,
            ..Trace::default()
        };
        for part in parts {
            trace.claims.extend(part.claims);
            trace.pods.extend(part.pods);
            trace.interrupted.extend(part.interrupted);
            trace.load.extend(part.load);
            trace.records.extend(part.records);
            trace.end = trace.end.max(part.end);
        }
        trace.load.sort_by(|a, b| a.0.total_cmp(&b.0));
        trace
    }
}

/// What one arm cost on one run.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub launches: usize,
    pub node_seconds: f64,
    pub pods: usize,
    pub waited_for_launch: usize,
    pub wait_p50: f64,
    pub wait_p95: f64,
    /// The wait p95 of the pods of the CronJobs `long_gaps` names (those
    /// whose gaps are longer than the launch cost: their nodes are let go
    /// between runs).
    pub long_gap_wait_p95: f64,
    pub interrupted: i32,
}

impl Outcome {
    pub fn of(trace: &Trace, arm: &str, long_gaps: &[&str]) -> Outcome {
        let claims: Vec<&Claim> = trace.claims.values().filter(|c| c.pool == arm).collect();
        let node_seconds = claims
            .iter()
            .map(|c| c.gone.unwrap_or(trace.end) - c.created)
            .sum();
        let pods: Vec<&PodSeen> = trace.pods.values().filter(|p| p.arm == arm).collect();
        let waits = sorted_waits(pods.iter().copied());
        let long_gap = pods
            .iter()
            .copied()
            .filter(|p| p.cronjob.as_deref().is_some_and(|c| long_gaps.contains(&c)));
        let long_gap = sorted_waits(long_gap);
        Outcome {
            launches: claims.len(),
            node_seconds,
            pods: pods.len(),
            waited_for_launch: waited_for_launch(&claims, &pods),
            wait_p50: percentile(&waits, 50.0),
            wait_p95: percentile(&waits, 95.0),
            long_gap_wait_p95: percentile(&long_gap, 95.0),
            interrupted: trace.interrupted.get(arm).copied().unwrap_or(0),
        }
    }

    pub fn total(&self, launch: f64) -> f64 {
        super::total(self.node_seconds, self.launches, launch)
    }
}

/// The waits of the bound pods, from their appearance to their binding,
/// shortest first.
fn sorted_waits<'a>(pods: impl Iterator<Item = &'a PodSeen>) -> Vec<f64> {
    let mut waits: Vec<f64> = pods.filter_map(|p| Some(p.bound? - p.seen)).collect();
    waits.sort_by(f64::total_cmp);
    waits
}

/// The pods bound to a node launched after they appeared.
fn waited_for_launch(claims: &[&Claim], pods: &[&PodSeen]) -> usize {
    let launched_at: BTreeMap<&str, f64> = claims
        .iter()
        .filter_map(|c| Some((c.node.as_deref()?, c.created)))
        .collect();
    pods.iter()
        .filter(|p| {
            let launched = p.node.as_deref().and_then(|n| launched_at.get(n));
            launched.is_some_and(|&at| at > p.seen)
        })
        .count()
}
