//! Convergence: every node brought to the plan, what the patches did recorded.

use super::*;

/// The indices of the nodes whose plan holds, releases or re-stamps them.
fn by_action<'a>(
    planner: &Planner<'_>,
    nodes: impl Iterator<Item = &'a NodeMeta>,
) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
    let (mut hold, mut release, mut stamp) = (Vec::new(), Vec::new(), Vec::new());
    for (i, node) in nodes.enumerate() {
        match planner.node(node).map(|(action, _)| action) {
            Some(Action::Hold) => hold.push(i),
            Some(Action::Release) => release.push(i),
            Some(Action::Stamp) => stamp.push(i),
            None => {}
        }
    }
    (hold, release, stamp)
}

impl WindowTask {
    /// Records, before the holds come off, how many nodes the release starts with, for `status`; a
    /// failed write costs only that line of `status`: logged, not retried. Whether it was recorded.
    async fn record_release_start(&self, nodes: usize) -> bool {
        if nodes == 0 {
            return false;
        }
        match self.store.release_progress(Some(nodes), None).await {
            Ok(()) => true,
            Err(err) => {
                tracing::warn!(error = %err, "recording the release progress failed");
                false
            }
        }
    }

    /// Brings every node to the plan: holds first, then releases (recorded
    /// as a release under way while they run); returns when to wake.
    pub(super) async fn converge(
        &mut self,
        snapshot: &[Arc<NodeMeta>],
        now: Timestamp,
    ) -> Result<Option<Instant>> {
        let drifted = self.drifted();
        let planner = &Planner {
            window: &self.window,
            holds: &self.config.holding.holds,
            now,
            kept: self.config.schedule.map(|_| &self.kept),
            explained: self.config.schedule.map(|_| &self.explained),
            drifted: &drifted,
        };
        let metas = || snapshot.iter().map(|node| &**node);
        // Which nodes change is decided first (their patches are dropped at once), so the logs know
        // the totals; each patch is built again when the patcher takes it.
        let (hold, release, stamp) = by_action(planner, metas());
        let patches = |indices: Vec<usize>| {
            let planned = indices
                .into_iter()
                .filter_map(|i| planner.node(&snapshot[i]));
            planned.map(|(_, patch)| patch)
        };
        let marked = metas().filter(|node| is_marked(*node)).count();
        let wake_at = planner.wake(metas());
        let (held, hold_failures) = self.apply(Action::Hold, hold.len(), patches(hold)).await;
        let (_, stamp_failures) = self.apply(Action::Stamp, stamp.len(), patches(stamp)).await;
        if self.record_release_start(release.len()).await {
            self.releasing = true;
        }
        let (released, release_failures) = self
            .apply(Action::Release, release.len(), patches(release))
            .await;
        if hold_failures == 0 {
            self.record_held().await;
        }
        if release_failures == 0 {
            self.record_released().await;
        }
        let held_now = i64::try_from(marked.saturating_add(held).saturating_sub(released));
        self.metrics.held_nodes.set(held_now.unwrap_or(i64::MAX));
        // The next pass: after a backoff when patches failed, else when the plan changes by itself.
        if hold_failures + stamp_failures + release_failures > 0 {
            return Ok(self.failed());
        }
        self.failures = 0;
        Ok(wake_at.and_then(|at| instant_at(at, now)))
    }

    /// After a pass that removed every hold it had to, records the release
    /// done (`release` waits for that); a failed write is tried next pass.
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

    /// After a pass that put every hold it had to, records the manual hold
    /// done (`hold` waits for that); a failed write is tried next pass.
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
        total: usize,
        patches: impl IntoIterator<Item = NodePatch, IntoIter: Send>,
    ) -> (usize, usize) {
        if total == 0 {
            return (0, 0);
        }
        let action_label: &str = action.into();
        tracing::info!(nodes = total, action = action_label, "patching nodes");
        let started = Instant::now();
        let (mut applied, mut changed, mut failed) = (0usize, 0usize, 0usize);
        let limit = NODE_EVENTS_PER_PASS;
        let results = self.patcher.apply(patches, total);
        futures::pin_mut!(results);
        while let Some((patch, result)) = results.next().await {
            tracing::debug!(node = %patch.name, action = action_label, ?result, keys = ?patch.keys, "node patch");
            match result {
                PatchResult::Applied => {
                    applied += 1;
                    self.metrics.applied(action).inc();
                    // Past the bound, one Event on the record sums the pass up.
                    if let Some(event) = HoldEvent::applied(action, &patch, applied, limit) {
                        self.events.send(event);
                    }
                    // What a release did, for the report if one is kept.
                    if let (Some(report), Action::Release) = (&self.report, action) {
                        let mut report = report.lock().unwrap_or_else(|e| e.into_inner());
                        let left = patch.left.iter().map(|k| format!("{}: {k}", patch.name));
                        report.left.extend(left);
                        report.released.push(patch.name.clone());
                    }
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
        let namespace = &self.config.namespace;
        if let Some(summary) = HoldEvent::pass(namespace, action, applied, limit) {
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

/// Unix seconds of `at`; 0 for none (what the deadline gauges show).
pub(super) fn seconds(at: Option<Timestamp>) -> f64 {
    at.map_or(0.0, |at| at.as_millisecond() as f64 / 1000.0)
}

/// The `Instant` of `at` (now if past; none past what an `Instant` holds).
pub(super) fn instant_at(at: Timestamp, now: Timestamp) -> Option<Instant> {
    let after = Duration::try_from(at.duration_since(now)).unwrap_or_default();
    Instant::now().checked_add(after)
}
