//! The hold window against the real API server: new nodes open and extend it,
//! every node in scope is held while it is open, and node-holder's holds (only
//! node-holder's) are gone when it closes — also across a SIGKILL.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Served, node, register_webhook, serve};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use testenv::ControlPlane;

const HOLD: &str = "karpenter.sh/do-not-disrupt";
const MARKER: &str = "node-holder.dev/held";

/// Short windows and quick passes, so a test takes seconds.
fn fast(hold: &str) -> Vec<String> {
    vec![
        format!("--hold-duration={hold}"),
        "--coalesce-idle=200ms".into(),
        "--coalesce-max=1s".into(),
        "--lease-duration=3s".into(),
    ]
}

fn args(list: &[String]) -> Vec<&str> {
    list.iter().map(String::as_str).collect()
}

fn held(node: &Node) -> bool {
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

fn carries_anything_of_node_holders(node: &Node) -> bool {
    node.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.keys().any(|k| k.starts_with("node-holder.dev/")))
        || node
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.keys().any(|k| k.starts_with("node-holder.dev/")))
}

/// Polls `check` every 100 ms until it holds or `limit` passes.
async fn eventually<F, Fut>(what: &str, limit: Duration, served: &Served, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + limit;
    while !check().await {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within {limit:?}\n{}",
            served.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn create(nodes: &Api<Node>, name: &str, annotations: &[(&str, &str)]) -> Node {
    let mut n = node(name);
    if !annotations.is_empty() {
        n.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        );
    }
    nodes.create(&PostParams::default(), &n).await.unwrap()
}

fn created(node: &Node) -> Timestamp {
    node.metadata.creation_timestamp.as_ref().unwrap().0
}

async fn all(nodes: &Api<Node>) -> Vec<Node> {
    nodes.list(&ListParams::default()).await.unwrap().items
}

/// Creates `names` and waits until they are older than `hold`, so that they
/// do not open a window themselves.
async fn old_nodes(nodes: &Api<Node>, names: &[&str], foreign: &[&str], hold: Duration) {
    for name in names {
        create(nodes, name, &[]).await;
    }
    for name in foreign {
        create(nodes, name, &[(HOLD, "true")]).await;
    }
    tokio::time::sleep(hold + Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_new_node_holds_every_node_each_new_one_extends_and_then_only_node_holders_holds_go() {
    let cp = ControlPlane::start().await.unwrap();
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());
    old_nodes(
        &nodes,
        &["old-1", "old-2", "old-3"],
        &["foreign"],
        Duration::from_secs(6),
    )
    .await;
    let served = serve(&cp, &args(&fast("6s"))).await;
    register_webhook(&cp, &served).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        all(&nodes).await.iter().all(|n| !held(n)),
        "no window before a new node"
    );

    let first = create(&nodes, "new-1", &[]).await;
    assert!(
        held(&nodes.get("new-1").await.unwrap()),
        "held by the webhook"
    );
    let api = &nodes;
    eventually(
        "every old node held",
        Duration::from_secs(10),
        &served,
        || async move {
            for name in ["old-1", "old-2", "old-3"] {
                if !held(&api.get(name).await.unwrap()) {
                    return false;
                }
            }
            true
        },
    )
    .await;
    let record: Api<ConfigMap> = Api::namespaced(cp.admin_client().await.unwrap(), "node-holder");
    let window = record.get("node-holder-window").await.unwrap();
    let window: serde_json::Value =
        serde_json::from_str(&window.data.unwrap()["window.json"]).unwrap();
    let opened_at: Timestamp = window["open"]["openedAt"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(opened_at, created(&first));

    tokio::time::sleep(Duration::from_secs(3)).await;
    let second = create(&nodes, "new-2", &[]).await;
    let deadline = created(&second) + Duration::from_secs(6);
    assert!(deadline > created(&first) + Duration::from_secs(6));
    let record = &record;
    let deadline_text = deadline.to_string();
    let deadline_text = &deadline_text;
    eventually(
        "the window extended to the second node",
        Duration::from_secs(5),
        &served,
        || async move {
            let window = record.get("node-holder-window").await.unwrap();
            let window: serde_json::Value =
                serde_json::from_str(&window.data.unwrap()["window.json"]).unwrap();
            window["open"]["deadline"].as_str() == Some(deadline_text.as_str())
        },
    )
    .await;

    // Still held just before the deadline...
    let now = Timestamp::now();
    if now + Duration::from_secs(1) < deadline {
        tokio::time::sleep(
            Duration::try_from(deadline.duration_since(now)).unwrap() - Duration::from_secs(1),
        )
        .await;
        assert!(
            all(&nodes).await.iter().filter(|n| held(n)).count() == 5,
            "all five held until the deadline"
        );
    }
    // ...and released after it: every hold node-holder placed, nothing else.
    eventually(
        "every node-holder hold released",
        Duration::from_secs(10),
        &served,
        || async move {
            all(api)
                .await
                .iter()
                .all(|n| !carries_anything_of_node_holders(n))
        },
    )
    .await;
    assert!(Timestamp::now() >= deadline, "released before the deadline");
    for n in all(&nodes).await {
        let has_hold = n
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(HOLD));
        assert_eq!(
            has_hold,
            n.metadata.name.as_deref() == Some("foreign"),
            "{:?}",
            n.metadata
        );
    }

    // `kubectl describe node` tells the story.
    let events: Api<Event> = Api::namespaced(cp.admin_client().await.unwrap(), "default");
    let events = &events;
    eventually(
        "hold and release events",
        Duration::from_secs(10),
        &served,
        || async move {
            let reasons: Vec<(String, String)> = events
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter_map(|e| Some((e.regarding?.name?, e.reason?)))
                .collect();
            let has =
                |node: &str, reason: &str| reasons.iter().any(|(n, r)| n == node && r == reason);
            has("old-1", "HoldApplied")
                && has("old-1", "HoldReleased")
                && has("new-1", "HoldWindowOpened")
                && has("new-2", "HoldWindowExtended")
        },
    )
    .await;

    let (_, metrics) = common::http_get(served.admin_port, "/metrics")
        .await
        .unwrap();
    for line in [
        "node_holder_leader 1",
        "node_holder_holds_applied_total 3",
        "node_holder_window_deadline_seconds 0.0",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} missing:\n{metrics}"
        );
    }
    assert!(
        metrics.contains("node_holder_holds_released_total 5"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_hold_edited_by_a_human_during_the_window_is_left_as_they_set_it() {
    let cp = ControlPlane::start().await.unwrap();
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());
    let served = serve(&cp, &args(&fast("4s"))).await;
    register_webhook(&cp, &served).await;
    create(&nodes, "edited", &[]).await;
    assert!(held(&nodes.get("edited").await.unwrap()));
    // The operator decides this node stays protected, with their own value.
    nodes
        .patch(
            "edited",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {HOLD: "yes-keep"}}})),
        )
        .await
        .unwrap();
    let api = &nodes;
    eventually(
        "node-holder's record dropped",
        Duration::from_secs(15),
        &served,
        || async move { !carries_anything_of_node_holders(&api.get("edited").await.unwrap()) },
    )
    .await;
    let annotations = nodes
        .get("edited")
        .await
        .unwrap()
        .metadata
        .annotations
        .unwrap();
    assert_eq!(annotations[HOLD], "yes-keep");
}

#[tokio::test]
async fn a_release_patch_from_a_stale_read_is_rejected_by_the_api_server() {
    use node_holder::core::holds::Holds;
    let cp = ControlPlane::start().await.unwrap();
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());
    let served = serve(&cp, &args(&fast("1h"))).await;
    register_webhook(&cp, &served).await;
    create(&nodes, "raced", &[]).await;
    let stale = nodes.get("raced").await.unwrap().metadata;
    // A human edit lands between node-holder's read and its patch.
    nodes
        .patch(
            "raced",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {HOLD: "false"}}})),
        )
        .await
        .unwrap();
    let holds = Holds::new(&[], &[]).unwrap();
    let release = node_holder::core::patch::release_holds(&stale, &holds);
    let err = nodes
        .patch_metadata(
            "raced",
            &PatchParams::default(),
            &Patch::<()>::Json(release.patch),
        )
        .await
        .expect_err("the test operation fails on the changed value");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 422),
        "{err:?}"
    );
    assert_eq!(
        nodes
            .get("raced")
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap()[HOLD],
        "false"
    );
}
