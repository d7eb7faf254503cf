//! The desired state of every node, as patches: which nodes to hold and which
//! to release, given the hold window and the nodes as last read. Pure and
//! deterministic, so the background task can run it on every change and
//! patch only the nodes whose state changes.

use std::collections::BTreeMap;

use jiff::Timestamp;
use json_patch::Patch;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::holds::Holds;
use super::patch::{hold_existing, release_holds};
use super::selector::NodeScope;
use super::window::{Mode, Window, WindowConfig};

/// What planning needs of a node: its metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub creation: Timestamp,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

impl NodeView {
    /// `None` for metadata without a name or creation time, which the API
    /// server never returns for a stored Node.
    pub fn from_meta(meta: &ObjectMeta) -> Option<NodeView> {
        Some(NodeView {
            name: meta.name.clone()?,
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            creation: meta.creation_timestamp.as_ref()?.0,
            labels: meta.labels.clone().unwrap_or_default(),
            annotations: meta.annotations.clone().unwrap_or_default(),
        })
    }

    /// The metadata the patch builders read (absent maps stay absent, as
    /// patches that add to them depend on it).
    fn meta(&self) -> ObjectMeta {
        let map = |m: &BTreeMap<String, String>| (!m.is_empty()).then(|| m.clone());
        ObjectMeta {
            name: Some(self.name.clone()),
            uid: self.uid.clone(),
            resource_version: self.resource_version.clone(),
            labels: map(&self.labels),
            annotations: map(&self.annotations),
            ..ObjectMeta::default()
        }
    }
}

/// One node's patch and what it changes, for logs and Events.
#[derive(Debug, Clone, PartialEq)]
pub struct NodePatch {
    pub name: String,
    pub uid: Option<String>,
    pub patch: Patch,
    /// Hold keys the patch adds (hold) or removes (release).
    pub keys: Vec<String>,
    /// Release only: keys node-holder added that someone changed since;
    /// left in place, only node-holder's record of them is dropped.
    pub left: Vec<String>,
}

/// The patches that bring the nodes to the desired state, by node name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub hold: Vec<NodePatch>,
    pub release: Vec<NodePatch>,
    /// When the plan changes by itself (a hold ends), absent node changes:
    /// the window's deadline, or in `node` mode the first node's hold end.
    pub wake: Option<Timestamp>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.hold.is_empty() && self.release.is_empty()
    }
}

