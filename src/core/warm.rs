//! Capacity in time (`--warm-before-runs`): which runs are warmed, and their
//! placeholder Job and PriorityClass (docs/architecture.md, "Capacity in
//! time"). Pure: what to ask for and when; the caller creates and deletes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Value, json};

use super::due::{Kept, Reason, Terms};
use super::known::{KnownWork, Run};
use super::plus;

/// The PriorityClass of every placeholder: below every real pod (whose
/// default priority is 0), and never preempting.
pub const PRIORITY_CLASS: &str = "node-holder-warm";
const PRIORITY: i32 = -100;
/// What every placeholder Job and pod carries, so that node-holder (and
/// `uninstall`, and `status`) finds its own and nothing else; and as a selector.
pub const WARM_LABEL: (&str, &str) = ("node-holder.dev/warm", "true");
pub const WARM_SELECTOR: &str = "node-holder.dev/warm=true";
/// The placeholder Job's annotations: the CronJob and the run it warms for.
const FOR_ANNOTATION: &str = "node-holder.dev/warm-for";
const RUN_ANNOTATION: &str = "node-holder.dev/warm-run-at";
/// Placeholder Jobs' names: the prefix, the run's minute since the epoch and
/// the start of the CronJob's uid.
const NAME_PREFIX: &str = "node-holder-warm-";
const UID_CHARS: usize = 8;
/// How long before the run's start the placeholders go: the CronJob controller starts the Job at
/// the scheduled second, so its pods find the nodes free instead of preempting.
pub const HANDOVER: Duration = Duration::from_secs(5);
/// The container every placeholder runs: it does nothing until stopped.
const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";

/// One run's warm: a placeholder Job.
#[derive(Debug, Clone, PartialEq)]
pub struct Warm<'a> {
    pub run: &'a Run,
    /// The nodes the run lacks.
    pub nodes: usize,
    /// Placeholder pods: the run's pods, in proportion to the nodes lacking.
    pub pods: usize,
    pub name: String,
}

/// A placeholder Job's name for a run of the CronJob with `uid`.
fn placeholder_name(uid: &str, at: Timestamp) -> String {
    let uid: String = uid.chars().take(UID_CHARS).collect();
    format!("{NAME_PREFIX}{}-{uid}", at.as_second().div_euclid(60))
}

/// Whether `job` names a placeholder (in node-holder's namespace).
pub fn is_placeholder(job: &str) -> bool {
    job.strip_prefix(NAME_PREFIX)
        .and_then(|rest| rest.split_once('-'))
        .is_some_and(|(minute, _)| minute.parse::<i64>().is_ok())
}

/// The placeholder Job each run should have now: runs due within `lead`
/// (and not yet handed over) that lack nodes the schedule keeps for them.
pub fn due_warms<'a>(
    known: &'a KnownWork,
    kept: &BTreeMap<String, Kept>,
    lead: Duration,
    now: Timestamp,
) -> Vec<Warm<'a>> {
    let mut ready: BTreeMap<&str, usize> = BTreeMap::new();
    let for_runs = kept.values().filter(|k| k.reason == Reason::Run);
    for cronjob in for_runs.filter_map(|k| k.cronjob.as_deref()) {
        *ready.entry(cronjob).or_default() += 1;
    }
    let warm = |run: &'a Run| {
        let uid = run.uid.as_deref().filter(|_| warming(run.at, lead, now))?;
        let ready = ready.get(run.cronjob.as_str()).copied().unwrap_or(0);
        let nodes = run.nodes.saturating_sub(ready);
        let pods = run.pods.saturating_mul(nodes).div_ceil(run.nodes.max(1));
        let name = placeholder_name(uid, run.at);
        (pods > 0 && run.shape.is_some()).then_some(Warm {
            run,
            nodes,
            pods,
            name,
        })
    };
    known.runs.iter().filter_map(warm).collect()
}

/// The placeholder Job of every run in its warming window, whatever its nodes: a warm goes on until
/// the hand-over even when the schedule hold keeps its nodes for the run (they are then both;
/// neither must end the other). Only a run that no longer comes ends its warm early.
pub fn in_window(known: &KnownWork, lead: Duration, now: Timestamp) -> BTreeSet<String> {
    known
        .runs
        .iter()
        .filter(|run| warming(run.at, lead, now))
        .filter_map(|run| Some(placeholder_name(run.uid.as_deref()?, run.at)))
        .collect()
}

