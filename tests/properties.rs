//! Properties of the pure core over generated input: the patch builder adds
//! exactly the intended keys and keeps every other one, a release undoes
//! exactly what node-holder added, and the admission handler answers any
//! body without panicking, with a well-formed review or a clear error.

use std::collections::BTreeMap;

use base64::Engine;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use node_holder::core::admission::{decide, review_body};
use node_holder::core::holds::{HELD_KEYS_ANNOTATION, Hold, Holding, Holds, MARKER_LABEL, Preset};
use node_holder::core::patch::{add_holds, release_holds};
use node_holder::core::selector::NodeScope;
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use serde_json::{Value, json};

/// Keys as Kubernetes allows them, including the hold keys and `~` free
/// prefixes with `/`, so JSON Pointer escaping is exercised.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("karpenter.sh/do-not-disrupt".to_string()),
        Just("karpenter.sh/do-not-consolidate".to_string()),
        Just("cluster-autoscaler.kubernetes.io/scale-down-disabled".to_string()),
        "[a-z]([a-z0-9.-]{0,8}[a-z0-9])?(/[A-Za-z0-9]([A-Za-z0-9_.-]{0,8}[A-Za-z0-9])?)?",
    ]
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![Just("true".to_string()), "[ -~]{0,12}"]
}

fn map() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    proptest::option::of(btree_map(key(), value(), 0..6))
}

fn holds() -> impl Strategy<Value = Holds> {
    (
        proptest::sample::subsequence(
            vec![
                Preset::KarpenterV1,
                Preset::KarpenterV0,
                Preset::ClusterAutoscaler,
            ],
            0..=3,
        ),
        vec(("example\\.com/[a-z]{1,6}", "[a-z]{0,4}"), 0..3),
    )
        .prop_filter_map("a key configured twice", |(presets, explicit)| {
            let explicit: Vec<Hold> = explicit
                .into_iter()
                .map(|(key, value)| Hold { key, value })
                .collect();
            Holds::new(&presets, &explicit).ok()
        })
}

fn meta(
    annotations: &Option<BTreeMap<String, String>>,
    labels: &Option<BTreeMap<String, String>>,
) -> ObjectMeta {
    ObjectMeta {
        name: Some("n".into()),
        annotations: annotations.clone(),
        labels: labels.clone(),
        ..ObjectMeta::default()
    }
}

/// The object the patch produces, as the API server would store it.
fn apply(meta: &ObjectMeta, patch: &json_patch::Patch) -> ObjectMeta {
    let mut doc = json!({ "metadata": meta });
    json_patch::patch(&mut doc, patch).expect("the patch applies to the object it was built for");
    serde_json::from_value(doc["metadata"].take()).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn adding_holds_sets_exactly_the_missing_holds_and_keeps_every_other_key(
        annotations in map(), labels in map(), holds in holds()
    ) {
        let before = meta(&annotations, &labels);
        let (patch, added) = add_holds(&before, &holds);
        let after = apply(&before, &patch);
        let old = annotations.clone().unwrap_or_default();
        let new = after.annotations.clone().unwrap_or_default();
        // Every key there before keeps its value, except node-holder's record.
        for (k, v) in &old {
            if k != HELD_KEYS_ANNOTATION {
                prop_assert_eq!(new.get(k), Some(v), "{} changed", k);
            }
        }
        for (k, v) in labels.clone().unwrap_or_default() {
            prop_assert_eq!(after.labels.as_ref().and_then(|l| l.get(&k)), Some(&v));
        }
        // Exactly the configured holds the node lacked were added.
        let missing: Vec<&Hold> = holds.iter().filter(|h| !old.contains_key(&h.key)).collect();
        prop_assert_eq!(added.len(), missing.len());
        for hold in &missing {
            prop_assert_eq!(new.get(&hold.key), Some(&hold.value));
        }
        let expected_new_keys = missing.len() + usize::from(!missing.is_empty() && !old.contains_key(HELD_KEYS_ANNOTATION));
        prop_assert_eq!(new.len(), old.len() + expected_new_keys);
        if missing.is_empty() {
            prop_assert!(patch.0.is_empty(), "nothing to add, no operations");
        } else {
            prop_assert_eq!(after.labels.as_ref().and_then(|l| l.get(MARKER_LABEL)).map(String::as_str), Some("true"));
            let record = &new[HELD_KEYS_ANNOTATION];
            for hold in &missing {
                prop_assert!(record.split(',').any(|k| k == hold.key), "{} not recorded in {}", hold.key, record);
            }
        }
        // Re-invocation: the patched object needs nothing more.
        prop_assert!(add_holds(&after, &holds).0 .0.is_empty());
    }

    #[test]
    fn releasing_undoes_exactly_what_node_holder_added(
        annotations in map(), labels in map(), holds in holds()
    ) {
        // A node that carries nothing of node-holder's to begin with.
        let strip = |m: &Option<BTreeMap<String, String>>| m.clone().map(|m| {
            m.into_iter().filter(|(k, _)| !k.starts_with("node-holder.dev/")).collect::<BTreeMap<_, _>>()
        });
        let before = meta(&strip(&annotations), &strip(&labels));
        let (patch, _) = add_holds(&before, &holds);
        let held = apply(&before, &patch);
        let release = release_holds(&held, &holds);
        let after = apply(&held, &release.patch);
        let empty_as_none = |m: Option<BTreeMap<String, String>>| m.filter(|m| !m.is_empty());
        prop_assert_eq!(empty_as_none(after.annotations), empty_as_none(before.annotations.clone()));
        prop_assert_eq!(empty_as_none(after.labels), empty_as_none(before.labels.clone()));
        prop_assert!(release.left.is_empty());
        // And a second release has nothing to do.
        prop_assert!(release_holds(&apply(&held, &release.patch), &holds).patch.0.is_empty());
    }

    #[test]
    fn a_hold_changed_by_someone_else_survives_the_release(
        annotations in map(), holds in holds(), changed in "[a-z]{1,5}"
    ) {
        let before = meta(&annotations.map(|m| m.into_iter().filter(|(k, _)| !k.starts_with("node-holder.dev/")).collect()), &None);
        let (patch, added) = add_holds(&before, &holds);
        prop_assume!(!added.is_empty());
        let mut held = apply(&before, &patch);
        let edited = &added[0];
        let new_value = format!("{}-{changed}", edited.value);
        held.annotations.as_mut().unwrap().insert(edited.key.clone(), new_value.clone());
        let release = release_holds(&held, &holds);
        let after = apply(&held, &release.patch);
        prop_assert_eq!(after.annotations.as_ref().and_then(|a| a.get(&edited.key)), Some(&new_value));
        prop_assert!(release.left.contains(&edited.key));
        prop_assert!(!after.labels.unwrap_or_default().contains_key(MARKER_LABEL));
    }
}

