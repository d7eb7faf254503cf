//! The scheduled work the cluster knows (`--launch-cost`): each CronJob's
//! next run, the group its runs land in and how many nodes its last run
//! occupied, read from the CronJobs and their Jobs' pods as the leader last
//! saw them. Pure: the caller watches, this reads.
//!
//! A Job belongs to the CronJob whose name it carries: the CronJob
//! controller names each Job `<cronjob>-<scheduled minute since the epoch>`
//! (and a pod carries its Job's name in `batch.kubernetes.io/job-name`), so
//! no Job needs to be read. A node that runs a known CronJob's pods (and no
//! other Job's) is *explained*: the schedule says when its work comes back,
//! so it opens no hold window. A CronJob whose schedule cannot be predicted
//! is not known: its pods are other work, which the window holds.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;

use super::schedule::{Schedule, ScheduleError};

/// A CronJob's next run in a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// `namespace/name`.
    pub cronjob: String,
    /// When the CronJob controller starts it.
    pub at: Timestamp,
    /// How many nodes its last run occupied.
    pub nodes: usize,
    /// The nodes its last run occupied: kept for it first (its images are
    /// there).
    pub on: Vec<String>,
}

/// A CronJob as the hold reads it.
#[derive(Debug, Clone)]
pub struct CronJobSpec {
    /// `namespace/name`.
    pub key: String,
    pub uid: Option<String>,
    pub schedule: Result<Schedule, ScheduleError>,
    pub suspended: bool,
}

/// A Job's pod as the hold reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobPod<'a> {
    pub namespace: &'a str,
    /// Its Job's name (`batch.kubernetes.io/job-name`).
    pub job: &'a str,
    /// The node it is bound to, if any.
    pub node: Option<&'a str>,
    /// Not finished (neither `Succeeded` nor `Failed`).
    pub running: bool,
}

/// What the CronJobs and their pods say, at one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KnownWork {
    /// Each group's CronJobs' next runs, by group.
    pub runs: BTreeMap<String, Vec<Run>>,
    /// Nodes running a known CronJob's pod now.
    pub busy: BTreeSet<String>,
    /// Nodes whose Job pods are all known CronJobs' (see the module doc).
    pub explained: BTreeSet<String>,
    /// CronJobs whose schedule cannot be predicted, and why.
    pub unpredictable: Vec<Unpredictable>,
}

/// A CronJob whose schedule cannot be predicted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unpredictable {
    /// `namespace/name`.
    pub cronjob: String,
    pub uid: Option<String>,
    pub why: String,
}

/// One CronJob's runs as its pods show them: the nodes of each run, by the
/// run's scheduled minute.
#[derive(Default)]
struct Seen<'a> {
    runs: BTreeMap<i64, BTreeSet<&'a str>>,
}

/// Reads the scheduled work: `group_of` names the group of a node (`None`
/// for a node that is gone or out of scope).
pub fn known_work<'a>(
    cronjobs: &[CronJobSpec],
    pods: impl IntoIterator<Item = JobPod<'a>>,
    group_of: impl Fn(&str) -> Option<String>,
    now: Timestamp,
) -> KnownWork {
    let keys: BTreeSet<&str> = cronjobs
        .iter()
        .filter(|c| c.schedule.is_ok())
        .map(|c| c.key.as_str())
        .collect();
    let mut seen: BTreeMap<String, Seen<'a>> = BTreeMap::new();
    let mut work = KnownWork::default();
    let mut others: BTreeSet<&str> = BTreeSet::new();
    for pod in pods {
        let Some(node) = pod.node else { continue };
        match cronjob_of(pod.namespace, pod.job, &keys) {
            Some((key, minute)) => {
                let runs = &mut seen.entry(key).or_default().runs;
                runs.entry(minute).or_default().insert(node);
                work.explained.insert(node.to_string());
                if pod.running {
                    work.busy.insert(node.to_string());
                }
            }
            None => {
                others.insert(node);
            }
        }
    }
    work.explained
        .retain(|node| !others.contains(node.as_str()));
    for cronjob in cronjobs {
        let schedule = match &cronjob.schedule {
            Ok(schedule) => schedule,
            Err(err) => {
                work.unpredictable.push(Unpredictable {
                    cronjob: cronjob.key.clone(),
                    uid: cronjob.uid.clone(),
                    why: err.to_string(),
                });
                continue;
            }
        };
        let next = schedule.next_after(now).filter(|_| !cronjob.suspended);
        let last = seen.get(&cronjob.key).and_then(|s| last_run(s, &group_of));
        if let (Some(at), Some((group, on))) = (next, last) {
            work.runs.entry(group).or_default().push(Run {
                cronjob: cronjob.key.clone(),
                at,
                nodes: on.len(),
                on: on.into_iter().map(str::to_string).collect(),
            });
        }
    }
    work
}

