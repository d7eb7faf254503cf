//! The hold window against the real API server: new nodes open and extend it,
//! every node in scope is held while it is open, and node-holder's holds (only
//! node-holder's) are gone when it closes — also across a SIGKILL.

use testsupport as common;

use std::time::Duration;

use common::window::{
    Cluster, HOLD, all_held, annotate, at, carries_anything_of_node_holders, create, created,
    eventually_logging, fast, held, no_node_carries_anything, node_holder_stamps, old_nodes,
    scrape, strs, window,
};
use common::{has_node_events, register_webhook, serve};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams};

const OTHERS_LABEL: &str = "example.com/team";
const OTHERS_ANNOTATION: &str = "example.com/owner";

/// The old nodes still carry the label and the annotation others set.
async fn others_kept(nodes: &Api<Node>) {
    for name in ["old-1", "old-2", "old-3"] {
        let meta = nodes.get(name).await.unwrap().metadata;
        let label = meta.labels.as_ref().and_then(|l| l.get(OTHERS_LABEL));
        assert_eq!(label.map(String::as_str), Some("a"), "{name}: {meta:?}");
        if name == "old-2" {
            let annotation = meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(OTHERS_ANNOTATION));
            assert_eq!(
                annotation.map(String::as_str),
                Some("team-a"),
                "{name}: {meta:?}"
            );
        }
    }
}

const FIVE: [&str; 5] = ["old-1", "old-2", "old-3", "new-1", "new-2"];

/// Whether each of `names` carries `node-holder.dev/held-until` = `at`.
async fn stamped(nodes: &Api<Node>, names: &[&str], at: Timestamp) -> bool {
    let want = at.to_string();
    for name in names {
        let node = nodes.get(name).await.unwrap();
        let stamp = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("node-holder.dev/held-until"));
        if stamp != Some(&want) {
            return false;
        }
    }
    true
}

async fn all(nodes: &Api<Node>) -> Vec<Node> {
    nodes.list(&ListParams::default()).await.unwrap().items
}

