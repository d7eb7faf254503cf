//! The one patch builder: JSON Patches that put holds on a node.
//!
//! JSON Patch pitfalls handled here: `add` to `/metadata/annotations/<key>`
//! fails when the map is absent, and adding the whole map when it exists would
//! wipe the other keys; keys are escaped as JSON Pointer tokens (`/` -> `~1`,
//! `~` -> `~0`).

use std::collections::BTreeMap;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::holds::{HELD_KEYS_ANNOTATION, Hold, Holds, MARKER_LABEL, MARKER_VALUE};

/// The patch that adds every configured hold the node lacks, marks the node as
/// held by node-holder and records which hold keys node-holder added. A hold
/// key the node already has, with any value, is left alone and not claimed.
/// Returns an empty patch (and no added holds) when nothing is missing, so
/// applying it again changes nothing.
pub fn add_holds(meta: &ObjectMeta, holds: &Holds) -> (Patch, Vec<Hold>) {
    let annotations = meta.annotations.as_ref();
    let missing: Vec<Hold> = holds
        .iter()
        .filter(|hold| annotations.is_none_or(|a| !a.contains_key(&hold.key)))
        .cloned()
        .collect();
    if missing.is_empty() {
        return (Patch(Vec::new()), missing);
    }

    let mut held_keys: Vec<String> = annotations
        .and_then(|a| a.get(HELD_KEYS_ANNOTATION))
        .map(|v| {
            v.split(',')
                .filter(|k| !k.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
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

    let mut ops = map_entries("annotations", annotations.is_some(), to_add);
    let marked = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(MARKER_LABEL))
        .is_some_and(|v| v == MARKER_VALUE);
    if !marked {
        let marker = BTreeMap::from([(MARKER_LABEL.to_string(), MARKER_VALUE.to_string())]);
        ops.extend(map_entries("labels", meta.labels.is_some(), marker));
    }
    (Patch(ops), missing)
}

/// Operations that set `entries` in `/metadata/<map>`: one `add` per key when
/// the map exists, one `add` of a new map when it does not.
fn map_entries(map: &str, exists: bool, entries: BTreeMap<String, String>) -> Vec<PatchOperation> {
    if exists {
        entries
            .into_iter()
            .map(|(key, value)| {
                add(
                    PointerBuf::from_tokens(["metadata", map, key.as_str()]),
                    Value::String(value),
                )
            })
            .collect()
    } else {
        let object = entries
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect();
        vec![add(
            PointerBuf::from_tokens(["metadata", map]),
            Value::Object(object),
        )]
    }
}

fn add(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path, value })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::holds::Preset;
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
    fn only_the_missing_holds_are_added_and_recorded() {
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
}
