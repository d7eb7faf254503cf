//! The scheduled work the cluster knows (`--launch-cost`): each CronJob's next run and how many
//! nodes its last run occupied, read from the CronJobs and their Jobs' pods, matched by the Jobs'
//! names (docs/architecture.md, "The schedule hold"). A CronJob whose schedule cannot be predicted
//! is not known: its pods are other work, which the window holds. Pure: the caller watches.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use foldhash::{HashMap, HashSet};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Affinity, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::schedule::{Schedule, ScheduleError};

/// What a run's pods ask of a node, from the CronJob's pod template (what a
/// placeholder copies, [`super::warm`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodShape {
    /// Each container's name and requests.
    pub containers: Vec<(String, BTreeMap<String, Quantity>)>,
    pub node_selector: Option<BTreeMap<String, String>>,
    pub tolerations: Option<Vec<Toleration>>,
    pub affinity: Option<Affinity>,
}

/// A CronJob's next run.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// `namespace/name`.
    pub cronjob: String,
    pub uid: Option<String>,
    /// When the CronJob controller starts it.
    pub at: Timestamp,
    /// How many nodes its last run occupied.
    pub nodes: usize,
    /// How many pods its last run had on them.
    pub pods: usize,
    /// The nodes its last run occupied: kept for it first (its images are there).
    pub on: Vec<String>,
    /// What its pods ask of a node (`None`: unknown).
    pub shape: Option<Arc<PodShape>>,
}

/// A CronJob as the hold reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct CronJobSpec {
    /// `namespace/name`.
    pub key: String,
    pub uid: Option<String>,
    pub schedule: Result<Schedule, ScheduleError>,
    pub suspended: bool,
    /// What its pods ask of a node, from its Job template.
    pub shape: Option<Arc<PodShape>>,
}

/// A Job's pod as the hold reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobPod<'a> {
    pub namespace: &'a str,
    /// Its Job's name (`batch.kubernetes.io/job-name`).
    pub job: &'a str,
    pub node: Option<&'a str>,
    /// Not finished (neither `Succeeded` nor `Failed`).
    pub running: bool,
    /// node-holder's placeholder ([`super::warm`]): it keeps its node for the
    /// run it warms, and is no run's pod.
    pub placeholder: bool,
}

/// How large a CronJob's last run was: remembered once its nodes are gone (a
/// run after a long gap finds none of them).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct LastRun {
    pub nodes: usize,
    pub pods: usize,
    /// The run's scheduled minute since the epoch (0 in older records).
    #[serde(default)]
    pub minute: i64,
}

impl LastRun {
    /// The same run as `remembered` saw it larger: as its nodes go one by
    /// one, the pod garbage collector takes their pods with them, so the
    /// run looks smaller than it was; its size is the largest seen.
    fn at_least(self, remembered: Option<&LastRun>) -> LastRun {
        match remembered {
            Some(kept) if kept.minute == self.minute => LastRun {
                nodes: self.nodes.max(kept.nodes),
                pods: self.pods.max(kept.pods),
                ..self
            },
            _ => self,
        }
    }
}

/// What the CronJobs and their pods say, at one instant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KnownWork {
    pub runs: Vec<Run>,
    /// Nodes running a known CronJob's pod now.
    pub busy: HashSet<String>,
    /// Nodes whose Job pods are all known CronJobs' (see the module doc).
    pub explained: HashSet<String>,
    /// Nodes running (or that ran) the pods of other Jobs: explained by no
    /// schedule, whatever ran on them before.
    pub other_work: HashSet<String>,
    pub unpredictable: Vec<Unpredictable>,
    /// Each predictable CronJob's last run, from its nodes or as remembered:
    /// what the caller remembers next.
    pub last: BTreeMap<String, LastRun>,
}

impl KnownWork {
    /// Until when a later `from` reads the same work from the same CronJobs
    /// and pods (`from` only decides each next run): the earliest run.
    pub fn same_until(&self) -> Option<Timestamp> {
        self.runs.iter().map(|run| run.at).min()
    }
}

/// A CronJob whose schedule cannot be predicted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unpredictable {
    /// `namespace/name`.
    pub cronjob: String,
    pub uid: Option<String>,
    pub why: String,
}

/// One CronJob's runs as its pods show them: the nodes of each run and its
/// pods, by the run's scheduled minute.
type Seen<'a> = BTreeMap<i64, (BTreeSet<&'a str>, usize)>;