/// Whether a run at `at` is warmed at `now`: from `lead` before it until the hand-over.
fn warming(at: Timestamp, lead: Duration, now: Timestamp) -> bool {
    let start = at.saturating_sub(lead).unwrap_or(Timestamp::MIN);
    let end = at.saturating_sub(HANDOVER).unwrap_or(Timestamp::MIN);
    start <= now && now < end
}

/// The next instant after `now` a warm starts or hands over.
pub fn next_change(known: &KnownWork, lead: Duration, now: Timestamp) -> Option<Timestamp> {
    let instants = |run: &Run| [lead, HANDOVER].map(|d| run.at.saturating_sub(d));
    let instants = known.runs.iter().flat_map(instants).flatten();
    instants.filter(|&t| t > now).min()
}

/// The placeholder Job for `warm`, in `namespace`: it ends by itself at the
/// run's start plus the grace.
pub fn placeholder_job(warm: &Warm<'_>, namespace: &str, terms: &Terms, now: Timestamp) -> Value {
    let run = warm.run;
    let end = plus(run.at, terms.grace);
    let deadline = end.duration_since(now).as_secs().max(1);
    let labels =
        json!({ WARM_LABEL.0: WARM_LABEL.1, "app.kubernetes.io/managed-by": "node-holder" });
    let pods = i32::try_from(warm.pods).unwrap_or(i32::MAX);
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": warm.name,
            "namespace": namespace,
            "labels": labels,
            "annotations": { FOR_ANNOTATION: run.cronjob, RUN_ANNOTATION: run.at.to_string() },
        },
        "spec": {
            "parallelism": pods,
            "completions": pods,
            // A preempted placeholder is not replaced: its index fails, the others go on.
            "completionMode": "Indexed",
            "backoffLimitPerIndex": 0,
            "maxFailedIndexes": pods,
            "podReplacementPolicy": "Failed",
            "activeDeadlineSeconds": deadline,
            "ttlSecondsAfterFinished": 60,
            "template": { "metadata": { "labels": labels }, "spec": pod_spec(run) },
        }
    })
}

/// The placeholder pod: the run's shape, pause containers, non-root.
fn pod_spec(run: &Run) -> Value {
    let shape = run.shape.as_deref().cloned().unwrap_or_default();
    let containers: Vec<Value> = shape
        .containers
        .iter()
        .map(|(name, requests)| {
            json!({
                "name": name,
                "image": PAUSE_IMAGE,
                "resources": { "requests": requests },
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true,
                    "capabilities": { "drop": ["ALL"] },
                },
            })
        })
        .collect();
    let mut spec = json!({
        "priorityClassName": PRIORITY_CLASS,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 65535,
            "seccompProfile": { "type": "RuntimeDefault" },
        },
        "containers": containers,
    });
    let fields = [
        ("nodeSelector", serde_json::to_value(&shape.node_selector)),
        ("tolerations", serde_json::to_value(&shape.tolerations)),
        ("affinity", serde_json::to_value(&shape.affinity)),
    ];
    for (key, value) in fields {
        if let Some(value) = value.ok().filter(|v| !v.is_null()) {
            spec[key] = value;
        }
    }
    spec
}

/// The CronJob and the run a placeholder Job warms for, from its annotations.
pub fn warmed_for(
    annotations: Option<&BTreeMap<String, String>>,
) -> (Option<String>, Option<Timestamp>) {
    let get = |key: &str| annotations.and_then(|a| a.get(key));
    let run_at = get(RUN_ANNOTATION).and_then(|at| at.parse().ok());
    (get(FOR_ANNOTATION).cloned(), run_at)
}

/// What a warm did by its run's start (or, for `status`, so far).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HandOver {
    /// Placeholder pods on a node, and still waiting for one.
    pub ready: usize,
    pub late: usize,
    /// The nodes they were on, and how long those were up before the run,
    /// each from its creation or the warm's start, whichever came later.
    pub nodes: usize,
    pub node_seconds: f64,
}

