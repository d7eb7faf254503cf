//! Leadership: competing for the Lease, leading the window while held,
//! handing it over; and the one pass `uninstall` runs as the leader.

use super::*;

/// This replica's name in the Lease: `HOSTNAME` (a pod's name; with `hostNetwork` the node's, which
/// two replicas cannot share), else `/etc/hostname`, else the process id.
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
                _ = tokio::time::sleep(retry::TASK_RESTART) => {}
            }
        }
    }
    // Dropping the receiver makes the lease task release the Lease, so a
    // standby takes over at once instead of after the lease duration.
    drop(is_leader);
    match tokio::time::timeout(retry::LEASE_HANDOVER, lease_task).await {
        Ok(Ok(Ok(_))) => tracing::info!("hold window lease released"),
        Ok(Ok(Err(err))) => tracing::warn!(error = %err, "releasing the lease failed"),
        Ok(Err(err)) => tracing::warn!(error = %err, "lease task failed"),
        Err(_) => tracing::warn!("releasing the lease timed out"),
    }
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
    // The hold is the configuration's: shown once, not at every pass.
    metrics.hold.set(config.window.hold.as_secs_f64());
    let events = events.clone();
    let mut task = WindowTask::new(client.clone(), config.clone(), metrics.clone(), events);
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
    Ok(outcome)
}

/// `uninstall`'s release (requested at `request`) by the leader's own pass, as `config.identity`,
/// which must hold the Lease; a pass whose patches failed runs again from a fresh list, a few times.
pub async fn release_once(
    client: kube::Client,
    config: Config,
    request: Timestamp,
) -> Result<PassReport> {
    let metrics = super::WindowMetrics::register(&mut crate::metrics::registry());
    let mut task = WindowTask::new(client, config, metrics, EventSink::none());
    task.report = Some(std::sync::Mutex::new(PassReport::default()));
    let record = task.store.load().await?;
    task.restore(record);
    task.release_unconfirmed = Some(request);
    task.release_request = Some(request);
    for attempt in 1..=retry::ONCE_ATTEMPTS {
        let nodes = list_nodes(&task.client, task.config.holding.clone()).await?;
        task.pass(&nodes).await?;
        if task.failures == 0 {
            break;
        }
        if attempt == retry::ONCE_ATTEMPTS {
            bail!("node patches still failed after {attempt} passes; run the command again");
        }
        tokio::time::sleep(retry::pass_backoff(task.failures)).await;
    }
    let report = task.report.take().unwrap_or_default();
    let mut report = report.into_inner().unwrap_or_else(|e| e.into_inner());
    // Patches complete in any order; the report is by name.
    report.released.sort();
    report.left.sort();
    Ok(report)
}