/// Reads the scheduled work: each CronJob's first run after `from` (the caller's now less the grace
/// a started run's pods get to land); `in_scope` says whether a node is still there and in scope. A
/// CronJob whose runs' nodes are all gone counts with its last run as `remembered`.
///
/// At 50,000 nodes a pass reads this every time: what it builds per pod borrows
/// (no allocation per pod), and its lookups hash.
pub fn known_work<'a, C: std::borrow::Borrow<CronJobSpec>>(
    cronjobs: &[C],
    pods: impl IntoIterator<Item = JobPod<'a>>,
    in_scope: impl Fn(&str) -> bool,
    from: Timestamp,
    remembered: &BTreeMap<String, LastRun>,
) -> KnownWork {
    let cronjobs = cronjobs.iter().map(Borrow::borrow);
    let keys: HashSet<&str> = cronjobs
        .clone()
        .filter(|c: &&CronJobSpec| c.schedule.is_ok())
        .map(|c| c.key.as_str())
        .collect();
    let mut work = KnownWork::default();
    let seen = read_pods(pods, &keys, &mut work);
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
        let seen = seen.get(cronjob.key.as_str());
        let seen_last = seen.and_then(|s| last_run(s, &in_scope));
        let (last, on) = match seen_last {
            Some((last, on)) => (last.at_least(remembered.get(&cronjob.key)), on),
            None => match remembered.get(&cronjob.key) {
                Some(last) => (last.clone(), Vec::new()),
                None => continue,
            },
        };
        let next = next_run(schedule, seen, from).filter(|_| !cronjob.suspended);
        if let Some(at) = next {
            work.runs.push(Run {
                cronjob: cronjob.key.clone(),
                uid: cronjob.uid.clone(),
                at,
                nodes: last.nodes,
                pods: last.pods,
                on: on.into_iter().map(str::to_string).collect(),
                shape: cronjob.shape.clone(),
            });
        }
        work.last.insert(cronjob.key.clone(), last);
    }
    work
}

/// Reads the Job pods into `work` (busy, explained and other work's nodes) and returns each known
/// CronJob's runs as its pods show them, by the CronJob's key (one of `keys`).
fn read_pods<'a, 'k>(
    pods: impl IntoIterator<Item = JobPod<'a>>,
    keys: &HashSet<&'k str>,
    work: &mut KnownWork,
) -> HashMap<&'k str, Seen<'a>> {
    let mut seen: HashMap<&'k str, Seen<'a>> = HashMap::default();
    let (mut explained, mut busy, mut others) =
        (HashSet::default(), HashSet::default(), HashSet::default());
    let mut key = String::new();
    for pod in pods {
        let Some(node) = pod.node else { continue };
        if pod.placeholder {
            explained.insert(node);
            busy.insert(node);
            continue;
        }
        let Some((cronjob, minute)) = cronjob_of(pod.namespace, pod.job, keys, &mut key) else {
            others.insert(node);
            continue;
        };
        let run = seen.entry(cronjob).or_default().entry(minute).or_default();
        run.0.insert(node);
        run.1 += 1;
        explained.insert(node);
        if pod.running {
            busy.insert(node);
        }
    }
    let owned = |nodes: &mut dyn Iterator<Item = &&str>| nodes.map(|n| n.to_string()).collect();
    work.explained = owned(&mut explained.difference(&others));
    work.busy = owned(&mut busy.iter());
    work.other_work = owned(&mut others.iter());
    seen
}

/// The CronJob's first run after `from`; a run whose pods are there has
/// begun, so the next one is the one after it.
fn next_run(schedule: &Schedule, seen: Option<&Seen<'_>>, from: Timestamp) -> Option<Timestamp> {
    let at = schedule.next_after(from)?;
    let minute = at.as_second().div_euclid(60);
    if !seen.is_some_and(|s| s.contains_key(&minute)) {
        return Some(at);
    }
    schedule.next_after(at)
}

/// The CronJob (`namespace/name`, one of `keys`) a Job of that name belongs
/// to, and the Job's scheduled minute; `key` is a buffer to spell it in.
fn cronjob_of<'k>(
    namespace: &str,
    job: &str,
    keys: &HashSet<&'k str>,
    key: &mut String,
) -> Option<(&'k str, i64)> {
    let (cronjob, minute) = job.rsplit_once('-')?;
    let minute: i64 = minute.parse().ok()?;
    key.clear();
    key.extend([namespace, "/", cronjob]);
    keys.get(key.as_str()).map(|&cronjob| (cronjob, minute))
}

