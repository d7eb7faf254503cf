//! The hold window task: on the elected leader only, it watches Node metadata,
//! drives the window record forward and converges the nodes to the plan the
//! pure core computes (hold while open, release when closed). Level-triggered:
//! every pass starts from the watched state and the record, so running it
//! again, or after a crash, changes nothing more.

mod budgets;
mod coalesce;
mod events;
pub mod lease;
mod nodes;
pub mod patcher;
pub mod record;
mod work;

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube_lease_manager::LeaseManager;
use tokio_util::sync::CancellationToken;

use crate::core::budget::{AddedBudgets, Mechanism, NODEPOOL_LABEL};
use crate::core::groups::{self, Grouping, UNLABELLED, Windows};
use crate::core::holds::HoldPolicy;
use crate::core::holds::is_marked;
use crate::core::node::NodeMeta;
use crate::core::pace::Pacing;
use crate::core::plan::{Action, NodePatch, Planner, paced_keep};
use crate::core::selector::NodeScope;
use crate::core::window::{ManualHold, Mode, Observed, Window, WindowConfig};
use crate::metrics::WindowMetrics;
use coalesce::{Coalesce, Due};
use events::{EventSink, HoldEvent, PassEvents};
use nodes::{Feed, NodeStore, NodeWatch, list_nodes, watch_nodes};
use patcher::{PatchResult, Patcher};
use record::{RecordStore, ReleaseRequest, Settings};
use work::{WorkWatch, watch_work};

/// Everything the window task runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub window: WindowConfig,
    pub policy: HoldPolicy,
    /// `--hold-mechanism budget`: the NodePools held by a budget (a label
    /// selector); `None`: nodes are held by annotation.
    pub pools: Option<NodeScope>,
    pub namespace: String,
    pub identity: String,
    pub lease_duration: Duration,
    /// `--window-follows-work`: work on held nodes keeps their window open.
    pub follow_work: bool,
    pub qps: u32,
    pub max_in_flight: usize,
    /// How many nodes of one pass's patches one way get an Event each;
    /// past it, one Event on the record sums the pass up.
    pub node_events_per_pass: usize,
    pub coalesce_idle: Duration,
    pub coalesce_max: Duration,
}

impl Config {
    /// What the node store keeps of each node: besides the marker, the
    /// label that groups windows, and with budgets the NodePool's.
    fn keep(&self) -> nodes::Keep {
        let groups = self.window.groups.key().map(str::to_string);
        let pools = self.pools.as_ref().map(|_| NODEPOOL_LABEL.to_string());
        nodes::Keep::new(&self.policy, groups.into_iter().chain(pools).collect())
    }

    /// What the record keeps of this configuration, for `status` and `release`.
    pub fn settings(&self) -> Settings {
        Settings {
            mode: self.window.mode,
            hold_duration: self.window.hold,
            max_hold: self.window.max_hold,
            holds: self.policy.holds.iter().map(ToString::to_string).collect(),
            node_selector: self.policy.scope.text().to_string(),
            release_pace: self.window.release_pace,
            window_per_label: self.window.groups.key().map(str::to_string),
            group_hold_durations: self.window.group_holds.clone(),
            window_follows_work: self.follow_work,
            learned_hold: self.window.learned.map(|l| record::LearnedTerms {
                launch_cost: l.launch_cost,
                floor: l.floor,
                ceiling: l.ceiling,
            }),
            hold_mechanism: if self.pools.is_some() {
                Mechanism::Budget
            } else {
                Mechanism::Annotation
            },
            nodepool_selector: self
                .pools
                .as_ref()
                .map_or_else(String::new, |pools| pools.text().to_string()),
        }
    }
}

/// This replica's default name in the Lease: the pod's host name.
pub fn default_identity() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("node-holder-{}", std::process::id()))
}

/// Competes for the Lease until `stop`; while leader, runs the window task.
pub async fn run(
    client: kube::Client,
    config: Config,
    metrics: WindowMetrics,
    stop: CancellationToken,
) -> Result<()> {
    let manager = lease::lease_manager(
        &client,
        &config.namespace,
        &config.identity,
        config.lease_duration.as_secs(),
    )
    .await?;
    let (mut is_leader, lease_task) = manager.watch().await;
    tracing::info!(identity = %config.identity, lease = record::NAME, namespace = %config.namespace, "competing for the hold window's lease");
    let events = EventSink::spawn(client.clone(), &config.identity, stop.clone());

    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            changed = is_leader.wait_for(|leader| *leader) => {
                changed.context("leader election ended")?;
            }
        }
        let outcome =
            lead_while_leader(&client, &config, &metrics, &events, &mut is_leader, &stop).await?;
        if let Some(Err(err)) = outcome {
            tracing::error!(
                error = format!("{err:#}"),
                "hold window task failed; starting again"
            );
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            }
        }
    }
    hand_over(is_leader, lease_task).await;
    Ok(())
}

