//! Kubernetes Events on nodes, so `kubectl describe node` says why a node is
//! held and when that ends. Events are best effort and must never slow the
//! bulk patching: they queue (bounded) and a task of their own publishes them
//! at a modest rate; when the queue is full an event is dropped and counted in
//! the log.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::core::plan::{NodePatch, NodeView};
use crate::core::window::Observed;

const QUEUE: usize = 10_000;
const PER_SECOND: u32 = 20;

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
    pub fn counted(node: &NodeView, observed: Observed, deadline: Option<Timestamp>) -> Self {
        let (reason, what) = match observed {
            Observed::Opened => ("HoldWindowOpened", "opened node-holder's hold window"),
            Observed::Extended => ("HoldWindowExtended", "extended node-holder's hold window"),
            _ => ("HeldWithWindow", "joined node-holder's open hold window"),
        };
        HoldEvent {
            node: node.name.clone(),
            uid: node.uid.clone(),
            reason,
            action: "Hold",
            note: format!(
                "new node (created {}) {what}: held {}",
                node.creation,
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
    /// Starts the publishing task; it ends with `stop`.
    pub fn spawn(client: kube::Client, instance: &str, stop: CancellationToken) -> Self {
        let (queue, mut events) = mpsc::channel::<HoldEvent>(QUEUE);
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: "node-holder".to_string(),
                instance: Some(instance.to_string()),
            },
        );
        tokio::spawn(async move {
            let mut pacer = tokio::time::interval(Duration::from_secs(1) / PER_SECOND);
            loop {
                let event = tokio::select! {
                    _ = stop.cancelled() => return,
                    event = events.recv() => match event {
                        Some(event) => event,
                        None => return,
                    },
                };
                pacer.tick().await;
                let reference = ObjectReference {
                    api_version: Some("v1".to_string()),
                    kind: Some("Node".to_string()),
                    name: Some(event.node.clone()),
                    uid: event.uid.clone(),
                    ..ObjectReference::default()
                };
                let published = recorder
                    .publish(
                        &Event {
                            type_: EventType::Normal,
                            reason: event.reason.to_string(),
                            note: Some(event.note),
                            action: event.action.to_string(),
                            secondary: None,
                        },
                        &reference,
                    )
                    .await;
                if let Err(err) = published {
                    tracing::debug!(node = %event.node, error = %err, "publishing an event failed");
                }
            }
        });
        EventSink { queue }
    }

    /// Queues `event`; drops it when the queue is full.
    pub fn send(&self, event: HoldEvent) {
        if let Err(mpsc::error::TrySendError::Full(event)) = self.queue.try_send(event) {
            tracing::debug!(node = %event.node, reason = event.reason, "event queue full; event dropped");
        }
    }
}
