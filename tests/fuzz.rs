//! The record's parser fuzzed: ConfigMap `node-holder-window` as anyone with
//! write access could leave it (arbitrary text and JSON, and node-holder's
//! own record with any one value replaced) is read or refused with an error
//! that names it, never a panic; and whatever is read, the window task's
//! arithmetic (observe, until when a node is held, the next wake, release)
//! runs on it without a panic, at any time of day from the epoch to 9999.
//!
//! The admission decoder's counterpart is in tests/properties.rs. Both take
//! their case count from `NODE_HOLDER_FUZZ_CASES` (default: a few thousand,
//! for the suite); docs/reliability.md records a run of a million each.

use std::collections::BTreeMap;

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use node_holder::core::window::{ManualHold, Window, WindowConfig};
use node_holder::state::record::{Record, Settings};
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use serde_json::{Value, json};
use testsupport::fuzz_cases;

/// The configuration whose record the fuzzing starts from.
fn configured() -> WindowConfig {
    let minutes = |m: u64| Duration::from_secs(m * 60);
    WindowConfig {
        hold: minutes(20),
        max_hold: Some(minutes(120)),
    }
}

/// What node-holder itself writes, made by its own code: a window open and
/// a manual hold; the settings of [`configured`]; one CronJob's last run.
fn written() -> (Value, Value, Value) {
    let cfg = configured();
    let t = |s: &str| s.parse::<Timestamp>().unwrap();
    let mut window = Window::default();
    let nodes = [t("2026-11-22T12:00:00Z"), t("2026-11-22T12:01:00Z")];
    window.observe_all(nodes, t("2026-11-22T12:02:00Z"), &cfg);
    window.hold_manually(
        ManualHold {
            requested_at: t("2026-11-22T12:02:00Z"),
            until: t("2026-11-22T13:00:00Z"),
            by: "alice".into(),
            reason: "rollout".into(),
        },
        t("2026-11-22T12:02:00Z"),
    );
    let settings = Settings {
        hold_duration: cfg.hold,
        max_hold: cfg.max_hold,
        holds: vec!["karpenter.sh/do-not-disrupt=true".into()],
        node_selector: String::new(),
        launch_cost: Some(Duration::from_secs(300)),
    };
    (
        serde_json::to_value(&window).unwrap(),
        json!({"team/report": {"nodes": 3, "pods": 6, "minute": 5}}),
        serde_json::to_value(&settings).unwrap(),
    )
}

/// Arbitrary JSON, a few levels deep, with the numbers and strings that
/// break arithmetic and parsers.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        prop_oneof![
            Just("9999-12-31T23:59:59Z".to_string()),
            Just("-009999-01-01T00:00:00Z".to_string()),
            Just("18446744073709551615s".to_string()),
            Just("584942417355y".to_string()),
            "[0-9]{1,20}(ns|ms|s|m|h|d|y)",
            "[ -~]{0,12}",
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            btree_map("[a-zA-Z]{1,12}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// `value` with the `pick`-th node of its tree (in depth-first order,
/// modulo their number) replaced by `by`.
fn replace_one(mut value: Value, pick: usize, by: Value) -> Value {
    fn count(v: &Value) -> usize {
        1 + match v {
            Value::Array(a) => a.iter().map(count).sum(),
            Value::Object(o) => o.values().map(count).sum(),
            _ => 0,
        }
    }
    fn walk(v: &mut Value, left: &mut usize, by: &mut Option<Value>) {
        if *left == 0 {
            if let Some(by) = by.take() {
                *v = by;
            }
            return;
        }
        *left -= 1;
        let children: Vec<&mut Value> = match v {
            Value::Array(a) => a.iter_mut().collect(),
            Value::Object(o) => o.values_mut().collect(),
            _ => Vec::new(),
        };
        for child in children {
            walk(child, left, by);
        }
    }
    let mut left = pick % count(&value);
    walk(&mut value, &mut left, &mut Some(by));
    value
}

/// One stored text: node-holder's own with one value replaced, arbitrary
/// JSON, or arbitrary text.
fn stored(own: Value) -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        4 => (any::<usize>(), any_json()).prop_map(move |(pick, by)| {
            Some(replace_one(own.clone(), pick, by).to_string())
        }),
        2 => any_json().prop_map(|v| Some(v.to_string())),
        1 => "\\PC{0,64}".prop_map(Some),
        1 => Just(None),
    ]
}

fn config_map(texts: [Option<String>; 3], annotations: BTreeMap<String, String>) -> ConfigMap {
    let data: BTreeMap<String, String> = ["window.json", "last-runs.json", "settings.json"]
        .into_iter()
        .zip(texts)
        .filter_map(|(key, text)| Some((key.to_string(), text?)))
        .collect();
    ConfigMap {
        metadata: ObjectMeta {
            name: Some("node-holder-window".into()),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..ConfigMap::default()
    }
}

/// node-holder's request annotations with arbitrary values.
fn annotations() -> impl Strategy<Value = BTreeMap<String, String>> {
    let key = prop_oneof![
        Just("node-holder.dev/release-requested-at"),
        // `release --group`'s, removed: a stale key the parser ignores.
        Just("node-holder.dev/release-group"),
        Just("node-holder.dev/release-done-at"),
        Just("node-holder.dev/releasing"),
        Just("node-holder.dev/hold-requested"),
    ];
    btree_map(key.prop_map(str::to_string), "\\PC{0,40}", 0..4)
}

/// The window task's arithmetic on what was read, at `now`.
fn run_the_arithmetic(record: &Record, now: Timestamp) {
    let cfg = record
        .settings
        .as_ref()
        .map_or_else(default_config, |s| s.window_config());
    let mut window: Window = record.window.clone();
    let _ = window.observe_all([now], now, &cfg);
    let _ = window.held_until(now);
    let _ = window.holds(now);
    let _ = window.manual_held_until(now);
    let _ = window.deadline();
    let _ = window.next_wake();
    let _ = window.release_now(now);
}

fn default_config() -> WindowConfig {
    WindowConfig {
        hold: std::time::Duration::from_secs(1200),
        max_hold: None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fuzz_cases(3_000)))]

    #[test]
    fn any_record_is_read_or_refused_by_name_and_never_panics_the_window_task(
        window in stored(written().0),
        last_runs in stored(written().1),
        settings in stored(written().2),
        annotations in annotations(),
        now in prop_oneof![
            Just(Timestamp::UNIX_EPOCH),
            Just(Timestamp::MAX),
            (0i64..=253_402_207_200).prop_map(|s| Timestamp::from_second(s).unwrap()),
        ],
    ) {
        match Record::from_config_map(&config_map([window, last_runs, settings], annotations)) {
            Ok(record) => run_the_arithmetic(&record, now),
            Err(err) => prop_assert!(
                format!("{err:#}").contains("ConfigMap node-holder-window"),
                "{err:#}"
            ),
        }
    }
}

/// The record the fuzzing starts from is one node-holder reads: most cases
/// replace one value in it, so they reach the arithmetic, not only the
/// parser's first error.
#[test]
fn the_record_the_fuzzing_starts_from_is_read_whole() {
    let (window, last_runs, settings) = written();
    let texts = [window, last_runs, settings].map(|v| Some(v.to_string()));
    let record = Record::from_config_map(&config_map(texts, BTreeMap::new())).unwrap();
    assert!(record.window.open().is_some());
    assert!(record.window.manual().is_some());
    assert_eq!(record.last_runs["team/report"].nodes, 3);
    let settings = record.settings.expect("settings");
    assert!(settings.launch_cost.is_some());
}