/// Leads the window until the Lease is lost, `stop`, or the task fails
/// (`Some(Err)`); afterwards this replica reports no window.
async fn lead_while_leader(
    client: &kube::Client,
    config: &Config,
    metrics: &WindowMetrics,
    events: &EventSink,
    is_leader: &mut tokio::sync::watch::Receiver<bool>,
    stop: &CancellationToken,
) -> Result<Option<Result<()>>> {
    tracing::info!(identity = %config.identity, "leading the hold window");
    metrics.leader.set(1);
    let mut task = WindowTask::new(
        client.clone(),
        config.clone(),
        metrics.clone(),
        events.clone(),
    );
    let outcome = tokio::select! {
        _ = stop.cancelled() => None,
        lost = is_leader.wait_for(|leader| !*leader) => {
            lost.context("leader election ended")?;
            tracing::warn!(identity = %config.identity, "lost the hold window's lease");
            None
        }
        result = task.lead() => Some(result),
    };
    // A standby reports nothing of a window it no longer runs.
    metrics.leader.set(0);
    metrics.deadline.set(0.0);
    metrics.held_nodes.set(0);
    metrics.show_groups(Vec::new());
    Ok(outcome)
}

/// Dropping the receiver makes the lease task release the Lease, so a
/// standby takes over at once instead of after the lease duration.
async fn hand_over(
    is_leader: tokio::sync::watch::Receiver<bool>,
    lease_task: tokio::task::JoinHandle<kube_lease_manager::Result<LeaseManager>>,
) {
    drop(is_leader);
    match tokio::time::timeout(Duration::from_secs(5), lease_task).await {
        Ok(Ok(Ok(_))) => tracing::info!("hold window lease released"),
        Ok(Ok(Err(err))) => tracing::warn!(error = %err, "releasing the lease failed"),
        Ok(Err(err)) => tracing::warn!(error = %err, "lease task failed"),
        Err(_) => tracing::warn!("releasing the lease timed out"),
    }
}

/// How many passes [`handle_once`] runs at most while node patches fail.
const ONCE_ATTEMPTS: u32 = 5;

/// What an operator asks of the window through the record.
#[derive(Debug, Clone)]
pub enum Request {
    /// `release`: close the windows now (and end a manual hold), or one
    /// group's window.
    Release(ReleaseRequest),
    /// `hold`: hold every node in scope until the hold's end.
    Hold(ManualHold),
}

/// Handles `request` with the leader's own pass, once, as
/// `config.identity`, which must hold the Lease: what `release` and `hold`
/// do when no leader runs. The pass puts the request in the window record,
/// converges the nodes (holds, releases) as a leader would, and records the
/// request as done. A pass whose patches failed runs again from a fresh
/// list, a few times.
pub async fn handle_once(
    client: kube::Client,
    config: Config,
    request: Request,
) -> Result<PassReport> {
    let metrics = crate::metrics::Metrics::default().window;
    let mut task = WindowTask::new(client, config, metrics, EventSink::none());
    task.report = Some(std::sync::Mutex::new(PassReport::default()));
    let record = task.store.load().await?;
    task.restore(record);
    match request {
        Request::Release(requested) => {
            task.release_unconfirmed = Some(requested.at);
            task.release_request = Some(requested);
        }
        Request::Hold(hold) => {
            task.hold_unconfirmed = Some(hold.requested_at);
            task.hold_request = Some(hold);
        }
    }
    for attempt in 1..=ONCE_ATTEMPTS {
        let nodes = list_nodes(&task.client, task.config.keep()).await?;
        task.pass(&nodes).await?;
        if task.failures == 0 {
            break;
        }
        if attempt == ONCE_ATTEMPTS {
            bail!("node patches still failed after {attempt} passes; run the command again");
        }
        tokio::time::sleep(task.backoff()).await;
    }
    let report = task.report.take().unwrap_or_default();
    let mut report = report.into_inner().unwrap_or_else(|e| e.into_inner());
    // Patches complete in any order; the report is by name.
    report.held.sort();
    report.released.sort();
    report.left.sort();
    Ok(report)
}

/// Retry delays of node-holder's watches: from half a second, doubling, to
/// at most five. kube's default (0.8 s to 30 s, reset after 2 minutes)
/// would leave the window task blind for up to 30 s after an API server
/// restart; the window waits for the watch, so the reconnect must be quick.
fn watch_backoff() -> watcher::ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(5))
        .with_factor(2.0)
        .without_max_times()
        .into()
}

