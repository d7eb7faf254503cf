//! The hold window through faults of the API server itself: a restart
//! mid-window (etcd kept, the node watch's resourceVersion compacted away),
//! API Priority and Fairness refusing node-holder's PATCHes with 429, and
//! node PATCHes failing with 500.
//!
//! What node-holder sent, and what the API server answered, is read from the
//! API server's audit log: every node PATCH of node-holder's identity,
//! refused ones included, with its status code.

use testsupport as common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use common::window::{
    Cluster, MARKER, all_held, at, create, created, eventually, eventually_logging, fast, held,
    metric, node_holder_patch_codes, node_holder_stamps, old_nodes, record_at, released_on_time,
    releases, secs, strs, window,
};
use common::{register_webhook, serve};
use jiff::Timestamp;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
use kube::api::{Api, Patch, PatchParams, PostParams};
use node_holder::server::metrics::TlsMetrics;
use node_holder::server::tls::ReloadingTls;
use node_holder::server::{TlsServing, serve_tls};
use serde_json::{Value, json};
use tempfile::TempDir;
use testenv::ControlPlane;
use tokio_util::sync::CancellationToken;

/// The nodes that are there before node-holder.
const OLD: [&str; 2] = ["old-1", "old-2"];

#[tokio::test]
async fn after_an_api_server_restart_mid_window_the_watch_relists_and_the_release_is_on_time() {
    // Compaction every second: by the time the API server is back, the
    // resourceVersion node-holder's watch had reached is gone from etcd as
    // well as from the new API server's watch cache, so resuming from it
    // would get 410 Gone; node-holder lists every node again instead.
    let Cluster {
        mut cp,
        nodes,
        records,
    } = Cluster::start_with_args(&["--etcd-compaction-interval=1s"]).await;
    // Long enough for the API server to restart (3 s down, then its
    // start-up, slower on a busy machine) well before the first deadline.
    let hold = secs(20);
    old_nodes(&nodes, &OLD, &[], hold).await;
    let served = serve(&cp, &strs(&fast("20s", &[]))).await;
    register_webhook(&cp, &served).await;
    let new_1 = create(&nodes, "new-1", &[], &[]).await;
    assert!(held(&new_1), "held by the webhook");
    eventually("every old node held", secs(10), || all_held(&nodes, &OLD)).await;
    let first_deadline = created(&new_1) + hold;
    assert_eq!(
        record_at(&records, "/open/deadline").await,
        Some(first_deadline)
    );

    let closed_through = at(&window(&records).await, "/closedThrough");
    let down = Timestamp::now();
    cp.restart_apiserver(secs(3)).await.unwrap();
    eprintln!(
        "API server back after {:?}",
        Timestamp::now().duration_since(down)
    );
    assert!(
        all_held(&nodes, &["old-1", "old-2", "new-1"]).await,
        "the holds survived the restart"
    );
    assert_eq!(
        record_at(&records, "/open/deadline").await,
        Some(first_deadline),
        "the record survived the restart"
    );

    // A node created as soon as the API server is back, a few seconds
    // before the first deadline.
    let new_2 = create(&nodes, "new-2", &[], &[]).await;
    assert!(held(&new_2), "held by the webhook after the restart");
    let deadline = created(&new_2) + hold;
    assert!(deadline > first_deadline);
    // node-holder's watch failed with the API server and listed every node
    // again once it was back.
    eventually_logging(
        "the node watch listed every node again after its failure",
        secs(20),
        &served,
        || async {
            let lines = served.log_lines();
            let failed = lines.iter().position(|l| {
                l["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("node watch failed"))
            });
            failed.is_some_and(|at| {
                lines[at..].iter().any(|l| {
                    l["message"] == "node watch listed every node" && l["after_a_failure"] == true
                })
            })
        },
    )
    .await;
    // Until its watch has listed again node-holder cannot know of new-2, so
    // its first deadline must not close the window: the window is extended
    // by new-2, not closed under it.
    eventually_logging(
        "the window extended by the node created after the restart",
        secs(20),
        &served,
        || async {
            let window = window(&records).await;
            assert_eq!(
                at(&window, "/closedThrough"),
                closed_through,
                "the window closed at {first_deadline} without new-2, created {} before \
                 node-holder's watch had listed again: {window}",
                created(&new_2)
            );
            at(&window, "/open/deadline") == Some(deadline)
        },
    )
    .await;

    released_on_time(
        &cp,
        &nodes,
        &[("old-1", 2), ("old-2", 2), ("new-1", 1), ("new-2", 1)],
        secs(35),
        deadline,
    )
    .await;
}

/// node-holder's own PATCH failures with status `code`, from its metrics.
async fn patch_errors(served: &common::Served, code: u16) -> f64 {
    metric(
        served,
        &format!("node_holder_patch_errors_total{{code=\"{code}\"}}"),
    )
    .await
    .unwrap_or(0.0)
}

#[tokio::test]
async fn under_priority_and_fairness_rejections_every_node_is_held_and_released_with_bounded_requests()
 {
    // A small server-wide concurrency, so that one share of it is a single
    // seat: with a queue of two behind it, the priority level below refuses
    // most of node-holder's 16 concurrent PATCHes with 429 instead of
    // absorbing them.
    let Cluster { cp, nodes, .. } = Cluster::start_with_args(&[
        "--max-requests-inflight=50",
        "--max-mutating-requests-inflight=50",
    ])
    .await;
    let admin = cp.admin_client().await.unwrap();
    let level: PriorityLevelConfiguration = serde_json::from_value(json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "PriorityLevelConfiguration",
        "metadata": {"name": "node-holder-throttled"},
        "spec": {
            "type": "Limited",
            "limited": {
                "nominalConcurrencyShares": 1,
                "lendablePercent": 0,
                "borrowingLimitPercent": 0,
                "limitResponse": {
                    "type": "Queue",
                    "queuing": {"queues": 1, "handSize": 1, "queueLengthLimit": 2}
                }
            }
        }
    }))
    .unwrap();
    // Only node-holder's node PATCHes: its Lease, record and Events keep
    // their usual priority, so leadership is not what gets tested here.
    let schema: FlowSchema = serde_json::from_value(json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": "node-holder-node-patches"},
        "spec": {
            "priorityLevelConfiguration": {"name": "node-holder-throttled"},
            // Before the built-in `service-accounts` schema (9000).
            "matchingPrecedence": 50,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{
                "subjects": [{"kind": "User", "user": {"name": testenv::NODE_HOLDER_USER}}],
                "resourceRules": [{
                    "verbs": ["patch"],
                    "apiGroups": [""],
                    "resources": ["nodes"],
                    "clusterScope": true
                }]
            }]
        }
    }))
    .unwrap();
    Api::<PriorityLevelConfiguration>::all(admin.clone())
        .create(&PostParams::default(), &level)
        .await
        .unwrap();
    let schemas: Api<FlowSchema> = Api::all(admin.clone());
    schemas
        .create(&PostParams::default(), &schema)
        .await
        .unwrap();
    // The API server's APF controller marks the schema not dangling once it
    // has taken the new configuration in.
    eventually("the flow schema in effect", secs(20), || async {
        schemas
            .get("node-holder-node-patches")
            .await
            .unwrap()
            .status
            .and_then(|s| s.conditions)
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c.type_ == "Dangling" && c.status.as_deref() == Some("False"))
            })
    })
    .await;

    // The window is long enough that a machine busy with other tests still
    // holds every node inside it: the test waits for the holds until the
    // deadline, not for a fixed time.
    let hold = secs(40);
    let old: Vec<String> = (0..APF_NODES).map(|i| format!("old-{i}")).collect();
    old_nodes(&nodes, &strs(&old), &[], hold).await;
    // Far more than one seat's worth at once, as fast as node-holder goes.
    let served = serve(&cp, &strs(&fast("40s", &["--api-qps=2000"]))).await;
    register_webhook(&cp, &served).await;
    let new_1 = create(&nodes, "new-1", &[], &[]).await;
    assert!(held(&new_1), "held by the webhook");
    let deadline = created(&new_1) + hold;
    // Unthrottled, 80 holds take well under a second; a single seat that
    // serves a PATCH in a few milliseconds still has room for all of them
    // many times over before the deadline.
    let old_names = strs(&old);
    let until_deadline =
        || Duration::try_from(deadline.duration_since(Timestamp::now())).unwrap_or_default();
    eventually_logging(
        "every old node held before the window's end",
        until_deadline(),
        &served,
        || all_held(&nodes, &old_names),
    )
    .await;
    assert!(
        Timestamp::now() < deadline,
        "every node was held only after the window ended"
    );

    let mut expect: Vec<(&str, usize)> = old.iter().map(|n| (n.as_str(), 2)).collect();
    expect.push(("new-1", 1));
    releases(&cp, &nodes, &expect, until_deadline() + secs(30)).await;

    let codes = node_holder_patch_codes(&cp);
    let attempts: usize = codes.values().map(Vec::len).sum();
    let refused: usize = codes
        .values()
        .flatten()
        .filter(|&&code| code == 429)
        .count();
    let applied = 2 * APF_NODES + 1;
    eprintln!(
        "{attempts} node PATCHes for {applied} holds and releases, {refused} refused with 429; \
         node-holder counted {} failed with 429",
        patch_errors(&served, 429).await
    );
    assert!(refused > 0, "priority and fairness refused nothing");
    assert!(
        codes
            .values()
            .flatten()
            .all(|&code| code == 200 || code == 429),
        "{codes:?}"
    );
    // A refused PATCH is not retried in place (kube's retry layer is off):
    // the next pass plans again. So no node is patched more often than
    // node-holder ran passes; how many passes the throttled stretch takes
    // depends on how fast the one seat serves, so that is the bound, not a
    // multiple of the work that load can change.
    let passes = metric(&served, "node_holder_pass_duration_seconds_count")
        .await
        .unwrap_or(0.0);
    let most = codes.values().map(Vec::len).max().unwrap_or(0);
    assert!(
        most as f64 <= passes,
        "a node patched {most} times in {passes} passes: retries stacked ({attempts} PATCHes \
         for {applied} holds and releases)"
    );
}

