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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use futures::TryStreamExt;
use jiff::Timestamp;
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio_util::task::AbortOnDropHandle;

use super::budgets::{api_missing, karpenter_resource, watch_refused};

/// The last work on each node (by node name), as Karpenter last said.
/// Cloning shares it: the watch task writes, passes read.
#[derive(Debug, Clone, Default)]
pub struct WorkSeen {
    last: Arc<RwLock<HashMap<String, Timestamp>>>,
    /// A complete list has been read (or Karpenter's API is not there, so
    /// there is nothing to wait for).
    listed: Arc<AtomicBool>,
}

impl WorkSeen {
    /// Whether passes may trust the map: a window must not close for want
    /// of work a list would have shown.
    pub fn listed(&self) -> bool {
        self.listed.load(Ordering::Acquire)
    }

    /// When work last landed on `node`, if Karpenter has said.
    pub fn last_on(&self, node: &str) -> Option<Timestamp> {
        let map = self.last.read().unwrap_or_else(PoisonError::into_inner);
        map.get(node).copied()
    }

    /// Applies one watch event; returns whether the work seen changed.
    fn apply(&self, event: Event<DynamicObject>, relist: &mut HashMap<String, Timestamp>) -> bool {
        let mut map = self.last.write().unwrap_or_else(PoisonError::into_inner);
        match event {
            Event::Apply(claim) => match last_work(&claim) {
                Some((node, at)) => map.insert(node, at) != Some(at),
                None => false,
            },
            Event::Delete(claim) => {
                node_name(&claim).is_some_and(|node| map.remove(&node).is_some())
            }
            Event::Init => {
                relist.clear();
                false
            }
            Event::InitApply(claim) => {
                relist.extend(last_work(&claim));
                false
            }
            Event::InitDone => {
                *map = std::mem::take(relist);
                self.listed.store(true, Ordering::Release);
                true
            }
        }
    }
}

/// The watch and what it has seen; dropping it stops the watch. `changes`
/// ticks when the work seen changes, so the leader runs a (coalesced)
/// pass: each burst of work is counted when it comes, not only at the
/// window's deadline.
pub struct WorkWatch {
    pub seen: WorkSeen,
    pub changes: tokio::sync::watch::Receiver<u64>,
    _task: AbortOnDropHandle<()>,
}

/// Watches Karpenter's NodeClaims for the last work on each node.
pub fn watch_work(client: kube::Client, backoff: watcher::ExponentialBackoff) -> WorkWatch {
    let resource = karpenter_resource("NodeClaim", "nodeclaims");
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    let seen = WorkSeen::default();
    let writer = seen.clone();
    let (tick, changes) = tokio::sync::watch::channel(0u64);
    let task = tokio::spawn(async move {
        let events = watcher::watcher(api, watcher::Config::default()).backoff(backoff);
        futures::pin_mut!(events);
        let mut relist = HashMap::new();
        loop {
            let changed = match events.try_next().await {
                Ok(Some(event)) => writer.apply(event, &mut relist),
                Ok(None) => return,
                Err(err) if api_missing(&err) => {
                    tracing::debug!(error = %err, "no NodeClaims to follow work on; retrying");
                    // Nothing to wait for: no Karpenter, no work to miss.
                    !writer.listed.swap(true, Ordering::AcqRel)
                }
                Err(err) if watch_refused(&err) == Some(403) => {
                    tracing::warn!(
                        error = %err,
                        "may not list Karpenter's NodeClaims: windows follow new nodes only \
                         (grant webhook-config/rbac-nodeclaims.yaml); retrying"
                    );
                    // Waiting would stop every pass; go on without the work.
                    !writer.listed.swap(true, Ordering::AcqRel)
                }
                Err(err) => {
                    tracing::warn!(error = %err, "NodeClaim watch failed; retrying");
                    false
                }
            };
            if changed {
                tick.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    });
    WorkWatch {
        seen,
        changes,
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
        assert!(!seen.listed());
        assert!(seen.apply(Event::Apply(claim("a", Some(at))), &mut relist));
        assert!(
            !seen.apply(Event::Apply(claim("a", Some(at))), &mut relist),
            "no news"
        );
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