/// The record's metadata as it changes (release requests arrive this way).
fn watch_record(
    client: kube::Client,
    namespace: &str,
) -> impl futures::Stream<Item = Result<PartialObjectMeta<ConfigMap>, watcher::Error>> + use<> {
    let api: Api<PartialObjectMeta<ConfigMap>> = Api::namespaced(client, namespace);
    watcher::watcher(
        api,
        watcher::Config::default().fields(&format!("metadata.name={}", record::NAME)),
    )
    .backoff(watch_backoff())
    .applied_objects()
}

/// With `--hold-mechanism budget`, the NodePools' changes; else nothing, ever.
fn watch_pools(
    pools: Option<&budgets::Pools>,
) -> futures::stream::BoxStream<'static, Result<PartialObjectMeta<DynamicObject>, watcher::Error>> {
    match pools {
        Some(pools) => pools.changes().boxed(),
        None => futures::stream::pending().boxed(),
    }
}

/// What the NodePool watch's `change` asks of the next pass: to run soon
/// after a pool appears or someone edits it. A watch failure is retried;
/// one for want of Karpenter's API is left to the pass to report.
fn pool_changed(
    next: &mut Coalesce,
    change: Result<Option<PartialObjectMeta<DynamicObject>>, watcher::Error>,
) -> Result<()> {
    match change {
        Ok(Some(pool)) => {
            let meta = &pool.metadata;
            tracing::debug!(
                pool = meta.name,
                generation = meta.generation,
                "NodePool changed"
            );
            next.change(Instant::now());
        }
        Ok(None) => bail!("the NodePool watch ended"),
        Err(err) if budgets::api_missing(&err) => {
            tracing::debug!(error = %err, "NodePool watch failed; retrying");
        }
        Err(err) => tracing::warn!(error = %err, "NodePool watch failed; retrying"),
    }
    Ok(())
}

/// What the node watch's progress from `seen` to `now` asks of the next
/// pass: to run at once after a (re)list, coalesced after changes.
fn nodes_seen(next: &mut Coalesce, seen: Feed, now: Feed) {
    if now.lists > seen.lists {
        next.run_now();
    } else if now.changes > seen.changes {
        next.change(Instant::now());
    }
}

/// Until the work seen changes; for ever without `--window-follows-work`.
async fn work_changed(changes: &mut Option<tokio::sync::watch::Receiver<u64>>) {
    match changes {
        Some(receiver) => {
            if receiver.changed().await.is_err() {
                // The watch task ended (it only does with the leadership).
                *changes = None;
            }
        }
        None => std::future::pending().await,
    }
}

/// Sleeps until `due`; for ever while the node store is not `synced`.
async fn sleep_until(due: Due, synced: bool) {
    match due {
        Due::Now if synced => {}
        Due::At(at) if synced => tokio::time::sleep_until(at.into()).await,
        _ => std::future::pending().await,
    }
}

/// A node in scope, as one pass reads it.
struct InScope<'a> {
    node: &'a NodeMeta,
    /// The group whose window it counts in.
    group: &'a str,
}

/// The leader's state between passes.
struct WindowTask {
    client: kube::Client,
    config: Config,
    metrics: WindowMetrics,
    events: EventSink,
    store: RecordStore,
    patcher: Patcher,
    /// The windows and the NodePool budgets as last saved.
    saved: Option<(Windows, AddedBudgets)>,
    windows: Windows,
    /// `--hold-mechanism budget`: the NodePools.
    pools: Option<budgets::Pools>,
    /// What node-holder added to which NodePool's budgets.
    added: AddedBudgets,
    /// `--window-follows-work`: the last work on each node, while leading.
    work: Option<WorkWatch>,
    /// A release request not handled yet.
    release_request: Option<ReleaseRequest>,
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
    /// What the patches did, node by node, when someone asked (`release`
    /// and `hold` without a leader print it).
    report: Option<std::sync::Mutex<PassReport>>,
}

/// What the patches of [`handle_once`] did, node by node.
#[derive(Debug, Default, Clone)]
pub struct PassReport {
    /// Nodes that got node-holder's hold.
    pub held: Vec<String>,
    /// Nodes whose holds came off.
    pub released: Vec<String>,
    /// `node: key` of holds someone changed since node-holder placed them:
    /// left in place, only node-holder's record of them dropped.
    pub left: Vec<String>,
}

/// Before a closed window's holds come off in `cluster` scope, the record
/// says how many nodes the release starts with, for `status`; whether it
/// does. (In `node` scope holds end one by one; there is no release to
/// follow.) A failed write costs only that line of `status`: logged, not
/// retried.
async fn record_releasing(store: &RecordStore, total: usize) -> bool {
    match store.release_progress(Some(total), None).await {
        Ok(()) => true,
        Err(err) => {
            tracing::warn!(error = %err, "recording the release progress failed");
            false
        }
    }
}

