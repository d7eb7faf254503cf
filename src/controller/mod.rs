//! The hold window task: on the elected leader only, it watches Node metadata,
//! drives the window record forward and converges the nodes to the plan the
//! pure core computes (hold while open, release when closed). Level-triggered:
//! every pass starts from the watched state and the record, so running it
//! again, or after a crash, changes nothing more.

mod coalesce;
mod compact;
mod converge;
mod drift;
mod error;
mod events;
mod job_pods;
mod leader;
pub mod metrics;
mod nodes;
mod observe;
pub mod patcher;
mod requests;
mod scheduled;
mod warming;
mod watches;

use crate::retry::{self, watch_backoff};
use converge::seconds;
pub use error::FailureKind;
pub use leader::{default_identity, release_once, run};
use watches::{nodes_seen, sleep_until, watch_changed, watch_record};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use foldhash::HashSet;
use futures::{StreamExt, TryStreamExt};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube_lease_manager::LeaseManager;
use tokio_util::sync::CancellationToken;

use crate::core::due::Terms;
use crate::core::holds::{Holding, Preset, is_marked};
use crate::core::node::NodeMeta;
use crate::core::plan::{Action, NodePatch, Planner};
use crate::core::window::{ManualHold, Observed, Window, WindowConfig};
use crate::state::lease;
use crate::state::record::{self, RecordStore, Settings};
use coalesce::{Coalesce, Due};
pub use events::NODE_EVENTS_PER_PASS;
use events::{EventSink, HoldEvent};
pub use metrics::WindowMetrics;
use nodes::{Feed, NodeStore, NodeWatch, list_nodes, watch_nodes};
use patcher::{PatchResult, Patcher};
use scheduled::{ScheduledWatch, watch_scheduled};

/// Everything the window task runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub window: WindowConfig,
    pub holding: Holding,
    pub namespace: String,
    pub identity: String,
    pub lease_duration: Duration,
    /// `--launch-cost`: the schedule keeps exactly the nodes due runs will
    /// use; `None`: off.
    pub schedule: Option<Terms>,
    /// `--warm-before-runs`: how long before a run whose nodes the schedule
    /// let go its placeholders ask for them; `None`: off.
    pub warm_lead: Option<Duration>,
    /// `--api-qps`: node PATCHes a second at most.
    pub qps: u32,
    /// How many nodes of one pass's patches one way get an Event each;
    /// past it, one Event on the record sums the pass up.
    pub node_events_per_pass: usize,
}

impl Config {
    /// What the record keeps of this configuration, for `status` and `release`.
    fn settings(&self) -> Settings {
        Settings {
            hold_duration: self.window.hold,
            max_hold: self.window.max_hold,
            holds: self.holding.holds.iter().map(ToString::to_string).collect(),
            node_selector: self.holding.scope.text().to_string(),
            launch_cost: self.schedule.map(|terms| terms.launch_cost),
        }
    }
}

/// What the leader last wrote of its state to the record.
#[derive(Debug, Clone, PartialEq)]
struct Saved {
    window: Window,
    kept: crate::core::kept::KeptSummary,
    last_runs: BTreeMap<String, crate::core::known::LastRun>,
}

/// The leader's state between passes.
struct WindowTask {
    client: kube::Client,
    config: Config,
    metrics: WindowMetrics,
    events: EventSink,
    store: RecordStore,
    patcher: Patcher,
    /// The window and the schedule's nodes as last saved.
    saved: Option<Saved>,
    window: Window,
    /// `--launch-cost`: the CronJobs and their pods, while leading.
    scheduled: Option<ScheduledWatch>,
    /// With Karpenter v1's hold: the NodeClaims Karpenter marked drifted,
    /// while leading.
    drift: Option<drift::DriftWatch>,
    /// `--launch-cost`: every node a known CronJob's pods ran on, while it
    /// exists (it never counts in a window, even once its pods are gone).
    explained: HashSet<String>,
    /// `--launch-cost`: the nodes the schedule keeps this pass, each until
    /// when, if known.
    kept: BTreeMap<String, crate::core::due::Kept>,
    /// CronJobs whose schedule was said to be unpredictable (once each).
    unpredictable: BTreeSet<String>,
    /// `--launch-cost`: how long a new node settles before the window
    /// counts it: the terms' settle while the cluster has CronJobs, nothing
    /// while it has none (no pod can explain a node then, so the window
    /// counts each from its creation, as without `--launch-cost`).
    settle: Duration,
    /// `--warm-before-runs`: the placeholder Jobs made.
    warming: warming::Warming,
    /// `--launch-cost`: each CronJob's last run, remembered once its nodes
    /// are gone.
    last_runs: BTreeMap<String, crate::core::known::LastRun>,
    /// A release request not handled yet.
    release_request: Option<Timestamp>,
    /// A release request handled but not yet recorded as done: some of its
    /// holds may still be on.
    release_unconfirmed: Option<Timestamp>,
    /// Whether the record says a release is under way.
    releasing: bool,
    /// A manual hold request not handled yet.
    hold_request: Option<ManualHold>,
    /// A manual hold request handled but not yet recorded as done: some
    /// nodes may still lack its hold.
    hold_unconfirmed: Option<Timestamp>,
    /// New nodes of the current window whose Event was sent.
    announced: HashSet<String>,
    failures: u32,
    /// What the releases did, node by node, when someone asked
    /// (`uninstall` prints it).
    report: Option<std::sync::Mutex<PassReport>>,
}

