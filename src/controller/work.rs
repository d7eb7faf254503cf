//! `--window-follows-work`: when work last landed on each node, as Karpenter
//! records it on the node's NodeClaim. Karpenter stamps
//! `status.lastPodEventTime` when a pod binds to the node, finishes on it or
//! starts terminating on it (at most once every 10 s per node): the signal it
//! counts `consolidateAfter` from. One watch on NodeClaims, O(nodes), not a
//! watch on every pod; kept as node name -> time and nothing else, so 50,000
//! nodes cost a few MiB.
//!
//! Without Karpenter's API (Cluster Autoscaler) there is no such signal: the
//! watch retries quietly, the map stays empty, and windows follow new nodes
//! only.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use futures::TryStreamExt;
use jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio_util::task::AbortOnDropHandle;

use super::budgets::api_missing;

/// The last work on each node (by node name), as Karpenter last said.
/// Cloning shares it: the watch task writes, passes read.
#[derive(Debug, Clone, Default)]
pub struct WorkSeen(Arc<RwLock<HashMap<String, Timestamp>>>);

impl WorkSeen {
    /// When work last landed on `node`, if Karpenter has said.
    pub fn last_on(&self, node: &str) -> Option<Timestamp> {
        let map = self.0.read().unwrap_or_else(PoisonError::into_inner);
        map.get(node).copied()
    }

    fn apply(&self, event: Event<DynamicObject>, relist: &mut HashMap<String, Timestamp>) {
        let mut map = self.0.write().unwrap_or_else(PoisonError::into_inner);
        match event {
            Event::Apply(claim) => {
                if let Some((node, at)) = last_work(&claim) {
                    map.insert(node, at);
                }
            }
            Event::Delete(claim) => {
                if let Some(node) = node_name(&claim) {
                    map.remove(&node);
                }
            }
            Event::Init => relist.clear(),
            Event::InitApply(claim) => relist.extend(last_work(&claim)),
            Event::InitDone => *map = std::mem::take(relist),
        }
    }
}

/// The watch and what it has seen; dropping it stops the watch.
pub struct WorkWatch {
    pub seen: WorkSeen,
    _task: AbortOnDropHandle<()>,
}

/// Watches Karpenter's NodeClaims for the last work on each node.
pub fn watch_work(client: kube::Client, backoff: watcher::ExponentialBackoff) -> WorkWatch {
    let resource = ApiResource {
        group: "karpenter.sh".into(),
        version: "v1".into(),
        api_version: "karpenter.sh/v1".into(),
        kind: "NodeClaim".into(),
        plural: "nodeclaims".into(),
    };
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    let seen = WorkSeen::default();
    let writer = seen.clone();
    let task = tokio::spawn(async move {
        let events = watcher::watcher(api, watcher::Config::default()).backoff(backoff);
        futures::pin_mut!(events);
        let mut relist = HashMap::new();
        loop {
            match events.try_next().await {
                Ok(Some(event)) => writer.apply(event, &mut relist),
                Ok(None) => return,
                Err(err) if api_missing(&err) => {
                    tracing::debug!(error = %err, "no NodeClaims to follow work on; retrying");
                }
                Err(err) => tracing::warn!(error = %err, "NodeClaim watch failed; retrying"),
            }
        }
    });
    WorkWatch {
        seen,
        _task: AbortOnDropHandle::new(task),
    }
}

fn node_name(claim: &DynamicObject) -> Option<String> {
    let name = claim.data.get("status")?.get("nodeName")?.as_str()?;
    (!name.is_empty()).then(|| name.to_string())
}

/// The claim's node and its last work, once it has both.
fn last_work(claim: &DynamicObject) -> Option<(String, Timestamp)> {
    let at = claim
        .data
        .get("status")?
        .get("lastPodEventTime")?
        .as_str()?;
    Some((node_name(claim)?, at.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(node: &str, last: Option<&str>) -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodeClaim",
            "metadata": {"name": format!("claim-{node}")},
            "status": {"nodeName": node, "lastPodEventTime": last}
        }))
        .unwrap()
    }

    #[test]
    fn the_map_follows_applies_deletes_and_a_relist() {
        let seen = WorkSeen::default();
        let mut relist = HashMap::new();
        let at = "2026-11-25T10:00:00Z";
        seen.apply(Event::Apply(claim("a", Some(at))), &mut relist);
        seen.apply(Event::Apply(claim("b", None)), &mut relist);
        assert_eq!(seen.last_on("a"), Some(at.parse().unwrap()));
        assert_eq!(seen.last_on("b"), None, "no work yet");
        seen.apply(Event::Delete(claim("a", Some(at))), &mut relist);
        assert_eq!(seen.last_on("a"), None);
        // A relist replaces the map only once it is complete.
        seen.apply(Event::Apply(claim("c", Some(at))), &mut relist);
        seen.apply(Event::Init, &mut relist);
        seen.apply(Event::InitApply(claim("d", Some(at))), &mut relist);
        assert!(seen.last_on("c").is_some(), "kept until the list ends");
        seen.apply(Event::InitDone, &mut relist);
        assert_eq!(
            (seen.last_on("c"), seen.last_on("d").is_some()),
            (None, true)
        );
    }

    #[test]
    fn a_claim_without_a_node_or_a_readable_time_says_nothing() {
        assert_eq!(last_work(&claim("", Some("2026-11-25T10:00:00Z"))), None);
        assert_eq!(last_work(&claim("a", Some("yesterday"))), None);
    }
}
