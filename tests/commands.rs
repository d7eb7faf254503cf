//! `node-holder status` and `node-holder release`, run as an operator runs
//! them (the admin's kubeconfig) against the real API server.

use testsupport as common;

use std::process::Command;
use std::time::Duration;

use common::window::marked;
use common::{Served, node, operator, register_webhook, serve, succeeded};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use testenv::ControlPlane;

/// Starts serve with a long window, creates `names` through the webhook and
/// waits until the window task has counted them.
async fn held_cluster(cp: &ControlPlane, names: &[&str]) -> Served {
    held_cluster_with(cp, names, &[]).await
}

/// [`held_cluster`] with `extra` flags for serve.
async fn held_cluster_with(cp: &ControlPlane, names: &[&str], extra: &[&str]) -> Served {
    let mut flags = vec!["--hold-duration=1h", "--lease-duration=3s"];
    flags.extend_from_slice(extra);
    let served = serve(cp, &flags).await;
    register_webhook(cp, &served).await;
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());
    for name in names {
        nodes
            .create(&PostParams::default(), &node(name))
            .await
            .unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let json: serde_json::Value =
            serde_json::from_str(&succeeded(&operator(cp, &["status", "-o", "json"]))).unwrap();
        if json["open"] == true && json["heldNodes"].as_array().unwrap().len() == names.len() {
            return served;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "window never opened: {json}\n{}",
            served.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn status_shows_the_open_window_its_leader_and_the_held_nodes() {
    let cp = ControlPlane::start().await.unwrap();
    let served = held_cluster(&cp, &["ip-10-0-1-7", "ip-10-0-2-9"]).await;
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());
    let last = nodes.get("ip-10-0-2-9").await.unwrap();
    let created = last.metadata.creation_timestamp.unwrap().0;

    let json: serde_json::Value =
        serde_json::from_str(&succeeded(&operator(&cp, &["status", "-o", "json"]))).unwrap();
    let identity = format!("serve-{}", served.webhook_port);
    assert_eq!(json["leader"]["identity"], identity.as_str());
    assert_eq!(json["leader"]["expired"], false);
    let deadline: Timestamp = json["deadline"].as_str().unwrap().parse().unwrap();
    assert_eq!(deadline, created + Duration::from_secs(3600));
    assert_eq!(json["settings"]["holdDuration"], "1h");
    assert_eq!(json["settings"]["maxHold"], "2h");
    let held: Vec<&str> = json["heldNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(held, ["ip-10-0-1-7", "ip-10-0-2-9"]);
    assert_eq!(
        json["heldNodes"][0]["holds"],
        serde_json::json!(["karpenter.sh/do-not-disrupt"])
    );
    // The leader stamps each node the webhook held with the deadline as it
    // was when it held it: at least the node's own creation + hold (a pass
    // between the two creates stamps the first with its own), at most the
    // deadline; the last node's is the deadline.
    let mut creations = Vec::new();
    for name in ["ip-10-0-1-7", "ip-10-0-2-9"] {
        let node = nodes.get(name).await.unwrap();
        creations.push(node.metadata.creation_timestamp.unwrap().0 + Duration::from_secs(3600));
    }
    let stamped = |json: &serde_json::Value| -> Vec<Option<Timestamp>> {
        json["heldNodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["heldUntil"].as_str().and_then(|t| t.parse().ok()))
            .collect()
    };
    common::window::eventually("both nodes stamped", Duration::from_secs(10), || {
        let json: serde_json::Value =
            serde_json::from_str(&succeeded(&operator(&cp, &["status", "-o", "json"]))).unwrap();
        std::future::ready(stamped(&json).iter().all(Option::is_some))
    })
    .await;
    let json: serde_json::Value =
        serde_json::from_str(&succeeded(&operator(&cp, &["status", "-o", "json"]))).unwrap();
    let stamps: Vec<Timestamp> = stamped(&json).into_iter().flatten().collect();
    for (stamp, own_end) in stamps.iter().zip(&creations) {
        assert!(
            *own_end <= *stamp && *stamp <= deadline,
            "{stamps:?} {creations:?}"
        );
    }
    assert_eq!(stamps.last(), Some(&deadline), "{stamps:?}");
    assert!(json.get("overdue").is_none(), "{json}");

    let text = succeeded(&operator(&cp, &["status"]));
    assert!(
        text.starts_with("Window:      open (all nodes, hold 1h, max 2h)\nOpened:      "),
        "{text}"
    );
    assert!(
        text.contains(&format!("Deadline:    {deadline} (in 59m")),
        "{text}"
    );
    assert!(
        text.contains(&format!("Leader:      {identity} (renewed ")),
        "{text}"
    );
    assert!(text.contains("Held nodes:  2\n\nNODE "), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("ip-10-0-1-7 ") && l.ends_with(" karpenter.sh/do-not-disrupt")),
        "{text}"
    );
}

#[tokio::test]
async fn release_asks_the_running_leader_which_closes_the_window_and_strips_the_holds() {
    let cp = ControlPlane::start().await.unwrap();
    let served = held_cluster(&cp, &["a", "b"]).await;
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());
    assert_eq!(marked(&nodes).await.len(), 2);

    let out = succeeded(&operator(&cp, &["release"]));
    assert!(
        out.contains("window open, 2 node(s) carry node-holder's hold"),
        "{out}"
    );
    assert!(
        out.contains(&format!("released by serve-{}", served.webhook_port)),
        "{out}"
    );
    assert!(marked(&nodes).await.is_empty());
    let a = nodes.get("a").await.unwrap().metadata;
    assert!(a.annotations.unwrap_or_default().is_empty(), "hold gone");
    // The leader's release PATCHes say who sent them.
    let agents = node_patch_agents(&cp, "a");
    assert_eq!(
        agents,
        [node_holder::cluster::user_agent(None)],
        "{agents:?}"
    );
    assert!(
        served.log().contains("hold window released on request"),
        "{}",
        served.log()
    );
    let text = succeeded(&operator(&cp, &["status"]));
    assert!(text.starts_with("Window:      closed"), "{text}");
    assert!(text.contains("Held nodes:  0"), "{text}");
    assert!(
        !text.contains("Release:"),
        "a finished release is not pending: {text}"
    );
    // The leader recorded the request as done: what `release` waited for.
    let record = record_annotations(&cp).await;
    assert_eq!(
        record.get("node-holder.dev/release-done-at"),
        record.get("node-holder.dev/release-requested-at"),
        "{record:?}"
    );

    // A node created after the release opens a new window as usual (creation
    // times have whole seconds: one in the release's second counts as before).
    tokio::time::sleep(Duration::from_secs(1)).await;
    nodes
        .create(&PostParams::default(), &node("after"))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while marked(&nodes).await.len() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "no new window: {}",
            served.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The new window supersedes the old request: status does not show it.
    let text = succeeded(&operator(&cp, &["status"]));
    assert!(text.starts_with("Window:      open"), "{text}");
    assert!(!text.contains("Release:"), "{text}");
}

/// The `userAgent` of every PATCH of node `name` in the audit log that put holds
/// on or took them off (not the leader's `held-until` rewrites).
fn node_patch_agents(cp: &ControlPlane, name: &str) -> Vec<String> {
    cp.audit_events()
        .unwrap()
        .iter()
        .filter(|e| {
            e["verb"] == "patch"
                && e["objectRef"]["resource"] == "nodes"
                && e["objectRef"]["name"] == name
                && e["stage"] == "ResponseComplete"
                && !common::audit::is_stamp(e)
        })
        .map(|e| e["userAgent"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The annotations of node-holder's window record.
async fn record_annotations(cp: &ControlPlane) -> std::collections::BTreeMap<String, String> {
    let records: Api<ConfigMap> = Api::namespaced(
        cp.admin_client().await.unwrap(),
        testenv::NODE_HOLDER_NAMESPACE,
    );
    records
        .get("node-holder-window")
        .await
        .unwrap()
        .metadata
        .annotations
        .unwrap_or_default()
}

/// `status -o json`, parsed.
fn status_json(cp: &ControlPlane) -> serde_json::Value {
    serde_json::from_str(&succeeded(&operator(cp, &["status", "-o", "json"]))).unwrap()
}

#[tokio::test]
async fn status_calls_a_node_held_at_admission_but_not_yet_counted_a_window_opening() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.admin_client().await.unwrap();
    // Another replica leads (its Lease renewed now, for a minute): this
    // one's webhook holds the new node, and no pass counts it.
    common::install_node_holder_rbac(&cp).await;
    let leases: Api<Lease> = Api::namespaced(admin.clone(), testenv::NODE_HOLDER_NAMESPACE);
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("node-holder-window".to_string()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("another-replica".to_string()),
            lease_duration_seconds: Some(60),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..LeaseSpec::default()
        }),
    };
    leases.create(&PostParams::default(), &lease).await.unwrap();
    let served = serve(&cp, &["--hold-duration=1h"]).await;
    register_webhook(&cp, &served).await;
    let nodes: Api<Node> = Api::all(admin);
    nodes
        .create(&PostParams::default(), &node("fresh"))
        .await
        .unwrap();

    let json = status_json(&cp);
    assert_eq!(json["open"], false, "{json}");
    assert_eq!(json["windowOpening"], true, "{json}");
    assert_eq!(json["heldNodes"][0]["name"], "fresh", "{json}");
    let text = succeeded(&operator(&cp, &["status"]));
    assert!(text.starts_with("Window:      opening ("), "{text}");
    assert!(!text.contains("Window:      closed"), "{text}");
}

#[tokio::test]
async fn status_follows_a_release_under_way_node_by_node() {
    let cp = ControlPlane::start().await.unwrap();
    let names = ["r1", "r2", "r3", "r4", "r5", "r6"];
    // One node PATCH a second: the release of six nodes takes five seconds.
    let _served = held_cluster_with(&cp, &names, &["--api-qps=1"]).await;
    let mut release = Command::new(env!("CARGO_BIN_EXE_node-holder"))
        .arg("release")
        .env("KUBECONFIG", cp.admin_kubeconfig())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = Vec::new();
    loop {
        let json = status_json(&cp);
        if json["release"]["state"] == "releasing" {
            assert_eq!(json["release"]["of"], 6, "{json}");
            seen.push(json["release"]["left"].as_u64().unwrap());
            let text = succeeded(&operator(&cp, &["status"]));
            if text.contains("Release:     releasing ") {
                assert!(text.contains(" of 6 node(s) still held\n"), "{text}");
                break;
            }
        }
        assert!(
            release.try_wait().unwrap().is_none(),
            "the release ended before status saw it under way: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let out = release.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(seen.iter().all(|&left| left <= 6), "{seen:?}");
    let json = status_json(&cp);
    assert!(json["release"].is_null(), "{json}");
    assert_eq!(json["heldNodes"].as_array().unwrap().len(), 0, "{json}");
}

/// With no live leader, `release` says so, names the one command that acts
/// without one and fails, stripping nothing; that command, `uninstall`
/// (naming nothing else to remove), strips the holds under the Lease.
#[tokio::test]
async fn release_with_no_leader_says_so_and_uninstall_strips_the_holds() {
    let cp = ControlPlane::start().await.unwrap();
    let mut served = held_cluster(&cp, &["x", "y"]).await;
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());
    // The leader dies without handing over its lease.
    served.child.kill().unwrap();
    served.child.wait().unwrap();

    let out = operator(&cp, &["release"]);
    let said = common::output_report(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("no live leader: the request is recorded"),
        "{said}"
    );
    assert!(said.contains("run `node-holder uninstall`"), "{said}");
    assert_eq!(
        marked(&nodes).await,
        ["x", "y"],
        "the command stripped nothing"
    );

    let out = succeeded(&operator(&cp, &["uninstall", "--timeout=60s"]));
    assert!(out.contains("released 2 node(s)"), "{out}");
    let agents = node_patch_agents(&cp, "x");
    assert_eq!(
        agents,
        [node_holder::cluster::user_agent(Some("uninstall"))],
        "{agents:?}"
    );
    assert!(marked(&nodes).await.is_empty());
}

/// webhook-config/flowschema.yaml is accepted by the API server and puts
/// node-holder's node PATCHes in their own priority level (the API server's
/// own count of requests dispatched per flow schema and priority level).
#[tokio::test]
async fn node_holders_patches_run_in_the_priority_level_of_its_flowschema() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.admin_client().await.unwrap();
    let manifest = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("webhook-config/flowschema.yaml"),
    )
    .unwrap();
    testenv::apply_manifests(&admin, &manifest).await.unwrap();
    // The API server's APF controller has taken it in once the schema is
    // not dangling (its priority level exists).
    let schemas: Api<k8s_openapi::api::flowcontrol::v1::FlowSchema> = Api::all(admin);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let schema = schemas.get("node-holder").await.unwrap();
        let dangling = schema
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Dangling");
        if dangling.is_some_and(|c| c.status.as_deref() == Some("False")) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "FlowSchema never taken in"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let _served = held_cluster(&cp, &["p1", "p2"]).await;
    let before = dispatched_to_node_holder(&cp).await;
    // Every PATCH the API server receives from here on is dispatched after
    // `before` was read.
    let since = Timestamp::now();
    succeeded(&operator(&cp, &["release"]));
    // The release patched both nodes (a busy machine may add a retry or a
    // stamp; no count here depends on it).
    let patches_since = || {
        common::audit::node_holder_patches(&cp, &["nodes"])
            .unwrap()
            .into_iter()
            .filter(|patch| patch.at >= since)
            .count()
    };
    common::window::eventually(
        "the release's PATCHes audited",
        Duration::from_secs(10),
        || std::future::ready(patches_since() >= 2),
    )
    .await;
    let patches = patches_since();
    let after = dispatched_to_node_holder(&cp).await;
    // Every one of them ran in node-holder's priority level: the level
    // dispatched at least as many requests since (the schema matches only
    // node-holder's node PATCHes, so nothing of anyone else's).
    assert!(
        after - before >= patches as f64,
        "{patches} PATCHes since, {} dispatched in node-holder's level",
        after - before
    );
}

/// Requests the API server dispatched through the `node-holder` flow schema
/// and priority level (its own metric).
async fn dispatched_to_node_holder(cp: &ControlPlane) -> f64 {
    let admin = cp.admin_client().await.unwrap();
    let request = hyper::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = admin.request_text(request).await.unwrap();
    testenv::metrics::named(&text, "apiserver_flowcontrol_dispatched_requests_total")
        .filter(|s| {
            s.label("flow_schema") == "node-holder" && s.label("priority_level") == "node-holder"
        })
        .map(|s| s.value)
        .sum()
}
