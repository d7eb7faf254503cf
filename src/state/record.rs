//! The window record: a ConfigMap in node-holder's namespace that keeps what the cluster cannot
//! tell after a restart (deleted nodes' contributions, where the cap started, what a release
//! consumed) and what `status` shows. Only the leader writes its data; `release` and `hold` write
//! only their request annotations.

use std::collections::BTreeMap;

use anyhow::{Context, Result, anyhow};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::core::holds::Holding;
use crate::core::holds::{Hold, Holds};
use crate::core::kept::KeptSummary;
use crate::core::known::LastRun;
use crate::core::selector::NodeScope;
use crate::core::window::{ManualHold, Window, WindowConfig};

/// The record's ConfigMap, and the Lease beside it ([`super::lease`]).
pub const NAME: &str = "node-holder-window";
pub const FIELD_MANAGER: &str = "node-holder";
/// Field managers of `release`'s and `hold`'s requests on the record.
const RELEASE_FIELD_MANAGER: &str = "node-holder-release";
const HOLD_FIELD_MANAGER: &str = "node-holder-hold";

const WINDOW_KEY: &str = "window.json";
/// `--launch-cost`: what the schedule keeps, for `status`, and each CronJob's
/// last run, for a new leader to warm for runs whose nodes are gone.
const SCHEDULE_KEY: &str = "schedule.json";
const LAST_RUNS_KEY: &str = "last-runs.json";
const SETTINGS_KEY: &str = "settings.json";

/// `release`'s request to close the window: the request's RFC 3339 time.
const RELEASE_REQUEST: &str = "node-holder.dev/release-requested-at";
/// The request's time, once every hold it covered is removed (by the leader,
/// or by `release` without one). `release` waits for it.
const RELEASE_DONE: &str = "node-holder.dev/release-done-at";
/// While the leader removes a closed window's holds: how many nodes that
/// release started with (`status` shows the progress).
const RELEASING: &str = "node-holder.dev/releasing";
/// `hold`'s request for a manual hold: the [`ManualHold`] as JSON.
const HOLD_REQUEST: &str = "node-holder.dev/hold-requested";
/// The request's time, once it is in the window and every node in scope
/// carries the hold (by the leader, or by `hold` without one).
const HOLD_DONE: &str = "node-holder.dev/hold-done-at";

/// The settings the leader runs with, kept beside the window so that `status`
/// and `release` need no flags of their own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    #[serde(with = "humantime_serde")]
    pub hold_duration: std::time::Duration,
    /// `None`: no cap.
    #[serde(with = "humantime_serde::option", default)]
    pub max_hold: Option<std::time::Duration>,
    /// The hold annotations, as `key=value`.
    pub holds: Vec<String>,
    /// The node selector, kubectl syntax; empty for every node.
    pub node_selector: String,
    /// `--launch-cost`; absent: the schedule keeps nothing.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "humantime_serde::option"
    )]
    pub launch_cost: Option<std::time::Duration>,
}

/// What the record's ConfigMap holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Record {
    pub window: Window,
    /// What the schedule keeps, summed up.
    pub schedule: KeptSummary,
    /// Each CronJob's last run (`namespace/name`).
    pub last_runs: BTreeMap<String, LastRun>,
    pub settings: Option<Settings>,
    /// When `release` last asked to close the window.
    pub release_request: Option<Timestamp>,
    /// The last release request that is done.
    pub release_done_at: Option<Timestamp>,
    /// Nodes the release in progress started with; `None` when none is.
    pub releasing: Option<u64>,
    /// The last manual hold `hold` asked for, while it is not done.
    pub pending_hold: Option<ManualHold>,
    pub exists: bool,
}

/// At most this much of the record remembers CronJobs' last runs (about
/// 6,000 of them): a ConfigMap holds 1 MiB in all.
const LAST_RUNS_BUDGET: usize = 512 * 1024;

