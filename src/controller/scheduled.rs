//! `--launch-cost`: the leader's watches of the cluster's CronJobs and its Jobs' pods, each kept
//! compact; what they mean is [`crate::core::known`]'s. Without the permission to list them (403)
//! the watch says so once and goes on empty: every node is then held as if nothing were scheduled.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::CronJob;
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::api::Api;
use kube::runtime::watcher;
use strum::IntoEnumIterator;
use tokio_util::task::AbortOnDropHandle;

use super::compact::{Compact, watch_compact};
use super::events::HoldEvent;
use super::job_pods::{JobPods, watch_failed, watch_job_pods};
use super::nodes::position;
use crate::core::due::{
    Keep, Kept, NodeView, Reason, Reserved, Terms, counted_at, counts_in_window, keep, why_kept,
    why_released,
};
use crate::core::holds::held_until_stamp;
use crate::core::known::{CronJobSpec, KnownWork, LastRun, PodShape, known_work};
use crate::core::node::NodeMeta;
use crate::core::patch::floor_seconds;
use crate::core::schedule::Schedules;
use crate::retry::watch_backoff;

/// Nodes a pass gives a log line and an Event of their own each way (held
/// for a run, let go); one line counts the rest, so as not to flood the log.
const NODES_SAID: usize = 20;

/// Says each of the first [`NODES_SAID`] `nodes`, then one line for the rest.
fn say_first<T>(mut nodes: impl Iterator<Item = T>, say: impl FnMut(T), rest: &str) {
    nodes.by_ref().take(NODES_SAID).for_each(say);
    let more = nodes.count();
    if more > 0 {
        tracing::info!(nodes = more, "and {more} {rest}");
    }
}

/// The watches and their stores; dropping it stops them. `changes` ticks
/// when either changes, so the leader runs a (coalesced) pass.
pub struct ScheduledWatch {
    /// Each CronJob, its schedule parsed once per change, not every pass.
    cronjobs: Compact<Arc<CronJobSpec>>,
    pods: JobPods,
    listed: [Arc<AtomicBool>; 2],
    pub changes: tokio::sync::watch::Receiver<u64>,
    /// The known work the last pass read, and from what.
    memo: std::sync::Mutex<Option<Memo>>,
    _tasks: [AbortOnDropHandle<()>; 2],
}

/// Known work and what it was read from: a pass with the same stores, nodes
/// in scope and remembered runs, before the work's earliest run, reads the
/// same (most passes follow node changes that touch none of it).
struct Memo {
    /// The watches' tick, read before the stores: a change under way makes the next pass reread.
    tick: u64,
    inputs: u64,
    from: Timestamp,
    work: Arc<KnownWork>,
}

impl Memo {
    /// Whether the work read then is what reading now would give.
    fn serves(&self, tick: u64, inputs: u64, from: Timestamp) -> bool {
        let current = self.work.same_until().is_none_or(|until| from < until);
        self.tick == tick && self.inputs == inputs && self.from <= from && current
    }
}

/// A fingerprint of the nodes in scope and the remembered runs.
fn fingerprint(in_scope: &[NodeView<'_>], remembered: &BTreeMap<String, LastRun>) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    let mut hasher = foldhash::fast::FixedState::with_seed(0x6e6f_6465).build_hasher();
    in_scope.iter().for_each(|view| view.name.hash(&mut hasher));
    remembered.hash(&mut hasher);
    hasher.finish()
}

/// Whether `name` is among the pass's views (sorted, as the node store is: no set built a pass).
fn in_scope(views: &[NodeView<'_>], name: &str) -> bool {
    views.binary_search_by(|view| view.name.cmp(name)).is_ok()
}

/// The node named `name` in the pass's (sorted) snapshot, if in scope.
fn in_scope_node<'n>(snapshot: &'n [Arc<NodeMeta>], name: &str) -> Option<&'n NodeMeta> {
    let i = position(snapshot, name).ok()?;
    Some(&*snapshot[i]).filter(|node| node.in_scope())
}

