//! Kubernetes Events on nodes, so `kubectl describe node` says why a node is held and when that
//! ends, and on the window record for a manual hold. Best effort, never slowing the bulk patching:
//! they queue (bounded) for a task that publishes them at a modest rate; a full queue drops them.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::CronJob;
use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Resource;
use kube::api::{Api, PostParams};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::core::holds::is_marked;
use crate::core::node::NodeMeta;
use crate::core::plan::{Action, NodePatch};
use crate::core::window::{ManualHold, ManualHoldOutcome, Observed};

const QUEUE: usize = 10_000;
const PER_SECOND: u32 = 20;

/// Nodes of one pass that get an Event each way; past it, one Event on the
/// record sums the pass up (the figures: `docs/comparison.md`).
pub const NODE_EVENTS_PER_PASS: usize = 500;
/// `reportingController` of node-holder's Events.
const REPORTING_CONTROLLER: &str = "node-holder.dev/node-holder";

/// One Event on a node, the window record, or a CronJob (`--launch-cost`).
#[derive(Debug, Clone, PartialEq)]
pub struct HoldEvent {
    regarding: ObjectReference,
    reason: &'static str,
    action: &'static str,
    note: String,
}

/// A reference to the `K` named `name` (`namespace`: none if cluster-scoped).
fn reference<K: Resource<DynamicType = ()>>(
    namespace: Option<&str>,
    name: &str,
    uid: Option<&str>,
) -> ObjectReference {
    ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        uid: uid.map(str::to_string),
        ..ObjectReference::default()
    }
}

fn until(deadline: Option<Timestamp>) -> String {
    deadline.map_or("while the schedule keeps it".into(), |d| {
        format!("until {d}")
    })
}

fn node_ref(name: &str, uid: Option<&str>) -> ObjectReference {
    reference::<Node>(None, name, uid)
}

fn record_ref(namespace: &str) -> ObjectReference {
    reference::<ConfigMap>(Some(namespace), crate::state::record::NAME, None)
}

/// A CronJob, by `namespace/name`.
fn cronjob_ref(cronjob: &str, uid: Option<&str>) -> ObjectReference {
    let (namespace, name) = cronjob.split_once('/').unwrap_or(("default", cronjob));
    reference::<CronJob>(Some(namespace), name, uid)
}

impl HoldEvent {
    fn new(on: ObjectReference, reason: &'static str, action: &'static str, note: String) -> Self {
        HoldEvent {
            regarding: on,
            reason,
            action,
            note,
        }
    }

    /// A new node in scope opened or extended the window.
    pub fn counted(node: &NodeMeta, observed: Observed, deadline: Option<Timestamp>) -> Self {
        let (reason, what) = match observed {
            Observed::Opened => ("HoldWindowOpened", "opened node-holder's hold window"),
            Observed::Extended => ("HoldWindowExtended", "extended node-holder's hold window"),
            _ => ("HeldWithWindow", "joined node-holder's open hold window"),
        };
        let carried = if is_marked(node) {
            " (carried the hold from its CREATE)"
        } else {
            ""
        };
        let (created, until) = (node.created(), until(deadline));
        let note = format!("new node (created {created}) {what}: held {until}{carried}");
        HoldEvent::new(node_ref(node.name(), node.uid()), reason, "Hold", note)
    }

    /// The Event of the pass's `applied`th patch of `action`: none past
    /// `limit` (the summary covers those) or for a stamp (no hold changed).
    pub fn applied(
        action: Action,
        patch: &NodePatch,
        applied: usize,
        limit: usize,
    ) -> Option<Self> {
        match action {
            _ if applied > limit => None,
            Action::Hold => Some(HoldEvent::held(patch)),
            Action::Release => Some(HoldEvent::released(patch)),
            Action::Stamp => None,
        }
    }

    fn held(patch: &NodePatch) -> Self {
        let keys = patch.keys.join(", ");
        let note = format!("node-holder added {keys} {}", until(patch.until));
        let uid = patch.uid.as_deref();
        HoldEvent::new(node_ref(&patch.name, uid), "HoldApplied", "Hold", note)
    }

