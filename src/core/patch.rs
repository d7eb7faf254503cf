//! The one patch builder: JSON Patches that put holds on a node and take node-holder's off again.
//! `add` to `/metadata/annotations/<key>` fails when the map is absent, and adding the whole map
//! when it exists would wipe the other keys; keys are escaped as JSON Pointer tokens. Patches on
//! existing nodes carry `test`s (docs/architecture.md, "Patching").

use std::collections::BTreeMap;

use jiff::Timestamp;
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, TestOperation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::holds::{
    HELD_KEYS_ANNOTATION, HELD_UNTIL_ANNOTATION, Hold, Holds, MARKER_LABEL, MARKER_VALUE, Preset,
    held_keys, is_marked, listed_keys,
};
use super::node::{NodeFields, NodeMeta, labels};
use super::selector::NodeScope;

/// The patch that adds every configured hold the node lacks, marks the node and
/// lists the hold keys node-holder added. A hold key the node already has, with
/// any value, is left alone and not claimed. Empty when nothing is missing.
pub fn add_holds(meta: &impl NodeFields, holds: &Holds) -> (Patch, Vec<Hold>) {
    let missing: Vec<Hold> = holds
        .iter()
        .filter(|hold| meta.annotation(&hold.key).is_none())
        .cloned()
        .collect();
    if missing.is_empty() {
        return (Patch(Vec::new()), missing);
    }

    let mut held_keys: Vec<String> = held_keys(meta).into_iter().map(str::to_string).collect();
    for hold in &missing {
        if !held_keys.contains(&hold.key) {
            held_keys.push(hold.key.clone());
        }
    }
    let mut to_add: BTreeMap<String, String> = missing
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect();
    to_add.insert(HELD_KEYS_ANNOTATION.to_string(), held_keys.join(","));

    let mut ops = map_entries("annotations", meta.has_annotations(), to_add);
    if !is_marked(meta) {
        let marker = BTreeMap::from([(MARKER_LABEL.to_string(), MARKER_VALUE.to_string())]);
        ops.extend(map_entries("labels", meta.has_labels(), marker));
    }
    (Patch(ops), missing)
}

/// [`add_holds`] for a node that already exists (the backstop), guarded by
/// `test /metadata/resourceVersion`: its `add`s overwrite what appeared since
/// the read, and JSON Patch cannot test that a key is absent.
pub fn hold_existing(meta: &impl NodeFields, holds: &Holds) -> (Patch, Vec<Hold>) {
    let (Patch(mut ops), added) = add_holds(meta, holds);
    if let (false, Some(version)) = (ops.is_empty(), meta.resource_version()) {
        let path = PointerBuf::from_tokens(["metadata", "resourceVersion"]);
        ops.insert(0, test(path, version));
    }
    (Patch(ops), added)
}

/// `patch` (a hold of `meta`, possibly empty) with [`HELD_UNTIL_ANNOTATION`]
/// set to `until` rounded down to the second (never later than the hold's end).
/// An empty `patch` first `test`s node-holder's marker: only a node it holds is
/// stamped, and a release since the node was read makes the stamp fail.
pub fn with_held_until(meta: &impl NodeFields, Patch(mut ops): Patch, until: Timestamp) -> Patch {
    if ops.is_empty() {
        let path = PointerBuf::from_tokens(["metadata", "labels", MARKER_LABEL]);
        ops.push(test(path, MARKER_VALUE));
    }
    // A hold patch adds the annotations map first when the node had none.
    let map_exists =
        meta.has_annotations() || !ops.iter().all(|op| matches!(op, PatchOperation::Test(_)));
    let stamp = floor_seconds(until).to_string();
    let stamp = BTreeMap::from([(HELD_UNTIL_ANNOTATION.to_string(), stamp)]);
    ops.extend(map_entries("annotations", map_exists, stamp));
    Patch(ops)
}

/// `t` rounded down to a whole second.
pub fn floor_seconds(t: Timestamp) -> Timestamp {
    Timestamp::from_second(t.as_second()).unwrap_or(t)
}

