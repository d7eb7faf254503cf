//! What wakes the leader's loop: the record's, the NodePools' and the
//! schedule's watches, the node feed, and the coalesced deadline.

use super::*;

/// The record's metadata as it changes (release requests arrive this way).
pub(super) fn watch_record(
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
pub(super) fn watch_pools(
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
pub(super) fn pool_changed(
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
pub(super) fn nodes_seen(next: &mut Coalesce, seen: Feed, now: Feed) {
    if now.lists > seen.lists {
        next.run_now();
    } else if now.changes > seen.changes {
        next.change(Instant::now());
    }
}

/// Until what the watch has seen changes; for ever without a watch.
pub(super) async fn watch_changed<T>(changes: &mut Option<tokio::sync::watch::Receiver<T>>) {
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
pub(super) async fn sleep_until(due: Due, synced: bool) {
    match due {
        Due::Now if synced => {}
        Due::At(at) if synced => tokio::time::sleep_until(at.into()).await,
        _ => std::future::pending().await,
    }
}
