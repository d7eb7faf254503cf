//! Drift: the nodes whose NodeClaim Karpenter marked `Drifted` (its
//! `status.conditions`), which node-holder's window and schedule do not hold
//! ([`crate::core::plan::Planner::drifted`]). Only with Karpenter v1's hold
//! (`karpenter.sh/do-not-disrupt`), the one that blocks drift.
//!
//! The watch keeps of each drifted NodeClaim its name and its node's, not
//! the object. Without Karpenter's API (404) or the permission (403) it
//! says so once and goes on empty: drifted nodes are then held like the
//! others, as before.

use std::collections::{BTreeMap, BTreeSet};

use futures::TryStreamExt;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

use super::budgets::watch_refused;
use crate::retry::optional_api_backoff;

/// Drifted NodeClaims by name, each with its node's name.
type Drifted = BTreeMap<String, String>;

/// The watch and what it has seen; dropping it stops the watch.
pub struct DriftWatch {
    /// Changes when a NodeClaim drifts or a drifted one goes.
    pub changes: watch::Receiver<Drifted>,
    _task: AbortOnDropHandle<()>,
}

impl DriftWatch {
    /// The nodes marked drifted now.
    pub fn nodes(&self) -> BTreeSet<String> {
        self.changes.borrow().values().cloned().collect()
    }
}

impl super::WindowTask {
    /// The nodes marked drifted now (none without the watch).
    pub(super) fn drifted(&self) -> BTreeSet<String> {
        self.drift
            .as_ref()
            .map(DriftWatch::nodes)
            .unwrap_or_default()
    }
}

/// Starts the NodeClaim watch.
pub fn watch_drift(client: kube::Client) -> DriftWatch {
    let claim = GroupVersionKind::gvk("karpenter.sh", "v1", "NodeClaim");
    let api: Api<DynamicObject> = Api::all_with(
        client,
        &ApiResource::from_gvk_with_plural(&claim, "nodeclaims"),
    );
    let (tx, changes) = watch::channel(Drifted::new());
    let task = tokio::spawn(follow(api, tx));
    DriftWatch {
        changes,
        _task: AbortOnDropHandle::new(task),
    }
}

/// Follows the NodeClaims into `tx` until the watch ends.
async fn follow(api: Api<DynamicObject>, tx: watch::Sender<Drifted>) {
    let events = watcher::watcher(api, watcher::Config::default()).backoff(optional_api_backoff());
    futures::pin_mut!(events);
    let mut listing = Drifted::new();
    let mut said = false;
    loop {
        match events.try_next().await {
            Ok(Some(Event::Init)) => listing.clear(),
            Ok(Some(Event::InitApply(claim))) => {
                if let Some((name, node)) = drifted(&claim) {
                    listing.insert(name, node);
                }
            }
            Ok(Some(Event::InitDone)) => {
                tx.send_if_modified(|now| replace(now, std::mem::take(&mut listing)));
            }
            Ok(Some(Event::Apply(claim))) => {
                tx.send_if_modified(|now| applied(now, &claim));
            }
            Ok(Some(Event::Delete(claim))) => {
                let name = claim.metadata.name.unwrap_or_default();
                tx.send_if_modified(|now| now.remove(&name).is_some());
            }
            Ok(None) => return,
            Err(err) => refused(&err, &mut said),
        }
    }
}

/// Says once why the watch cannot list; other failures each time.
fn refused(err: &watcher::Error, said: &mut bool) {
    let why = match watch_refused(err) {
        Some(404) => "Karpenter v1's NodeClaims are not served",
        Some(403) => "may not list NodeClaims (grant webhook-config/rbac.yaml's nodeclaims rule)",
        _ => {
            tracing::warn!(error = %err, "NodeClaim watch failed; retrying");
            return;
        }
    };
    if !std::mem::replace(said, true) {
        tracing::info!(error = %err, "{why}: drifted nodes are held like the others; retrying");
    }
}

fn replace(now: &mut Drifted, listed: Drifted) -> bool {
    let changed = *now != listed;
    *now = listed;
    changed
}

/// Takes in one changed NodeClaim; whether the drifted set changed.
fn applied(now: &mut Drifted, claim: &DynamicObject) -> bool {
    match drifted(claim) {
        Some((name, node)) => now.insert(name, node.clone()).as_ref() != Some(&node),
        None => claim
            .metadata
            .name
            .as_ref()
            .is_some_and(|name| now.remove(name).is_some()),
    }
}

/// The NodeClaim's name and its node's when Karpenter marked it drifted
/// (condition `Drifted` with status `True`) and it has a node.
fn drifted(claim: &DynamicObject) -> Option<(String, String)> {
    let status = claim.data.get("status")?;
    let node = status.get("nodeName")?.as_str()?;
    let name = claim.metadata.name.as_ref()?;
    let conditions = status.get("conditions")?.as_array()?;
    conditions
        .iter()
        .any(|c| c["type"] == "Drifted" && c["status"] == "True")
        .then(|| (name.clone(), node.to_string()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn claim(name: &str, node: Option<&str>, drifted: &str) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": name},
            "status": {
                "nodeName": node,
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "Drifted", "status": drifted},
                ],
            },
        }))
        .unwrap()
    }

    #[test]
    fn only_a_drifted_claim_with_a_node_counts() {
        assert_eq!(
            drifted(&claim("a", Some("n1"), "True")),
            Some(("a".into(), "n1".into()))
        );
        assert_eq!(drifted(&claim("a", Some("n1"), "False")), None);
        assert_eq!(drifted(&claim("a", None, "True")), None);
    }

    #[test]
    fn a_change_is_reported_only_when_the_set_moves() {
        let mut now = Drifted::new();
        assert!(applied(&mut now, &claim("a", Some("n1"), "True")));
        assert!(!applied(&mut now, &claim("a", Some("n1"), "True")));
        assert!(!applied(&mut now, &claim("b", Some("n2"), "False")));
        assert!(applied(&mut now, &claim("a", Some("n1"), "False")));
        assert!(now.is_empty());
    }
}
