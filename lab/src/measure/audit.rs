//! node-holder's PATCHes as the API server's audit log records them (read by
//! [`testsupport::audit`], re-exported here), counted by phase (when the API
//! server received each) or by the instant each completed.

use std::collections::HashSet;

use jiff::Timestamp;

pub use testsupport::audit::*;

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
