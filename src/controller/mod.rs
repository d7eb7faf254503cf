//! The hold window task: on the elected leader only, it watches Node metadata,
//! drives the window record forward and converges the nodes to the core's
//! plan. Level-triggered: every pass starts from the watched state and the
//! record, so running it again, or after a crash, changes nothing more.

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
use converge::{instant_at, seconds};
pub use error::FailureKind;
pub use leader::{default_identity, release_once, run};
use watches::{sleep_until, watch_changed, watch_record};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use foldhash::HashSet;
use futures::{StreamExt, TryStreamExt};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use tokio_util::sync::CancellationToken;

use crate::core::due::Terms;
use crate::core::holds::{Holding, Preset, is_marked};
use crate::core::node::NodeMeta;
use crate::core::plan::{Action, NodePatch, Planner};
use crate::core::window::{ManualHold, Observed, Window, WindowConfig};
use crate::state::lease;
use crate::state::record::{self, RecordStore, Settings};
use coalesce::{Coalesce, Due};
use events::NODE_EVENTS_PER_PASS;
use events::{EventSink, HoldEvent};
pub use metrics::WindowMetrics;
use nodes::{Feed, NodeStore, list_nodes, watch_nodes};
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
    /// `--launch-cost`; `None`: off.
    pub schedule: Option<Terms>,
    /// `--warm-before-runs`; `None`: off.
    pub warm_lead: Option<Duration>,
    /// `--api-qps`: node PATCHes a second at most.
    pub qps: u32,
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
    client: Client,
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
    /// With Karpenter v1's hold: the NodeClaims marked drifted, while leading.
    drift: Option<drift::DriftWatch>,
    /// `--launch-cost`: every node a known CronJob's pods ran on, while it
    /// exists (never counted in a window, even once its pods are gone).
    explained: HashSet<String>,
    /// `--launch-cost`: the nodes the schedule keeps this pass, and until when.
    kept: BTreeMap<String, crate::core::due::Kept>,
    /// CronJobs whose schedule was said to be unpredictable (once each).
    unpredictable: BTreeSet<String>,
    /// `--launch-cost`: the terms' settle while the cluster has CronJobs;
    /// zero while it has none (no pod can explain a node then).
    settle: Duration,
    warming: warming::Warming,
    /// `--launch-cost`: each CronJob's last run, kept once its nodes are gone.
    last_runs: BTreeMap<String, crate::core::known::LastRun>,
    release_request: Option<Timestamp>,
    /// A release request handled but not recorded as done: some of its holds may still be on.
    release_unconfirmed: Option<Timestamp>,
    /// Whether the record says a release is under way.
    releasing: bool,
    hold_request: Option<ManualHold>,
    /// A manual hold request handled but not recorded as done: some nodes may still lack its hold.
    hold_unconfirmed: Option<Timestamp>,
    /// New nodes of the current window whose Event was sent.
    announced: HashSet<String>,
    failures: u32,
    /// What the releases did, node by node, for `uninstall` to print.
    report: Option<std::sync::Mutex<PassReport>>,
}

/// What the releases of [`release_once`] did, node by node.
#[derive(Debug, Default, Clone)]
pub struct PassReport {
    /// Nodes whose holds came off.
    pub released: Vec<String>,
    /// `node: key` of holds someone else changed: left in place.
    pub left: Vec<String>,
}

impl WindowTask {
    fn new(client: Client, config: Config, metrics: WindowMetrics, events: EventSink) -> Self {
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
        let (nodes, mut feed, _watch) =
            watch_nodes(self.client.clone(), self.config.holding.clone());
        let record_events = watch_record(self.client.clone(), &self.config.namespace);
        futures::pin_mut!(record_events);
        let (client, namespace) = (&self.client, &self.config.namespace);
        let launch_cost = self.config.schedule.is_some();
        self.scheduled = launch_cost.then(|| watch_scheduled(client.clone(), namespace));
        let mut schedule_changes = self.scheduled.as_ref().map(|w| w.changes.clone());
        let karpenter_v1 = self.config.holding.holds.includes(Preset::KarpenterV1);
        self.drift = karpenter_v1.then(|| drift::watch_drift(client.clone()));
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
                    // A (re)list runs a pass at once; changes, coalesced.
                    if now_seen.lists > seen.lists {
                        next.run_now();
                    } else if now_seen.changes > seen.changes {
                        next.change(Instant::now());
                    }
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

    /// Takes up where the record left off; a record with other settings counts
    /// as unsaved, so the first pass writes those `status` and `hold` read.
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
        // A release the last leader left unfinished is finished (and recorded as done) by this one.
        self.release_unconfirmed = record
            .release_request
            .filter(|&at| done.is_none_or(|done| done < at));
        self.releasing = record.releasing.is_some();
        // A manual hold not recorded as done is handled again (that changes nothing) and recorded.
        self.hold_request = record.pending_hold;
        self.hold_unconfirmed = self.hold_request.as_ref().map(|hold| hold.requested_at);
    }

    /// One pass, timed; returns when the next must run at the latest.
    async fn timed_pass(&mut self, nodes: &NodeStore) -> Option<Instant> {
        let started = Instant::now();
        let outcome = self.pass(nodes).await;
        let elapsed = started.elapsed().as_secs_f64();
        self.metrics.pass_duration.observe(elapsed);
        outcome.unwrap_or_else(|err| {
            let kind = error::kind(&err);
            self.metrics.pass_failed(kind);
            tracing::warn!(error = %format_args!("{err:#}"), kind = kind.label(), "hold window pass failed");
            self.failed()
        })
    }

    /// Counts a failure: the next pass runs after a backoff.
    fn failed(&mut self) -> Option<Instant> {
        self.failures += 1;
        Some(Instant::now() + retry::pass_backoff(self.failures))
    }

    /// One pass: the window forward, the record saved, the nodes converged.
    /// It reads the store's nodes in place and builds each patch only when
    /// the patcher takes it: its memory grows with the patches in flight.
    async fn pass(&mut self, nodes: &NodeStore) -> Result<Option<Instant>> {
        // Leadership as the Lease says now, not as the lease manager last
        // saw it: after an API server outage another replica may lead.
        lease::ensure_leading(&self.client, &self.config.namespace, &self.config.identity).await?;
        let now = Timestamp::now();
        let snapshot = nodes.snapshot();
        self.apply_requests(now);
        let known = self.keep_for_schedules(&snapshot, now);
        self.observe(&snapshot, now);
        // The record first: a crash after holding nodes must find the window that releases them.
        self.save_record().await?;
        let wake = self.converge(&snapshot, now).await?;
        let Some(known) = known else { return Ok(wake) };
        self.warm_for_runs(&known, &snapshot, now).await;
        let warm_wake = self.warming.wake.and_then(|at| instant_at(at, now));
        Ok(wake.into_iter().chain(warm_wake).min())
    }

    /// Saves the window if it changed, and shows its deadline.
    async fn save_record(&mut self) -> Result<()> {
        let now = Saved {
            window: self.window.clone(),
            kept: crate::core::kept::KeptSummary::of(&self.kept),
            last_runs: self.last_runs.clone(),
        };
        if self.saved.as_ref() != Some(&now) {
            let settings = self.config.settings();
            self.store
                .save(&now.window, &now.kept, &now.last_runs, &settings)
                .await?;
            self.saved = Some(now);
        }
        self.metrics.deadline.set(seconds(self.window.deadline()));
        Ok(())
    }
}