/// The CronJob's latest run with a node still there and in scope, and its nodes.
fn last_run<'a>(
    seen: &Seen<'a>,
    in_scope: &impl Fn(&str) -> bool,
) -> Option<(LastRun, Vec<&'a str>)> {
    seen.iter().rev().find_map(|(&minute, (nodes, pods))| {
        if !nodes.iter().any(|node| in_scope(node)) {
            return None;
        }
        let last = LastRun {
            nodes: nodes.len(),
            pods: *pods,
            minute,
        };
        Some((last, nodes.iter().copied().collect()))
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
            shape: None,
        }
    }

    fn pod<'a>(namespace: &'a str, job: &'a str, node: &'a str, running: bool) -> JobPod<'a> {
        JobPod {
            namespace,
            job,
            node: Some(node),
            running,
            placeholder: false,
        }
    }

    /// Nodes `a*` and `w*` are there; others are gone.
    fn in_scope(node: &str) -> bool {
        node.starts_with(['a', 'w'])
    }

    #[test]
    fn each_cronjob_runs_next_on_its_last_runs_nodes_in_scope() {
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
        let work = known_work(
            &cronjobs,
            pods,
            in_scope,
            at("2026-04-25T03:05:00Z"),
            &BTreeMap::new(),
        );
        assert_eq!(
            work.runs,
            [Run {
                cronjob: "team/report".into(),
                uid: None,
                at: at("2026-04-25T03:10:00Z"),
                nodes: 3,
                pods: 3,
                on: vec!["a1".into(), "a2".into(), "a3".into()],
                shape: None,
            }]
        );
        assert_eq!(work.busy, HashSet::from_iter(["a3".to_string()]));
        assert_eq!(work.explained.len(), 3);
    }

    /// A pass reuses the known work until its earliest run: any `from`
    /// before it reads the same, the first after it reads the run after.
    #[test]
    fn the_known_work_is_the_same_until_its_earliest_run() {
        let cronjobs = [
            cronjob("team/report", "*/10 * * * *"),
            cronjob("team/hourly", "0 * * * *"),
        ];
        let pods = [
            pod("team", "report-29618880", "a1", false),
            pod("team", "hourly-29618820", "w1", false),
        ];
        let read = |from: &str| {
            known_work(
                &cronjobs,
                pods.clone(),
                in_scope,
                at(from),
                &BTreeMap::new(),
            )
        };
        let first = read("2026-04-25T03:01:00Z");
        let until = first.same_until();
        assert_eq!(until, Some(at("2026-04-25T03:10:00Z")));
        for later in ["2026-04-25T03:05:00Z", "2026-04-25T03:09:59.9Z"] {
            assert_eq!(read(later), first, "{later}");
        }
        assert_ne!(read("2026-04-25T03:10:00Z"), first);
        assert_eq!(KnownWork::default().same_until(), None);
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
        let work = known_work(
            &cronjobs,
            pods,
            in_scope,
            at("2026-04-25T03:05:00Z"),
            &BTreeMap::new(),
        );
        assert_eq!(work.explained, HashSet::from_iter(["a1".to_string()]));
        assert_eq!(
            work.other_work,
            HashSet::from_iter(["a2".to_string(), "a3".to_string()])
        );
        assert_eq!(
            work.busy,
            HashSet::from_iter(["a1".to_string(), "a2".to_string()])
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
        let work = known_work(
            &cronjobs,
            pods,
            in_scope,
            at("2026-04-25T03:05:00Z"),
            &BTreeMap::new(),
        );
        assert!(work.runs.is_empty(), "{:?}", work.runs);
        assert_eq!(work.unpredictable.len(), 1);
        assert!(work.unpredictable[0].why.contains("@every"));
        // The suspended one's node is still explained (its schedule is
        // known); the unpredictable one's pods are other work, which the
        // window holds.
        assert_eq!(work.explained, HashSet::from_iter(["a1".to_string()]));
    }

    #[test]
    fn a_cronjob_whose_nodes_are_all_gone_counts_with_its_remembered_last_run() {
        let cronjobs = [cronjob("team/hourly", "0 * * * *")];
        let pods = [
            pod("team", "hourly-29618880", "gone-1", false),
            pod("team", "hourly-29618880", "gone-2", false),
        ];
        let now = at("2026-04-25T03:05:00Z");
        let nothing = known_work(&cronjobs, pods.clone(), in_scope, now, &BTreeMap::new());
        assert!(nothing.runs.is_empty() && nothing.last.is_empty());
        let last = LastRun {
            nodes: 2,
            pods: 4,
            minute: 29618880,
        };
        let remembered = BTreeMap::from([("team/hourly".to_string(), last.clone())]);
        let work = known_work(&cronjobs, pods, in_scope, now, &remembered);
        let run = &work.runs[0];
        assert_eq!(
            (run.at, run.nodes, run.pods),
            (at("2026-04-25T04:00:00Z"), 2, 4)
        );
        assert!(run.on.is_empty());
        assert_eq!(work.last, remembered, "remembered again");
    }

    #[test]
    fn a_run_whose_nodes_go_one_by_one_keeps_the_size_it_had() {
        let cronjobs = [cronjob("team/hourly", "0 * * * *")];
        let now = at("2026-04-25T03:05:00Z");
        let whole = [
            pod("team", "hourly-29618880", "a1", false),
            pod("team", "hourly-29618880", "a2", false),
            pod("team", "hourly-29618880", "a3", false),
        ];
        let first = known_work(&cronjobs, whole, in_scope, now, &BTreeMap::new());
        assert_eq!(first.last["team/hourly"].nodes, 3);
        // Two of its nodes are gone, and their pods with them.
        let left = [pod("team", "hourly-29618880", "a1", false)];
        let later = known_work(&cronjobs, left, in_scope, now, &first.last);
        let run = &later.runs[0];
        assert_eq!((run.nodes, run.pods), (3, 3));
        assert_eq!(run.on, ["a1"]);
        assert_eq!(later.last, first.last);
        // The next run is sized by itself, smaller or not.
        let next = [pod("team", "hourly-29618940", "a1", false)];
        let after = known_work(&cronjobs, next, in_scope, now, &first.last);
        assert_eq!(after.last["team/hourly"].nodes, 1);
    }

    #[test]
    fn a_run_whose_pods_are_there_is_not_the_next_run_any_more() {
        let cronjobs = [cronjob("team/report", "*/10 * * * *")];
        // 03:10 is minute 29,618,110; from 03:09:30 the next run is 03:10
        // until its pods appear, then 03:20.
        let from = at("2026-04-25T03:09:30Z");
        let earlier = [pod("team", "report-29618880", "a1", false)];
        let work = known_work(&cronjobs, earlier, in_scope, from, &BTreeMap::new());
        assert_eq!(work.runs[0].at, at("2026-04-25T03:10:00Z"));
        let begun = [
            pod("team", "report-29618880", "a1", false),
            pod("team", "report-29618110", "a2", true),
        ];
        let work = known_work(&cronjobs, begun, in_scope, from, &BTreeMap::new());
        assert_eq!(work.runs[0].at, at("2026-04-25T03:20:00Z"));
    }

    #[test]
    fn a_placeholder_keeps_and_explains_its_node_and_is_no_runs_pod() {
        let cronjobs = [cronjob("team/report", "*/10 * * * *")];
        let mut warm = pod("node-holder", "node-holder-warm-29618900-abcd", "a9", true);
        warm.placeholder = true;
        let pods = [pod("team", "report-29618890", "a1", false), warm];
        let now = at("2026-04-25T03:05:00Z");
        let work = known_work(&cronjobs, pods, in_scope, now, &BTreeMap::new());
        assert!(work.busy.contains("a9") && work.explained.contains("a9"));
        assert_eq!(
            work.runs[0].nodes, 1,
            "the placeholder's node is not the run's"
        );
    }

    #[test]
    fn a_run_whose_nodes_are_gone_counts_with_the_latest_run_still_known() {
        let cronjobs = [cronjob("team/report", "*/10 * * * *")];
        let pods = [
            pod("team", "report-29618880", "w1", false),
            pod("team", "report-29618890", "gone-1", false),
        ];
        let work = known_work(
            &cronjobs,
            pods,
            in_scope,
            at("2026-04-25T03:05:00Z"),
            &BTreeMap::new(),
        );
        assert_eq!(work.runs[0].nodes, 1);
    }
}
