//! Holding through Karpenter's own NodePool disruption budgets
//! (`--hold-mechanism budget`): while a window holds a NodePool's nodes, the
//! pool carries one more budget, `{nodes: "0", reasons: [Underutilized,
//! Empty]}`, which stops its consolidation and lets drift go on; when the
//! window closes, exactly that entry comes off. One write per pool each way,
//! whatever its number of nodes.
//!
//! `spec.disruption.budgets` is an atomic list (server-side apply cannot own
//! one entry), and an entry has no name: node-holder's entry is recognised by
//! its value. The owner may have the very same entry, so what the record keeps
//! is how many copies the owner had when node-holder added one: the pool
//! carries node-holder's entry while it has more copies than that, and
//! removing it removes the last copy. The owner's entries are never dropped,
//! changed or reordered.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::selector::NodeScope;

/// Label every node of a Karpenter NodePool carries: the pool's name.
pub const NODEPOOL_LABEL: &str = "karpenter.sh/nodepool";

/// How node-holder holds nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mechanism {
    /// The hold annotation on every node in scope (one PATCH a node).
    #[default]
    Annotation,
    /// A budget on every NodePool in scope that stops its consolidation
    /// (one PATCH a pool); drift goes on. The webhook still holds each new
    /// node until its pool carries the budget.
    Budget,
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mechanism::Annotation => "annotation",
            Mechanism::Budget => "budget",
        })
    }
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

/// The budget entry node-holder adds to a NodePool.
pub fn entry() -> Value {
    json!({"nodes": "0", "reasons": ["Underutilized", "Empty"]})
}

/// What node-holder added to one NodePool, as the record keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Added {
    /// Copies of node-holder's entry the owner's budgets had when it added
    /// its own.
    pub owner_copies: usize,
}

/// What node-holder added, by NodePool name.
pub type AddedBudgets = BTreeMap<String, Added>;

fn copies(budgets: &[Value]) -> usize {
    let ours = entry();
    budgets.iter().filter(|b| **b == ours).count()
}

/// Whether `budgets` carry node-holder's entry, added as `added` says.
pub fn carries(budgets: &[Value], added: &Added) -> bool {
    copies(budgets) > added.owner_copies
}

/// `budgets` with node-holder's entry at the end, and what to record.
pub fn add(budgets: &[Value]) -> (Vec<Value>, Added) {
    let added = Added {
        owner_copies: copies(budgets),
    };
    let mut with = budgets.to_vec();
    with.push(entry());
    (with, added)
}

/// `budgets` without node-holder's entry (its last copy); `None` when they
/// do not carry it (nothing to write).
pub fn remove(budgets: &[Value], added: &Added) -> Option<Vec<Value>> {
    if !carries(budgets, added) {
        return None;
    }
    let ours = entry();
    let last = budgets.iter().rposition(|b| *b == ours)?;
    let mut without = budgets.to_vec();
    without.remove(last);
    Some(without)
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

    fn owner() -> Vec<Value> {
        vec![
            json!({"nodes": "10%"}),
            json!({"nodes": "0", "schedule": "0 9 * * mon-fri", "duration": "8h"}),
        ]
    }

    #[test]
    fn adding_then_removing_leaves_the_owners_budgets_as_they_were() {
        let (with, added) = add(&owner());
        assert_eq!(with.len(), 3);
        assert_eq!(with[..2], owner()[..]);
        assert!(carries(&with, &added));
        assert!(!carries(&owner(), &added));
        assert_eq!(remove(&with, &added), Some(owner()));
        assert_eq!(remove(&owner(), &added), None, "nothing of node-holder's");
    }

    #[test]
    fn an_owners_identical_entry_is_never_taken_for_node_holders() {
        let mut theirs = owner();
        theirs.insert(0, entry());
        let (with, added) = add(&theirs);
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
        let (mut with, added) = add(&owner());
        // The owner (or a GitOps controller) adds an entry and drops one.
        with.insert(0, json!({"nodes": "5"}));
        with.remove(1);
        let without = remove(&with, &added).unwrap();
        assert_eq!(without, [json!({"nodes": "5"}), owner()[1].clone()]);
        // The owner took node-holder's entry out: nothing left to remove.
        let (with, added) = add(&owner());
        let taken_out: Vec<Value> = with.into_iter().filter(|b| *b != entry()).collect();
        assert_eq!(remove(&taken_out, &added), None);
    }

    #[test]
    fn the_patch_tests_the_resource_version_and_sets_the_whole_list() {
        let pool = json!({"metadata": {"resourceVersion": "7"}, "spec": {"disruption": {"budgets": owner()}}});
        let (with, _) = add(&budgets_of(&pool));
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
            set_budgets(&bare, "1", vec![entry()])[1],
            json!({"op": "add", "path": "/spec/disruption", "value": {"budgets": [entry()]}})
        );
    }
}