impl HandOver {
    /// From the nodes of a warm's placeholder pods (`None`: not bound) and
    /// when each node was created, for a run at `at` warmed `since`.
    pub fn of<'a>(
        pods: impl IntoIterator<Item = Option<&'a str>>,
        created: impl Fn(&str) -> Option<Timestamp>,
        at: Timestamp,
        since: Timestamp,
    ) -> HandOver {
        let pods: Vec<Option<&str>> = pods.into_iter().collect();
        let nodes: BTreeMap<&str, _> = pods.iter().flatten().map(|&n| (n, created(n))).collect();
        let ready = pods.iter().flatten().count();
        let late = pods.len().saturating_sub(ready);
        let node_seconds = nodes
            .values()
            .flatten()
            .map(|&created| at.duration_since(created.max(since)).as_secs_f64().max(0.0))
            .sum();
        HandOver {
            ready,
            late,
            nodes: nodes.len(),
            node_seconds,
        }
    }

    /// The `WarmedForRun` Event's note.
    pub fn note(&self, at: Timestamp) -> String {
        let late = if self.late > 0 {
            "; the others were still waiting for a node: warm earlier (--warm-before-runs)"
        } else {
            ""
        };
        format!(
            "the run at {at}: {} of {} placeholder pod(s) were on {} node(s) at its start ({:.0} node-seconds up before it){late}",
            self.ready,
            self.ready.saturating_add(self.late),
            self.nodes,
            self.node_seconds,
        )
    }
}

/// The PriorityClass placeholders run at.
pub fn priority_class() -> Value {
    json!({
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {
            "name": PRIORITY_CLASS,
            "labels": { WARM_LABEL.0: WARM_LABEL.1, "app.kubernetes.io/managed-by": "node-holder" },
        },
        "value": PRIORITY,
        "globalDefault": false,
        "preemptionPolicy": "Never",
        "description": "node-holder's placeholders before scheduled runs: any real pod preempts them",
    })
}

