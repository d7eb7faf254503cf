//! The desired state of every node, as patches: which nodes to hold and which to release, given the
//! hold window and the nodes as last read. Pure and deterministic, so the background task can run
//! it on every change and patch only the nodes whose state changes.
//!
//! It reads each stored [`NodeMeta`] in place and builds one node's patch at
//! a time, so a pass over thousands of nodes streams its patches.

use std::collections::{BTreeMap, BTreeSet};

use foldhash::HashSet;
use jiff::Timestamp;
use json_patch::Patch;

use super::due::Kept;
use super::holds::{Holds, held_until_stamp, is_marked};
use super::node::{NodeFields, NodeMeta};
use super::patch::{floor_seconds, hold_existing, release_holds, with_held_until};
use super::window::Window;

/// One node's patch and what it changes, for logs and Events.
#[derive(Debug, Clone, PartialEq)]
pub struct NodePatch {
    pub name: String,
    pub uid: Option<String>,
    pub patch: Patch,
    /// Hold keys the patch adds (hold) or removes (release).
    pub keys: Vec<String>,
    /// Release only: keys node-holder added that someone changed since;
    /// left in place, only node-holder's listing of them is dropped.
    pub left: Vec<String>,
    /// Hold only: until when the node is held, as far as known now (`None`
    /// for a busy node the schedule keeps until its run ends).
    pub until: Option<Timestamp>,
    /// Release only: Karpenter marked the node drifted, and only a manual
    /// hold holds a drifted node.
    pub drifted: bool,
}

/// Which way a node's patch goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
pub enum Action {
    Hold,
    Release,
    /// A held node's `held-until` rewritten, its holds untouched.
    Stamp,
}

/// The `held-until` a node held until `until` should carry, if its own is not true now: none (or
/// unreadable), past while the hold goes on, or later than the hold's end. A stamp between now and
/// the end stays as the window moves later (it is still "held at least until"), so a node is not
/// rewritten on every move of the window. `None` also when the hold ends within the second.
pub fn needs_stamp(node: &impl NodeFields, until: Timestamp, now: Timestamp) -> Option<Timestamp> {
    let target = floor_seconds(until);
    if target <= now {
        return None;
    }
    held_until_stamp(node)
        .is_none_or(|stamp| stamp <= now || stamp > target)
        .then_some(target)
}

/// The desired state, one node at a time: while the window (or the manual
/// hold) is open every node in scope carries every hold, else none carries
/// node-holder's; nor does a node out of scope. Nodes as desired get no patch.
#[derive(Debug, Clone)]
pub struct Planner<'a> {
    pub window: &'a Window,
    pub holds: &'a Holds,
    pub now: Timestamp,
    /// `--launch-cost`: the nodes the schedule keeps ([`super::due::keep`]),
    /// held whatever the window says.
    pub kept: Option<&'a BTreeMap<String, Kept>>,
    /// `--launch-cost`: the nodes the schedule explains. For them the schedule decides alone: the
    /// window does not hold one it lets go (only a manual hold does).
    pub explained: Option<&'a HashSet<String>>,
    /// The nodes whose NodeClaim Karpenter marked `Drifted`: a change the operator made, not churn,
    /// so only a manual hold holds them (docs/architecture.md).
    pub drifted: &'a BTreeSet<String>,
}

