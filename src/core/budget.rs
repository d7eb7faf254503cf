//! Holding through Karpenter's own NodePool disruption budgets
//! (`--hold-mechanism budget`): while a window holds a NodePool's nodes, the
//! pool carries one more budget, `{nodes: "0", reasons: [Underutilized,
//! Empty]}`, which stops its consolidation and lets drift go on; when the
//! window closes, exactly that entry comes off. One write per pool each way,
//! whatever its number of nodes, and one more each time the deadline passes
//! the entry's end. The entry ends by itself (Karpenter's own `schedule` and
//! `duration`, [`self_ending_entry`]) shortly after the deadline it was
//! written for, so a pool is never held for long by a node-holder that is
//! gone.
//!
//! `spec.disruption.budgets` is an atomic list (server-side apply cannot own
//! one entry), and an entry has no name: node-holder's entry is recognised by
//! its value. The owner may have the very same entry, so what the record keeps
//! is how many copies the owner had when node-holder added one: the pool
//! carries node-holder's entry while it has more copies than that, and
//! removing it removes the last copy. The owner's entries are never dropped,
//! changed or reordered.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::selector::NodeScope;

/// Label every node of a Karpenter NodePool carries: the pool's name.
pub const NODEPOOL_LABEL: &str = "karpenter.sh/nodepool";

/// How node-holder holds nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, strum::Display)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum Mechanism {
    /// The hold annotation on every node in scope (one PATCH a node).
    #[default]
    Annotation,
    /// A budget on every NodePool in scope that stops its consolidation
    /// (one PATCH a pool); drift goes on. The webhook still holds each new
    /// node until its pool carries the budget.
    Budget,
}

impl Mechanism {
    /// The NodePools held by budget: those `selector` (kubectl syntax)
    /// selects with the budget mechanism, `None` with annotations; the
    /// selector's parse error otherwise.
    pub fn pools(self, selector: &str) -> Result<Option<NodeScope>, String> {
        match self {
            Mechanism::Annotation => Ok(None),
            Mechanism::Budget => NodeScope::parse(selector).map(Some),
        }
    }
}

/// The budget entry node-holder added before its entries ended by
/// themselves (records of older versions): always active.
pub fn entry() -> Value {
    json!({"nodes": "0", "reasons": ["Underutilized", "Empty"]})
}

/// node-holder's budget entry for a hold from `now` until at least `until`,
/// and when Karpenter stops honouring it: Karpenter's own `schedule` (cron,
/// UTC, to the minute) and `duration` (whole minutes), so that the entry
/// ends by itself even if node-holder is gone.
///
/// Karpenter holds a budget active while a schedule hit lies in
/// `(now - duration, now]`. The schedule hits once a year, at the minute
/// before `now` (a minute early, so that a Karpenter whose clock is up to a
/// minute behind ours sees it active at once); the duration runs from that
/// hit past `until`. Cron cannot say "once" or "this year", and needs none
/// of it: next year's hit is eleven months past any window (a manual hold
/// is at most a year, and then the entry stays active throughout). Time
/// zones do not arise: Karpenter reads the schedule in UTC, as it is written.
pub fn self_ending_entry(now: Timestamp, until: Timestamp) -> (Value, Timestamp) {
    let early = now.as_second().saturating_sub(60);
    let start_second = early.saturating_sub(early.rem_euclid(60));
    let start = Timestamp::from_second(start_second).unwrap_or(now);
    let span = until.as_second().saturating_sub(start_second).max(60);
    let minutes = span.saturating_add(59) / 60;
    let ends = Timestamp::from_second(start_second.saturating_add(minutes.saturating_mul(60)))
        .unwrap_or(Timestamp::MAX);
    let at = jiff::tz::Offset::UTC.to_datetime(start);
    let schedule = format!(
        "{} {} {} {} *",
        at.minute(),
        at.hour(),
        at.day(),
        at.month()
    );
    let entry = json!({
        "nodes": "0",
        "reasons": ["Underutilized", "Empty"],
        "schedule": schedule,
        "duration": format!("{minutes}m"),
    });
    (entry, ends)
}