/// node-holder's window over this many old nodes under APF.
const APF_NODES: usize = 80;

/// A validating admission webhook served by the test, which refuses the
/// first attempt of each node-holder hold, release and `held-until` rewrite
/// of each node with status 500: a fault the API server turns into the
/// PATCH's response.
struct Injector {
    /// Attempts so far, by (node, "hold" | "release" | "stamp": marked before
    /// and after).
    attempts: Mutex<HashMap<(String, &'static str), u32>>,
    /// Requests of anyone else, allowed: the test's probes.
    others: AtomicU32,
}

async fn inject(State(injector): State<Arc<Injector>>, Json(review): Json<Value>) -> Json<Value> {
    let request = &review["request"];
    let allowed = json!({"uid": request["uid"], "allowed": true});
    let response = if request["userInfo"]["username"] != testenv::NODE_HOLDER_USER {
        injector.others.fetch_add(1, Ordering::SeqCst);
        allowed
    } else {
        let marked = |object: &Value| object["metadata"]["labels"][MARKER] == "true";
        let action = match (marked(&request["oldObject"]), marked(&request["object"])) {
            (false, true) => "hold",
            (true, false) => "release",
            _ => "stamp",
        };
        let name = request["name"].as_str().unwrap_or_default().to_string();
        let mut attempts = injector.attempts.lock().unwrap();
        let count = attempts.entry((name, action)).or_default();
        *count += 1;
        if *count == 1 {
            json!({
                "uid": request["uid"],
                "allowed": false,
                "status": {"code": 500, "message": "injected fault"}
            })
        } else {
            allowed
        }
    };
    Json(json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response
    }))
}