/// The plan for `snapshot` at `now`: the window's, with what a paced
/// release keeps held.
fn planner<'a>(
    windows: &'a Windows,
    config: &'a Config,
    snapshot: &'a [Arc<NodeMeta>],
    now: Timestamp,
) -> Planner<'a> {
    let cfg = &config.window;
    Planner {
        windows,
        cfg,
        holds: &config.policy.holds,
        now,
        paced: paced_keep(windows, cfg, now, snapshot.iter().map(|n| &**n)),
        pool_budgets: None,
    }
}

/// Unix seconds of `at`; 0 for none (what the deadline gauges show).
fn seconds(at: Option<Timestamp>) -> f64 {
    at.map_or(0.0, |at| at.as_millisecond() as f64 / 1000.0)
}

/// Each group's held nodes once a pass's patches land, for the group
/// metrics.
#[derive(Default)]
struct GroupGauges<'a> {
    held: std::collections::BTreeMap<&'a str, i64>,
}

impl<'a> GroupGauges<'a> {
    fn count(&mut self, groups: &Grouping, node: &'a NodeMeta, held: bool) {
        if groups.key().is_none() {
            return;
        }
        *self.held.entry(groups.group_of(node)).or_default() += i64::from(held);
    }

    /// Every group's (deadline in Unix seconds, held nodes, hold in
    /// seconds), the groups with a window and those with nodes.
    fn finish(self, windows: &Windows, cfg: &WindowConfig) -> Vec<(String, f64, i64, f64)> {
        let mut held: std::collections::BTreeMap<String, i64> = self
            .held
            .into_iter()
            .map(|(group, n)| (group.to_string(), n))
            .collect();
        for (group, _) in windows.iter() {
            held.entry(group.to_string()).or_default();
        }
        held.into_iter()
            .map(|(group, held)| {
                let deadline = seconds(windows.deadline(&group));
                let hold = windows.config_for(&group, cfg).hold.as_secs_f64();
                (group, deadline, held, hold)
            })
            .collect()
    }
}

/// What one pass asks of the next.
struct PassOutcome {
    /// When the next pass must run at the latest.
    wake: Option<Instant>,
}