/// The patch that takes node-holder's holds off a node, and what it does.
#[derive(Debug, Clone, PartialEq)]
pub struct Release {
    pub patch: Patch,
    /// Hold keys removed.
    pub removed: Vec<String>,
    /// Hold keys node-holder added whose value someone changed since: they are
    /// theirs now, left in place; only node-holder's listing of them goes.
    pub left: Vec<String>,
}

/// The patch that removes the holds node-holder listed in `hold-keys` whose value is still the one
/// it set, then that list, `held-until` and the marker. Every value removed or relied on is
/// `test`ed first, so a concurrent edit makes the API server reject the whole patch (the caller
/// reads the node again). A hold it did not list is never touched. Empty when the node carries
/// nothing of node-holder's.
pub fn release_holds(meta: &impl NodeFields, holds: &Holds) -> Release {
    let mut ops = Vec::new();
    let mut take = |map: &str, key: &str, value: &str, remove_it: bool| {
        let path = PointerBuf::from_tokens(["metadata", map, key]);
        ops.push(test(path.clone(), value));
        if remove_it {
            ops.push(remove(path));
        }
    };
    let (mut removed, mut left) = (Vec::new(), Vec::new());
    if let Some(list) = meta.annotation(HELD_KEYS_ANNOTATION) {
        for key in listed_keys(list) {
            // Already gone: nothing to remove, and nothing to test for.
            let Some(current) = meta.annotation(key) else {
                continue;
            };
            let ours = value_set_by_node_holder(key, holds).as_deref() == Some(current);
            take("annotations", key, current, ours);
            if ours { &mut removed } else { &mut left }.push(key.to_string());
        }
        take("annotations", HELD_KEYS_ANNOTATION, list, true);
    }
    if let Some(stamp) = meta.annotation(HELD_UNTIL_ANNOTATION) {
        take("annotations", HELD_UNTIL_ANNOTATION, stamp, true);
    }
    if let Some(marker) = meta.label(MARKER_LABEL) {
        take("labels", MARKER_LABEL, marker, true);
    }
    Release {
        patch: Patch(ops),
        removed,
        left,
    }
}

/// What a store of thousands of nodes keeps of `meta`: what the patches and the plan read, and
/// whether the node selector selects it, so that every decision made from it is the one made from
/// the whole. A map left empty is kept (empty, not absent): holds go into it, never as a whole new
/// map that would replace the others' keys. `None` without a name or a creation time.
pub fn keep_what_patches_read(
    meta: &ObjectMeta,
    holds: &Holds,
    scope: &NodeScope,
) -> Option<NodeMeta> {
    let listed = held_keys(meta);
    NodeMeta::read(
        meta,
        scope.matches(labels(meta)),
        |key| key == MARKER_LABEL,
        |key| {
            key == HELD_KEYS_ANNOTATION
                || key == HELD_UNTIL_ANNOTATION
                || holds.iter().any(|h| h.key == key)
                || listed.contains(&key)
        },
    )
}

/// The value node-holder puts under `key`: the configured one, else a
/// preset's (so holds placed before the configuration moved to another preset,
/// e.g. Karpenter v0 to v1, are still released). `None`: unknown, leave it.
fn value_set_by_node_holder(key: &str, holds: &Holds) -> Option<String> {
    let configured = holds.iter().find(|h| h.key == key).cloned();
    configured
        .or_else(|| Preset::ALL.iter().map(|p| p.hold()).find(|h| h.key == key))
        .map(|h| h.value)
}

/// Operations that set `entries` in `/metadata/<map>`: one `add` per key when
/// the map exists, one `add` of a new map when it does not.
fn map_entries(map: &str, exists: bool, entries: BTreeMap<String, String>) -> Vec<PatchOperation> {
    let entries = entries.into_iter().map(|(k, v)| (k, Value::String(v)));
    if !exists {
        let path = PointerBuf::from_tokens(["metadata", map]);
        return vec![add(path, Value::Object(entries.collect()))];
    }
    let path = |key: &str| PointerBuf::from_tokens(["metadata", map, key]);
    entries.map(|(key, value)| add(path(&key), value)).collect()
}

fn add(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path, value })
}