    fn released(patch: &NodePatch) -> Self {
        let why = if patch.drifted {
            "Karpenter marked it drifted: node-holder does not hold a rollout, \
             only `node-holder hold` does"
        } else {
            "node-holder's hold window closed"
        };
        let mut note = if patch.keys.is_empty() {
            why.to_string()
        } else {
            format!("{why}: removed {}", patch.keys.join(", "))
        };
        if !patch.left.is_empty() {
            let left = patch.left.join(", ");
            note.push_str(&format!("; left {left} (changed by someone else)"));
        }
        let uid = patch.uid.as_deref();
        HoldEvent::new(node_ref(&patch.name, uid), "HoldReleased", "Release", note)
    }

    /// After a pass's patches of `action`: the Event on the record that sums
    /// them up when more were `applied` than got their own Event (`limit`).
    pub fn pass(namespace: &str, action: Action, applied: usize, limit: usize) -> Option<Self> {
        if applied <= limit {
            return None;
        }
        let (reason, action, did) = match action {
            Action::Hold => ("NodesHeld", "Hold", "put its hold on"),
            Action::Release => ("NodesReleased", "Release", "removed its hold from"),
            Action::Stamp => return None,
        };
        let note = format!(
            "node-holder {did} {applied} nodes in one pass; the first {limit} have an Event of \
             their own"
        );
        Some(HoldEvent::new(record_ref(namespace), reason, action, note))
    }

    /// `--launch-cost`: the node is kept for a scheduled run.
    pub fn kept_for_run(node: &NodeMeta, until: Timestamp, why: String) -> Self {
        let note = format!("held until {until}: {why}");
        let on = node_ref(node.name(), node.uid());
        HoldEvent::new(on, "HeldForScheduledRun", "Hold", note)
    }

    /// `--launch-cost`: the schedule no longer keeps the node.
    pub fn nothing_due(node: &NodeMeta, why: String) -> Self {
        let on = node_ref(node.name(), node.uid());
        HoldEvent::new(on, "ScheduledHoldEnded", "Release", why)
    }

    /// `--launch-cost`: a CronJob whose schedule node-holder cannot predict.
    pub fn unpredictable(cronjob: &str, uid: Option<&str>, why: &str) -> Self {
        let note = format!(
            "{why}: node-holder keeps no node for its runs; their nodes are held by the hold window as other work"
        );
        let on = cronjob_ref(cronjob, uid);
        HoldEvent::new(on, "UnpredictableSchedule", "Hold", note)
    }

    /// `--warm-before-runs`: what a run's warm did, or why it was cut short.
    pub fn warm(cronjob: &str, uid: Option<&str>, reason: &'static str, note: String) -> Self {
        HoldEvent::new(cronjob_ref(cronjob, uid), reason, "Warm", note)
    }

    /// A manual hold request handled (`current`: the one in force afterwards).
    pub fn manual(
        namespace: &str,
        hold: &ManualHold,
        outcome: ManualHoldOutcome,
        current: Option<&ManualHold>,
    ) -> Self {
        let (by, until, why) = (&hold.by, hold.until, &hold.reason);
        let asked = format!("{by} asked to hold every node until {until} ({why})");
        let (reason, note) = match (outcome, current) {
            (ManualHoldOutcome::Started, _) => ("ManualHoldStarted", asked),
            (ManualHoldOutcome::Extended, _) => ("ManualHoldExtended", asked),
            (ManualHoldOutcome::AlreadyLonger, Some(current)) => (
                "ManualHoldUnchanged",
                format!(
                    "{asked}; the manual hold of {} until {} lasts longer and stays",
                    current.by, current.until
                ),
            ),
            (ManualHoldOutcome::AlreadyLonger | ManualHoldOutcome::Expired, _) => (
                "ManualHoldExpired",
                format!("{asked}; that time has passed"),
            ),
        };
        HoldEvent::new(record_ref(namespace), reason, "Hold", note)
    }

    fn name(&self) -> &str {
        self.regarding.name.as_deref().unwrap_or_default()
    }

    /// Nodes are cluster-scoped: their Events go to `default`.
    fn namespace(&self) -> &str {
        self.regarding.namespace.as_deref().unwrap_or("default")
    }

    /// The `events.k8s.io/v1` Event, named as client-go names them: object, time.
    fn to_k8s(&self, instance: &str) -> K8sEvent {
        let nanos = Timestamp::now().as_nanosecond();
        let name = format!("{}.{nanos:x}", truncate(self.name(), 230));
        K8sEvent {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(self.namespace().to_string()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(Timestamp::now())),
            action: Some(self.action.to_string()),
            reason: Some(self.reason.to_string()),
            note: Some(self.note.clone()),
            type_: Some("Normal".to_string()),
            reporting_controller: Some(REPORTING_CONTROLLER.to_string()),
            reporting_instance: Some(instance.to_string()),
            regarding: Some(self.regarding.clone()),
            ..K8sEvent::default()
        }
    }
}

