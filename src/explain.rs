//! `node-holder explain NODE`: why one node is held, by whom, until when,
//! and what was last said about it (node-holder's and Karpenter's Events),
//! on one screen. Read from the node, the record and the Lease (through
//! [`crate::status`]) and the node's Events; writes nothing.

use anyhow::{Context, Result};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{Api, ListParams};
use serde::Serialize;

use crate::cli::{ExplainArgs, Output};
use crate::core::budget::{Mechanism, NODEPOOL_LABEL};
use crate::core::holds::{HELD_UNTIL_ANNOTATION, Preset, held_keys, held_until_stamp, is_marked};
use crate::status::{self, Status};

/// Everything `explain` says about one node.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub node: String,
    pub created: Option<Timestamp>,
    /// The hold annotations on the node, and whose each is.
    pub holds: Vec<HoldOnNode>,
    /// With the budget mechanism: the node's NodePool, when it carries
    /// node-holder's budget entry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool_budget: Option<String>,
    /// Until when node-holder holds it, and why then; `None` when it does
    /// not (or its hold comes off at the leader's next pass).
    pub until: Option<Until>,
    /// The node's `node-holder.dev/held-until`: held at least until then.
    #[serde(skip_serializing_if = "Option::is_none")]
    held_until_annotation: Option<Timestamp>,
    pub leader: Option<String>,
    /// The node's last Events, oldest first.
    pub events: Vec<NodeEvent>,
}