/// The CronJobs' last runs as the record keeps them: the most recent that
/// fit in [`LAST_RUNS_BUDGET`]. A CronJob left out is sized from its pods
/// while its nodes are there, and launches what its run needs otherwise.
fn remembered_runs(last_runs: &BTreeMap<String, LastRun>) -> Result<String> {
    let text = serde_json::to_string(last_runs).context("serialising the CronJobs' last runs")?;
    if text.len() <= LAST_RUNS_BUDGET {
        return Ok(text);
    }
    let mut newest: Vec<(&String, &LastRun)> = last_runs.iter().collect();
    newest.sort_by_key(|(_, run)| std::cmp::Reverse(run.minute));
    let mut kept = BTreeMap::new();
    let mut size = 2;
    for (cronjob, run) in newest {
        let entry = cronjob.len() + serde_json::to_string(run)?.len() + 4;
        if size + entry > LAST_RUNS_BUDGET {
            break;
        }
        size += entry;
        kept.insert(cronjob, run);
    }
    tracing::warn!(
        remembered = kept.len(),
        of = last_runs.len(),
        "the record remembers only the most recent CronJob runs that fit in {} KiB",
        LAST_RUNS_BUDGET / 1024
    );
    serde_json::to_string(&kept).context("serialising the CronJobs' last runs")
}

/// Reads and writes the record in one namespace.
#[derive(Clone)]
pub struct RecordStore {
    api: Api<ConfigMap>,
}

impl RecordStore {
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        RecordStore {
            api: Api::namespaced(client, namespace),
        }
    }

    /// The record; an empty one when the ConfigMap does not exist yet.
    pub async fn load(&self) -> Result<Record> {
        let config_map = self.api.get_opt(NAME).await;
        let config_map = config_map.with_context(|| format!("reading ConfigMap {NAME}"))?;
        config_map.map_or_else(|| Ok(Record::default()), |cm| Record::from_config_map(&cm))
    }

    /// Writes the window and settings (creating the ConfigMap if needed).
    /// Only the leader calls this; the request annotations are not its fields.
    pub async fn save(
        &self,
        window: &Window,
        schedule: &KeptSummary,
        last_runs: &BTreeMap<String, LastRun>,
        settings: &Settings,
    ) -> Result<()> {
        let mut data = BTreeMap::from([
            (WINDOW_KEY.into(), json(window, "the window")?),
            (SETTINGS_KEY.into(), json(settings, "the settings")?),
        ]);
        if !schedule.is_empty() {
            data.insert(
                SCHEDULE_KEY.into(),
                json(schedule, "what the schedule keeps")?,
            );
        }
        if !last_runs.is_empty() {
            data.insert(LAST_RUNS_KEY.into(), remembered_runs(last_runs)?);
        }
        let labels = BTreeMap::from([("app.kubernetes.io/name".into(), "node-holder".into())]);
        let metadata = ObjectMeta {
            labels: Some(labels),
            ..ObjectMeta::default()
        };
        self.apply(FIELD_MANAGER, metadata, Some(data)).await
    }

    /// Asks the leader to close the window (and end the manual hold) now.
    pub async fn request_release(&self, at: Timestamp) -> Result<()> {
        self.request(RELEASE_FIELD_MANAGER, RELEASE_REQUEST, at.to_string())
            .await
    }

    pub async fn request_hold(&self, hold: &ManualHold) -> Result<()> {
        let request = json(hold, "the hold request")?;
        self.request(HOLD_FIELD_MANAGER, HOLD_REQUEST, request)
            .await
    }

    /// Writes a request's annotation as `manager`, the only field it owns.
    async fn request(&self, manager: &str, key: &str, value: String) -> Result<()> {
        let metadata = ObjectMeta {
            annotations: Some(BTreeMap::from([(key.to_string(), value)])),
            ..ObjectMeta::default()
        };
        self.apply(manager, metadata, None).await
    }

    /// Records that the manual hold requested at `at` is done (under the Lease).
    pub async fn hold_done(&self, at: Timestamp) -> Result<()> {
        let annotations = serde_json::json!({HOLD_DONE: at.to_string()});
        self.annotate(annotations, "the manual hold").await
    }

    /// Records the release progress: the nodes a release in progress started with (`None`: none
    /// is), and a release request now done. Called under the Lease, once the record exists.
    pub async fn release_progress(
        &self,
        releasing: Option<usize>,
        done: Option<Timestamp>,
    ) -> Result<()> {
        let mut annotations = serde_json::json!({RELEASING: releasing.map(|n| n.to_string())});
        if let Some(done) = done {
            annotations[RELEASE_DONE] = done.to_string().into();
        }
        self.annotate(annotations, "the release progress").await
    }

    /// Merge-patches the record's annotations as node-holder (a `null`
    /// removes one); `what` names them in the error.
    async fn annotate(&self, annotations: serde_json::Value, what: &str) -> Result<()> {
        let patch = serde_json::json!({"metadata": {"annotations": annotations}});
        // `apply` only names the field manager; the patch is a merge.
        let params = PatchParams::apply(FIELD_MANAGER);
        self.api
            .patch(NAME, &params, &Patch::Merge(&patch))
            .await
            .with_context(|| format!("recording {what} in ConfigMap {NAME}"))?;
        Ok(())
    }

    /// Server-side applies `metadata` and `data` as `manager`, creating the
    /// ConfigMap when there is none: each writer owns its own fields (the
    /// leader the data and label, `release` and `hold` their requests).
    async fn apply(
        &self,
        manager: &str,
        mut metadata: ObjectMeta,
        data: Option<BTreeMap<String, String>>,
    ) -> Result<()> {
        metadata.name = Some(NAME.to_string());
        let config_map = ConfigMap {
            metadata,
            data,
            ..ConfigMap::default()
        };
        self.api
            .patch(
                NAME,
                &PatchParams::apply(manager).force(),
                &Patch::Apply(&config_map),
            )
            .await
            .with_context(|| format!("writing ConfigMap {NAME}"))?;
        Ok(())
    }
}

