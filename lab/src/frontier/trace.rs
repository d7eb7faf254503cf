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
    /// A Deployment's pod (the steady pods, the service). Traces recorded
    /// before this was kept have none.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deployment: bool,
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
    /// cluster's arms (`kaw-0s,…,nh-2m` or `nh-5m`; older traces name
    /// several `nh` arms that shared one install).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub records: BTreeMap<String, BTreeMap<String, String>>,
    /// node-holder's log in each cluster, by the cluster's arms: saved
    /// beside the trace, not in it.
    #[serde(skip)]
    pub logs: BTreeMap<String, String>,
}

impl Trace {
    /// Writes the trace into `out` as `<day>-seed<N>.json`, and each
    /// node-holder log beside it as `<day>-seed<N>-<arms>.log`: where the
    /// trace went, and whether all could be written.
    pub fn save(&self, out: &Path) -> (PathBuf, anyhow::Result<()>) {
        let name = format!("{}-seed{}", self.day, self.seed);
        let path = out.join(format!("{name}.json"));
        let saved = serde_json::to_vec_pretty(self)
            .map_err(anyhow::Error::from)
            .and_then(|bytes| Ok(std::fs::write(&path, bytes)?))
            .and_then(|()| {
                for (arms, log) in &self.logs {
                    std::fs::write(out.join(format!("{name}-{arms}.log")), log)?;
                }
                Ok(())
            });
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
            trace.logs.extend(part.logs);
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
    /// The wait p95 of the pods of the runs after a gap of the CronJobs
    /// `long_gaps` names (those whose gaps are longer than the launch cost:
    /// their nodes are let go between runs). Each CronJob's first run is
    /// left out: no gap comes before it, and nothing is known of it.
    pub long_gap_wait_p95: f64,
    pub interrupted: i32,
    /// Deployment pods created beyond what the day's scaling created: the
    /// pods Karpenter moved (service restarts). `None`: the trace did not
    /// keep which pods were a Deployment's, and other Jobs ran beside them.
    pub moved: Option<usize>,
}

/// What the day says of its Deployments' pods.
#[derive(Debug, Clone, Copy)]
pub struct Deployments {
    /// Pods the day's scaling creates.
    pub created: usize,
    /// Whether every pod of no CronJob is a Deployment's (no other Jobs):
    /// then a trace that did not mark them still tells.
    pub alone: bool,
}

impl Outcome {
    pub fn of(trace: &Trace, arm: &str, long_gaps: &[&str], deployments: Deployments) -> Outcome {
        let claims: Vec<&Claim> = trace.claims.values().filter(|c| c.pool == arm).collect();
        let node_seconds = claims
            .iter()
            .map(|c| c.gone.unwrap_or(trace.end) - c.created)
            .sum();
        let pods: Vec<&PodSeen> = trace.pods.values().filter(|p| p.arm == arm).collect();
        let waits = sorted_waits(pods.iter().copied());
        let long_gap = sorted_waits(after_a_gap(&pods, long_gaps).into_iter());
        Outcome {
            launches: claims.len(),
            node_seconds,
            pods: pods.len(),
            waited_for_launch: waited_for_launch(&claims, &pods),
            wait_p50: percentile(&waits, 50.0),
            wait_p95: percentile(&waits, 95.0),
            long_gap_wait_p95: percentile(&long_gap, 95.0),
            interrupted: trace.interrupted.get(arm).copied().unwrap_or(0),
            moved: moved(&pods, deployments),
        }
    }

    pub fn total(&self, launch: f64) -> f64 {
        super::total(self.node_seconds, self.launches, launch)
    }
}

/// The Deployment pods beyond those the scaling created; `None` when no
/// pod is marked as a Deployment's (an older trace) and other Jobs' pods
/// cannot be told from them.
fn moved(pods: &[&PodSeen], deployments: Deployments) -> Option<usize> {
    let marked = pods.iter().filter(|p| p.deployment).count();
    let seen = if marked > 0 {
        marked
    } else if deployments.alone {
        pods.iter().filter(|p| p.cronjob.is_none()).count()
    } else {
        return None;
    };
    Some(seen.saturating_sub(deployments.created))
}

/// How long after a CronJob's first pod appeared its first run's pods still
/// appear (its runs are minutes apart).
const FIRST_RUN: f64 = 60.0;

/// The pods of the runs of the CronJobs `long_gaps` names, each CronJob's
/// first run left out.
fn after_a_gap<'a>(pods: &[&'a PodSeen], long_gaps: &[&str]) -> Vec<&'a PodSeen> {
    let of = |p: &PodSeen| {
        p.cronjob
            .clone()
            .filter(|c| long_gaps.contains(&c.as_str()))
    };
    let mut first: BTreeMap<String, f64> = BTreeMap::new();
    for pod in pods {
        if let Some(cronjob) = of(pod) {
            let at = first.entry(cronjob).or_insert(pod.seen);
            *at = at.min(pod.seen);
        }
    }
    pods.iter()
        .copied()
        .filter(|p| of(p).is_some_and(|c| p.seen >= first[&c] + FIRST_RUN))
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(cronjob: Option<&str>, seen: f64) -> PodSeen {
        PodSeen {
            arm: "nsx-5m".into(),
            seen,
            bound: Some(seen + 1.0),
            node: None,
            cronjob: cronjob.map(str::to_string),
            deployment: false,
        }
    }

    #[test]
    fn deployment_pods_beyond_the_scalings_are_the_moved_ones() {
        let mut service = pod(None, 10.0);
        service.deployment = true;
        let pods = [service.clone(), service.clone(), service, pod(None, 5.0)];
        let pods: Vec<&PodSeen> = pods.iter().collect();
        let created = |created, alone| Deployments { created, alone };
        assert_eq!(moved(&pods, created(2, false)), Some(1));
        assert_eq!(moved(&pods, created(5, false)), Some(0), "never below zero");
        // An older trace: other Jobs' pods look the same.
        assert_eq!(moved(&pods[3..], created(0, false)), None);
        // An older trace of a day of CronJobs alone: every pod of no
        // CronJob is a Deployment's.
        let older = [pod(None, 1.0), pod(None, 2.0), pod(Some("every-5m"), 3.0)];
        let older: Vec<&PodSeen> = older.iter().collect();
        assert_eq!(moved(&older, created(1, true)), Some(1));
    }

    #[test]
    fn the_runs_after_a_gap_leave_out_each_cronjobs_first_run_and_other_work() {
        let pods = [
            pod(Some("every-15m"), 60.0),
            pod(Some("every-15m"), 61.5),
            pod(Some("every-15m"), 960.0),
            pod(Some("every-3m"), 180.0),
            pod(None, 965.0),
        ];
        let pods: Vec<&PodSeen> = pods.iter().collect();
        let after: Vec<f64> = after_a_gap(&pods, &["every-15m"])
            .iter()
            .map(|p| p.seen)
            .collect();
        assert_eq!(after, [960.0]);
    }
}
