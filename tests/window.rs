//! The hold window against the real API server: new nodes open and extend it,
//! every node in scope is held while it is open, and node-holder's holds (only
//! node-holder's) are gone when it closes — also across a SIGKILL.

use testsupport as common;

use std::time::Duration;

use common::window::{
    Cluster, HOLD, all_held, annotate, at, carries_anything_of_node_holders, create, created,
    eventually_logging, fast, held, logged, metric, no_node_carries_anything,
    node_holder_patch_log, node_holder_stamps, old_nodes, scrape, strs, window,
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
        Duration::from_secs(10),
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

/// `--held-until-annotation=false`: node-holder writes no stamp (the
/// webhook's new node gets no PATCH of its own while held), and removes one an
/// earlier run left on a node it holds.
#[tokio::test]
async fn with_the_stamp_off_no_held_until_is_written_and_an_old_one_goes() {
    let Cluster { cp, nodes, .. } = Cluster::start().await;
    let marker = ("node-holder.dev/held", "true");
    let stale = [
        (HOLD, "true"),
        ("node-holder.dev/hold-keys", HOLD),
        ("node-holder.dev/held-until", "2026-01-01T00:00:00Z"),
    ];
    create(&nodes, "left", &[marker], &stale).await;
    let served = serve(&cp, &strs(&fast("30s", &["--held-until-annotation=false"]))).await;
    register_webhook(&cp, &served).await;
    create(&nodes, "new-1", &[], &[]).await;
    eventually_logging(
        "the old stamp removed, the node still held, both counted as new and held",
        Duration::from_secs(10),
        &served,
        || async {
            let left = nodes.get("left").await.unwrap();
            let stamped = left
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("node-holder.dev/held-until"));
            let counted = metric(&served, r#"node_holder_new_nodes_total{at_create="held"}"#).await;
            held(&left) && !stamped && counted.is_some_and(|n| n >= 2.0)
        },
    )
    .await;
    // "left" was new at the leader's first pass (created just before it
    // started, within the hold), so the window held it all along: its one
    // PATCH is the stamp's removal, not a release and a hold again.
    // (The audit event trails the response a little.)
    let left_patches = || {
        node_holder_patch_log(&cp)
            .remove("left")
            .unwrap_or_default()
    };
    eventually_logging(
        "the removal's audit event",
        Duration::from_secs(10),
        &served,
        || std::future::ready(!left_patches().is_empty()),
    )
    .await;
    assert_eq!(left_patches().len(), 1, "{:?}", left_patches());
    for name in ["left", "new-1"] {
        let node = nodes.get(name).await.unwrap();
        assert!(held(&node), "{name}");
        let annotations = node.metadata.annotations.unwrap_or_default();
        assert!(
            !annotations.contains_key("node-holder.dev/held-until"),
            "{name}: {annotations:?}"
        );
    }
    assert!(node_holder_stamps(&cp, "new-1").is_empty());
    assert_eq!(
        node_holder_stamps(&cp, "left").len(),
        0,
        "the removal is no stamp"
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

/// Coalescing times longer than the machine has been up (and than an
/// `Instant` can hold) mean "never by that rule", not a panic: a burst still
/// runs after its quiet time, and the first pass after listing at once.
#[tokio::test]
async fn a_coalesce_max_longer_than_the_uptime_still_holds_and_releases() {
    let Cluster { cp, nodes, .. } = Cluster::start().await;
    let served = serve(
        &cp,
        &[
            "--hold-duration=3s",
            "--coalesce-idle=200ms",
            "--coalesce-max=500000000y",
            "--lease-duration=3s",
        ],
    )
    .await;
    register_webhook(&cp, &served).await;
    create(&nodes, "late", &[], &[]).await;
    assert!(held(&nodes.get("late").await.unwrap()));
    eventually_logging(
        "the window opened and its hold released",
        Duration::from_secs(30),
        &served,
        || no_node_carries_anything(&nodes),
    )
    .await;
    assert!(
        !logged(&served, "hold window opened").is_empty(),
        "{}",
        served.log()
    );
    assert!(!served.log().contains("panicked"), "{}", served.log());
}

/// `(reason, note)` of the Events in `events` regarding `name`.
async fn events_of(events: &Api<Event>, name: &str) -> Vec<(String, String)> {
    let listed = events.list(&ListParams::default()).await.unwrap().items;
    listed
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn a_pass_over_more_nodes_than_get_their_own_event_is_summed_up_on_the_record() {
    let Cluster { cp, nodes, .. } = Cluster::start().await;
    let old = ["old-1", "old-2", "old-3", "old-4"];
    old_nodes(&nodes, &old, &[], Duration::from_secs(4)).await;
    let served = serve(&cp, &strs(&fast("4s", &["--node-events-per-pass", "2"]))).await;
    // No webhook: the window's pass holds the new node too, five in all.
    create(&nodes, "new-1", &[], &[]).await;
    let five = ["old-1", "old-2", "old-3", "old-4", "new-1"];
    eventually_logging("every node held", Duration::from_secs(20), &served, || {
        all_held(&nodes, &five)
    })
    .await;
    eventually_logging(
        "every node released",
        Duration::from_secs(20),
        &served,
        || no_node_carries_anything(&nodes),
    )
    .await;

    let admin = cp.admin_client().await.unwrap();
    let on_record: Api<Event> = Api::namespaced(admin.clone(), testenv::NODE_HOLDER_NAMESPACE);
    let summaries = || async {
        let events = events_of(&on_record, "node-holder-window").await;
        let summary = |reason: &str| {
            events
                .iter()
                .any(|(r, note)| r == reason && note.contains(" 5 nodes in one pass"))
        };
        summary("NodesHeld") && summary("NodesReleased")
    };
    eventually_logging(
        "the two summaries on the record",
        Duration::from_secs(20),
        &served,
        summaries,
    )
    .await;
    // Events are published in order: the nodes' own came before the summary.
    let on_nodes: Api<Event> = Api::namespaced(admin, "default");
    let mut own = std::collections::BTreeMap::<String, usize>::new();
    for name in five {
        for (reason, _) in events_of(&on_nodes, name).await {
            *own.entry(reason).or_default() += 1;
        }
    }
    assert_eq!(own.get("HoldApplied"), Some(&2), "{own:?}");
    assert_eq!(own.get("HoldReleased"), Some(&2), "{own:?}");
}