/// `value` as JSON; `what` names it in the error.
fn json(value: &impl Serialize, what: &str) -> Result<String> {
    serde_json::to_string(value).with_context(|| format!("serialising {what}"))
}

/// The JSON under `key` of the record's `data`, if there; `what` it should be
/// names it in the error.
fn parsed<T: DeserializeOwned>(
    data: Option<&BTreeMap<String, String>>,
    key: &str,
    what: &str,
) -> Result<Option<T>> {
    let Some(text) = data.and_then(|data| data.get(key)) else {
        return Ok(None);
    };
    let value = serde_json::from_str(text)
        .with_context(|| format!("ConfigMap {NAME}: {key} is not {what}"))?;
    Ok(Some(value))
}

impl Record {
    pub fn from_config_map(config_map: &ConfigMap) -> Result<Record> {
        let (data, meta) = (config_map.data.as_ref(), &config_map.metadata);
        Ok(Record {
            window: parsed(data, WINDOW_KEY, "a window")?.unwrap_or_default(),
            schedule: parsed(data, SCHEDULE_KEY, "what the schedule keeps")?.unwrap_or_default(),
            last_runs: parsed(data, LAST_RUNS_KEY, "the CronJobs' last runs")?.unwrap_or_default(),
            settings: parsed(data, SETTINGS_KEY, "node-holder's settings")?,
            release_request: release_request(meta),
            release_done_at: release_done_at(meta),
            releasing: annotation(meta, RELEASING).and_then(|n| n.parse().ok()),
            pending_hold: pending_hold(meta),
            exists: true,
        })
    }
}

/// Whether a release request made at `at` is still to be handled: neither
/// recorded as `done` nor consumed by its window (closed `through` at or after
/// it). The leader and `status` both decide it here.
pub fn release_pending(at: Timestamp, done: Option<Timestamp>, through: Option<Timestamp>) -> bool {
    let consumed = through.is_some_and(|through| through >= at);
    !consumed && done.is_none_or(|done| done < at)
}

/// The release request's time in `meta`'s annotations, if well-formed.
pub fn release_request(meta: &ObjectMeta) -> Option<Timestamp> {
    annotation(meta, RELEASE_REQUEST)?.parse().ok()
}

/// The last release request done, in `meta`'s annotations, if any.
pub fn release_done_at(meta: &ObjectMeta) -> Option<Timestamp> {
    annotation(meta, RELEASE_DONE)?.parse().ok()
}

/// The manual hold request in `meta`'s annotations not done yet, if well-formed.
pub fn pending_hold(meta: &ObjectMeta) -> Option<ManualHold> {
    let hold: ManualHold = serde_json::from_str(annotation(meta, HOLD_REQUEST)?).ok()?;
    let done = hold_done_at(meta).is_some_and(|done| done >= hold.requested_at);
    (!done).then_some(hold)
}

