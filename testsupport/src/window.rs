//! The hold window's fixtures: node-holder's marks on nodes, its window
//! record, metrics and log, and its PATCHes in the API server's audit log.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::Value;
use testenv::ControlPlane;

use super::{Served, node};

pub const HOLD: &str = "karpenter.sh/do-not-disrupt";
pub const MARKER: &str = "node-holder.dev/held";

/// A fresh control plane with the admin's view of its nodes and of
/// node-holder's namespace, where the window record lives.
pub struct Cluster {
    pub cp: ControlPlane,
    pub nodes: Api<Node>,
    pub records: Api<ConfigMap>,
}

impl Cluster {
    pub async fn start() -> Cluster {
        let cp = ControlPlane::start().await.unwrap();
        let admin = cp.admin_client().await.unwrap();
        Cluster {
            nodes: Api::all(admin.clone()),
            records: Api::namespaced(admin, testenv::NODE_HOLDER_NAMESPACE),
            cp,
        }
    }
}

/// Short windows and a 3 s lease, plus `extra` flags.
pub fn fast(hold: &str, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        format!("--hold-duration={hold}"),
        "--lease-duration=3s".into(),
    ];
    args.extend(extra.iter().map(ToString::to_string));
    args
}

pub fn strs(list: &[String]) -> Vec<&str> {
    list.iter().map(String::as_str).collect()
}

pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Held by node-holder: its marker and the hold, both `true`.
pub fn held(node: &Node) -> bool {
    node.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.get(MARKER).is_some_and(|v| v == "true"))
        && node
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.get(HOLD).is_some_and(|v| v == "true"))
}

pub fn carries_anything_of_node_holders(node: &Node) -> bool {
    let ours = |m: &Option<BTreeMap<String, String>>| {
        m.as_ref()
            .is_some_and(|m| m.keys().any(|k| k.starts_with("node-holder.dev/")))
    };
    ours(&node.metadata.labels) || ours(&node.metadata.annotations)
}

/// Polls `check` every 100 ms until it holds or `limit` passes. (A failing
/// test prints every live `Served`'s log as it drops.)
pub async fn eventually<F, Fut>(what: &str, limit: Duration, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    poll(what, limit, check, || {
        format!(" (now {})", Timestamp::now())
    })
    .await;
}

/// As [`eventually`], with `served`'s log in the failure message.
pub async fn eventually_logging<F, Fut>(what: &str, limit: Duration, served: &Served, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    poll(what, limit, check, || format!("\n{}", served.log())).await;
}

async fn poll<F, Fut>(what: &str, limit: Duration, mut check: F, detail: impl Fn() -> String)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {limit:?}{}",
            detail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn sleep_until(t: Timestamp) {
    if let Ok(d) = Duration::try_from(t.duration_since(Timestamp::now())) {
        tokio::time::sleep(d).await;
    }
}

/// Creates node `name` with `labels` and `annotations`.
pub async fn create(
    nodes: &Api<Node>,
    name: &str,
    labels: &[(&str, &str)],
    annotations: &[(&str, &str)],
) -> Node {
    let n = crate::node_with(name, labels, annotations);
    nodes.create(&PostParams::default(), &n).await.unwrap()
}

pub fn created(node: &Node) -> Timestamp {
    node.metadata.creation_timestamp.as_ref().unwrap().0
}

/// Creates `names` (with `labels`) and waits until they are older than
/// `hold`, so that they do not open a window themselves.
pub async fn old_nodes(nodes: &Api<Node>, names: &[&str], labels: &[(&str, &str)], hold: Duration) {
    let mut newest = Timestamp::UNIX_EPOCH;
    for name in names {
        newest = newest.max(created(&create(nodes, name, labels, &[]).await));
    }
    sleep_until(newest + hold + secs(1)).await;
}

pub async fn all_held(nodes: &Api<Node>, names: &[&str]) -> bool {
    for name in names {
        if !held(&nodes.get(name).await.unwrap()) {
            return false;
        }
    }
    true
}

/// Whether no node in the cluster carries anything of node-holder's.
pub async fn no_node_carries_anything(nodes: &Api<Node>) -> bool {
    nodes
        .list(&kube::api::ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .all(|n| !carries_anything_of_node_holders(n))
}

pub async fn none_carries_anything(nodes: &Api<Node>, names: &[&str]) -> bool {
    for name in names {
        if carries_anything_of_node_holders(&nodes.get(name).await.unwrap()) {
            return false;
        }
    }
    true
}

/// Sets annotation `key` of node `name` to `value`, as a human would.
pub async fn annotate(nodes: &Api<Node>, name: &str, key: &str, value: &str) {
    nodes
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {key: value}}})),
        )
        .await
        .unwrap();
}