/// What the releases of [`release_once`] did, node by node.
#[derive(Debug, Default, Clone)]
pub struct PassReport {
    /// Nodes whose holds came off.
    pub released: Vec<String>,
    /// `node: key` of holds someone changed since node-holder placed them:
    /// left in place, only node-holder's record of them dropped.
    pub left: Vec<String>,
}

impl WindowTask {
    fn new(
        client: kube::Client,
        config: Config,
        metrics: WindowMetrics,
        events: EventSink,
    ) -> Self {
        WindowTask {
            store: RecordStore::new(client.clone(), &config.namespace),
            patcher: Patcher::new(client.clone(), config.qps),
            client,
            config,
            metrics,
            events,
            saved: None,
            window: Window::default(),
            scheduled: None,
            drift: None,
            explained: HashSet::default(),
            kept: Default::default(),
            unpredictable: BTreeSet::new(),
            settle: Duration::ZERO,
            warming: Default::default(),
            last_runs: BTreeMap::new(),
            release_request: None,
            release_unconfirmed: None,
            releasing: false,
            hold_request: None,
            hold_unconfirmed: None,
            announced: HashSet::default(),
            failures: 0,
            report: None,
        }
    }

    /// Runs the window until an error; the caller stops it on lost leadership.
    async fn lead(&mut self) -> Result<()> {
        let record = self.store.load().await?;
        self.restore(record);
        let NodeWatch {
            store: nodes,
            mut feed,
            _task,
        } = watch_nodes(
            self.client.clone(),
            self.config.holding.clone(),
            watch_backoff(),
        );
        let record_events = watch_record(self.client.clone(), &self.config.namespace);
        futures::pin_mut!(record_events);
        self.scheduled = self
            .config
            .schedule
            .map(|_| watch_scheduled(self.client.clone(), &self.config.namespace));
        let mut schedule_changes = self.scheduled.as_ref().map(|w| w.changes.clone());
        self.drift = self
            .config
            .holding
            .holds
            .includes(Preset::KarpenterV1)
            .then(|| drift::watch_drift(self.client.clone()));
        let mut drift_changes = self.drift.as_ref().map(|w| w.changes.clone());

        let mut seen = Feed::default();
        let mut next = Coalesce::default();
        let mut wake: Option<Instant> = None;
        loop {
            // No pass on a store that may miss nodes: before the first list,
            // and from a watch failure until the next complete list; nor,
            // with the schedule, before the CronJobs and their pods are listed.
            let scheduled_listed = self.scheduled.as_ref().is_none_or(ScheduledWatch::listed);
            let synced = seen.lists > 0 && !seen.broken && scheduled_listed;
            let due = next.due().or_at(wake);
            tokio::select! {
                changed = feed.changed() => {
                    changed.map_err(|_| anyhow::anyhow!("the node watch ended"))?;
                    let now_seen = *feed.borrow_and_update();
                    nodes_seen(&mut next, seen, now_seen);
                    seen = now_seen;
                }
                event = record_events.try_next() => match event {
                    Ok(Some(config_map)) => {
                        if self.requested(&config_map.metadata) {
                            next.run_now();
                        }
                    }
                    Ok(None) => bail!("the record watch ended"),
                    Err(err) => tracing::warn!(error = %err, "record watch failed; retrying"),
                },
                () = watch_changed(&mut schedule_changes) => next.change(Instant::now()),
                () = watch_changed(&mut drift_changes) => next.change(Instant::now()),
                () = sleep_until(due, synced) => {
                    next.ran();
                    wake = self.timed_pass(&nodes).await;
                }
            }
        }
    }

