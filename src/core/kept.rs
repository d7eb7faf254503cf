//! What the schedule keeps, summed up for the record and `status`: the soonest runs, each with its
//! nodes counted and a few named, and the rest counted, so the record stays small (a ConfigMap
//! holds at most 1 MiB); each node's own hold is on the node (`held-until`) and in its Event.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::due::{Kept, Reason};

/// Runs the summary names; past them, runs and nodes are counted.
pub const RUNS_SHOWN: usize = 20;
/// Nodes a line names; past them, they are counted.
pub const NODES_NAMED: usize = 3;

/// Some nodes: how many, and the first few by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nodes {
    pub count: usize,
    pub named: Vec<String>,
}

impl Nodes {
    fn add(&mut self, node: &str) {
        self.count += 1;
        if self.named.len() < NODES_NAMED {
            self.named.push(node.to_string());
        }
    }
}

/// The nodes kept for one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeptRun {
    pub cronjob: String,
    pub run_at: Timestamp,
    pub until: Timestamp,
    pub nodes: Nodes,
}

/// What the schedule keeps, summed up.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeptSummary {
    /// The soonest [`RUNS_SHOWN`] runs.
    pub runs: Vec<KeptRun>,
    /// The runs past them, and their nodes.
    #[serde(default)]
    pub more_runs: usize,
    #[serde(default)]
    pub more_nodes: usize,
    /// Nodes running a CronJob's pods.
    #[serde(default)]
    pub busy: Nodes,
    /// New nodes waiting for their pods.
    #[serde(default)]
    pub settling: Nodes,
}

impl KeptSummary {
    /// The summary of `kept` (by node name).
    pub fn of(kept: &BTreeMap<String, Kept>) -> KeptSummary {
        let mut summary = KeptSummary::default();
        let mut runs: BTreeMap<(Timestamp, &str), (Timestamp, Nodes)> = BTreeMap::new();
        for (node, k) in kept {
            match (k.reason, k.run_at, k.cronjob.as_deref()) {
                (Reason::Run, Some(at), Some(cronjob)) => {
                    let until = k.until.unwrap_or(at);
                    let run = runs
                        .entry((at, cronjob))
                        .or_insert((until, Nodes::default()));
                    run.1.add(node);
                }
                (Reason::Busy, ..) => summary.busy.add(node),
                _ => summary.settling.add(node),
            }
        }
        for (i, ((run_at, cronjob), (until, nodes))) in runs.into_iter().enumerate() {
            if i < RUNS_SHOWN {
                summary.runs.push(KeptRun {
                    cronjob: cronjob.to_string(),
                    run_at,
                    until,
                    nodes,
                });
            } else {
                summary.more_runs += 1;
                summary.more_nodes += nodes.count;
            }
        }
        summary
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty() && self.busy.count == 0 && self.settling.count == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(m: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + m * 60).unwrap()
    }

    fn for_run(cronjob: &str, at: i64) -> Kept {
        Kept {
            reason: Reason::Run,
            until: Some(t(at + 1)),
            cronjob: Some(cronjob.into()),
            run_at: Some(t(at)),
        }
    }

    #[test]
    fn runs_are_summed_up_soonest_first_and_the_rest_counted() {
        let mut kept = BTreeMap::new();
        for i in 0..(RUNS_SHOWN + 5) {
            for n in 0..5 {
                kept.insert(
                    format!("n{i:03}-{n}"),
                    for_run(&format!("ns/c{i:03}"), i as i64),
                );
            }
        }
        kept.insert(
            "busy-1".into(),
            Kept {
                reason: Reason::Busy,
                until: None,
                cronjob: None,
                run_at: None,
            },
        );
        let summary = KeptSummary::of(&kept);
        assert_eq!(summary.runs.len(), RUNS_SHOWN);
        assert_eq!(summary.runs[0].cronjob, "ns/c000");
        assert_eq!(summary.runs[0].nodes.count, 5);
        assert_eq!(summary.runs[0].nodes.named, ["n000-0", "n000-1", "n000-2"]);
        assert_eq!((summary.more_runs, summary.more_nodes), (5, 25));
        assert_eq!(summary.busy.count, 1);
        assert!(!summary.is_empty());
        assert!(KeptSummary::of(&BTreeMap::new()).is_empty());
    }
}