/// How far past the hold's deadline node-holder's entry runs: a quarter of
/// the hold, between a minute and five. The deadline moving less
/// than that needs no new write; node-holder takes the entry off at the
/// deadline itself, so this only bounds how long Karpenter honours it once
/// node-holder is gone.
pub fn entry_slack(hold: Duration) -> Duration {
    (hold / 4).clamp(Duration::from_secs(60), Duration::from_secs(300))
}

/// What node-holder added to one NodePool, as the record keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Added {
    /// Copies of node-holder's entry the owner's budgets had when it added
    /// its own.
    owner_copies: usize,
    /// The entry node-holder added; absent in records of older versions,
    /// whose entry was [`entry`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<Value>,
    /// When Karpenter stops honouring it (`None`: never, the old entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ends: Option<Timestamp>,
}

impl Added {
    /// The entry node-holder added, as it reads in the pool's list.
    fn ours(&self) -> Value {
        self.entry.clone().unwrap_or_else(entry)
    }

    /// Whether the entry still holds at `until` (else it is renewed).
    pub fn holds_until(&self, until: Timestamp) -> bool {
        self.ends.is_some_and(|ends| ends >= until)
    }
}

/// What node-holder added, by NodePool name.
pub type AddedBudgets = BTreeMap<String, Added>;

fn copies(budgets: &[Value], ours: &Value) -> usize {
    budgets.iter().filter(|b| *b == ours).count()
}

/// Whether `budgets` carry node-holder's entry, added as `added` says.
pub fn carries(budgets: &[Value], added: &Added) -> bool {
    copies(budgets, &added.ours()) > added.owner_copies
}

/// `budgets` with `(entry, ends)` (from [`self_ending_entry`]) at the end,
/// and what to record.
pub fn add(budgets: &[Value], (entry, ends): (Value, Timestamp)) -> (Vec<Value>, Added) {
    let added = Added {
        owner_copies: copies(budgets, &entry),
        entry: Some(entry.clone()),
        ends: Some(ends),
    };
    let mut with = budgets.to_vec();
    with.push(entry);
    (with, added)
}

/// `budgets` without node-holder's entry (its last copy); `None` when they
/// do not carry it (nothing to write).
pub fn remove(budgets: &[Value], added: &Added) -> Option<Vec<Value>> {
    if !carries(budgets, added) {
        return None;
    }
    let ours = added.ours();
    let last = budgets.iter().rposition(|b| *b == ours)?;
    let mut without = budgets.to_vec();
    without.remove(last);
    Some(without)
}

/// `budgets` with node-holder's entry replaced by `(entry, ends)`, in one
/// write, and what to record; `None` when they do not carry it.
pub fn renew(
    budgets: &[Value],
    added: &Added,
    (entry, ends): (Value, Timestamp),
) -> Option<(Vec<Value>, Added)> {
    let without = remove(budgets, added)?;
    Some(add(&without, (entry, ends)))
}

/// Annotation on a NodePool while it carries node-holder's entry: when the
/// entry ends (RFC 3339), so that the pool itself says who holds it and
/// until when.
pub const BUDGET_MARKER: &str = "node-holder.dev/budget-until";

/// JSON Patch operations that set the pool's [`BUDGET_MARKER`] to `until`,
/// or remove it (`None`) if the pool has it; `annotations` are the pool's.
pub fn marker_ops(
    annotations: Option<&BTreeMap<String, String>>,
    until: Option<Timestamp>,
) -> Vec<Value> {
    let path = "/metadata/annotations/node-holder.dev~1budget-until";
    match (annotations, until) {
        (Some(_), Some(until)) => {
            vec![json!({"op": "add", "path": path, "value": until.to_string()})]
        }
        (None, Some(until)) => vec![json!({
            "op": "add",
            "path": "/metadata/annotations",
            "value": {BUDGET_MARKER: until.to_string()},
        })],
        (Some(annotations), None) if annotations.contains_key(BUDGET_MARKER) => {
            vec![json!({"op": "remove", "path": path})]
        }
        _ => Vec::new(),
    }
}

