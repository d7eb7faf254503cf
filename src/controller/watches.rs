//! What wakes the leader's loop: the record's and schedule's watches and the coalesced deadline.

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

/// Until what the watch has seen changes; for ever without a watch.
pub(super) async fn watch_changed<T>(changes: &mut Option<tokio::sync::watch::Receiver<T>>) {
    let Some(receiver) = changes else {
        return std::future::pending().await;
    };
    if receiver.changed().await.is_err() {
        // The watch task ended (it only does with the leadership).
        *changes = None;
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

/// The HTTP status the API server refused a watch's list or start with.
pub(super) fn watch_refused(err: &watcher::Error) -> Option<u16> {
    match err {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status)) => Some(status.code),
        _ => None,
    }
}