/// SIGKILLs the process and reaps it.
pub fn sigkill(served: &mut Served) {
    served.child.kill().unwrap();
    served.child.wait().unwrap();
}

/// The window record's `window.json`; `{}` while there is none.
pub async fn window(records: &Api<ConfigMap>) -> Value {
    records
        .get_opt("node-holder-window")
        .await
        .unwrap()
        .and_then(|cm| cm.data)
        .and_then(|data| data.get("window.json").cloned())
        .map_or(Value::Object(Default::default()), |text| {
            serde_json::from_str(&text).unwrap()
        })
}

/// A timestamp in the window record, by JSON pointer (`/open/deadline`).
pub fn at(window: &Value, pointer: &str) -> Option<Timestamp> {
    window.pointer(pointer)?.as_str()?.parse().ok()
}

/// [`at`] in the window record as it is now.
pub async fn record_at(records: &Api<ConfigMap>, pointer: &str) -> Option<Timestamp> {
    at(&window(records).await, pointer)
}

/// The admin port's `/metrics` page.
pub async fn scrape(served: &Served) -> std::io::Result<String> {
    let (_, body) = super::http_get(served.admin_port, "/metrics").await?;
    Ok(body)
}

/// One metric's value from the admin port; `None` when unreachable.
/// `name` is the whole series as exposed, labels included
/// (`node_holder_patch_errors_total{code="409"}`).
pub async fn metric(served: &Served, name: &str) -> Option<f64> {
    let text = scrape(served).await.ok()?;
    text.lines().find_map(|line| {
        let (series, _) = line.rsplit_once(' ')?;
        if series != name {
            return None;
        }
        testenv::metrics::sample(line).map(|s| s.value)
    })
}

/// Each replica's `node_holder_leader`.
pub async fn leader_flags(replicas: &[Served]) -> Vec<Option<f64>> {
    let mut flags = Vec::new();
    for replica in replicas {
        flags.push(metric(replica, "node_holder_leader").await);
    }
    flags
}

/// The process's JSON log lines with `message`.
pub fn logged(served: &Served, message: &str) -> Vec<Value> {
    served
        .log_lines()
        .into_iter()
        .filter(|line| line["message"] == message)
        .collect()
}

/// Nodes the process patched for `action` (`hold`, `release`), by its
/// "nodes patched" log lines.
pub fn patched(served: &Served, action: &str) -> u64 {
    logged(served, "nodes patched")
        .iter()
        .filter(|line| line["action"] == action)
        .map(|line| line["applied"].as_u64().unwrap())
        .sum()
}

/// Checks that `served` logged exactly `expected` nodes patched for
/// `action`. The line follows the last PATCH's response, so it can trail
/// what the cluster shows: it is waited for (10 s), then no more may have
/// been logged.
pub async fn patched_exactly(served: &Served, action: &str, expected: u64) {
    eventually_logging(
        &format!("{expected} nodes patched for {action}"),
        Duration::from_secs(10),
        served,
        || std::future::ready(patched(served, action) >= expected),
    )
    .await;
    assert_eq!(patched(served, action), expected, "{}", served.log());
}

/// When the API server received node-holder's successful PATCHes of node
/// `name`, in order.
pub fn node_holder_patches(cp: &ControlPlane, name: &str) -> Vec<Timestamp> {
    node_holder_patch_log(cp)
        .remove(name)
        .unwrap_or_default()
        .into_iter()
        .filter(|&(_, code)| code == 200)
        .map(|(at, _)| at)
        .collect()
}

/// Asserts node-holder never patched any of `names`.
pub fn never_patched(cp: &ControlPlane, names: &[&str]) {
    for name in names {
        assert!(
            node_holder_patches(cp, name).is_empty(),
            "{name} was patched"
        );
    }
}