fn test(path: PointerBuf, value: &str) -> PatchOperation {
    PatchOperation::Test(TestOperation {
        path,
        value: Value::String(value.to_string()),
    })
}

fn remove(path: PointerBuf) -> PatchOperation {
    PatchOperation::Remove(RemoveOperation { path })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::holds::{Preset, held_until_stamp};
    use serde_json::json;

    fn meta(value: Value) -> ObjectMeta {
        serde_json::from_value(value).unwrap()
    }

    fn apply(meta_json: Value, patch: &Patch) -> Value {
        let mut doc = json!({ "metadata": meta_json });
        json_patch::patch(&mut doc, patch).expect("the patch applies");
        doc["metadata"].take()
    }

    fn default_holds() -> Holds {
        Holds::new(&[Preset::KarpenterV1], &[]).unwrap()
    }

    #[test]
    fn a_node_without_annotations_or_labels_gets_both_maps() {
        let original = json!({"name": "n1"});
        let (patch, added) = add_holds(&meta(original.clone()), &default_holds());
        assert_eq!(added.len(), 1);
        assert_eq!(
            serde_json::to_value(&patch).unwrap(),
            json!([
                {"op": "add", "path": "/metadata/annotations", "value": {
                    "karpenter.sh/do-not-disrupt": "true",
                    "node-holder.dev/hold-keys": "karpenter.sh/do-not-disrupt"}},
                {"op": "add", "path": "/metadata/labels", "value": {"node-holder.dev/held": "true"}},
            ])
        );
        let result = apply(original, &patch);
        assert_eq!(result["annotations"]["karpenter.sh/do-not-disrupt"], "true");
    }

    #[test]
    fn existing_keys_are_kept_and_slashes_and_tildes_are_escaped() {
        let original = json!({"name": "n1",
            "annotations": {"a/b": "1", "karpenter.sh/do-not-consolidate": "x"},
            "labels": {"kubernetes.io/hostname": "n1"}});
        let (patch, _) = add_holds(&meta(original.clone()), &default_holds());
        let paths: Vec<String> = serde_json::to_value(&patch)
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .map(|op| op["path"].as_str().unwrap().to_string())
            .collect();
        assert!(
            paths
                .iter()
                .all(|p| !p.ends_with("/annotations") && !p.ends_with("/labels")),
            "{paths:?}"
        );
        assert!(
            paths.contains(&"/metadata/annotations/karpenter.sh~1do-not-disrupt".to_string()),
            "{paths:?}"
        );
        assert!(
            paths.contains(&"/metadata/labels/node-holder.dev~1held".to_string()),
            "{paths:?}"
        );
        let result = apply(original, &patch);
        assert_eq!(result["annotations"]["a/b"], "1");
        assert_eq!(
            result["annotations"]["karpenter.sh/do-not-consolidate"],
            "x"
        );
        assert_eq!(result["labels"]["kubernetes.io/hostname"], "n1");
        assert_eq!(result["labels"]["node-holder.dev/held"], "true");
    }

    #[test]
    fn pointer_tokens_escape_tilde_and_slash() {
        let ptr = PointerBuf::from_tokens(["metadata", "annotations", "a~b/c"]);
        assert_eq!(ptr.as_str(), "/metadata/annotations/a~0b~1c");
    }

    #[test]
    fn a_held_node_gets_no_operations_so_reinvocation_is_safe() {
        let original = json!({"name": "n1"});
        let (patch, _) = add_holds(&meta(original.clone()), &default_holds());
        let held = apply(original, &patch);
        let (again, added) = add_holds(&meta(held), &default_holds());
        assert!(again.0.is_empty() && added.is_empty());
    }

    #[test]
    fn a_hold_someone_else_set_is_neither_changed_nor_claimed() {
        let original =
            json!({"name": "n1", "annotations": {"karpenter.sh/do-not-disrupt": "false"}});
        let (patch, added) = add_holds(&meta(original), &default_holds());
        assert!(
            patch.0.is_empty(),
            "no marker either: the hold is not node-holder's"
        );
        assert!(added.is_empty());
    }

    #[test]
    fn only_the_missing_holds_are_added_and_listed() {
        let holds = Holds::new(&[Preset::KarpenterV1, Preset::ClusterAutoscaler], &[]).unwrap();
        let original =
            json!({"name": "n1", "annotations": {"karpenter.sh/do-not-disrupt": "true"}});
        let (patch, added) = add_holds(&meta(original.clone()), &holds);
        assert_eq!(added, vec![Preset::ClusterAutoscaler.hold()]);
        let result = apply(original, &patch);
        assert_eq!(
            result["annotations"]["node-holder.dev/hold-keys"],
            "cluster-autoscaler.kubernetes.io/scale-down-disabled"
        );
    }

    fn try_apply(meta_json: Value, patch: &Patch) -> Result<Value, json_patch::PatchError> {
        let mut doc = json!({ "metadata": meta_json });
        json_patch::patch(&mut doc, patch)?;
        Ok(doc["metadata"].take())
    }

    /// A node as the webhook leaves it, plus its own other keys.
    fn held_node() -> Value {
        let original = json!({"name": "n1", "resourceVersion": "7",
            "annotations": {"a/b": "1"}, "labels": {"kubernetes.io/hostname": "n1"}});
        let (patch, _) = add_holds(&meta(original.clone()), &default_holds());
        apply(original, &patch)
    }

    #[test]
    fn release_takes_off_exactly_what_add_put_on() {
        let node = held_node();
        let release = release_holds(&meta(node.clone()), &default_holds());
        assert_eq!(release.removed, ["karpenter.sh/do-not-disrupt"]);
        assert!(release.left.is_empty());
        assert_eq!(
            serde_json::to_value(&release.patch).unwrap(),
            json!([
                {"op": "test", "path": "/metadata/annotations/karpenter.sh~1do-not-disrupt", "value": "true"},
                {"op": "remove", "path": "/metadata/annotations/karpenter.sh~1do-not-disrupt"},
                {"op": "test", "path": "/metadata/annotations/node-holder.dev~1hold-keys", "value": "karpenter.sh/do-not-disrupt"},
                {"op": "remove", "path": "/metadata/annotations/node-holder.dev~1hold-keys"},
                {"op": "test", "path": "/metadata/labels/node-holder.dev~1held", "value": "true"},
                {"op": "remove", "path": "/metadata/labels/node-holder.dev~1held"},
            ])
        );
        assert_eq!(
            apply(node, &release.patch),
            json!({"name": "n1", "resourceVersion": "7",
                "annotations": {"a/b": "1"}, "labels": {"kubernetes.io/hostname": "n1"}})
        );
    }

    #[test]
    fn a_hold_whose_value_a_human_changed_is_left_and_only_its_listing_goes() {
        let mut node = held_node();
        node["annotations"]["karpenter.sh/do-not-disrupt"] = json!("forever");
        let release = release_holds(&meta(node.clone()), &default_holds());
        assert!(release.removed.is_empty());
        assert_eq!(release.left, ["karpenter.sh/do-not-disrupt"]);
        assert_eq!(
            apply(node, &release.patch),
            json!({"name": "n1", "resourceVersion": "7",
                "annotations": {"a/b": "1", "karpenter.sh/do-not-disrupt": "forever"},
                "labels": {"kubernetes.io/hostname": "n1"}})
        );
    }

    #[test]
    fn a_hold_node_holder_did_not_list_is_never_touched() {
        let node = json!({"name": "n1",
            "annotations": {"karpenter.sh/do-not-disrupt": "true"}, "labels": {}});
        let release = release_holds(&meta(node), &default_holds());
        assert!(release.patch.0.is_empty());
        assert!(release.removed.is_empty() && release.left.is_empty());
        // Only node-holder's listing goes when a human set the same hold on a
        // node node-holder marked but added nothing to.
        let node = json!({"name": "n1",
            "annotations": {"karpenter.sh/do-not-disrupt": "true"},
            "labels": {"node-holder.dev/held": "true"}});
        let release = release_holds(&meta(node.clone()), &default_holds());
        assert_eq!(
            apply(node, &release.patch),
            json!({"name": "n1",
                "annotations": {"karpenter.sh/do-not-disrupt": "true"}, "labels": {}})
        );
    }

    #[test]
    fn the_release_is_rejected_when_the_node_changed_since_it_was_read() {
        let node = held_node();
        let release = release_holds(&meta(node.clone()), &default_holds());
        for (path, value) in [
            ("/annotations/karpenter.sh~1do-not-disrupt", json!("false")),
            ("/annotations/node-holder.dev~1hold-keys", json!("x")),
            ("/labels/node-holder.dev~1held", json!("no")),
        ] {
            let mut changed = node.clone();
            *changed.pointer_mut(path).unwrap() = value;
            assert!(try_apply(changed, &release.patch).is_err(), "{path}");
        }
        let mut gone = node.clone();
        gone["annotations"]
            .as_object_mut()
            .unwrap()
            .remove("karpenter.sh/do-not-disrupt");
        assert!(try_apply(gone, &release.patch).is_err());
    }

    #[test]
    fn release_handles_partial_and_odd_lists() {
        let holds = Holds::new(&[Preset::KarpenterV1, Preset::ClusterAutoscaler], &[]).unwrap();
        // A listed hold already removed, a duplicate, a blank and
        // node-holder's own key in the list; no marker label.
        let node = json!({"name": "n1", "annotations": {
            "cluster-autoscaler.kubernetes.io/scale-down-disabled": "true",
            "node-holder.dev/hold-keys": "karpenter.sh/do-not-disrupt,,cluster-autoscaler.kubernetes.io/scale-down-disabled,node-holder.dev/hold-keys,cluster-autoscaler.kubernetes.io/scale-down-disabled"}});
        let release = release_holds(&meta(node.clone()), &holds);
        assert_eq!(
            release.removed,
            ["cluster-autoscaler.kubernetes.io/scale-down-disabled"]
        );
        assert_eq!(
            apply(node, &release.patch),
            json!({"name": "n1", "annotations": {}})
        );
        assert!(
            release_holds(&meta(json!({"name": "n1"})), &holds)
                .patch
                .0
                .is_empty()
        );
    }

    #[test]
    fn holds_of_a_preset_no_longer_configured_are_released_others_left() {
        let mut node = held_node();
        // Placed under the Karpenter v1 preset and an explicit hold; the
        // configuration has since moved to Cluster Autoscaler only.
        node["annotations"]["example.com/freeze"] = json!("yes");
        node["annotations"]["node-holder.dev/hold-keys"] =
            json!("karpenter.sh/do-not-disrupt,example.com/freeze");
        let holds = Holds::new(&[Preset::ClusterAutoscaler], &[]).unwrap();
        let release = release_holds(&meta(node.clone()), &holds);
        assert_eq!(release.removed, ["karpenter.sh/do-not-disrupt"]);
        assert_eq!(release.left, ["example.com/freeze"]);
        let result = apply(node, &release.patch);
        assert_eq!(
            result["annotations"],
            json!({"a/b": "1", "example.com/freeze": "yes"})
        );
    }

    #[test]
    fn hold_then_release_round_trips_with_other_holds_kept() {
        let holds = Holds::new(&[Preset::KarpenterV1, Preset::ClusterAutoscaler], &[]).unwrap();
        let original = json!({"name": "n1", "resourceVersion": "3",
            "annotations": {"karpenter.sh/do-not-disrupt": "true"}});
        let (patch, _) = hold_existing(&meta(original.clone()), &holds);
        let held = apply(original.clone(), &patch);
        let release = release_holds(&meta(held.clone()), &holds);
        assert_eq!(
            release.removed,
            ["cluster-autoscaler.kubernetes.io/scale-down-disabled"]
        );
        // The human's Karpenter hold stays; the labels map node-holder
        // created stays, empty.
        let mut expected = original;
        expected["labels"] = json!({});
        assert_eq!(apply(held, &release.patch), expected);
    }

    #[test]
    fn holding_an_existing_node_is_conditional_on_its_version() {
        let original = json!({"name": "n1", "resourceVersion": "42"});
        let (patch, added) = hold_existing(&meta(original.clone()), &default_holds());
        assert_eq!(added, vec![Preset::KarpenterV1.hold()]);
        let ops = serde_json::to_value(&patch).unwrap();
        assert_eq!(
            ops[0],
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": "42"})
        );
        assert_eq!(
            ops.as_array().unwrap()[1..],
            serde_json::to_value(add_holds(&meta(original.clone()), &default_holds()).0)
                .unwrap()
                .as_array()
                .unwrap()[..]
        );
        let held = apply(original.clone(), &patch);
        assert_eq!(held["annotations"]["karpenter.sh/do-not-disrupt"], "true");
        // Someone added annotations since the read: the whole-map add would
        // have wiped them; the version test rejects it instead.
        let changed = json!({"name": "n1", "resourceVersion": "43",
            "annotations": {"karpenter.sh/do-not-disrupt": "false"}});
        assert!(try_apply(changed, &patch).is_err());
    }

    #[test]
    fn holding_a_held_node_again_is_an_empty_patch() {
        let (patch, added) = hold_existing(&meta(held_node()), &default_holds());
        assert!(patch.0.is_empty() && added.is_empty());
        let (patch, _) = hold_existing(&meta(json!({"name": "n1"})), &default_holds());
        assert!(
            serde_json::to_value(&patch).unwrap()[0]["op"] == "add",
            "no version, no test"
        );
    }

    #[test]
    fn trimmed_metadata_gives_the_same_patches_and_scope() {
        let holds = Holds::new(&[Preset::KarpenterV1, Preset::ClusterAutoscaler], &[]).unwrap();
        let scopes = [
            NodeScope::default(),
            NodeScope::parse("zone=a,!gone").unwrap(),
            NodeScope::parse("pool in (batch),zone").unwrap(),
        ];
        for original in [
            json!({"name": "n1", "creationTimestamp": "2026-11-24T08:00:00Z", "annotations": {"big": "x".repeat(1000), "a/b": "1"},
                   "labels": {"kubernetes.io/hostname": "n1", "zone": "a"},
                   "managedFields": [{"manager": "kubelet", "operation": "Update"}]}),
            json!({"name": "n1", "creationTimestamp": "2026-11-24T08:00:00Z", "resourceVersion": "7",
                   "annotations": {"karpenter.sh/do-not-disrupt": "true", "other": "v",
                       "karpenter.sh/do-not-consolidate": "true",
                       "node-holder.dev/hold-keys": "karpenter.sh/do-not-disrupt,karpenter.sh/do-not-consolidate",
                       "node-holder.dev/held-until": "2026-11-24T08:10:00Z"},
                   "labels": {"node-holder.dev/held": "true", "zone": "a", "pool": "batch"},
                   "finalizers": ["f"]}),
            json!({"name": "n1", "creationTimestamp": "2026-11-24T08:00:00Z", "resourceVersion": "8"}),
        ] {
            let whole = meta(original);
            for scope in &scopes {
                let trimmed = keep_what_patches_read(&whole, &holds, scope).unwrap();
                assert!(trimmed.annotation("a/b").is_none() && trimmed.annotation("big").is_none());
                assert!(trimmed.label("kubernetes.io/hostname").is_none());
                // A map that existed still exists, however little is left.
                assert_eq!(trimmed.has_labels(), whole.labels.is_some());
                assert_eq!(trimmed.has_annotations(), whole.annotations.is_some());
                assert_eq!(trimmed.in_scope(), scope.matches(labels(&whole)), "{scope}");
                assert_eq!(
                    hold_existing(&trimmed, &holds),
                    hold_existing(&whole, &holds)
                );
                assert_eq!(
                    release_holds(&trimmed, &holds),
                    release_holds(&whole, &holds)
                );
                assert_eq!(held_until_stamp(&trimmed), held_until_stamp(&whole));
                let until = "2026-11-24T08:20:00.5Z".parse().unwrap();
                assert_eq!(
                    with_held_until(&trimmed, Patch(Vec::new()), until),
                    with_held_until(&whole, Patch(Vec::new()), until)
                );
            }
        }
    }
}
