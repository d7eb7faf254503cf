//! node-holder's PATCHes as the API server's audit log records them: one
//! reading of the log, then counted by phase (when the API server received
//! each) or by the instant each completed.

use std::collections::HashSet;

use anyhow::{Context, Result};
use jiff::Timestamp;
use serde_json::Value;
use testenv::ControlPlane;

/// One PATCH by node-holder's identity that the API server answered.
pub struct AuditPatch {
    /// When the API server received it (`requestReceivedTimestamp`).
    pub at: Timestamp,
    /// When its answer completed (`stageTimestamp`).
    pub completed: Option<Timestamp>,
    /// The resource patched (`nodes`, `nodepools`).
    pub resource: String,
    /// The object patched.
    pub name: String,
    /// The HTTP status of the answer (0 when the event has none).
    pub code: i64,
    /// It only rewrote the node's `node-holder.dev/held-until`.
    pub stamp: bool,
}

impl AuditPatch {
    fn of(event: &Value) -> Result<AuditPatch> {
        let text = |field: &Value| field.as_str().unwrap_or("").to_string();
        Ok(AuditPatch {
            at: event["requestReceivedTimestamp"]
                .as_str()
                .context("requestReceivedTimestamp")?
                .parse()
                .context("requestReceivedTimestamp")?,
            completed: event["stageTimestamp"]
                .as_str()
                .and_then(|t| t.parse().ok()),
            resource: text(&event["objectRef"]["resource"]),
            name: text(&event["objectRef"]["name"]),
            code: event["responseStatus"]["code"].as_i64().unwrap_or(0),
            stamp: is_stamp(event),
        })
    }
}

/// Every PATCH of one of `resources` by node-holder's identity
/// (`testenv::NODE_HOLDER_USER`) that the API server answered, in the
/// order it received them.
pub fn node_holder_patches(cp: &ControlPlane, resources: &[&str]) -> Result<Vec<AuditPatch>> {
    let mut patches = Vec::new();
    for event in cp.audit_events().context("reading the audit log")? {
        let resource = event["objectRef"]["resource"].as_str().unwrap_or("");
        if event["user"]["username"] != testenv::NODE_HOLDER_USER
            || event["verb"] != "patch"
            || !resources.contains(&resource)
            || event["stage"] != "ResponseComplete"
        {
            continue;
        }
        patches.push(AuditPatch::of(&event)?);
    }
    patches.sort_by_key(|p| p.at);
    Ok(patches)
}

/// The PATCHes the API server received from `from` (included) until `to`.
pub fn between(patches: &[AuditPatch], from: Timestamp, to: Timestamp) -> Vec<&AuditPatch> {
    patches
        .iter()
        .filter(|p| p.at >= from && p.at < to)
        .collect()
}

/// How many PATCHes of `resource` completed from `from` until `to` (both
/// included).
pub fn completed_within(
    patches: &[AuditPatch],
    resource: &str,
    from: Timestamp,
    to: Timestamp,
) -> usize {
    patches
        .iter()
        .filter(|p| p.resource == resource)
        .filter(|p| p.completed.is_some_and(|at| at >= from && at <= to))
        .count()
}

/// How many distinct objects `patches` patched.
pub fn unique(patches: &[&AuditPatch]) -> usize {
    patches
        .iter()
        .map(|p| p.name.as_str())
        .collect::<HashSet<_>>()
        .len()
}

/// `node PATCH n (m nodes, k not 2xx) received over s: r/s`.
pub fn describe(patches: &[&AuditPatch]) -> String {
    let (Some(first), Some(last)) = (patches.first(), patches.last()) else {
        return "node PATCH 0".to_string();
    };
    let span = last.at.duration_since(first.at).as_secs_f64();
    let failed = patches
        .iter()
        .filter(|p| !(200..300).contains(&p.code))
        .count();
    format!(
        "node PATCH {} ({} nodes, {failed} not 2xx) received over {span:.2} s: {:.0}/s",
        patches.len(),
        unique(patches),
        if span > 0.0 {
            (patches.len() - 1) as f64 / span
        } else {
            0.0
        }
    )
}

/// Whether an audit event's JSON Patch (logged at Request level for
/// node-holder: docs/audit-policy.yaml) only rewrites `held-until`: a `test`
/// of the marker and the stamp's `add`.
pub fn is_stamp(event: &Value) -> bool {
    let Some(ops) = event["requestObject"].as_array() else {
        return false;
    };
    let stamp = |op: &Value| match op["op"].as_str() {
        Some("test") => op["path"] == "/metadata/labels/node-holder.dev~1held",
        Some("add") => {
            op["path"] == "/metadata/annotations/node-holder.dev~1held-until"
                || (op["path"] == "/metadata/annotations"
                    && op["value"].as_object().is_some_and(|map| {
                        map.keys().all(|key| key == "node-holder.dev/held-until")
                    }))
        }
        _ => false,
    };
    !ops.is_empty() && ops.iter().all(stamp)
}
