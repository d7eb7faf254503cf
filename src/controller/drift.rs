//! Drift: the nodes whose NodeClaim Karpenter marked `Drifted`, which the window and schedule do
//! not hold ([`crate::core::plan::Planner::drifted`]). Only with Karpenter v1's hold
//! (`karpenter.sh/do-not-disrupt`), the one that blocks drift. Without Karpenter's API (404) or the
//! permission (403) the watch says so once and goes on empty: drifted nodes are then held.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use kube::runtime::watcher;
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

use super::compact::{Compact, watch_compact};
use super::watches::watch_refused;
use crate::retry::optional_api_backoff;

/// The watch and what it has seen; dropping it stops the watch.
pub struct DriftWatch {
    /// Each drifted NodeClaim's node, by the claim's name.
    claims: Compact<Box<str>>,
    /// Ticks when a NodeClaim drifts or a drifted one goes.
    pub changes: watch::Receiver<u64>,
    _task: AbortOnDropHandle<()>,
}

impl super::WindowTask {
    /// The nodes marked drifted now (none without the watch).
    pub(super) fn drifted(&self) -> BTreeSet<String> {
        let Some(watch) = &self.drift else {
            return BTreeSet::new();
        };
        watch
            .claims
            .read(|claims| claims.values().map(|node| node.to_string()).collect())
    }
}

pub fn watch_drift(client: kube::Client) -> DriftWatch {
    let claim = GroupVersionKind::gvk("karpenter.sh", "v1", "NodeClaim");
    let api: Api<DynamicObject> = Api::all_with(
        client,
        &ApiResource::from_gvk_with_plural(&claim, "nodeclaims"),
    );
    let (tick, changes) = watch::channel(0u64);
    let watched = watch_compact(
        api,
        watcher::Config::default(),
        optional_api_backoff(),
        Arc::new(tick),
        drifted_node,
        refused,
    );
    DriftWatch {
        claims: watched.store,
        changes,
        _task: watched.task,
    }
}

/// Says once (`said`) why the watch cannot list; other failures each time.
fn refused(err: &watcher::Error, said: &AtomicBool) {
    let why = match watch_refused(err) {
        Some(404) => "Karpenter v1's NodeClaims are not served",
        Some(403) => "may not list NodeClaims (grant webhook-config/rbac.yaml's nodeclaims rule)",
        _ => {
            tracing::warn!(error = %err, "NodeClaim watch failed; retrying");
            return;
        }
    };
    if !said.swap(true, Ordering::AcqRel) {
        tracing::info!(error = %err, "{why}: drifted nodes are held like the others; retrying");
    }
}

/// The NodeClaim's node when it has one and condition `Drifted` is `True`.
fn drifted_node(claim: &DynamicObject) -> Option<Box<str>> {
    let status = claim.data.get("status")?;
    let node = status.get("nodeName")?.as_str()?;
    let conditions = status.get("conditions")?.as_array()?;
    conditions
        .iter()
        .any(|c| c["type"] == "Drifted" && c["status"] == "True")
        .then(|| node.into())
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
            drifted_node(&claim("a", Some("n1"), "True")).as_deref(),
            Some("n1")
        );
        assert_eq!(drifted_node(&claim("a", Some("n1"), "False")), None);
        assert_eq!(drifted_node(&claim("a", None, "True")), None);
    }
}