    /// Takes up the window where the record left it: the window, a release
    /// request not yet handled, and one handled but not recorded as done.
    /// A record whose settings are not this leader's counts as unsaved, so
    /// the first pass writes the settings `status`, `release` and `hold`
    /// read (after a restart with other flags).
    fn restore(&mut self, record: record::Record) {
        self.window = record.window.clone();
        let settings_current = record.settings.as_ref() == Some(&self.config.settings());
        self.last_runs = record.last_runs.clone();
        self.saved = (record.exists && settings_current).then_some(Saved {
            window: record.window,
            kept: record.schedule,
            last_runs: record.last_runs,
        });
        let done = record.release_done_at;
        self.release_request = record
            .release_request
            .filter(|&at| self.is_new_release(at, done));
        // A release the last leader handled but did not finish is finished
        // (and recorded as done) by this one.
        self.release_unconfirmed = record
            .release_request
            .filter(|&at| done.is_none_or(|done| done < at));
        self.releasing = record.releasing.is_some();
        // A manual hold not recorded as done is handled (again: handling it
        // twice changes nothing) and recorded.
        self.hold_request = record.pending_hold;
        self.hold_unconfirmed = self.hold_request.as_ref().map(|hold| hold.requested_at);
    }

    /// One pass, timed; returns when the next must run at the latest (a
    /// backoff after a failure).
    async fn timed_pass(&mut self, nodes: &NodeStore) -> Option<Instant> {
        let started = Instant::now();
        let outcome = self.pass(nodes).await;
        self.metrics
            .pass_duration
            .observe(started.elapsed().as_secs_f64());
        match outcome {
            Ok(wake) => wake,
            Err(err) => {
                self.failures += 1;
                let kind = error::kind(&err);
                self.metrics.pass_failed(kind);
                tracing::warn!(error = %format_args!("{err:#}"), kind = kind.label(), "hold window pass failed");
                Some(Instant::now() + self.backoff())
            }
        }
    }

    fn backoff(&self) -> Duration {
        retry::pass_backoff(self.failures)
    }

    /// One pass: the window forward, the record saved, the nodes converged;
    /// returns when the next must run at the latest.
    ///
    /// It reads the store's objects in place (shared, not copied) and builds
    /// each node's patch only when the patcher takes it, so its memory grows
    /// with the patches in flight, not with the nodes.
    async fn pass(&mut self, nodes: &NodeStore) -> Result<Option<Instant>> {
        // Leadership as the Lease says now, not as the lease manager last
        // saw it: after an API server outage another replica may lead.
        lease::ensure_leading(&self.client, &self.config.namespace, &self.config.identity).await?;
        let now = Timestamp::now();
        let snapshot = nodes.snapshot();
        self.apply_requests(now);
        let known = self.keep_for_schedules(&snapshot, now);
        self.observe(&snapshot, now);
        // The record first: a crash after holding nodes must still find the
        // window that releases them.
        self.save_record().await?;
        let mut wake = self.converge(&snapshot, now).await?;
        if let Some(known) = known {
            self.warm_for_runs(&known, &snapshot, now).await;
            let warm_wake = self.warming.wake.and_then(|at| {
                let after = Duration::try_from(at.duration_since(now)).unwrap_or_default();
                Instant::now().checked_add(after)
            });
            wake = wake.into_iter().chain(warm_wake).min();
        }
        Ok(wake)
    }

    /// Saves the window if it changed since last saved, and shows the
    /// latest deadline in the metrics.
    async fn save_record(&mut self) -> Result<()> {
        let now = Saved {
            window: self.window.clone(),
            kept: crate::core::kept::KeptSummary::of(&self.kept),
            last_runs: self.last_runs.clone(),
        };
        if self.saved.as_ref() != Some(&now) {
            self.store
                .save(
                    &now.window,
                    &now.kept,
                    &now.last_runs,
                    &self.config.settings(),
                )
                .await?;
            self.saved = Some(now);
        }
        self.metrics.deadline.set(seconds(self.window.deadline()));
        Ok(())
    }
}