/// Waits (up to `limit`) until none of the nodes in `expect` carries anything
/// of node-holder's and the audit log shows exactly the given number of
/// node-holder PATCHes on each (its holds, then one release); returns each
/// node's last PATCH, its release, as the API server received it.
pub async fn releases(
    cp: &ControlPlane,
    nodes: &Api<Node>,
    expect: &[(&str, usize)],
    limit: Duration,
) -> BTreeMap<String, Timestamp> {
    let names: Vec<&str> = expect.iter().map(|(name, _)| *name).collect();
    eventually("every hold released", limit, || {
        none_carries_anything(nodes, &names)
    })
    .await;
    // The audit event trails the response a little. The log is read once a
    // poll, however many nodes there are.
    let successes = |log: &BTreeMap<String, Vec<(Timestamp, u16)>>, name: &str| -> Vec<Timestamp> {
        log.get(name)
            .into_iter()
            .flatten()
            .filter(|&&(_, code)| code == 200)
            .map(|&(at, _)| at)
            .collect()
    };
    eventually("the releases in the audit log", secs(10), || async {
        let log = node_holder_patch_log(cp);
        expect.iter().all(|&(name, count)| {
            let patches = successes(&log, name);
            assert!(
                patches.len() <= count,
                "{name}: node-holder patched it {} times, expected {count}: {patches:?}",
                patches.len()
            );
            patches.len() == count
        })
    })
    .await;
    let log = node_holder_patch_log(cp);
    expect
        .iter()
        .map(|&(name, _)| (name.to_string(), *successes(&log, name).last().unwrap()))
        .collect()
}

/// Registers the webhook at a port nothing listens on (the API server fails
/// open) and waits until the API server calls it: a dry-run create's audit
/// event records the failed-open call.
pub async fn register_unreachable_webhook(cp: &ControlPlane, served: &Served) {
    let (nodes, dry_run) =
        super::create_webhook_configuration(cp, super::free_port(), served.ca_pem()).await;
    for attempt in 0..100 {
        let probe = format!("unreachable-probe-{attempt}");
        let returned = nodes.create(&dry_run, &node(&probe)).await.unwrap();
        assert!(!carries_anything_of_node_holders(&returned));
        let event = cp.wait_for_node_create_event(&probe).await.unwrap();
        if failed_open(&event) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the API server never called the unreachable webhook");
}

/// Every node of `nodes` was created by the autoscaler's identity
/// (Karpenter) and went through node-holder's webhook and came out held:
/// the API server's audit log of each CREATE.
pub fn created_held<'a>(cp: &ControlPlane, nodes: impl IntoIterator<Item = &'a String>) {
    let events = cp.audit_events().unwrap();
    for node in nodes {
        let create = events
            .iter()
            .find(|e| {
                e["verb"] == "create"
                    && e["objectRef"]["resource"] == "nodes"
                    && e["objectRef"]["name"] == node.as_str()
                    && e["stage"] == "ResponseComplete"
            })
            .unwrap_or_else(|| panic!("no audit event of {node}'s create"));
        assert_eq!(
            create["user"]["username"],
            testenv::AUTOSCALER_USER,
            "{create}"
        );
        assert_eq!(
            create["annotations"][format!("{}/decision", super::WEBHOOK_NAME)],
            "held",
            "{create}"
        );
        let mutation: Value = serde_json::from_str(
            create["annotations"]["mutation.webhook.admission.k8s.io/round_0_index_0"]
                .as_str()
                .unwrap_or("{}"),
        )
        .unwrap();
        assert_eq!(mutation["mutated"], true, "{create}");
    }
}

/// Whether the API server's audit event records our webhook failing open.
pub fn failed_open(audit_event: &Value) -> bool {
    audit_event["annotations"].as_object().is_some_and(|a| {
        a.iter().any(|(k, v)| {
            k.starts_with("failed-open.mutation.webhook.admission.k8s.io/")
                && v == super::WEBHOOK_NAME
        })
    })
}

impl Cluster {
    /// As [`Cluster::start`], with `extra` kube-apiserver flags.
    pub async fn start_with_args(extra: &[&str]) -> Cluster {
        let extra: Vec<String> = extra.iter().map(ToString::to_string).collect();
        let cp = ControlPlane::start_with_args(&extra).await.unwrap();
        let admin = cp.admin_client().await.unwrap();
        Cluster {
            nodes: Api::all(admin.clone()),
            records: Api::namespaced(admin, testenv::NODE_HOLDER_NAMESPACE),
            cp,
        }
    }
}