/// Where the window task drops its Events.
#[derive(Clone)]
pub struct EventSink {
    queue: mpsc::Sender<HoldEvent>,
}

impl EventSink {
    /// Starts the publishing task; it ends with `stop`. Not kube's Recorder:
    /// its series cache would keep every Event of a bulk pass in memory for
    /// minutes, and ours, one node and one moment each, make no series.
    pub fn spawn(client: kube::Client, instance: &str, stop: CancellationToken) -> Self {
        let (queue, mut events) = mpsc::channel::<HoldEvent>(QUEUE);
        let instance = instance.to_string();
        tokio::spawn(async move {
            let mut pacer = tokio::time::interval(Duration::from_secs(1) / PER_SECOND);
            let mut failures = 0u64;
            loop {
                let next = stop.run_until_cancelled(events.recv()).await;
                let Some(event) = next.flatten() else { return };
                pacer.tick().await;
                let api: Api<K8sEvent> = Api::namespaced(client.clone(), event.namespace());
                let k8s_event = event.to_k8s(&instance);
                if let Err(err) = api.create(&PostParams::default(), &k8s_event).await {
                    failures += 1;
                    // The 1st, 2nd, 4th, 8th… failure: visible, never a flood.
                    if failures.is_power_of_two() {
                        tracing::warn!(regarding = %event.name(), failures, error = %err, "publishing an event failed");
                    }
                }
            }
        });
        EventSink { queue }
    }

    /// A sink that publishes nothing (`release` run by hand leaves no Events).
    pub fn none() -> Self {
        let (queue, _) = mpsc::channel::<HoldEvent>(1);
        EventSink { queue }
    }

    /// Queues `event`; drops it when the queue is full.
    pub fn send(&self, event: HoldEvent) {
        if let Err(mpsc::error::TrySendError::Full(event)) = self.queue.try_send(event) {
            tracing::debug!(regarding = %event.name(), reason = event.reason, "event queue full; event dropped");
        }
    }
}

/// At most `max` bytes of `name`, cut at a character boundary.
fn truncate(name: &str, max: usize) -> &str {
    let mut end = name.len().min(max);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].trim_end_matches(['.', '-'])
}

#[cfg(test)]
mod tests {
    use json_patch::Patch;

    use super::*;

    fn patch(name: &str) -> NodePatch {
        NodePatch {
            name: name.to_string(),
            uid: None,
            patch: Patch(Vec::new()),
            keys: vec!["karpenter.sh/do-not-disrupt".to_string()],
            left: Vec::new(),
            until: None,
            drifted: false,
        }
    }

    #[test]
    fn a_pass_past_the_limit_is_summed_up_on_the_record() {
        let held = HoldEvent::applied(Action::Hold, &patch("a"), 2, 2);
        assert_eq!(held, Some(HoldEvent::held(&patch("a"))));
        // Nodes past the limit get no Event of their own.
        assert_eq!(HoldEvent::applied(Action::Hold, &patch("c"), 3, 2), None);
        let summary = HoldEvent::pass("ops", Action::Hold, 4, 2).unwrap();
        assert_eq!(summary.name(), crate::state::record::NAME);
        assert_eq!(summary.namespace(), "ops");
        assert_eq!(summary.reason, "NodesHeld");
        assert!(summary.note.contains(" 4 nodes") && summary.note.contains("first 2"));
    }

    #[test]
    fn a_pass_within_the_limit_has_only_node_events() {
        let released = HoldEvent::applied(Action::Release, &patch("a"), 1, 2);
        assert_eq!(released, Some(HoldEvent::released(&patch("a"))));
        assert_eq!(HoldEvent::applied(Action::Stamp, &patch("a"), 1, 2), None);
        assert_eq!(HoldEvent::pass("ops", Action::Release, 2, 2), None);
        assert_eq!(HoldEvent::pass("ops", Action::Stamp, 9, 2), None);
        let none = HoldEvent::pass("ops", Action::Release, 1, 0).unwrap();
        assert_eq!(none.reason, "NodesReleased");
    }
}