impl Planner<'_> {
    /// Whether the node should carry the holds now, and until when its
    /// window (or the manual hold) holds it.
    fn wanted(&self, node: &NodeMeta) -> (bool, Option<Timestamp>) {
        if !node.in_scope() {
            return (false, None);
        }
        let manual = self.window.manual_held_until(self.now);
        if self.drifted.contains(node.name()) {
            return (manual.is_some(), manual);
        }
        let until = self.window.held_until(self.now);
        match self.kept.and_then(|kept| kept.get(node.name())) {
            // Held at least until the later end known (`None` < `Some`).
            Some(scheduled) => (true, until.max(scheduled.until)),
            None if self.explained.is_some_and(|e| e.contains(node.name())) => {
                (manual.is_some(), manual)
            }
            None => (until.is_some(), until),
        }
    }

    /// The patch that brings this node to its desired state; `None` when it is already there.
    pub fn node(&self, node: &NodeMeta) -> Option<(Action, NodePatch)> {
        let node_patch = |patch: Patch, keys: Vec<String>, left: Vec<String>, until| NodePatch {
            name: node.name().to_string(),
            uid: node.uid().map(str::to_string),
            patch,
            keys,
            left,
            until,
            drifted: false,
        };
        let (wanted, until) = self.wanted(node);
        if wanted {
            let (patch, added) = hold_existing(node, self.holds);
            let action = if patch.0.is_empty() {
                Action::Stamp
            } else {
                Action::Hold
            };
            // Only a node marked once patched is stamped.
            let marked_after = is_marked(node) || action == Action::Hold;
            let stamp = until.filter(|_| marked_after);
            let patch = match stamp.and_then(|until| needs_stamp(node, until, self.now)) {
                Some(stamp) => with_held_until(node, patch, stamp),
                None if action == Action::Stamp => return None,
                None => patch,
            };
            let keys = added.into_iter().map(|h| h.key).collect();
            Some((action, node_patch(patch, keys, Vec::new(), until)))
        } else {
            let release = release_holds(node, self.holds);
            (!release.patch.0.is_empty()).then(|| {
                let mut patch = node_patch(release.patch, release.removed, release.left, None);
                patch.drifted = self.drifted.contains(node.name());
                (Action::Release, patch)
            })
        }
    }

    /// When this node's plan changes by itself: when the schedule stops keeping it, or when its
    /// `held-until` passes before the hold ends (it is rewritten then).
    fn node_wake(&self, node: &NodeMeta) -> Option<Timestamp> {
        let scheduled = self.kept.and_then(|kept| kept.get(node.name())?.until);
        let (wanted, until) = self.wanted(node);
        let stamp = until.filter(|_| wanted).and_then(|until| {
            held_until_stamp(node).filter(|&stamp| {
                is_marked(node) && self.now < stamp && stamp < floor_seconds(until)
            })
        });
        scheduled.into_iter().chain(stamp).min()
    }

    /// When the plan changes by itself (a hold ends), absent node changes:
    /// the window's deadline or the first `held-until` to pass.
    pub fn wake<'m>(&self, nodes: impl IntoIterator<Item = &'m NodeMeta>) -> Option<Timestamp> {
        nodes
            .into_iter()
            .filter_map(|node| self.node_wake(node))
            .chain(self.window.next_wake())
            .min()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{Value, json};

    use super::*;
    use crate::core::holds::{HELD_UNTIL_ANNOTATION, Preset};
    use crate::core::node::labels;
    use crate::core::selector::NodeScope;
    use crate::core::window::WindowConfig;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    /// The patches that bring the nodes to the desired state, by node name.
    #[derive(Debug, Clone, Default, PartialEq)]
    struct Plan {
        hold: Vec<NodePatch>,
        release: Vec<NodePatch>,
        stamp: Vec<NodePatch>,
        /// See [`Planner::wake`].
        wake: Option<Timestamp>,
    }

    impl Plan {
        fn is_empty(&self) -> bool {
            self.hold.is_empty() && self.release.is_empty() && self.stamp.is_empty()
        }
    }

    /// Every node's patch at once, sorted by name, as a test wants to see it
    /// (the leader streams them one by one instead).
    fn plan_all(planner: &Planner<'_>, nodes: &[NodeMeta]) -> Plan {
        let mut nodes: Vec<&NodeMeta> = nodes.iter().collect();
        nodes.sort_by(|a, b| a.name().cmp(b.name()));
        let mut plan = Plan {
            wake: planner.wake(nodes.iter().copied()),
            ..Plan::default()
        };
        for (action, patch) in nodes.into_iter().filter_map(|meta| planner.node(meta)) {
            match action {
                Action::Hold => plan.hold.push(patch),
                Action::Release => plan.release.push(patch),
                Action::Stamp => plan.stamp.push(patch),
            }
        }
        plan
    }

    fn t(m: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + m * 60).unwrap()
    }

    fn cfg() -> WindowConfig {
        WindowConfig {
            hold: Duration::from_secs(10 * 60),
            max_hold: Some(Duration::from_secs(30 * 60)),
        }
    }

    fn holds() -> Holds {
        Holds::new(&[Preset::KarpenterV1], &[]).unwrap()
    }

    fn node(name: &str, created: i64, labels: Value, annotations: Value) -> ObjectMeta {
        let meta: ObjectMeta = serde_json::from_value(json!({
            "name": name, "uid": format!("uid-{name}"), "resourceVersion": "5",
            "creationTimestamp": t(created).to_string(),
            "labels": labels, "annotations": annotations,
        }))
        .unwrap();
        meta
    }

    /// A node as the webhook (or an earlier plan) left it.
    fn held(name: &str, created: i64) -> ObjectMeta {
        node(
            name,
            created,
            json!({"node-holder.dev/held": "true"}),
            json!({"karpenter.sh/do-not-disrupt": "true",
                "node-holder.dev/hold-keys": "karpenter.sh/do-not-disrupt"}),
        )
    }

    /// `meta` with `node-holder.dev/held-until` set to `at`.
    fn stamped(mut meta: ObjectMeta, at: Timestamp) -> ObjectMeta {
        let annotations = meta.annotations.get_or_insert_default();
        annotations.insert(HELD_UNTIL_ANNOTATION.into(), at.to_string());
        meta
    }

    /// A manual hold from t(1) to t(60).
    fn hold_by_hand(window: &mut Window) {
        let manual = crate::core::window::ManualHold {
            requested_at: t(1),
            until: t(60),
            by: "ops".into(),
            reason: "rollout".into(),
        };
        window.hold_manually(manual, t(1));
    }

    fn names(patches: &[NodePatch]) -> Vec<&str> {
        patches.iter().map(|p| p.name.as_str()).collect()
    }

    fn open_window(cfg: &WindowConfig, created: i64) -> Window {
        let mut w = Window::default();
        w.observe(t(created), t(created), cfg);
        w
    }

    fn plan(
        window: &Window,
        scope: &NodeScope,
        holds: &Holds,
        nodes: &[ObjectMeta],
        now: Timestamp,
    ) -> Plan {
        let nodes = stored(nodes, scope);
        let planner = Planner {
            window,
            holds,
            now,
            kept: None,
            explained: None,
            drifted: &BTreeSet::new(),
        };
        plan_all(&planner, &nodes)
    }

    /// The nodes as the leader stores them, whole.
    fn stored(nodes: &[ObjectMeta], scope: &NodeScope) -> Vec<NodeMeta> {
        nodes
            .iter()
            .map(|meta| {
                let in_scope = scope.matches(labels(meta));
                NodeMeta::read(meta, in_scope, |_| true, |_| true).unwrap()
            })
            .collect()
    }

    /// The store keeps a map that had only others' keys as an empty map: it
    /// still exists on the node, so the hold is added to it, never as a whole
    /// new map (that would wipe the others' keys).
    #[test]
    fn a_trimmed_empty_map_is_added_to_not_replaced() {
        let cfg = cfg();
        let trimmed = node("a", -50, json!({}), json!({}));
        let absent = ObjectMeta {
            labels: None,
            annotations: None,
            ..trimmed.clone()
        };
        let w = open_window(&cfg, 0);
        let ops = |meta: ObjectMeta| {
            let plan = plan(&w, &NodeScope::default(), &holds(), &[meta], t(1));
            let patch = serde_json::to_value(&plan.hold[0].patch).unwrap();
            let paths: Vec<String> = patch
                .as_array()
                .unwrap()
                .iter()
                .map(|op| op["path"].as_str().unwrap().to_string())
                .collect();
            paths
        };
        assert_eq!(
            ops(trimmed),
            [
                "/metadata/resourceVersion",
                "/metadata/annotations/karpenter.sh~1do-not-disrupt",
                "/metadata/annotations/node-holder.dev~1hold-keys",
                "/metadata/labels/node-holder.dev~1held",
                "/metadata/annotations/node-holder.dev~1held-until",
            ]
        );
        // The stamp goes into the map the hold patch adds first.
        assert_eq!(
            ops(absent),
            [
                "/metadata/resourceVersion",
                "/metadata/annotations",
                "/metadata/labels",
                "/metadata/annotations/node-holder.dev~1held-until",
            ]
        );
    }

    #[test]
    fn an_open_window_holds_every_node_in_scope_that_lacks_a_hold() {
        let cfg = cfg();
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
        let plan = plan(&open_window(&cfg, 0), &scope, &holds(), &nodes, t(1));
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

    /// `held-until` is written when a node is first held, left alone while
    /// it is true (before the hold's end, not yet past) however the window
    /// moves, rewritten when it passes while the hold goes on or when the
    /// end moved before it, and the plan wakes when the first one passes.
    #[test]
    fn held_until_is_written_once_and_again_only_when_it_would_be_false() {
        let cfg = cfg();
        let scope = NodeScope::default();
        let mut w = open_window(&cfg, 0);
        w.observe(t(4), t(4), &cfg); // the deadline moves to t(14)
        let nodes = [
            held("new", 4),
            stamped(held("true-before-the-move", -20), t(10)),
            stamped(held("past", -30), t(2) - jiff::SignedDuration::from_secs(1)),
            stamped(held("too-late", -30), t(20)),
            stamped(held("garbled", -30), t(11)),
        ];
        let mut garbled = nodes[4].clone();
        garbled
            .annotations
            .as_mut()
            .unwrap()
            .insert(HELD_UNTIL_ANNOTATION.into(), "soon".into());
        let nodes = [&nodes[..4], &[garbled]].concat();
        let plan = plan(&w, &scope, &holds(), &nodes, t(2));
        assert!(plan.hold.is_empty() && plan.release.is_empty());
        assert_eq!(names(&plan.stamp), ["garbled", "new", "past", "too-late"]);
        for patch in &plan.stamp {
            assert_eq!(
                serde_json::to_value(&patch.patch).unwrap(),
                json!([
                    {"op": "test", "path": "/metadata/labels/node-holder.dev~1held", "value": "true"},
                    {"op": "add", "path": "/metadata/annotations/node-holder.dev~1held-until",
                     "value": t(14).to_string()},
                ]),
                "{}",
                patch.name
            );
        }
        // The first stamp to pass before the deadline wakes the plan.
        assert_eq!(plan.wake, Some(t(10)));

        // Released: the stamp goes with the holds.
        let mut closed = w.clone();
        closed.tick(t(14));
        let plan = plan_all_at(&closed, &nodes[1..2], t(14));
        let release = serde_json::to_value(&plan.release[0].patch).unwrap();
        assert!(
            release.as_array().unwrap().iter().any(|op| op
                == &json!({"op": "remove", "path": "/metadata/annotations/node-holder.dev~1held-until"})),
            "{release}"
        );
        // A node someone else holds (no marker) is never stamped.
        let theirs = node(
            "theirs",
            0,
            json!({}),
            json!({"karpenter.sh/do-not-disrupt": "true"}),
        );
        assert!(plan_all_at(&w, &[theirs], t(2)).is_empty());
    }

    fn plan_all_at(w: &Window, nodes: &[ObjectMeta], now: Timestamp) -> Plan {
        plan(w, &NodeScope::default(), &holds(), nodes, now)
    }

    #[test]
    fn nodes_already_as_desired_get_nothing() {
        let cfg = cfg();
        let scope = NodeScope::default();
        let nodes = [stamped(held("a", 0), t(10)), stamped(held("b", -100), t(5))];
        let w = open_window(&cfg, 0);
        assert!(plan(&w, &scope, &holds(), &nodes, t(1)).is_empty());
        let unheld = [node("a", 0, json!({}), json!({}))];
        let mut closed = w.clone();
        closed.tick(t(10));
        assert!(plan(&closed, &scope, &holds(), &unheld, t(10)).is_empty());
    }

    #[test]
    fn a_closed_window_releases_every_node_node_holder_holds() {
        let cfg = cfg();
        let scope = NodeScope::default();
        let mut human = node(
            "c-human",
            -100,
            json!({}),
            json!({"karpenter.sh/do-not-disrupt": "true"}),
        );
        human
            .labels
            .get_or_insert_default()
            .insert("x".into(), "y".into());
        let nodes = [held("b", 0), held("a", 3), human];
        let w = open_window(&cfg, 0);
        // The deadline passed but tick has not run yet: already closed.
        let plan = plan(&w, &scope, &holds(), &nodes, t(10));
        assert!(plan.hold.is_empty());
        assert_eq!(names(&plan.release), ["a", "b"], "sorted by name");
        assert_eq!(plan.release[0].keys, ["karpenter.sh/do-not-disrupt"]);
    }

    #[test]
    fn a_human_edited_hold_is_reported_as_left() {
        let mut node = held("a", 0);
        node.annotations
            .get_or_insert_default()
            .insert("karpenter.sh/do-not-disrupt".into(), "no".into());
        let plan = plan(
            &Window::default(),
            &NodeScope::default(),
            &holds(),
            &[node],
            t(20),
        );
        let release = &plan.release[0];
        assert!(release.keys.is_empty());
        assert_eq!(release.left, ["karpenter.sh/do-not-disrupt"]);
    }

    /// `--launch-cost`: with no window open, the nodes the schedule keeps
    /// are held (a busy one with no end, a reserved one until its run) and
    /// the others released; the plan wakes when a reservation ends.
    #[test]
    fn the_nodes_the_schedule_keeps_are_held_and_the_rest_released() {
        let window = Window::default();
        let nodes = stored(
            &[held("busy", -30), held("due", -30), held("idle", -30)],
            &NodeScope::default(),
        );
        let kept_until = |until| Kept {
            reason: crate::core::due::Reason::Run,
            until,
            cronjob: None,
            run_at: None,
        };
        let kept = BTreeMap::from([
            ("busy".to_string(), kept_until(None)),
            ("due".to_string(), kept_until(Some(t(4)))),
        ]);
        let planner = Planner {
            window: &window,
            holds: &holds(),
            now: t(0),
            kept: Some(&kept),
            explained: None,
            drifted: &BTreeSet::new(),
        };
        let plan = plan_all(&planner, &nodes);
        assert_eq!(names(&plan.release), ["idle"]);
        assert_eq!(names(&plan.stamp), ["due"], "stamped with its run's time");
        assert_eq!(plan.stamp[0].until, Some(t(4)));
        assert_eq!(plan.wake, Some(t(4)));
    }

    /// `--launch-cost`: a node only known CronJobs' pods ran on is not held
    /// by the open window when the schedule does not keep it (the
    /// window another workload opened); a node of other work still is, and
    /// a manual hold holds both.
    #[test]
    fn the_schedule_alone_decides_for_the_nodes_it_explains() {
        let cfg = cfg();
        let mut window = open_window(&cfg, 0);
        let nodes = stored(
            &[held("cron-idle", -30), held("service", -30)],
            &NodeScope::default(),
        );
        let kept = BTreeMap::new();
        let explained = HashSet::from_iter(["cron-idle".to_string()]);
        let plan_at = |window: &Window| {
            let planner = Planner {
                window,
                holds: &holds(),
                now: t(1),
                kept: Some(&kept),
                explained: Some(&explained),
                drifted: &BTreeSet::new(),
            };
            plan_all(&planner, &nodes)
        };
        let plan = plan_at(&window);
        assert_eq!(names(&plan.release), ["cron-idle"]);
        hold_by_hand(&mut window);
        assert!(
            plan_at(&window).release.is_empty(),
            "the manual hold holds all"
        );
    }

    /// A drifted node is released while its window is open, even the one
    /// the schedule keeps, and says why; a new node (a drift replacement)
    /// is held; a manual hold holds the drifted node too.
    #[test]
    fn the_window_and_the_schedule_do_not_hold_a_drifted_node_a_manual_hold_does() {
        let cfg = cfg();
        let mut window = open_window(&cfg, 0);
        let nodes = stored(
            &[
                held("drifted", -30),
                held("kept-drifted", -30),
                node("replacement", 0, json!({}), json!({})),
            ],
            &NodeScope::default(),
        );
        let kept = BTreeMap::from([(
            "kept-drifted".to_string(),
            Kept {
                reason: crate::core::due::Reason::Run,
                until: Some(t(5)),
                cronjob: None,
                run_at: None,
            },
        )]);
        let drifted = BTreeSet::from(["drifted".to_string(), "kept-drifted".to_string()]);
        let plan_at = |window: &Window| {
            let planner = Planner {
                window,
                holds: &holds(),
                now: t(1),
                kept: Some(&kept),
                explained: None,
                drifted: &drifted,
            };
            plan_all(&planner, &nodes)
        };
        let plan = plan_at(&window);
        assert_eq!(names(&plan.release), ["drifted", "kept-drifted"]);
        assert!(plan.release.iter().all(|p| p.drifted), "{plan:?}");
        assert_eq!(names(&plan.hold), ["replacement"]);
        hold_by_hand(&mut window);
        let plan = plan_at(&window);
        assert!(plan.release.is_empty(), "{plan:?}");
        assert_eq!(names(&plan.stamp), ["drifted", "kept-drifted"]);
    }

    #[test]
    fn a_node_leaving_the_scope_is_released_while_the_window_is_open() {
        let cfg = cfg();
        let scope = NodeScope::parse("pool=batch").unwrap();
        let mut moved = held("a", 0);
        moved
            .labels
            .get_or_insert_default()
            .insert("pool".into(), "web".into());
        let plan = plan(&open_window(&cfg, 0), &scope, &holds(), &[moved], t(1));
        assert_eq!(names(&plan.release), ["a"]);
        assert!(plan.hold.is_empty());
    }

    #[test]
    fn the_plan_does_not_depend_on_the_order_of_the_nodes() {
        let cfg = cfg();
        let mut nodes = vec![
            node("b", -50, json!({}), json!({})),
            node("a", -50, json!({}), json!({})),
            node("c", -50, json!({}), json!({})),
        ];
        let w = open_window(&cfg, 0);
        let first = plan(&w, &NodeScope::default(), &holds(), &nodes, t(1));
        nodes.reverse();
        let second = plan(&w, &NodeScope::default(), &holds(), &nodes, t(1));
        assert_eq!(first, second);
        assert_eq!(names(&first.hold), ["a", "b", "c"]);
    }
}