impl ScheduledWatch {
    /// Whether both lists have been read (or refused): a pass before that
    /// would release nodes a run is about to use.
    pub fn listed(&self) -> bool {
        self.listed.iter().all(|l| l.load(Ordering::Acquire))
    }

    /// The scheduled work after `from` on the nodes in scope (`views`), and
    /// whether it was read again (not served by the memo).
    fn known(
        &self,
        from: Timestamp,
        views: &[NodeView<'_>],
        remembered: &BTreeMap<String, LastRun>,
    ) -> (Arc<KnownWork>, bool) {
        let tick = *self.changes.borrow();
        let inputs = fingerprint(views, remembered);
        let mut memo = self.memo.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(memo) = memo.as_ref().filter(|m| m.serves(tick, inputs, from)) {
            return (memo.work.clone(), false);
        }
        // The old work goes before the new is read: one at a time in memory.
        *memo = None;
        let cronjobs: Vec<_> = self.cronjobs.read(|c| c.values().cloned().collect());
        let in_scope = |node: &str| in_scope(views, node);
        let work = self
            .pods
            .pods(|pods| known_work(&cronjobs, pods, in_scope, from, remembered));
        let work = Arc::new(work);
        *memo = Some(Memo {
            tick,
            inputs,
            from,
            work: work.clone(),
        });
        (work, true)
    }

    /// The placeholder pods seen: each one's Job and node (if bound).
    pub fn placeholders(&self) -> Vec<(String, Option<String>)> {
        self.pods.pods(|pods| {
            pods.filter(|pod| pod.placeholder)
                .map(|pod| (pod.job.to_string(), pod.node.map(str::to_string)))
                .collect()
        })
    }
}

pub fn watch_scheduled(client: kube::Client, namespace: &str) -> ScheduledWatch {
    let (tick, changes) = tokio::sync::watch::channel(0u64);
    let tick = Arc::new(tick);
    let mut schedules = Schedules::default();
    let cronjobs = watch_compact(
        Api::<CronJob>::all(client.clone()),
        watcher::Config::default(),
        watch_backoff(),
        tick.clone(),
        move |cronjob: &CronJob| Some(Arc::new(spec(cronjob, &mut schedules))),
        |err, listed| watch_failed(err, "CronJob", listed),
    );
    let pods = watch_job_pods(Api::<Pod>::all(client), namespace, watch_backoff(), tick);
    ScheduledWatch {
        cronjobs: cronjobs.store,
        pods: pods.store,
        listed: [cronjobs.listed, pods.listed],
        changes,
        memo: std::sync::Mutex::new(None),
        _tasks: [cronjobs.task, pods.task],
    }
}

/// The CronJob as the hold reads it: its name, schedule, zone and
/// `suspend`, and of its pod template what a placeholder copies.
fn spec(cronjob: &CronJob, schedules: &mut Schedules) -> CronJobSpec {
    let namespace = cronjob.metadata.namespace.as_deref().unwrap_or_default();
    let name = cronjob.metadata.name.as_deref().unwrap_or_default();
    let spec = &cronjob.spec;
    CronJobSpec {
        key: format!("{namespace}/{name}"),
        uid: cronjob.metadata.uid.clone(),
        schedule: schedules.parse(&spec.schedule, spec.time_zone.as_deref()),
        suspended: spec.suspend.unwrap_or(false),
        shape: shape(cronjob).map(Arc::new),
    }
}

/// What the template says the run's pods ask of a node ([`PodShape`]).
fn shape(cronjob: &CronJob) -> Option<PodShape> {
    let job = cronjob.spec.job_template.spec.as_ref()?;
    let pod = job.template.spec.as_ref()?;
    let requests = |c: &Container| {
        let requests = c.resources.as_ref().and_then(|r| r.requests.clone());
        (c.name.clone(), requests.unwrap_or_default())
    };
    Some(PodShape {
        containers: pod.containers.iter().map(requests).collect(),
        node_selector: pod.node_selector.clone(),
        tolerations: pod.tolerations.clone(),
        affinity: pod.affinity.clone(),
    })
}

impl super::WindowTask {
    /// `--launch-cost`: the nodes the schedule keeps this pass and those it
    /// explains (which no window counts); returns the known work for the warm.
    pub(super) fn keep_for_schedules(
        &mut self,
        snapshot: &[Arc<NodeMeta>],
        now: Timestamp,
    ) -> Option<Arc<KnownWork>> {
        let (Some(terms), Some(watch)) = (self.config.schedule, &self.scheduled) else {
            return None;
        };
        let any = watch.cronjobs.read(|cronjobs| !cronjobs.is_empty());
        self.settle = if any { terms.settle } else { Duration::ZERO };
        let terms = self.terms()?;
        let views: Vec<NodeView<'_>> = snapshot
            .iter()
            .filter(|node| node.in_scope())
            .map(|node| NodeView {
                name: node.name(),
                created: node.created(),
                marked: crate::core::holds::is_marked(&**node),
            })
            .collect();
        debug_assert!(views.is_sorted_by(|a, b| a.name < b.name));
        let from = now.saturating_sub(terms.grace).unwrap_or(now);
        let (known, read) = watch.known(from, &views, &self.last_runs);
        // The same work on the same nodes remembers nothing new.
        if read {
            self.last_runs.clone_from(&known.last);
            self.remember_explained(&known, &views);
        }
        let kept = keep(&views, &known, &self.explained, now, &terms);
        self.say_what_changed(&kept, snapshot, &terms);
        self.say_unpredictable(&known);
        self.show_kept(&kept, known.unpredictable.len());
        self.kept = kept
            .iter()
            .map(|(n, k)| (n.to_string(), Kept::from(k)))
            .collect();
        Some(known)
    }