/// The desired state. `cluster` mode: while the window is open every node in
/// scope carries every hold, and when it is closed no node carries
/// node-holder's. `node` mode: a node in scope is held until its own
/// creation + hold (unless a release consumed it). A node out of scope never
/// carries node-holder's holds. Nodes already as desired get no patch.
pub fn plan(
    window: &Window,
    cfg: &WindowConfig,
    scope: &NodeScope,
    holds: &Holds,
    nodes: &[NodeView],
    now: Timestamp,
) -> Plan {
    let mut nodes: Vec<&NodeView> = nodes.iter().collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let mut plan = Plan {
        wake: window.next_wake(),
        ..Plan::default()
    };
    for node in nodes {
        let held = scope.matches(&node.labels)
            && match cfg.mode {
                Mode::Cluster => window.is_open(now),
                Mode::Node => match window.node_hold_end(node.creation, now, cfg) {
                    Some(end) if now < end => {
                        plan.wake = Some(plan.wake.map_or(end, |wake| wake.min(end)));
                        true
                    }
                    _ => false,
                },
            };
        let meta = node.meta();
        if held {
            let (patch, added) = hold_existing(&meta, holds);
            if !patch.0.is_empty() {
                plan.hold.push(NodePatch {
                    name: node.name.clone(),
                    uid: node.uid.clone(),
                    patch,
                    keys: added.into_iter().map(|h| h.key).collect(),
                    left: Vec::new(),
                });
            }
        } else {
            let release = release_holds(&meta, holds);
            if !release.patch.0.is_empty() {
                plan.release.push(NodePatch {
                    name: node.name.clone(),
                    uid: node.uid.clone(),
                    patch: release.patch,
                    keys: release.removed,
                    left: release.left,
                });
            }
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{Value, json};

    use super::*;
    use crate::core::holds::Preset;

    fn t(m: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + m * 60).unwrap()
    }

    fn cfg(mode: Mode) -> WindowConfig {
        WindowConfig {
            hold: Duration::from_secs(10 * 60),
            max_hold: Some(Duration::from_secs(30 * 60)),
            mode,
        }
    }

    fn holds() -> Holds {
        Holds::new(&[Preset::KarpenterV1], &[]).unwrap()
    }

    fn node(name: &str, created: i64, labels: Value, annotations: Value) -> NodeView {
        let meta: ObjectMeta = serde_json::from_value(json!({
            "name": name, "uid": format!("uid-{name}"), "resourceVersion": "5",
            "creationTimestamp": t(created).to_string(),
            "labels": labels, "annotations": annotations,
        }))
        .unwrap();
        NodeView::from_meta(&meta).unwrap()
    }

    /// A node as the webhook (or an earlier plan) left it.
    fn held(name: &str, created: i64) -> NodeView {
        node(
            name,
            created,
            json!({"node-holder.dev/held": "true"}),
            json!({"karpenter.sh/do-not-disrupt": "true",
                "node-holder.dev/hold-keys": "karpenter.sh/do-not-disrupt"}),
        )
    }

    fn names(patches: &[NodePatch]) -> Vec<&str> {
        patches.iter().map(|p| p.name.as_str()).collect()
    }

    fn open_window(cfg: &WindowConfig, created: i64) -> Window {
        let mut w = Window::default();
        w.observe(t(created), t(created), cfg);
        w
    }

    #[test]
    fn metadata_without_a_name_or_creation_is_no_node() {
        let meta = ObjectMeta {
            name: Some("n".into()),
            ..ObjectMeta::default()
        };
        assert_eq!(NodeView::from_meta(&meta), None);
        assert_eq!(NodeView::from_meta(&ObjectMeta::default()), None);
    }

    #[test]
    fn an_open_window_holds_every_node_in_scope_that_lacks_a_hold() {
        let cfg = cfg(Mode::Cluster);
        let scope = NodeScope::parse("pool=batch").unwrap();
        let nodes = [
            node("c-old", -500, json!({"pool": "batch"}), json!({})),
            held("a-new", 0),
            node("b-web", -500, json!({"pool": "web"}), json!({})),
            node(
                "d-human",
                -500,
                json!({"pool": "batch"}),
                json!({"karpenter.sh/do-not-disrupt": "false"}),
            ),
        ];
        let plan = plan(&open_window(&cfg, 0), &cfg, &scope, &holds(), &nodes, t(1));
        // a-new is out of scope here (no pool label): released; b-web out of
        // scope and not node-holder's: untouched; d-human has the key.
        assert_eq!(names(&plan.hold), ["c-old"]);
        assert_eq!(names(&plan.release), ["a-new"]);
        let hold = &plan.hold[0];
        assert_eq!(hold.uid.as_deref(), Some("uid-c-old"));
        assert_eq!(hold.keys, ["karpenter.sh/do-not-disrupt"]);
        assert_eq!(
            serde_json::to_value(&hold.patch).unwrap()[0],
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": "5"})
        );
        assert_eq!(plan.wake, Some(t(10)));
    }

    #[test]
    fn nodes_already_as_desired_get_nothing() {
        let cfg = cfg(Mode::Cluster);
        let scope = NodeScope::default();
        let nodes = [held("a", 0), held("b", -100)];
        let w = open_window(&cfg, 0);
        assert!(plan(&w, &cfg, &scope, &holds(), &nodes, t(1)).is_empty());
        let unheld = [node("a", 0, json!({}), json!({}))];
        let mut closed = w.clone();
        closed.tick(t(10));
        assert!(plan(&closed, &cfg, &scope, &holds(), &unheld, t(10)).is_empty());
    }

    #[test]
    fn a_closed_window_releases_every_node_node_holder_holds() {
        let cfg = cfg(Mode::Cluster);
        let scope = NodeScope::default();
        let mut human = node(
            "c-human",
            -100,
            json!({}),
            json!({"karpenter.sh/do-not-disrupt": "true"}),
        );
        human.labels.insert("x".into(), "y".into());
        let nodes = [held("b", 0), held("a", 3), human];
        let w = open_window(&cfg, 0);
        // The deadline passed but tick has not run yet: already closed.
        let plan = plan(&w, &cfg, &scope, &holds(), &nodes, t(10));
        assert!(plan.hold.is_empty());
        assert_eq!(names(&plan.release), ["a", "b"], "sorted by name");
        assert_eq!(plan.release[0].keys, ["karpenter.sh/do-not-disrupt"]);
    }

    #[test]
    fn a_human_edited_hold_is_reported_as_left() {
        let cfg = cfg(Mode::Cluster);
        let mut node = held("a", 0);
        node.annotations
            .insert("karpenter.sh/do-not-disrupt".into(), "no".into());
        let plan = plan(
            &Window::default(),
            &cfg,
            &NodeScope::default(),
            &holds(),
            &[node],
            t(20),
        );
        let release = &plan.release[0];
        assert!(release.keys.is_empty());
        assert_eq!(release.left, ["karpenter.sh/do-not-disrupt"]);
    }

    #[test]
    fn node_mode_holds_each_new_node_until_its_own_hold_ends() {
        let cfg = cfg(Mode::Node);
        let scope = NodeScope::default();
        let mut w = Window::default();
        for created in [0, 4] {
            w.observe(t(created), t(created), &cfg);
        }
        let nodes = [
            held("a", 0),
            held("b", 4),
            node("c", 5, json!({}), json!({})),
            node("old", -100, json!({}), json!({})),
        ];
        let plan = plan(&w, &cfg, &scope, &holds(), &nodes, t(10));
        assert_eq!(names(&plan.release), ["a"], "0 + 10 <= now");
        assert_eq!(
            names(&plan.hold),
            ["c"],
            "the backstop: missed by the webhook"
        );
        assert_eq!(plan.wake, Some(t(14)), "b's hold ends first");
    }

    #[test]
    fn node_mode_releases_what_a_release_consumed() {
        let cfg = cfg(Mode::Node);
        let mut w = Window::default();
        w.observe(t(0), t(0), &cfg);
        w.release_now(t(1));
        let nodes = [held("a", 0), node("b", 2, json!({}), json!({}))];
        let plan = plan(&w, &cfg, &NodeScope::default(), &holds(), &nodes, t(2));
        assert_eq!(names(&plan.release), ["a"]);
        assert_eq!(names(&plan.hold), ["b"]);
        assert_eq!(plan.wake, Some(t(12)));
    }

    #[test]
    fn a_node_leaving_the_scope_is_released_while_the_window_is_open() {
        for mode in [Mode::Cluster, Mode::Node] {
            let cfg = cfg(mode);
            let scope = NodeScope::parse("pool=batch").unwrap();
            let mut moved = held("a", 0);
            moved.labels.insert("pool".into(), "web".into());
            let plan = plan(
                &open_window(&cfg, 0),
                &cfg,
                &scope,
                &holds(),
                &[moved],
                t(1),
            );
            assert_eq!(names(&plan.release), ["a"], "{mode:?}");
            assert!(plan.hold.is_empty());
        }
    }

    #[test]
    fn the_plan_does_not_depend_on_the_order_of_the_nodes() {
        let cfg = cfg(Mode::Cluster);
        let mut nodes = vec![
            node("b", -50, json!({}), json!({})),
            node("a", -50, json!({}), json!({})),
            node("c", -50, json!({}), json!({})),
        ];
        let w = open_window(&cfg, 0);
        let first = plan(&w, &cfg, &NodeScope::default(), &holds(), &nodes, t(1));
        nodes.reverse();
        let second = plan(&w, &cfg, &NodeScope::default(), &holds(), &nodes, t(1));
        assert_eq!(first, second);
        assert_eq!(names(&first.hold), ["a", "b", "c"]);
    }
}
