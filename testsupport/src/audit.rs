//! node-holder's PATCHes as the API server's audit log records them, read
//! once: what the tests count, and what the lab's benches count by phase
//! (`node-holder-lab`'s `measure::audit`).

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
    /// The resource patched (`nodes`).
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