/// One hold annotation on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HoldOnNode {
    pub key: String,
    pub value: String,
    /// node-holder put it there (listed in `node-holder.dev/hold-keys` on a
    /// marked node); else it is someone else's and node-holder never
    /// removes it.
    node_holders: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Until {
    pub at: Timestamp,
    /// "its window's deadline", "the manual hold's end", "its own hold
    /// (node scope)".
    pub why: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeEvent {
    pub at: Option<Timestamp>,
    pub reason: String,
    pub by: String,
    pub message: String,
}

/// Events shown, the latest.
const EVENTS: usize = 8;

/// The `explain` subcommand.
pub async fn run(args: &ExplainArgs) -> Result<()> {
    let client = crate::cluster::command_client("explain", &args.client).await?;
    let now = Timestamp::now();
    let node = Api::<Node>::all(client.clone())
        .get(&args.node)
        .await
        .with_context(|| format!("reading node {}", args.node))?;
    let status = status::read(&client, &args.record.namespace, now).await?;
    let events = node_events(&client, &args.node).await?;
    let explanation = explain(&node, &status, events);
    match args.output {
        Output::Text => print!("{}", render_text(&explanation, now)),
        Output::Json => println!("{}", serde_json::to_string_pretty(&explanation)?),
        Output::Yaml => print!("{}", crate::status::yaml(&explanation)?),
    }
    Ok(())
}

/// The node's Events, every namespace's, oldest first, the last [`EVENTS`].
async fn node_events(client: &kube::Client, node: &str) -> Result<Vec<NodeEvent>> {
    let selector = format!("involvedObject.kind=Node,involvedObject.name={node}");
    let list = Api::<Event>::all(client.clone())
        .list(&ListParams::default().fields(&selector))
        .await
        .context("listing the node's Events")?;
    let mut events: Vec<NodeEvent> = list
        .items
        .into_iter()
        .map(|e| NodeEvent {
            at: e
                .event_time
                .map(|t| t.0)
                .or(e.last_timestamp.map(|t| t.0))
                .or(e.metadata.creation_timestamp.map(|t| t.0)),
            reason: e.reason.unwrap_or_default(),
            by: e
                .reporting_component
                .filter(|c| !c.is_empty())
                .or(e.source.and_then(|s| s.component))
                .unwrap_or_default(),
            message: e.message.unwrap_or_default(),
        })
        .collect();
    events.sort_by_key(|e| e.at);
    let skip = events.len().saturating_sub(EVENTS);
    Ok(events.split_off(skip))
}

/// What the node, the record and the Events say about the node.
pub fn explain(node: &Node, status: &Status, events: Vec<NodeEvent>) -> Explanation {
    let meta = &node.metadata;
    let settings = status.settings.as_ref();
    let label = |key: &str| meta.labels.as_ref().and_then(|l| l.get(key)).cloned();
    let pool_budget = label(NODEPOOL_LABEL).filter(|pool| {
        settings.is_some_and(|s| s.hold_mechanism == Mechanism::Budget)
            && status.nodepool_budgets.contains(pool)
    });
    let holds = holds_on(node, status);
    let held = holds.iter().any(|h| h.node_holders) || pool_budget.is_some();
    Explanation {
        node: meta.name.clone().unwrap_or_default(),
        created: meta.creation_timestamp.as_ref().map(|t| t.0),
        until: held.then(|| until(status)).flatten(),
        held_until_annotation: held_until_stamp(meta),
        holds,
        pool_budget,
        leader: status
            .leader
            .as_ref()
            .filter(|l| !l.expired)
            .map(|l| l.identity.clone()),
        events,
    }
}

/// The hold annotations on the node (the configured ones and every
/// preset's), and whose each is.
fn holds_on(node: &Node, status: &Status) -> Vec<HoldOnNode> {
    let meta = &node.metadata;
    let configured = status.settings.iter().flat_map(|s| s.holds.iter());
    let mut keys: Vec<String> = configured
        .filter_map(|h| h.split_once('=').map(|(k, _)| k.to_string()))
        .collect();
    for preset in [
        Preset::KarpenterV1,
        Preset::KarpenterV0,
        Preset::ClusterAutoscaler,
    ] {
        let key = preset.hold().key;
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let listed = held_keys(meta);
    let marked = is_marked(meta);
    keys.into_iter()
        .filter_map(|key| {
            let value = meta.annotations.as_ref()?.get(&key)?.clone();
            let node_holders = marked && listed.contains(&key.as_str());
            Some(HoldOnNode {
                key,
                value,
                node_holders,
            })
        })
        .collect()
}

/// Until when node-holder holds the node: the window's deadline or the
/// manual hold's end, the later; `None` when nothing holds it any more (the
/// next pass releases).
fn until(status: &Status) -> Option<Until> {
    status.settings.as_ref()?;
    let own = status.deadline.map(|at| (at, "its window's deadline"));
    let manual = status
        .manual
        .as_ref()
        .map(|m| (m.until, "the manual hold's end"));
    let (at, why) = own.into_iter().chain(manual).max_by_key(|(at, _)| *at)?;
    Some(Until {
        at,
        why: why.to_string(),
    })
}

/// The explanation in words, one screen.
pub fn render_text(e: &Explanation, now: Timestamp) -> String {
    let mut out = String::new();
    let mut line = |label: &str, value: String| out.push_str(&format!("{label:<10}{value}\n"));
    let created = e.created.map_or_else(String::new, |c| {
        format!(" (created {c}, {})", status::relative(c, now))
    });
    line("Node:", format!("{}{created}", e.node));
    line("Held:", held_text(e));
    let until = match (&e.until, held_by_node_holder(e)) {
        (Some(u), _) => format!("{} ({}): {}", u.at, status::relative(u.at, now), u.why),
        (None, true) => "its window is closed: the leader releases it at its next pass".into(),
        (None, false) => "-".into(),
    };
    line("Until:", until);
    if let Some(at) = e.held_until_annotation {
        line(
            "Stamped:",
            format!(
                "{HELD_UNTIL_ANNOTATION}={at} (held at least until then; the leader rewrites it once it passes while the hold lasts)"
            ),
        );
    }
    line(
        "Leader:",
        e.leader
            .clone()
            .unwrap_or_else(|| "none: nothing adds or releases holds now".into()),
    );
    out.push_str("Events:\n");
    if e.events.is_empty() {
        out.push_str("  none (Events expire after an hour)\n");
    }
    for ev in &e.events {
        let age = ev
            .at
            .map_or_else(|| "-".into(), |at| status::relative(at, now));
        out.push_str(&format!(
            "  {age:<10} {:<20} {:<16} {}\n",
            ev.reason, ev.by, ev.message
        ));
    }
    out
}

fn held_by_node_holder(e: &Explanation) -> bool {
    e.holds.iter().any(|h| h.node_holders) || e.pool_budget.is_some()
}

/// Who holds the node, with what.
fn held_text(e: &Explanation) -> String {
    let mut parts = Vec::new();
    for hold in &e.holds {
        let whose = if hold.node_holders {
            "node-holder's"
        } else {
            "someone else's: node-holder never removes it"
        };
        parts.push(format!("{}={} ({whose})", hold.key, hold.value));
    }
    if let Some(pool) = &e.pool_budget {
        parts.push(format!("NodePool {pool}'s budget entry (node-holder's)"));
    }
    if parts.is_empty() {
        "no".into()
    } else {
        format!("yes, {}", parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::window::ManualHold;
    use crate::state::record::Settings;
    use std::collections::BTreeMap;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn node(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Node {
        let map = |pairs: &[(&str, &str)]| {
            Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            )
        };
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        node.metadata.creation_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at("2026-11-22T12:00:00Z")),
        );
        node.metadata.labels = map(labels);
        node.metadata.annotations = map(annotations);
        node
    }

    fn settings(mechanism: Mechanism) -> Settings {
        Settings {
            hold_duration: std::time::Duration::from_secs(1200),
            max_hold: None,
            holds: vec!["karpenter.sh/do-not-disrupt=true".into()],
            node_selector: String::new(),
            hold_mechanism: mechanism,
            nodepool_selector: String::new(),
            launch_cost: None,
        }
    }

    const MARKED: (&str, &str) = ("node-holder.dev/held", "true");
    const HOLD: (&str, &str) = ("karpenter.sh/do-not-disrupt", "true");
    const LISTED: (&str, &str) = ("node-holder.dev/hold-keys", "karpenter.sh/do-not-disrupt");

    #[test]
    fn node_holders_hold_lasts_until_the_later_of_the_window_and_the_manual_hold() {
        let mut status = Status {
            settings: Some(settings(Mechanism::Annotation)),
            open: true,
            deadline: Some(at("2026-11-22T12:20:00Z")),
            ..Status::default()
        };
        let held = node(&[(NODEPOOL_LABEL, "gpu"), MARKED], &[HOLD, LISTED]);
        let e = explain(&held, &status, Vec::new());
        assert_eq!(
            e.until.as_ref().map(|u| (u.at, u.why.as_str())),
            Some((at("2026-11-22T12:20:00Z"), "its window's deadline"))
        );
        let text = render_text(&e, at("2026-11-22T12:10:00Z"));
        assert!(
            text.contains("Held:     yes, karpenter.sh/do-not-disrupt=true (node-holder's)\n"),
            "{text}"
        );
        assert!(
            text.contains("Leader:   none: nothing adds or releases holds now\n"),
            "{text}"
        );
        assert!(!text.contains("Stamped:"), "{text}");
        let stamp = ("node-holder.dev/held-until", "2026-11-22T12:15:00Z");
        let stamped = node(&[(NODEPOOL_LABEL, "gpu"), MARKED], &[HOLD, LISTED, stamp]);
        let e = explain(&stamped, &status, Vec::new());
        assert_eq!(e.held_until_annotation, Some(at("2026-11-22T12:15:00Z")));
        let text = render_text(&e, at("2026-11-22T12:10:00Z"));
        assert!(
            text.contains("Stamped:  node-holder.dev/held-until=2026-11-22T12:15:00Z (held at least until then;"),
            "{text}"
        );

        status.manual = Some(ManualHold {
            requested_at: at("2026-11-22T12:00:00Z"),
            until: at("2026-11-22T13:00:00Z"),
            by: "alice".into(),
            reason: "rollout".into(),
        });
        let e = explain(&held, &status, Vec::new());
        assert_eq!(e.until.map(|u| u.why), Some("the manual hold's end".into()));
    }

    #[test]
    fn a_hold_node_holder_did_not_list_is_someone_elses_and_has_no_end() {
        let status = Status {
            settings: Some(settings(Mechanism::Annotation)),
            deadline: Some(at("2026-11-22T12:20:00Z")),
            ..Status::default()
        };
        // Held by a person: no marker, no listing.
        let e = explain(&node(&[], &[HOLD]), &status, Vec::new());
        assert_eq!(e.holds.len(), 1);
        assert!(!e.holds[0].node_holders);
        assert_eq!(e.until, None);
        // Marked, but the key is not in the list: still theirs.
        let e = explain(
            &node(&[MARKED], &[HOLD, ("node-holder.dev/hold-keys", "")]),
            &status,
            Vec::new(),
        );
        assert!(!e.holds[0].node_holders);
        let text = render_text(&e, at("2026-11-22T12:10:00Z"));
        assert!(text.contains("Until:    -\n"), "{text}");
    }

    #[test]
    fn a_pool_budget_counts_as_node_holders() {
        let status = Status {
            settings: Some(settings(Mechanism::Budget)),
            nodepool_budgets: vec!["general".into()],
            deadline: Some(at("2026-11-22T12:20:00Z")),
            ..Status::default()
        };
        let e = explain(
            &node(&[(NODEPOOL_LABEL, "general")], &[]),
            &status,
            Vec::new(),
        );
        assert_eq!(e.pool_budget.as_deref(), Some("general"));
        assert_eq!(
            e.until.map(|u| (u.at, u.why)),
            Some((at("2026-11-22T12:20:00Z"), "its window's deadline".into()))
        );
        let other = explain(
            &node(&[(NODEPOOL_LABEL, "other")], &[]),
            &status,
            Vec::new(),
        );
        assert_eq!(other.pool_budget, None);
        assert!(render_text(&other, at("2026-11-22T12:10:00Z")).contains("Held:     no\n"));
    }
}