fn holding() -> Holding {
    Holding {
        holds: Holds::new(&[], &[]).unwrap(),
        scope: NodeScope::parse("").unwrap(),
    }
}

/// Checks the handler's answer to `body`: an error, or a review whose
/// response answers the request's uid and whose patch applies.
fn check_answer(body: &[u8]) -> Result<(), TestCaseError> {
    let holding = holding();
    let Ok(decision) = decide(body, &holding) else {
        return Ok(());
    };
    let uid = decision.request.uid.clone();
    let out: Value = serde_json::from_slice(&review_body(decision.response).unwrap()).unwrap();
    prop_assert_eq!(&out["apiVersion"], "admission.k8s.io/v1");
    prop_assert_eq!(&out["kind"], "AdmissionReview");
    prop_assert_eq!(out["response"]["uid"].as_str(), Some(uid.as_str()));
    prop_assert!(out["response"]["allowed"].is_boolean());
    if let Some(patch) = out["response"]["patch"].as_str() {
        let patch = base64::engine::general_purpose::STANDARD
            .decode(patch)
            .unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
        let request: Value = serde_json::from_slice(body).unwrap();
        let mut object = request["request"]["object"].clone();
        prop_assert!(
            json_patch::patch(&mut object, &patch).is_ok(),
            "the patch applies to the object"
        );
    }
    Ok(())
}

/// Arbitrary JSON, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        "[ -~]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            btree_map("[a-z]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    // NODE_HOLDER_FUZZ_CASES for the documented million-case run.
    #![proptest_config(ProptestConfig::with_cases(testsupport::fuzz_cases(5_000)))]

    #[test]
    fn any_bytes_get_an_answer_without_a_panic(body in vec(any::<u8>(), 0..512)) {
        check_answer(&body)?;
    }

    #[test]
    fn reviews_with_arbitrary_parts_get_a_well_formed_answer(
        uid in "[ -~]{0,40}",
        kind in prop_oneof![Just("Node".to_string()), Just("Pod".to_string()), "[A-Za-z]{0,6}"],
        operation in prop_oneof![
            Just("CREATE".to_string()),
            Just("UPDATE".to_string()),
            Just("DELETE".to_string()),
            Just("CONNECT".to_string()),
            "[A-Z]{0,6}",
        ],
        metadata in any_json(),
        annotations in map(),
        labels in map(),
        extra in any_json(),
        dry_run in any::<bool>(),
    ) {
        let mut object = json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": "n"}});
        if let Value::Object(extra) = metadata {
            object["metadata"]["extra"] = Value::Object(extra);
        }
        if let Some(a) = annotations { object["metadata"]["annotations"] = json!(a); }
        if let Some(l) = labels { object["metadata"]["labels"] = json!(l); }
        object["status"] = extra;
        let body = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "", "version": "v1", "kind": kind},
                "resource": {"group": "", "version": "v1", "resource": "nodes"},
                "name": "n",
                "operation": operation,
                "userInfo": {"username": "u"},
                "object": object,
                "dryRun": dry_run,
            }
        });
        check_answer(&serde_json::to_vec(&body).unwrap())?;
    }
}