#[tokio::test]
async fn a_new_node_holds_every_node_each_new_one_extends_and_then_only_node_holders_holds_go() {
    let Cluster { cp, nodes, records } = Cluster::start().await;
    create(&nodes, "foreign", &[], &[(HOLD, "true")]).await;
    // Real nodes carry labels and annotations of others (kubelet's, the
    // provisioner's): holding and releasing must keep every one of them.
    old_nodes(
        &nodes,
        &["old-1", "old-2", "old-3"],
        &[(OTHERS_LABEL, "a")],
        Duration::from_secs(6),
    )
    .await;
    annotate(&nodes, "old-2", OTHERS_ANNOTATION, "team-a").await;
    let served = serve(&cp, &strs(&fast("6s", &[]))).await;
    register_webhook(&cp, &served).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        all(&nodes).await.iter().all(|n| !held(n)),
        "no window before a new node"
    );

    let first = create(&nodes, "new-1", &[], &[]).await;
    assert!(
        held(&nodes.get("new-1").await.unwrap()),
        "held by the webhook"
    );
    eventually_logging(
        "every old node held",
        Duration::from_secs(10),
        &served,
        || all_held(&nodes, &["old-1", "old-2", "old-3"]),
    )
    .await;
    assert_eq!(
        at(&window(&records).await, "/open/openedAt"),
        Some(created(&first))
    );
    others_kept(&nodes).await;
    // Each held node says until when: the old ones in their hold patch, the
    // webhook's new-1 in a patch of its own.
    let first_deadline = created(&first) + Duration::from_secs(6);
    eventually_logging(
        "every held node stamped with the deadline",
        Duration::from_secs(10),
        &served,
        || {
            stamped(
                &nodes,
                &["old-1", "old-2", "old-3", "new-1"],
                first_deadline,
            )
        },
    )
    .await;

    tokio::time::sleep(Duration::from_secs(3)).await;
    let second = create(&nodes, "new-2", &[], &[]).await;
    let deadline = created(&second) + Duration::from_secs(6);
    assert!(deadline > created(&first) + Duration::from_secs(6));
    let deadline_text = deadline.to_string();
    eventually_logging(
        "the window extended to the second node",
        Duration::from_secs(5),
        &served,
        || async {
            window(&records).await["open"]["deadline"].as_str() == Some(deadline_text.as_str())
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
        // The first deadline's stamps were rewritten when it passed.
        eventually_logging(
            "every stamp moved to the new deadline",
            Duration::from_secs(1),
            &served,
            || stamped(&nodes, &FIVE, deadline),
        )
        .await;
    }
    // ...and released after it: every hold node-holder placed, nothing else.
    eventually_logging(
        "every node-holder hold released",
        Duration::from_secs(10),
        &served,
        || no_node_carries_anything(&nodes),
    )
    .await;
    assert!(Timestamp::now() >= deadline, "released before the deadline");
    others_kept(&nodes).await;
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
    eventually_logging(
        "hold and release events",
        Duration::from_secs(60),
        &served,
        || async {
            has_node_events(
                &events,
                &[
                    ("old-1", "HoldApplied"),
                    ("old-1", "HoldReleased"),
                    ("new-1", "HoldWindowOpened"),
                    ("new-2", "HoldWindowExtended"),
                ],
            )
            .await
        },
    )
    .await;

    // Stamps are written once, kept while true as the window moves, and
    // written again only when they pass: new-1's and the old nodes' at the
    // first deadline; new-2's (the second deadline) never.
    for (name, count) in [
        ("new-1", 2),
        ("new-2", 1),
        ("old-1", 1),
        ("old-2", 1),
        ("old-3", 1),
    ] {
        let stamps = node_holder_stamps(&cp, name);
        assert_eq!(stamps.len(), count, "{name}: {stamps:?}");
        assert!(
            stamps.iter().all(|&(_, code)| code == 200),
            "{name}: {stamps:?}"
        );
    }

    let metrics = scrape(&served).await.unwrap();
    for line in [
        "node_holder_leader 1",
        "node_holder_held_until_stamps_total 6",
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
    let Cluster { cp, nodes, .. } = Cluster::start().await;
    let served = serve(&cp, &strs(&fast("4s", &[]))).await;
    register_webhook(&cp, &served).await;
    create(&nodes, "edited", &[], &[]).await;
    assert!(held(&nodes.get("edited").await.unwrap()));
    // The operator decides this node stays protected, with their own value.
    annotate(&nodes, "edited", HOLD, "yes-keep").await;
    eventually_logging(
        "node-holder's record dropped",
        Duration::from_secs(15),
        &served,
        || async { !carries_anything_of_node_holders(&nodes.get("edited").await.unwrap()) },
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
    let Cluster { cp, nodes, .. } = Cluster::start().await;
    let served = serve(&cp, &strs(&fast("1h", &[]))).await;
    register_webhook(&cp, &served).await;
    create(&nodes, "raced", &[], &[]).await;
    let stale = nodes.get("raced").await.unwrap().metadata;
    // A human edit lands between node-holder's read and its patch.
    annotate(&nodes, "raced", HOLD, "false").await;
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

/// `--launch-cost` in a cluster with no CronJob: no pod can say what a new
/// node is for, so the window counts it from its creation at once, exactly
/// as the fixed hold does (it does not wait for the node to settle first).
#[tokio::test]
async fn with_no_cronjob_the_schedule_hold_counts_a_new_node_as_the_fixed_hold_does() {
    let Cluster { cp, nodes, records } = Cluster::start().await;
    common::install_node_holder_rbac(&cp).await;
    common::install_rbac_for(&cp, "schedules").await;
    let served = serve(&cp, &strs(&fast("6s", &["--launch-cost=2m"]))).await;
    register_webhook(&cp, &served).await;
    old_nodes(&nodes, &["old-1"], &[], Duration::from_secs(6)).await;

    let new = create(&nodes, "new-1", &[], &[]).await;
    let deadline = created(&new) + Duration::from_secs(6);
    eventually_logging(
        "the window opened at the node's creation",
        Duration::from_secs(10),
        &served,
        || async {
            let window = window(&records).await;
            at(&window, "/open/openedAt") == Some(created(&new))
                && at(&window, "/open/deadline") == Some(deadline)
        },
    )
    .await;
    eventually_logging(
        "the old node held until the fixed hold's deadline",
        Duration::from_secs(10),
        &served,
        || stamped(&nodes, &["old-1", "new-1"], deadline),
    )
    .await;
}