/// Serves [`inject`] over TLS on a free loopback port with node-holder's own
/// TLS server, and registers it for node UPDATEs (a PATCH is one); waits until
/// the API server calls it. Dropping the token stops the server.
async fn register_injector(
    cp: &ControlPlane,
    nodes: &Api<Node>,
    probe: &str,
) -> (Arc<Injector>, CancellationToken, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let certs = testenv::certs::make(dir.path(), &[]).unwrap();
    let tls = Arc::new(
        ReloadingTls::load(
            &dir.path().join("tls.crt"),
            &dir.path().join("tls.key"),
            None,
        )
        .unwrap(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let injector = Arc::new(Injector {
        attempts: Mutex::new(HashMap::new()),
        others: AtomicU32::new(0),
    });
    let router = axum::Router::new()
        .route("/validate", axum::routing::post(inject))
        .with_state(Arc::clone(&injector));
    let stop = CancellationToken::new();
    tokio::spawn(serve_tls(
        listener,
        tls,
        router,
        stop.clone(),
        TlsServing {
            closing: CancellationToken::new(),
            drain: secs(1),
            max_connections: 64,
            max_per_source: 64,
            idle_timeout: secs(60),
            metrics: TlsMetrics::default(),
        },
    ));

    let config: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "inject-500"},
        "webhooks": [{
            "name": "inject-500.api-faults.test",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
            "clientConfig": {
                "url": format!("https://127.0.0.1:{port}/validate"),
                "caBundle": k8s_openapi::ByteString(certs.ca_pem.clone().into_bytes())
            },
            "rules": [{
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["UPDATE"],
                "resources": ["nodes"],
                "scope": "Cluster"
            }]
        }]
    }))
    .unwrap();
    let admin = cp.admin_client().await.unwrap();
    Api::<ValidatingWebhookConfiguration>::all(admin)
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let touch = Patch::Merge(json!({"metadata": {"annotations": {"api-faults.test/probe": "x"}}}));
    eventually(
        "the API server calls the injecting webhook",
        secs(20),
        || async {
            nodes.patch(probe, &dry_run, &touch).await.unwrap();
            injector.others.load(Ordering::SeqCst) > 0
        },
    )
    .await;
    (injector, stop, dir)
}