/// The CronJob (`namespace/name`, one of `keys`) a Job of that name belongs
/// to, and the Job's scheduled minute.
fn cronjob_of(namespace: &str, job: &str, keys: &BTreeSet<&str>) -> Option<(String, i64)> {
    let (cronjob, minute) = job.rsplit_once('-')?;
    let minute: i64 = minute.parse().ok()?;
    let key = format!("{namespace}/{cronjob}");
    keys.contains(key.as_str()).then_some((key, minute))
}

/// The group and nodes of the CronJob's latest run whose nodes are still
/// known: the group most of its nodes are in.
fn last_run<'a>(
    seen: &Seen<'a>,
    group_of: &impl Fn(&str) -> Option<String>,
) -> Option<(String, Vec<&'a str>)> {
    seen.runs.values().rev().find_map(|nodes| {
        let mut groups: BTreeMap<String, usize> = BTreeMap::new();
        for node in nodes {
            if let Some(group) = group_of(node) {
                *groups.entry(group).or_default() += 1;
            }
        }
        let (group, _) = groups.into_iter().max_by_key(|&(_, n)| n)?;
        Some((group, nodes.iter().copied().collect()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn cronjob(key: &str, schedule: &str) -> CronJobSpec {
        CronJobSpec {
            key: key.into(),
            uid: None,
            schedule: Schedule::parse(schedule, None),
            suspended: false,
        }
    }

    fn pod<'a>(namespace: &'a str, job: &'a str, node: &'a str, running: bool) -> JobPod<'a> {
        JobPod {
            namespace,
            job,
            node: Some(node),
            running,
        }
    }

    /// Nodes `a*` are in pool `batch`, `w*` in `web`; others are gone.
    fn group_of(node: &str) -> Option<String> {
        match node.chars().next() {
            Some('a') => Some("batch".into()),
            Some('w') => Some("web".into()),
            _ => None,
        }
    }

    #[test]
    fn each_cronjob_runs_next_in_the_group_of_its_last_runs_nodes() {
        let cronjobs = [
            cronjob("team/report", "*/10 * * * *"),
            cronjob("team/nightly", "0 2 * * *"),
        ];
        // The report ran at minute 29,618,880 (two nodes), then later at
        // ...890 on three; the nightly's pods are gone.
        let pods = [
            pod("team", "report-29618880", "a1", false),
            pod("team", "report-29618880", "a2", false),
            pod("team", "report-29618890", "a1", false),
            pod("team", "report-29618890", "a2", false),
            pod("team", "report-29618890", "a3", true),
        ];
        let work = known_work(&cronjobs, pods, group_of, at("2026-04-25T03:05:00Z"));
        assert_eq!(
            work.runs,
            BTreeMap::from([(
                "batch".to_string(),
                vec![Run {
                    cronjob: "team/report".into(),
                    at: at("2026-04-25T03:10:00Z"),
                    nodes: 3,
                    on: vec!["a1".into(), "a2".into(), "a3".into()]
                }]
            )])
        );
        assert_eq!(work.busy, BTreeSet::from(["a3".to_string()]));
        assert_eq!(work.explained.len(), 3);
    }

    #[test]
    fn a_node_running_another_jobs_pods_is_not_explained_by_the_schedule() {
        let cronjobs = [cronjob("team/report", "*/10 * * * *")];
        let pods = [
            pod("team", "report-29618890", "a1", true),
            pod("team", "report-29618890", "a2", true),
            // A bare Job, and a Job of a CronJob in another namespace.
            pod("team", "backfill", "a2", true),
            pod("other", "report-29618890", "a3", true),
        ];
        let work = known_work(&cronjobs, pods, group_of, at("2026-04-25T03:05:00Z"));
        assert_eq!(work.explained, BTreeSet::from(["a1".to_string()]));
        assert_eq!(
            work.busy,
            BTreeSet::from(["a1".to_string(), "a2".to_string()])
        );
    }

    #[test]
    fn a_suspended_or_unpredictable_cronjob_has_no_next_run() {
        let mut suspended = cronjob("team/report", "*/10 * * * *");
        suspended.suspended = true;
        let cronjobs = [suspended, cronjob("team/every", "@every 5m")];
        let pods = [
            pod("team", "report-29618890", "a1", false),
            pod("team", "every-29618890", "a2", false),
        ];
        let work = known_work(&cronjobs, pods, group_of, at("2026-04-25T03:05:00Z"));
        assert!(work.runs.is_empty(), "{:?}", work.runs);
        assert_eq!(work.unpredictable.len(), 1);
        assert!(work.unpredictable[0].why.contains("@every"));
        // The suspended one's node is still explained (its schedule is
        // known); the unpredictable one's pods are other work, which the
        // window holds.
        assert_eq!(work.explained, BTreeSet::from(["a1".to_string()]));
    }

    #[test]
    fn a_run_whose_nodes_are_gone_counts_with_the_latest_run_still_known() {
        let cronjobs = [cronjob("team/report", "*/10 * * * *")];
        let pods = [
            pod("team", "report-29618880", "w1", false),
            pod("team", "report-29618890", "gone-1", false),
        ];
        let work = known_work(&cronjobs, pods, group_of, at("2026-04-25T03:05:00Z"));
        assert_eq!(work.runs["web"][0].nodes, 1);
    }
}