/// Every node PATCH node-holder's identity sent that the API server answered
/// (refused ones included), by node: the HTTP status of each, in the order the
/// API server received them. Reads the audit log once, so it stays cheap with
/// thousands of nodes.
pub fn node_holder_patch_codes(cp: &ControlPlane) -> BTreeMap<String, Vec<u16>> {
    node_holder_patch_log(cp)
        .into_iter()
        .map(|(name, patches)| (name, patches.into_iter().map(|(_, code)| code).collect()))
        .collect()
}

/// Creates `names` from the admin's client, 32 at a time (one by one, a
/// thousand nodes would take most of a test's time), and waits until they are
/// older than `hold`, as [`old_nodes`] does.
pub async fn many_old_nodes(nodes: &Api<Node>, names: &[String], hold: Duration) {
    use futures::StreamExt;
    let newest = futures::stream::iter(names)
        .map(|name| create(nodes, name, &[], &[]))
        .buffer_unordered(32)
        .fold(Timestamp::UNIX_EPOCH, |newest, node| async move {
            newest.max(created(&node))
        })
        .await;
    sleep_until(newest + hold + secs(1)).await;
}

/// How many nodes carry node-holder's marker, by one label-selector list of
/// their metadata: cheap enough to poll with thousands of nodes.
pub async fn marked_count(nodes: &Api<Node>) -> usize {
    marked_metadata(nodes).await.len()
}

/// The names of the nodes that carry node-holder's marker, sorted.
pub async fn marked(nodes: &Api<Node>) -> Vec<String> {
    let mut names: Vec<String> = marked_metadata(nodes)
        .await
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    names.sort();
    names
}

async fn marked_metadata(nodes: &Api<Node>) -> Vec<kube::core::PartialObjectMeta<Node>> {
    let selector = kube::api::ListParams::default().labels(&format!("{MARKER}=true"));
    nodes.list_metadata(&selector).await.unwrap().items
}

/// Every node PATCH node-holder's identity sent that the API server answered,
/// by node, holds and releases only (not the `held-until` rewrites:
/// [`node_holder_stamps`]): when the API server received it and its HTTP
/// status, in order. When a PATCH came (before or after a deadline, a kill, a
/// restart) is what tells a hold from a release and one process from the
/// next.
pub fn node_holder_patch_log(cp: &ControlPlane) -> BTreeMap<String, Vec<(Timestamp, u16)>> {
    patch_log(cp, false)
}

/// When the API server received node-holder's PATCHes of node `name` that
/// only rewrote its `node-holder.dev/held-until` (successful or not), in
/// order.
pub fn node_holder_stamps(cp: &ControlPlane, name: &str) -> Vec<(Timestamp, u16)> {
    patch_log(cp, true).remove(name).unwrap_or_default()
}

/// node-holder's node PATCHes, stamps only or none of them, by node
/// (read by [`crate::audit::node_holder_patches`]).
fn patch_log(cp: &ControlPlane, stamps: bool) -> BTreeMap<String, Vec<(Timestamp, u16)>> {
    let mut by_node: BTreeMap<String, Vec<(Timestamp, u16)>> = BTreeMap::new();
    let patches = crate::audit::node_holder_patches(cp, &["nodes"]).unwrap();
    for patch in patches.into_iter().filter(|p| p.stamp == stamps) {
        let code = u16::try_from(patch.code).unwrap();
        by_node
            .entry(patch.name)
            .or_default()
            .push((patch.at, code));
    }
    for patches in by_node.values_mut() {
        patches.sort();
    }
    by_node
}

/// How long after its deadline a release may come.
pub const SLACK: Duration = Duration::from_secs(3);

/// Asserts each release came at or after `deadline` and within [`SLACK`] of it.
pub fn on_time(released: &BTreeMap<String, Timestamp>, deadline: Timestamp) {
    for (name, &at) in released {
        assert!(
            at >= deadline,
            "{name} released at {at}, before the deadline {deadline}"
        );
        assert!(
            at <= deadline + SLACK,
            "{name} released at {at}, later than {SLACK:?} after the deadline {deadline}"
        );
    }
}

/// [`releases`] of `expect` (up to `limit`), each [`on_time`] for `deadline`.
pub async fn released_on_time(
    cp: &ControlPlane,
    nodes: &Api<Node>,
    expect: &[(&str, usize)],
    limit: Duration,
    deadline: Timestamp,
) {
    on_time(&releases(cp, nodes, expect, limit).await, deadline);
}