/// A NodePool's budgets as the object has them (`spec.disruption.budgets`);
/// none is an empty list.
pub fn budgets_of(pool: &Value) -> Vec<Value> {
    pool.pointer("/spec/disruption/budgets")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// The JSON Patch that sets a NodePool's budgets to `budgets`, if its
/// `resourceVersion` is still `resource_version`: a read-modify-write of the
/// whole list, refused when someone wrote the pool since.
pub fn set_budgets(pool: &Value, resource_version: &str, budgets: Vec<Value>) -> Value {
    let set = if pool
        .pointer("/spec/disruption")
        .is_some_and(Value::is_object)
    {
        json!({"op": "add", "path": "/spec/disruption/budgets", "value": budgets})
    } else {
        json!({"op": "add", "path": "/spec/disruption", "value": {"budgets": budgets}})
    };
    json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
        set
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn owner() -> Vec<Value> {
        vec![
            json!({"nodes": "10%"}),
            json!({"nodes": "0", "schedule": "0 9 * * mon-fri", "duration": "8h"}),
        ]
    }

    /// node-holder's entry for a hold from 12:00:30 to 12:20.
    fn ours() -> (Value, Timestamp) {
        self_ending_entry(at("2026-11-22T12:00:30Z"), at("2026-11-22T12:20:00Z"))
    }

    #[test]
    fn the_entry_starts_the_minute_before_now_and_runs_past_the_deadline_in_whole_minutes() {
        let (entry, ends) = ours();
        assert_eq!(
            entry,
            json!({"nodes": "0", "reasons": ["Underutilized", "Empty"],
                   "schedule": "59 11 22 11 *", "duration": "21m"})
        );
        assert_eq!(ends, at("2026-11-22T12:20:00Z"));
        // A deadline inside a minute rounds up; one already past still runs
        // a minute; the year's last minute wraps nothing.
        let (entry, ends) =
            self_ending_entry(at("2026-12-31T23:59:59Z"), at("2027-01-01T00:00:01Z"));
        assert_eq!(entry["schedule"], "58 23 31 12 *");
        assert_eq!(entry["duration"], "3m");
        assert_eq!(ends, at("2027-01-01T00:01:00Z"));
        let (entry, _) = self_ending_entry(at("2026-11-22T12:00:00Z"), at("2026-11-22T11:00:00Z"));
        assert_eq!(entry["duration"], "1m");
        // A year-long manual hold: one duration, in minutes.
        let (entry, _) = self_ending_entry(at("2026-11-22T12:00:00Z"), at("2027-11-22T12:00:00Z"));
        assert_eq!(entry["duration"], "525601m");
    }

    #[test]
    fn the_slack_is_a_quarter_of_the_hold_between_one_and_five_minutes() {
        let s = Duration::from_secs;
        assert_eq!(entry_slack(s(60)), s(60));
        assert_eq!(entry_slack(s(600)), s(150));
        assert_eq!(entry_slack(s(7200)), s(300));
    }

    #[test]
    fn adding_then_removing_leaves_the_owners_budgets_as_they_were() {
        let (with, added) = add(&owner(), ours());
        assert_eq!(with.len(), 3);
        assert_eq!(with[..2], owner()[..]);
        assert!(carries(&with, &added));
        assert!(!carries(&owner(), &added));
        assert_eq!(remove(&with, &added), Some(owner()));
        assert_eq!(remove(&owner(), &added), None, "nothing of node-holder's");
    }

    #[test]
    fn renewing_replaces_node_holders_entry_in_one_write_and_keeps_the_owners() {
        let (with, added) = add(&owner(), ours());
        assert!(added.holds_until(at("2026-11-22T12:20:00Z")));
        assert!(!added.holds_until(at("2026-11-22T12:25:00Z")));
        let later = self_ending_entry(at("2026-11-22T12:10:00Z"), at("2026-11-22T12:40:00Z"));
        let (renewed, now) = renew(&with, &added, later.clone()).unwrap();
        assert_eq!(renewed[..2], owner()[..]);
        assert_eq!(renewed[2], later.0);
        assert!(carries(&renewed, &now) && !carries(&renewed, &added));
        assert_eq!(remove(&renewed, &now), Some(owner()));
        assert_eq!(renew(&owner(), &added, later), None, "nothing to renew");
    }

    #[test]
    fn an_entry_from_an_older_version_is_still_recognised_and_renewed() {
        let old = Added {
            owner_copies: 0,
            entry: None,
            ends: None,
        };
        let mut with = owner();
        with.push(entry());
        assert!(carries(&with, &old));
        assert!(
            !old.holds_until(at("2026-11-22T12:00:00Z")),
            "it never ends: renew it"
        );
        let (renewed, _) = renew(&with, &old, ours()).unwrap();
        assert_eq!(renewed, [owner(), vec![ours().0]].concat());
        // The record as older versions wrote it reads.
        let read: Added = serde_json::from_value(json!({"ownerCopies": 1})).unwrap();
        assert_eq!(read.ours(), entry());
    }

    #[test]
    fn an_owners_identical_entry_is_never_taken_for_node_holders() {
        let mut theirs = owner();
        theirs.insert(0, ours().0);
        let (with, added) = add(&theirs, ours());
        assert_eq!(added.owner_copies, 1);
        assert!(carries(&with, &added));
        assert_eq!(remove(&with, &added), Some(theirs.clone()));
        // Recorded, but the write never happened (a crash in between): the
        // owner's copy stays.
        assert!(!carries(&theirs, &added));
        assert_eq!(remove(&theirs, &added), None);
    }

    #[test]
    fn the_owners_edits_while_held_are_kept() {
        let (mut with, added) = add(&owner(), ours());
        // The owner (or a GitOps controller) adds an entry and drops one.
        with.insert(0, json!({"nodes": "5"}));
        with.remove(1);
        let without = remove(&with, &added).unwrap();
        assert_eq!(without, [json!({"nodes": "5"}), owner()[1].clone()]);
        // The owner took node-holder's entry out: nothing left to remove.
        let (with, added) = add(&owner(), ours());
        let taken_out: Vec<Value> = with.into_iter().filter(|b| *b != ours().0).collect();
        assert_eq!(remove(&taken_out, &added), None);
    }

    #[test]
    fn the_marker_says_until_when_and_goes_with_the_entry() {
        let until = at("2026-11-22T12:21:00Z");
        let none: Option<&BTreeMap<String, String>> = None;
        assert_eq!(
            marker_ops(none, Some(until)),
            [json!({"op": "add", "path": "/metadata/annotations",
                    "value": {"node-holder.dev/budget-until": "2026-11-22T12:21:00Z"}})]
        );
        let mut theirs = BTreeMap::from([("team".to_string(), "a".to_string())]);
        assert_eq!(
            marker_ops(Some(&theirs), Some(until)),
            [
                json!({"op": "add", "path": "/metadata/annotations/node-holder.dev~1budget-until",
                    "value": "2026-11-22T12:21:00Z"})
            ]
        );
        assert!(
            marker_ops(Some(&theirs), None).is_empty(),
            "nothing to remove"
        );
        theirs.insert(BUDGET_MARKER.into(), until.to_string());
        assert_eq!(
            marker_ops(Some(&theirs), None),
            [
                json!({"op": "remove", "path": "/metadata/annotations/node-holder.dev~1budget-until"})
            ]
        );
    }

    #[test]
    fn the_patch_tests_the_resource_version_and_sets_the_whole_list() {
        let pool = json!({"metadata": {"resourceVersion": "7"}, "spec": {"disruption": {"budgets": owner()}}});
        let (with, _) = add(&budgets_of(&pool), ours());
        let patch = set_budgets(&pool, "7", with.clone());
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "add", "path": "/spec/disruption/budgets", "value": with}
            ])
        );
        let bare = json!({"metadata": {"resourceVersion": "1"}, "spec": {}});
        assert!(budgets_of(&bare).is_empty());
        assert_eq!(
            set_budgets(&bare, "1", vec![ours().0])[1],
            json!({"op": "add", "path": "/spec/disruption", "value": {"budgets": [ours().0]}})
        );
    }
}
