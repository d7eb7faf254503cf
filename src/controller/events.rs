//! Kubernetes Events on nodes, so `kubectl describe node` says why a node is
//! held and when that ends. Events are best effort and must never slow the
//! bulk patching: they queue (bounded) and a task of their own publishes them
//! at a modest rate; when the queue is full an event is dropped and counted in
//! the log.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::core::plan::NodePatch;
use crate::core::window::Observed;

const QUEUE: usize = 10_000;
const PER_SECOND: u32 = 20;
/// `reportingController` of node-holder's Events.
const REPORTING_CONTROLLER: &str = "node-holder.dev/node-holder";

/// One Event on one node.
#[derive(Debug, Clone)]
pub struct HoldEvent {
    node: String,
    uid: Option<String>,
    reason: &'static str,
    action: &'static str,
    note: String,
}

fn until(deadline: Option<Timestamp>) -> String {
    deadline.map_or_else(|| "for its own hold".to_string(), |d| format!("until {d}"))
}

impl HoldEvent {
    /// A new node in scope opened or extended the window.
    pub fn counted(
        node: &ObjectMeta,
        created: Timestamp,
        observed: Observed,
        deadline: Option<Timestamp>,
    ) -> Self {
        let (reason, what) = match observed {
            Observed::Opened => ("HoldWindowOpened", "opened node-holder's hold window"),
            Observed::Extended => ("HoldWindowExtended", "extended node-holder's hold window"),
            _ => ("HeldWithWindow", "joined node-holder's open hold window"),
        };
        HoldEvent {
            node: node.name.clone().unwrap_or_default(),
            uid: node.uid.clone(),
            reason,
            action: "Hold",
            note: format!(
                "new node (created {created}) {what}: held {}",
                until(deadline)
            ),
        }
    }

    /// node-holder put its hold on the node.
    pub fn held(patch: &NodePatch, deadline: Option<Timestamp>) -> Self {
        HoldEvent {
            node: patch.name.clone(),
            uid: patch.uid.clone(),
            reason: "HoldApplied",
            action: "Hold",
            note: format!(
                "node-holder added {} {}",
                patch.keys.join(", "),
                until(deadline)
            ),
        }
    }

    /// node-holder removed its hold from the node.
    pub fn released(patch: &NodePatch) -> Self {
        let mut note = if patch.keys.is_empty() {
            "node-holder's hold window closed".to_string()
        } else {
            format!(
                "node-holder's hold window closed: removed {}",
                patch.keys.join(", ")
            )
        };
        if !patch.left.is_empty() {
            note.push_str(&format!(
                "; left {} (changed by someone else)",
                patch.left.join(", ")
            ));
        }
        HoldEvent {
            node: patch.name.clone(),
            uid: patch.uid.clone(),
            reason: "HoldReleased",
            action: "Release",
            note,
        }
    }
}

/// Where the window task drops its events.
#[derive(Clone)]
pub struct EventSink {
    queue: mpsc::Sender<HoldEvent>,
}

impl EventSink {
    /// Starts the publishing task; it ends with `stop`. Events are created
    /// one by one without kube's Recorder, whose series cache would keep
    /// every Event of a bulk pass in memory for minutes: each of ours is about
    /// one node and one moment, so there is no series to build.
    pub fn spawn(client: kube::Client, instance: &str, stop: CancellationToken) -> Self {
        let (queue, mut events) = mpsc::channel::<HoldEvent>(QUEUE);
        let api: Api<K8sEvent> = Api::namespaced(client, "default");
        let instance = instance.to_string();
        tokio::spawn(async move {
            let mut pacer = tokio::time::interval(Duration::from_secs(1) / PER_SECOND);
            let mut failures = 0u64;
            loop {
                let event = tokio::select! {
                    _ = stop.cancelled() => return,
                    event = events.recv() => match event {
                        Some(event) => event,
                        None => return,
                    },
                };
                pacer.tick().await;
                if let Err(err) = api
                    .create(&PostParams::default(), &event.to_k8s(&instance))
                    .await
                {
                    failures += 1;
                    // The 1st, 2nd, 4th, 8th… failure: visible, never a flood.
                    if failures.is_power_of_two() {
                        tracing::warn!(node = %event.node, failures, error = %err, "publishing an event failed");
                    }
                }
            }
        });
        EventSink { queue }
    }

    /// A sink that publishes nothing (`release` run by hand leaves no
    /// Events; its own output says what it did).
    pub fn none() -> Self {
        let (queue, _) = mpsc::channel::<HoldEvent>(1);
        EventSink { queue }
    }

    /// Queues `event`; drops it when the queue is full.
    pub fn send(&self, event: HoldEvent) {
        if let Err(mpsc::error::TrySendError::Full(event)) = self.queue.try_send(event) {
            tracing::debug!(node = %event.node, reason = event.reason, "event queue full; event dropped");
        }
    }
}

impl HoldEvent {
    /// The `events.k8s.io/v1` Event, in the default namespace (Nodes are
    /// cluster-scoped), named by the API server.
    fn to_k8s(&self, instance: &str) -> K8sEvent {
        K8sEvent {
            metadata: ObjectMeta {
                // As kubectl and client-go name Events: object name, time.
                name: Some(format!(
                    "{}.{:x}",
                    truncate(&self.node, 230),
                    Timestamp::now().as_nanosecond()
                )),
                namespace: Some("default".to_string()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(Timestamp::now())),
            action: Some(self.action.to_string()),
            reason: Some(self.reason.to_string()),
            note: Some(self.note.clone()),
            type_: Some("Normal".to_string()),
            reporting_controller: Some(REPORTING_CONTROLLER.to_string()),
            reporting_instance: Some(instance.to_string()),
            regarding: Some(ObjectReference {
                api_version: Some("v1".to_string()),
                kind: Some("Node".to_string()),
                name: Some(self.node.clone()),
                uid: self.uid.clone(),
                ..ObjectReference::default()
            }),
            ..K8sEvent::default()
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