#[tokio::test]
async fn node_patches_failing_with_500_are_counted_and_retried_until_every_node_is_held_and_released_once()
 {
    let Cluster { cp, nodes, records } = Cluster::start().await;
    let hold = secs(8);
    old_nodes(&nodes, &OLD, &[], hold).await;
    let (injector, stop, _certs) = register_injector(&cp, &nodes, OLD[0]).await;
    let served = serve(&cp, &strs(&fast("8s", &[]))).await;
    register_webhook(&cp, &served).await;

    let new_1 = create(&nodes, "new-1", &[], &[]).await;
    assert!(held(&new_1), "held by the webhook");
    let deadline = created(&new_1) + hold;
    eventually_logging("every old node held", secs(10), &served, || {
        all_held(&nodes, &OLD)
    })
    .await;
    assert_eq!(record_at(&records, "/open/deadline").await, Some(deadline));

    // The backoff after a failed pass (1 s) stays within the slack.
    released_on_time(
        &cp,
        &nodes,
        &[("old-1", 2), ("old-2", 2), ("new-1", 1)],
        secs(20),
        deadline,
    )
    .await;

    // The API server answered each refused PATCH with the webhook's 500, and
    // each node's hold and release went through on the next pass.
    let codes = node_holder_patch_codes(&cp);
    for old in OLD {
        assert_eq!(codes[old], [500, 200, 500, 200], "{old}: {codes:?}");
    }
    assert_eq!(codes["new-1"], [500, 200], "{codes:?}");
    // new-1, held by the webhook, got its `held-until` in a PATCH of its own:
    // refused once too, and written on the next pass.
    let stamps: Vec<u16> = node_holder_stamps(&cp, "new-1")
        .iter()
        .map(|&(_, code)| code)
        .collect();
    assert_eq!(stamps, [500, 200]);
    assert_eq!(patch_errors(&served, 500).await, 6.0);
    // Each refusal is logged with the node and the code.
    let failures: Vec<Value> = served
        .log_lines()
        .into_iter()
        .filter(|l| l["level"] == "WARN" && l["node"].is_string() && l["code"].is_u64())
        .collect();
    assert_eq!(failures.len(), 6, "{failures:?}");
    assert!(failures.iter().all(|l| l["code"] == 500), "{failures:?}");
    let attempts = injector.attempts.lock().unwrap().clone();
    assert_eq!(
        attempts,
        HashMap::from([
            (("old-1".into(), "hold"), 2),
            (("old-2".into(), "hold"), 2),
            (("old-1".into(), "release"), 2),
            (("old-2".into(), "release"), 2),
            (("new-1".into(), "release"), 2),
            (("new-1".into(), "stamp"), 2),
        ])
    );
    stop.cancel();
}