/// Why a run is warmed, as its Event and the log say it.
pub fn why_warmed(warm: &Warm<'_>, terms: &Terms) -> String {
    format!(
        "cronjob {} runs at {}; its nodes were let go (the gap is longer than the launch cost, {}), \
         so {} node(s) are launched for it now ({} placeholder pod(s), Job {})",
        warm.run.cronjob,
        warm.run.at,
        humantime::format_duration(terms.launch_cost),
        warm.nodes,
        warm.pods,
        warm.name,
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;
    use crate::core::known::PodShape;

    fn t(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).unwrap()
    }

    fn shape() -> PodShape {
        PodShape {
            containers: vec![(
                "work".into(),
                BTreeMap::from([("cpu".to_string(), Quantity("600m".into()))]),
            )],
            node_selector: Some(BTreeMap::from([("pool".to_string(), "batch".to_string())])),
            ..PodShape::default()
        }
    }

    fn run(at: i64, nodes: usize, pods: usize) -> Run {
        Run {
            cronjob: "team/report".into(),
            uid: Some("0123456789abcdef".into()),
            at: t(at),
            nodes,
            pods,
            on: Vec::new(),
            shape: Some(Arc::new(shape())),
        }
    }

    fn known(runs: Vec<Run>) -> KnownWork {
        KnownWork {
            runs,
            ..KnownWork::default()
        }
    }

    fn terms() -> Terms {
        Terms {
            launch_cost: Duration::from_secs(300),
            grace: Duration::from_secs(60),
            settle: Duration::from_secs(60),
        }
    }

    const LEAD: Duration = Duration::from_secs(120);

    #[test]
    fn a_run_is_warmed_from_the_lead_before_it_until_the_hand_over() {
        let known = known(vec![run(600, 2, 4)]);
        let none = BTreeMap::new();
        assert!(due_warms(&known, &none, LEAD, t(479)).is_empty());
        let warms = due_warms(&known, &none, LEAD, t(480));
        assert_eq!(warms.len(), 1);
        assert_eq!((warms[0].nodes, warms[0].pods), (2, 4));
        assert_eq!(
            warms[0].name,
            format!("node-holder-warm-{}-01234567", (1_800_000_000 + 600) / 60)
        );
        assert!(is_placeholder(&warms[0].name));
        assert_eq!(due_warms(&known, &none, LEAD, t(594)).len(), 1);
        assert!(
            due_warms(&known, &none, LEAD, t(595)).is_empty(),
            "handed over"
        );
        assert_eq!(next_change(&known, LEAD, t(0)), Some(t(480)));
        assert_eq!(next_change(&known, LEAD, t(480)), Some(t(595)));
        assert_eq!(next_change(&known, LEAD, t(595)), None);
    }

    #[test]
    fn only_the_nodes_the_schedule_does_not_keep_for_the_run_are_warmed() {
        let known = known(vec![run(600, 3, 6)]);
        let for_run = |cronjob: &str| Kept {
            reason: Reason::Run,
            until: Some(t(660)),
            cronjob: Some(cronjob.into()),
            run_at: Some(t(600)),
        };
        let mut kept = BTreeMap::from([
            ("a1".to_string(), for_run("team/report")),
            ("b1".to_string(), for_run("team/other")),
        ]);
        let warms = due_warms(&known, &kept, LEAD, t(500));
        assert_eq!((warms[0].nodes, warms[0].pods), (2, 4));
        // Every node kept: nothing to warm.
        kept.insert("a2".into(), for_run("team/report"));
        kept.insert("a3".into(), for_run("team/report"));
        assert!(due_warms(&known, &kept, LEAD, t(500)).is_empty());
        // ...but a warm already made goes on: its run is in its window
        // (the suite once saw a warm "cancelled" when the schedule came to
        // keep its own placeholder's node for the run).
        let name = format!("node-holder-warm-{}-01234567", (1_800_000_000 + 600) / 60);
        assert_eq!(in_window(&known, LEAD, t(500)), BTreeSet::from([name]));
        assert!(
            in_window(&known, LEAD, t(479)).is_empty(),
            "before the lead"
        );
        assert!(in_window(&known, LEAD, t(595)).is_empty(), "handed over");
    }

    #[test]
    fn a_run_without_a_uid_a_pod_template_or_pods_is_not_warmed() {
        let mut no_uid = run(600, 1, 1);
        no_uid.uid = None;
        let mut no_shape = run(600, 1, 1);
        no_shape.shape = None;
        // The two-schedules day's log showed a warm of "0 of 0 placeholder
        // pod(s)": a run known by its nodes but not its pods asks for none.
        let no_pods = run(600, 1, 0);
        let known = known(vec![no_uid, no_shape, no_pods]);
        assert!(due_warms(&known, &BTreeMap::new(), LEAD, t(500)).is_empty());
    }

    #[test]
    fn the_placeholder_is_shaped_like_the_run_and_ends_by_itself() {
        let known = known(vec![run(600, 2, 4)]);
        let warms = due_warms(&known, &BTreeMap::new(), LEAD, t(500));
        let job = placeholder_job(&warms[0], "node-holder", &terms(), t(500));
        let spec = &job["spec"];
        assert_eq!(spec["parallelism"], 4);
        assert_eq!(
            spec["activeDeadlineSeconds"], 160,
            "the run's start plus the grace"
        );
        let pod = &spec["template"]["spec"];
        assert_eq!(pod["priorityClassName"], PRIORITY_CLASS);
        assert_eq!(pod["nodeSelector"]["pool"], "batch");
        assert!(pod.get("tolerations").is_none());
        assert_eq!(pod["containers"][0]["resources"]["requests"]["cpu"], "600m");
        assert_eq!(pod["containers"][0]["image"], PAUSE_IMAGE);
        assert_eq!(job["metadata"]["labels"][WARM_LABEL.0], "true");
        assert_eq!(
            job["metadata"]["annotations"][FOR_ANNOTATION],
            "team/report"
        );
        let annotations: BTreeMap<String, String> =
            serde_json::from_value(job["metadata"]["annotations"].clone()).unwrap();
        assert_eq!(
            warmed_for(Some(&annotations)),
            (Some("team/report".into()), Some(t(600))),
            "status reads back the run the Job warms for"
        );
        assert_eq!(warmed_for(None), (None, None));
        assert_eq!(format!("{}={}", WARM_LABEL.0, WARM_LABEL.1), WARM_SELECTOR);
        assert_eq!(priority_class()["value"], PRIORITY);
        assert_eq!(priority_class()["preemptionPolicy"], "Never");
    }

    #[test]
    fn the_hand_over_counts_ready_and_late_placeholders_and_what_their_nodes_cost() {
        let pods = [Some("n1"), Some("n1"), Some("n2"), None];
        // n1 came up before the warm started (it was idle): counted from the
        // warm's start; n2 was launched for it.
        let created = |node: &str| match node {
            "n1" => Some(t(0)),
            "n2" => Some(t(530)),
            _ => None,
        };
        let over = HandOver::of(pods, created, t(600), t(480));
        assert_eq!((over.ready, over.late, over.nodes), (3, 1, 2));
        assert_eq!(over.node_seconds, 120.0 + 70.0);
        let note = over.note(t(600));
        assert!(
            note.contains("3 of 4 placeholder pod(s) were on 2 node(s)"),
            "{note}"
        );
        assert!(
            note.contains("190 node-seconds") && note.contains("warm earlier"),
            "{note}"
        );
    }

    #[test]
    fn other_jobs_are_not_placeholders() {
        assert!(!is_placeholder("report-29618890"));
        assert!(!is_placeholder("node-holder-warm-x-1"));
        assert!(is_placeholder("node-holder-warm-29618890-abc"));
    }
}