impl WindowTask {
    fn new(
        client: kube::Client,
        config: Config,
        metrics: WindowMetrics,
        events: EventSink,
    ) -> Self {
        let pools = config
            .pools
            .clone()
            .map(|scope| budgets::Pools::new(client.clone(), scope));
        WindowTask {
            store: RecordStore::new(client.clone(), &config.namespace),
            patcher: Patcher::new(client.clone(), config.qps, config.max_in_flight),
            client,
            config,
            metrics,
            events,
            saved: None,
            windows: Windows::default(),
            pools,
            added: AddedBudgets::new(),
            work: None,
            release_request: None,
            release_unconfirmed: None,
            releasing: false,
            hold_request: None,
            hold_unconfirmed: None,
            announced: HashSet::new(),
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
        } = watch_nodes(self.client.clone(), self.config.keep(), watch_backoff());
        let record_events = watch_record(self.client.clone(), &self.config.namespace);
        futures::pin_mut!(record_events);
        let mut pool_changes = watch_pools(self.pools.as_ref());
        self.work = self
            .config
            .follow_work
            .then(|| watch_work(self.client.clone(), watch_backoff()));

        let mut work_changes = self.work.as_ref().map(|w| w.changes.clone());

        let mut seen = Feed::default();
        let mut next = Coalesce::new(self.config.coalesce_idle, self.config.coalesce_max);
        let mut wake: Option<Instant> = None;
        loop {
            // No pass on a store that may miss nodes: before the first list,
            // and from a watch failure until the next complete list; nor,
            // following work, before the NodeClaims are listed.
            let work_listed = self.work.as_ref().is_none_or(|w| w.seen.listed());
            let synced = seen.lists > 0 && !seen.broken && work_listed;
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
                change = pool_changes.try_next() => pool_changed(&mut next, change)?,
                () = work_changed(&mut work_changes) => next.change(Instant::now()),
                () = sleep_until(due, synced) => {
                    next.ran();
                    wake = self.timed_pass(&nodes).await;
                }
            }
        }
    }

    /// Takes up the window where the record left it: the window, a release
    /// request not yet handled, and one handled but not recorded as done.
    fn restore(&mut self, record: record::Record) {
        self.windows = record.window.clone();
        self.added = record.budgets.clone();
        self.saved = record.exists.then_some((record.window, record.budgets));
        let done = record.release_done_at;
        self.release_request = record
            .release_request
            .clone()
            .filter(|request| self.is_new_release(request, done));
        // A release the last leader handled but did not finish is finished
        // (and recorded as done) by this one.
        self.release_unconfirmed = record
            .release_request
            .map(|request| request.at)
            .filter(|&at| done.is_none_or(|done| done < at));
        self.releasing = record.releasing.is_some();
        // A manual hold not recorded as done is handled (again: handling it
        // twice changes nothing) and recorded.
        self.hold_request = record.pending_hold;
        self.hold_unconfirmed = self.hold_request.as_ref().map(|hold| hold.requested_at);
    }

    /// Whether the record, as changed, carries a release or manual hold
    /// request this leader has not taken yet; takes them.
    fn requested(&mut self, meta: &ObjectMeta) -> bool {
        let release = self.release_requested(meta);
        self.hold_requested(meta) || release
    }

    /// Whether the record, as changed, carries a manual hold request this
    /// leader has not taken yet; takes it.
    fn hold_requested(&mut self, meta: &ObjectMeta) -> bool {
        let Some(hold) = record::pending_hold(meta) else {
            return false;
        };
        let taken = self.hold_unconfirmed == Some(hold.requested_at)
            || self.hold_request.as_ref() == Some(&hold);
        if taken {
            return false;
        }
        tracing::info!(requested_at = %hold.requested_at, until = %hold.until, by = %hold.by, "manual hold requested");
        self.hold_unconfirmed = Some(hold.requested_at);
        self.hold_request = Some(hold);
        true
    }

    /// Applies the requests taken since the last pass to the window, in the
    /// order they were made: a release after a manual hold ends it, a hold
    /// after a release starts after it.
    fn apply_requests(&mut self, now: Timestamp) {
        let release = self.release_request.take();
        let hold = self.hold_request.take();
        let release_first = match (&release, &hold) {
            (Some(release), Some(hold)) => release.at < hold.requested_at,
            _ => true,
        };
        if release_first {
            self.apply_release(release, now);
            self.apply_hold(hold, now);
        } else {
            self.apply_hold(hold, now);
            self.apply_release(release, now);
        }
    }

    fn apply_release(&mut self, requested: Option<ReleaseRequest>, now: Timestamp) {
        if let Some(ReleaseRequest { at, group }) = requested {
            let was_open = self.windows.release_now(at.min(now), group.as_deref());
            tracing::info!(requested_at = %at, group, was_open, "hold window released on request");
        }
    }

    /// Puts a manual hold in the window; the log line and the Event on the
    /// record say who asked, why and until when.
    fn apply_hold(&mut self, hold: Option<ManualHold>, now: Timestamp) {
        let Some(hold) = hold else { return };
        if self
            .windows
            .manual()
            .is_some_and(|m| m.requested_at == hold.requested_at)
        {
            // A request an earlier leader put in the window but did not
            // record as done: only the nodes and the record remain to do.
            return;
        }
        let outcome = self.windows.hold_manually(hold.clone(), now);
        tracing::info!(
            requested_at = %hold.requested_at,
            until = %hold.until,
            by = %hold.by,
            reason = %hold.reason,
            outcome = ?outcome,
            "manual hold"
        );
        let current = self.windows.manual().cloned();
        self.events.send(HoldEvent::manual(
            &self.config.namespace,
            &hold,
            outcome,
            current.as_ref(),
        ));
    }

    /// Whether the record, as changed, carries a release request this leader
    /// has not taken yet; takes it.
    fn release_requested(&mut self, meta: &ObjectMeta) -> bool {
        let Some(request) = record::release_request(meta) else {
            return false;
        };
        let new = self.is_new_release(&request, record::release_done_at(meta))
            && self.release_request.as_ref() != Some(&request);
        if new {
            tracing::info!(requested_at = %request.at, group = request.group, "release requested");
            self.release_unconfirmed = Some(request.at);
            self.release_request = Some(request);
        }
        new
    }

    /// Whether a release request is still to be handled: not recorded as
    /// done, and made after what its window last consumed.
    fn is_new_release(&self, request: &ReleaseRequest, done: Option<Timestamp>) -> bool {
        let group = request.group.as_deref().unwrap_or(UNLABELLED);
        let consumed = self
            .windows
            .window(group)
            .and_then(Window::closed_through)
            .is_some_and(|through| through >= request.at);
        !consumed && done.is_none_or(|done| done < request.at)
    }

    /// One pass, timed; returns when the next must run at the latest (a
    /// backoff after a failure).
    async fn timed_pass(&mut self, nodes: &NodeStore) -> Option<Instant> {
        let started = Instant::now();
        let outcome = self.pass(nodes).await;
        self.metrics
            .reconcile
            .observe(started.elapsed().as_secs_f64());
        match outcome {
            Ok(outcome) => outcome.wake,
            Err(err) => {
                self.failures += 1;
                tracing::warn!(error = format!("{err:#}"), "hold window pass failed");
                Some(Instant::now() + self.backoff())
            }
        }
    }

    fn backoff(&self) -> Duration {
        Duration::from_millis(500 * 2u64.pow(self.failures.min(6))).min(Duration::from_secs(30))
    }

    /// One pass: the window forward, the record saved, the nodes converged.
    ///
    /// It reads the store's objects in place (shared, not copied) and builds
    /// each node's patch only when the patcher takes it, so its memory grows
    /// with the patches in flight, not with the nodes.
    async fn pass(&mut self, nodes: &NodeStore) -> Result<PassOutcome> {
        // Leadership as the Lease says now, not as the lease manager last
        // saw it: after an API server outage another replica may lead.
        lease::ensure_leading(&self.client, &self.config.namespace, &self.config.identity).await?;
        let now = Timestamp::now();
        let snapshot = nodes.snapshot();
        self.apply_requests(now);
        self.follow_work(&snapshot, now);
        self.observe(&snapshot, now);
        // The record first: a crash after holding nodes must still find the
        // window that releases them.
        self.save_record().await?;
        let pool_budgets = self.hold_pools(now).await?;
        self.converge(&snapshot, now, pool_budgets.as_ref()).await
    }

    /// Moves the windows forward with the nodes in scope, and says what they
    /// did: a log line for each node that opens or extends one, an Event for
    /// each new node of an open window (once per leader), a line when one
    /// closes.
    fn observe(&mut self, snapshot: &[Arc<NodeMeta>], now: Timestamp) {
        let cfg = &self.config.window.clone();
        let in_scope: Vec<InScope> = snapshot
            .iter()
            .filter(|node| node.in_scope())
            .map(|node| InScope {
                node,
                group: cfg.groups.group_of(&**node),
            })
            .collect();
        let open_before = self.open_groups();
        let (observed, ended) = self.windows.observe_all(
            in_scope.iter().map(|n| (n.group, n.node.created())),
            now,
            cfg,
        );
        for ended in ended {
            let held = in_scope
                .iter()
                .filter(|n| n.group == ended.group && is_marked(n.node))
                .count();
            self.pace_release(&ended.group, ended.since, held);
        }
        for (node, observed) in in_scope.iter().zip(observed) {
            self.observed(node, observed, now);
        }
        self.log_closed(open_before);
    }

    /// `--window-follows-work`: keeps each group's window open until its
    /// held nodes' last work plus the hold, before the windows are ticked
    /// (so work that came before the deadline counts even when the pass
    /// runs after it).
    fn follow_work(&mut self, snapshot: &[Arc<NodeMeta>], now: Timestamp) {
        let Some(work) = &self.work else {
            return;
        };
        let cfg = &self.config.window;
        let mut by_group: std::collections::BTreeMap<&str, Vec<Timestamp>> = Default::default();
        for node in snapshot.iter().filter(|node| node.in_scope()) {
            // Work "in the future" (clock skew) counts as now.
            if let Some(at) = work.seen.last_on(node.name()).map(|at| at.min(now)) {
                by_group
                    .entry(cfg.groups.group_of(&**node))
                    .or_default()
                    .push(at);
            }
        }
        for (group, times) in by_group {
            if self.windows.follow_work(group, times, cfg) {
                tracing::info!(
                    group = self.group_field(group),
                    deadline = %self.windows.deadline(group).map_or_else(String::new, |d| d.to_string()),
                    "hold window extended by work on its nodes"
                );
            }
        }
    }

    /// The groups whose window is open (ended or not).
    fn open_groups(&self) -> Vec<String> {
        self.windows
            .iter()
            .filter(|(_, w)| w.open().is_some())
            .map(|(group, _)| group.to_string())
            .collect()
    }

    /// What one node in scope did to its window: the log line of a node that
    /// opened or extended it, the Event of a node new in an open window.
    fn observed(&mut self, in_scope: &InScope, observed: Observed, now: Timestamp) {
        let (node, group) = (in_scope.node, in_scope.group);
        let cfg = &self.config.window;
        let until = self.windows.held_until(group, node.created(), now, cfg);
        if matches!(observed, Observed::Opened | Observed::Extended) {
            tracing::info!(
                node = %node.name(),
                group = self.group_field(group),
                created = %node.created(),
                deadline = %until.map_or_else(String::new, |d| d.to_string()),
                "hold window {}", observed.label()
            );
        }
        let new_in_window = match cfg.mode {
            Mode::Cluster => self
                .windows
                .window(group)
                .and_then(Window::open)
                .is_some_and(|open| node.created() >= open.opened_at),
            Mode::Node => until.is_some(),
        };
        if new_in_window && !matches!(observed, Observed::Consumed | Observed::Expired) {
            self.announce(node, observed, until);
        }
    }

    /// The log lines of the windows that closed at this pass.
    fn log_closed(&mut self, open_before: Vec<String>) {
        for group in open_before {
            let Some(w) = self.windows.window(&group).filter(|w| w.open().is_none()) else {
                continue;
            };
            tracing::info!(
                group = self.group_field(&group),
                closed_through = %w.closed_through().map_or_else(String::new, |t| t.to_string()),
                "hold window closed"
            );
        }
        if self.open_groups().is_empty() {
            self.announced.clear();
        }
    }

    /// A group as a log field: only when windows are grouped.
    fn group_field<'g>(&self, group: &'g str) -> Option<&'g str> {
        self.config
            .window
            .groups
            .key()
            .map(|_| groups::display(group))
    }

    /// A group's window (or the manual hold) that closed by itself lets its
    /// `held` nodes go at `--release-pace` from `since`, its end, when a pace
    /// is set (`cluster` scope only).
    fn pace_release(&mut self, group: &str, since: Timestamp, held: usize) {
        let cfg = &self.config.window;
        let Some(pace) = cfg.release_pace.filter(|_| cfg.mode == Mode::Cluster) else {
            return;
        };
        if held == 0 {
            return;
        }
        tracing::info!(group = self.group_field(group), %since, nodes = held, pace = %pace, "paced release starts");
        self.windows.start_pacing(
            group,
            Pacing {
                since,
                of: u64::try_from(held).unwrap_or(u64::MAX),
            },
        );
    }

    /// The Event that says why a new node is held, once per node and leader.
    fn announce(&mut self, node: &NodeMeta, observed: Observed, until: Option<Timestamp>) {
        let key = node.uid().unwrap_or(node.name());
        if self.announced.insert(key.to_string()) {
            if self.config.pools.is_none() {
                self.metrics.new_node(is_marked(node));
            }
            self.events.send(HoldEvent::counted(node, observed, until));
        }
    }

    /// Saves the windows if they changed since last saved, and shows the
    /// latest deadline in the metrics.
    async fn save_record(&mut self) -> Result<()> {
        let now = (&self.windows, &self.added);
        if self.saved.as_ref().map(|(w, a)| (w, a)) != Some(now) {
            self.store
                .save(&self.windows, &self.added, &self.config.settings())
                .await?;
            self.saved = Some((self.windows.clone(), self.added.clone()));
        }
        self.metrics
            .deadline
            .set(seconds(self.windows.latest_deadline()));
        Ok(())
    }

    /// Brings every node to the plan: holds first, then releases (recorded
    /// as a release under way while they run); returns when to wake.
    async fn converge(
        &mut self,
        snapshot: &[Arc<NodeMeta>],
        now: Timestamp,
        pool_budgets: Option<&BTreeSet<String>>,
    ) -> Result<PassOutcome> {
        let cfg = &self.config.window;
        let mut planner = planner(&self.windows, &self.config, snapshot, now);
        planner.pool_budgets = pool_budgets;
        let planner = &planner;
        let metas = || snapshot.iter().map(|node| &**node);
        // Which nodes change is decided first (their patches are dropped at
        // once), so the logs know the totals; each patch is built again when
        // the patcher takes it.
        let (mut hold, mut release) = (Vec::new(), Vec::new());
        let mut groups = GroupGauges::default();
        for (i, meta) in metas().enumerate() {
            let action = planner.node(meta).map(|(action, _)| action);
            match action {
                Some(Action::Hold) => hold.push(i),
                Some(Action::Release) => release.push(i),
                None => {}
            }
            let held_after = action == Some(Action::Hold) || (is_marked(meta) && action.is_none());
            groups.count(&self.config.window.groups, meta, held_after);
        }
        let patches = |indices: Vec<usize>| {
            indices
                .into_iter()
                .filter_map(move |i| planner.node(&snapshot[i]))
                .map(|(_, patch)| patch)
        };
        let marked = metas().filter(|node| is_marked(*node)).count() as i64;
        let wake_at = planner.wake(metas());
        let (hold_total, release_total) = (hold.len(), release.len());
        let (held, hold_failures) = self.apply(Action::Hold, patches(hold), hold_total).await;
        // A paced release shows its own progress (`pacing` in the record).
        if release_total > 0 && cfg.mode == Mode::Cluster && !self.windows.is_pacing() {
            self.releasing |= record_releasing(&self.store, release_total).await;
        }
        let (released, release_failures) = self
            .apply(Action::Release, patches(release), release_total)
            .await;
        if hold_failures == 0 {
            self.record_held().await;
        }
        if release_failures == 0 {
            self.record_released().await;
        }
        self.metrics.held_nodes.set(marked + held - released);
        self.show_windows(groups);
        Ok(PassOutcome {
            wake: self.wake(hold_failures + release_failures, wake_at, now),
        })
    }

    /// The windows' gauges after a pass: the hold, and each group's.
    fn show_windows(&self, groups: GroupGauges) {
        let window = &self.config.window;
        let hold = self.windows.config_for(UNLABELLED, window).hold;
        self.metrics.hold.set(hold.as_secs_f64());
        if window.groups.key().is_some() {
            self.metrics
                .show_groups(groups.finish(&self.windows, window));
        }
    }

    /// When the next pass must run: after a backoff when patches failed,
    /// else when the plan changes by itself (`at`; a time already past wakes
    /// at once, one past what an `Instant` holds never).
    fn wake(&mut self, failures: usize, at: Option<Timestamp>, now: Timestamp) -> Option<Instant> {
        if failures > 0 {
            self.failures += 1;
            return Some(Instant::now() + self.backoff());
        }
        self.failures = 0;
        let after = Duration::try_from(at?.duration_since(now)).unwrap_or_default();
        Instant::now().checked_add(after)
    }

    /// Adds what `patch` did to the report, if one is kept.
    fn note(&self, action: Action, patch: &NodePatch) {
        if let Some(report) = &self.report {
            let mut report = report.lock().unwrap_or_else(|e| e.into_inner());
            if action == Action::Hold {
                report.held.push(patch.name.clone());
                return;
            }
            report
                .left
                .extend(patch.left.iter().map(|k| format!("{}: {k}", patch.name)));
            report.released.push(patch.name.clone());
        }
    }

    /// After a pass that removed every hold it had to: no release under way,
    /// and the handled release request is done (`release` waits for that).
    /// A failed write is tried again after the next pass.
    async fn record_released(&mut self) {
        let done = self.release_unconfirmed;
        if !self.releasing && done.is_none() {
            return;
        }
        match self.store.release_progress(None, done).await {
            Ok(()) => {
                self.releasing = false;
                self.release_unconfirmed = None;
            }
            Err(err) => tracing::warn!(error = %err, "recording the release progress failed"),
        }
    }

    /// After a pass that put every hold it had to: the handled manual hold
    /// request is done (`hold` waits for that). A failed write is tried
    /// again after the next pass.
    async fn record_held(&mut self) {
        let Some(done) = self.hold_unconfirmed else {
            return;
        };
        match self.store.hold_done(done).await {
            Ok(()) => self.hold_unconfirmed = None,
            Err(err) => tracing::warn!(error = %err, "recording the manual hold failed"),
        }
    }

    /// Applies the patches of one kind; returns (applied, failed).
    async fn apply(
        &self,
        action: Action,
        patches: impl IntoIterator<Item = NodePatch, IntoIter: Send>,
        total: usize,
    ) -> (i64, usize) {
        if total == 0 {
            return (0, 0);
        }
        let action_label = action.label();
        tracing::info!(nodes = total, action = action_label, "patching nodes");
        let started = Instant::now();
        let (mut applied, mut changed, mut failed) = (0i64, 0usize, 0usize);
        let mut events = PassEvents::new(
            action,
            &self.config.namespace,
            self.config.node_events_per_pass,
        );
        let results = self.patcher.apply(patches, total);
        futures::pin_mut!(results);
        while let Some((patch, result)) = results.next().await {
            tracing::debug!(node = %patch.name, action = action_label, ?result, keys = ?patch.keys, "node patch");
            match result {
                PatchResult::Applied => {
                    applied += 1;
                    let counter = match action {
                        Action::Hold => &self.metrics.holds_applied,
                        Action::Release => &self.metrics.holds_released,
                    };
                    counter.inc();
                    if let Some(event) = events.applied(&patch) {
                        self.events.send(event);
                    }
                    self.note(action, &patch);
                }
                PatchResult::Gone => {}
                PatchResult::Changed(code) => {
                    changed += 1;
                    self.metrics.patch_error(code);
                }
                PatchResult::Failed(code) => {
                    failed += 1;
                    self.metrics.patch_error(code);
                }
            }
        }
        if let Some(summary) = events.finish() {
            self.events.send(summary);
        }
        tracing::info!(
            action = action_label,
            nodes = total,
            applied,
            changed_meanwhile = changed,
            failed,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "nodes patched"
        );
        (applied, changed + failed)
    }
}