    /// Adds the nodes the known CronJobs' pods explain now; forgets those
    /// gone from scope and those other work ran on.
    fn remember_explained(&mut self, known: &KnownWork, views: &[NodeView<'_>]) {
        self.explained.extend(known.explained.iter().cloned());
        self.explained
            .retain(|node| in_scope(views, node) && !known.other_work.contains(node));
    }

    /// A warning and an Event, once per CronJob, for each unpredictable schedule.
    fn say_unpredictable(&mut self, known: &KnownWork) {
        for bad in &known.unpredictable {
            if self.unpredictable.insert(bad.cronjob.clone()) {
                let (cronjob, why) = (&bad.cronjob, &bad.why);
                tracing::warn!(%cronjob, "{why}: its runs keep no node; the window holds them");
                let event = HoldEvent::unpredictable(cronjob, bad.uid.as_deref(), why);
                self.events.send(event);
            }
        }
    }

    /// The schedule's gauges after a pass.
    fn show_kept(&self, kept: &BTreeMap<&str, Keep<'_>>, unpredictable: usize) {
        let count = |reason: Reason| {
            let of_reason = kept.values().filter(|k| Kept::from(*k).reason == reason);
            (reason.into(), of_reason.count())
        };
        let schedule = &self.metrics.schedule;
        schedule.show(Reason::iter().map(count), unpredictable);
    }

    /// The log lines and Events of the nodes the schedule newly keeps, and of those it let go.
    fn say_what_changed(
        &self,
        kept: &BTreeMap<&str, Keep<'_>>,
        snapshot: &[Arc<NodeMeta>],
        terms: &Terms,
    ) {
        // New since the last pass, and not stamped with this end already
        // (a new leader's first pass: the node says it was announced).
        let newly_kept = kept.iter().filter_map(|(name, keep)| {
            let Keep::ForRun(reserved) = keep else {
                return None;
            };
            let new = self.kept.get(*name).and_then(|k| k.until) != Some(reserved.until);
            let node = new.then(|| in_scope_node(snapshot, name)).flatten()?;
            let stamped = held_until_stamp(node) == Some(floor_seconds(reserved.until));
            (!stamped).then_some((node, reserved))
        });
        let say_kept = |(node, reserved): (&NodeMeta, &Reserved<'_>)| {
            let why = why_kept(reserved, terms);
            tracing::info!(
                node = %node.name(),
                until = %reserved.until,
                "held for a scheduled run: {why}"
            );
            self.events
                .send(HoldEvent::kept_for_run(node, reserved.until, why));
        };
        say_first(newly_kept, say_kept, "more nodes held for scheduled runs");
        let ended = self.kept.keys().filter(|n| !kept.contains_key(n.as_str()));
        let say_ended = |node: &NodeMeta| {
            let why = why_released(terms);
            tracing::info!(node = %node.name(), "schedule hold ends: {why}");
            self.events.send(HoldEvent::nothing_due(node, why));
        };
        let ended = ended.filter_map(|name| in_scope_node(snapshot, name));
        say_first(ended, say_ended, "more nodes whose schedule hold ends");
    }

    /// When the window counts `node` as created: with `--launch-cost`, once it settled.
    pub(super) fn counted_at(&self, node: &NodeMeta) -> Timestamp {
        let created = node.created();
        self.terms()
            .map_or(created, |terms| counted_at(created, &terms))
    }

    /// `--launch-cost`'s terms, with the settle this pass uses.
    fn terms(&self) -> Option<Terms> {
        let terms = self.config.schedule?;
        Some(Terms {
            settle: self.settle,
            ..terms
        })
    }

    /// Whether the window counts `node`: not if the schedule explains it or it still settles.
    pub(super) fn counts_in_window(&self, node: &NodeMeta, now: Timestamp) -> bool {
        self.terms().is_none_or(|terms| {
            counts_in_window(node.name(), node.created(), &self.explained, now, &terms)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::known::Run;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn view(name: &str) -> NodeView<'_> {
        NodeView {
            name,
            created: at("2026-04-25T03:00:00Z"),
            marked: false,
        }
    }

    #[test]
    fn nodes_are_found_by_name_and_the_fingerprint_sees_any_change() {
        let views = [view("a"), view("b"), view("c")];
        assert!(in_scope(&views, "a") && in_scope(&views, "c"));
        assert!(!in_scope(&views, "bb"));
        let none = BTreeMap::new();
        assert_eq!(
            fingerprint(&views, &none),
            fingerprint(&views.clone(), &none)
        );
        let other = [view("a"), view("bb"), view("c")];
        assert_ne!(fingerprint(&views, &none), fingerprint(&other, &none));
        let fewer = [view("a"), view("b")];
        assert_ne!(fingerprint(&views, &none), fingerprint(&fewer, &none));
        let last = LastRun {
            nodes: 2,
            pods: 2,
            minute: 1,
        };
        let remembered = BTreeMap::from([("team/report".to_string(), last)]);
        assert_ne!(fingerprint(&views, &none), fingerprint(&views, &remembered));
    }

    #[test]
    fn the_memo_serves_the_same_inputs_until_the_earliest_run() {
        let run = Run {
            cronjob: "team/report".into(),
            uid: None,
            at: at("2026-04-25T03:10:00Z"),
            nodes: 1,
            pods: 1,
            on: Vec::new(),
            shape: None,
        };
        let work = KnownWork {
            runs: vec![run],
            ..KnownWork::default()
        };
        let memo = Memo {
            tick: 7,
            inputs: 42,
            from: at("2026-04-25T03:01:00Z"),
            work: Arc::new(work),
        };
        assert!(memo.serves(7, 42, at("2026-04-25T03:09:59Z")));
        assert!(
            !memo.serves(7, 42, at("2026-04-25T03:10:00Z")),
            "the run began"
        );
        assert!(
            !memo.serves(8, 42, at("2026-04-25T03:02:00Z")),
            "a store changed"
        );
        assert!(
            !memo.serves(7, 43, at("2026-04-25T03:02:00Z")),
            "the nodes changed"
        );
        assert!(!memo.serves(7, 42, at("2026-04-25T03:00:00Z")), "earlier");
    }
}