/// The last manual hold request done, in `meta`'s annotations, if any.
pub fn hold_done_at(meta: &ObjectMeta) -> Option<Timestamp> {
    annotation(meta, HOLD_DONE)?.parse().ok()
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

impl Settings {
    pub fn window_config(&self) -> WindowConfig {
        WindowConfig {
            hold: self.hold_duration,
            max_hold: self.max_hold,
        }
    }

    pub fn holding(&self) -> Result<Holding> {
        let holding = || -> Result<Holding, String> {
            let explicit: Result<Vec<Hold>, _> = self.holds.iter().map(|h| h.parse()).collect();
            Ok(Holding {
                holds: Holds::new(&[], &explicit?)?,
                scope: NodeScope::parse(&self.node_selector)?,
            })
        };
        holding().map_err(|e| anyhow!("ConfigMap {NAME}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_small_camel_case_json_with_durations_as_text() {
        let text = r#"{"holdDuration":"20m","maxHold":"2h","holds":[],"nodeSelector":""}"#;
        let settings: Settings = serde_json::from_str(text).unwrap();
        assert_eq!(
            settings.max_hold,
            Some(std::time::Duration::from_secs(7200))
        );
        assert_eq!(serde_json::to_string(&settings).unwrap(), text);
    }

    /// A record written with a removed flag (`--window-follows-work`,
    /// `--release-pace`, `--window-per-label`, `--group-hold-duration`,
    /// `--hold-mechanism`)
    /// still loads, and the next save leaves the field out.
    #[test]
    fn settings_of_a_removed_flag_still_load() {
        let kept = r#"{"holdDuration":"20m","maxHold":"2h","holds":[],"nodeSelector":""}"#;
        for field in [
            r#""windowFollowsWork":true"#,
            r#""releasePace":"10%/1m""#,
            r#""windowPerLabel":"karpenter.sh/nodepool""#,
            r#""groupHoldDurations":{"gpu":"45m"}"#,
            r#""holdMechanism":"budget","nodepoolSelector":"team=a""#,
        ] {
            let old = kept.replace('}', &format!(",{field}}}"));
            let settings: Settings = serde_json::from_str(&old).unwrap();
            assert_eq!(serde_json::to_string(&settings).unwrap(), kept, "{field}");
        }
    }

    /// A CronJob's last run as records with per-label windows (removed) kept
    /// it, with its group, loads; the next save leaves the group out.
    #[test]
    fn a_last_run_with_a_group_still_loads() {
        let old = r#"{"team/report":{"group":"pool-07","nodes":3,"pods":6,"minute":5}}"#;
        let loaded: BTreeMap<String, LastRun> = serde_json::from_str(old).unwrap();
        let run = &loaded["team/report"];
        assert_eq!((run.nodes, run.pods, run.minute), (3, 6, 5));
        assert_eq!(
            remembered_runs(&loaded).unwrap(),
            r#"{"team/report":{"nodes":3,"pods":6,"minute":5}}"#
        );
    }

    /// Past its budget the record remembers the most recent runs, as many as
    /// fit; within it, every run.
    #[test]
    fn the_record_remembers_the_newest_runs_that_fit() {
        let run = |minute: i64| LastRun {
            nodes: 10,
            pods: 10,
            minute,
        };
        let few = BTreeMap::from([("a/x".to_string(), run(1))]);
        assert_eq!(
            remembered_runs(&few).unwrap(),
            serde_json::to_string(&few).unwrap()
        );
        let many: BTreeMap<String, LastRun> = (0..20_000)
            .map(|i| (format!("team/report-{i:05}"), run(i)))
            .collect();
        let text = remembered_runs(&many).unwrap();
        assert!(text.len() <= LAST_RUNS_BUDGET, "{}", text.len());
        let kept: BTreeMap<String, LastRun> = serde_json::from_str(&text).unwrap();
        assert!(
            kept.len() > 1_000 && kept.len() < many.len(),
            "{}",
            kept.len()
        );
        let oldest = kept.values().map(|r| r.minute).min().unwrap();
        assert_eq!(oldest, 20_000 - kept.len() as i64, "the newest are kept");
    }

    fn at(minute: u32) -> Timestamp {
        format!("2026-11-22T12:{minute:02}:00Z").parse().unwrap()
    }

    #[test]
    fn a_release_is_pending_until_done_or_consumed_by_its_window() {
        assert!(release_pending(at(10), None, None));
        assert!(
            release_pending(at(10), Some(at(5)), Some(at(9))),
            "an older done, an older close"
        );
        assert!(!release_pending(at(10), Some(at(10)), None), "done");
        assert!(
            !release_pending(at(10), None, Some(at(10))),
            "its window closed through it"
        );
        assert!(!release_pending(at(10), Some(at(11)), Some(at(12))));
    }
}
