//! What node-holder is for, with the real Karpenter deciding: without it,
//! Karpenter removes empty nodes within `consolidateAfter` and launches new
//! ones for the next wave; with it, Karpenter keeps the held nodes for the
//! window, says why, reuses them, and consolidates them once the window
//! closes. Karpenter's KWOK provider creates every Node through the API, so
//! each one goes through node-holder's webhook like a kubelet registration.

use testsupport as common;
use testsupport::karpenter;

use std::collections::BTreeSet;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use testenv::Disruption;

use common::policy;
use common::window::{HOLD, annotate, at, created_held, held, window};
use common::{Served, operator, register_webhook, serve, succeeded};
use karpenter::{Autoscaled, BLOCKED_BY_HOLD, KARPENTER_ROUND};

/// What one run of [`two_waves`] saw.
struct TwoWaves {
    /// The nodes the first wave ran on.
    first: BTreeSet<String>,
    /// The nodes the second wave ran on.
    second: BTreeSet<String>,
    /// Nodes Karpenter had launched before the second wave, and after it.
    launched_before_second: usize,
    launched_after_second: usize,
}

/// The batch day in miniature: three pods that each need a node; the wave
/// ends; Karpenter gets its chance (every node's `consolidateAfter` has run
/// out, by Karpenter's own `Consolidatable` condition, and it has evaluated
/// empty nodes twice since); then the same three pods come back.
async fn two_waves(a: &mut Autoscaled) -> TwoWaves {
    let first = a.wave("wave-1", 3).await;
    assert_eq!(first.len(), 3, "one node a pod: {first:?}");
    a.end_wave("wave-1").await;
    a.until(
        "the first wave's nodes consolidatable (or gone)",
        KARPENTER_ROUND,
        async |a| a.consolidatable_or_gone(&first).await,
    )
    .await;
    a.karpenter_passes(2.0).await;
    let launched_before_second = a.nodes_launched().len();
    let second = a.wave("wave-2", 3).await;
    TwoWaves {
        first,
        second,
        launched_before_second,
        launched_after_second: a.nodes_launched().len(),
    }
}

/// node-holder's window record in its namespace.
fn records(a: &Autoscaled) -> Api<ConfigMap> {
    Api::namespaced(a.client.clone(), testenv::NODE_HOLDER_NAMESPACE)
}

/// `node-holder serve` with `flags`, registered as the cluster's webhook.
async fn install_node_holder(a: &Autoscaled, flags: &[&str]) -> Served {
    let mut args = vec!["--lease-duration=3s"];
    args.extend_from_slice(flags);
    let served = serve(a.cp(), &args).await;
    register_webhook(a.cp(), &served).await;
    served
}

#[tokio::test]
async fn without_node_holder_karpenter_removes_empty_nodes_and_launches_new_ones_for_the_next_wave()
{
    let mut a = Autoscaled::start(&Disruption::default()).await;
    let waves = two_waves(&mut a).await;

    // Karpenter consolidated every node of the first wave, as empty...
    let first = waves.first.clone();
    a.until(
        "the first wave's nodes deleted",
        KARPENTER_ROUND,
        async |a| first.iter().all(|n| a.nodes_deleted().contains_key(n)),
    )
    .await;
    for node in &waves.first {
        a.until_node_said(node, "DisruptionTerminating", "Empty")
            .await;
    }
    // ...so the second wave needed three new nodes: the churn.
    assert!(
        waves.first.is_disjoint(&waves.second),
        "{:?} {:?}",
        waves.first,
        waves.second
    );
    assert_eq!(
        waves.launched_after_second,
        waves.launched_before_second + 3
    );
}

#[tokio::test]
async fn with_node_holder_karpenter_keeps_the_held_nodes_reuses_them_and_consolidates_them_after_the_window()
 {
    let mut a = Autoscaled::start(&Disruption::default()).await;
    // Long enough to outlast Karpenter's two-minute silence on a node it has
    // already told about (it reports one reason per node per two minutes, and
    // the first may be "not initialized yet").
    let _served = install_node_holder(&a, &["--hold-duration=180s"]).await;
    let records = records(&a);
    let waves = two_waves(&mut a).await;

    // Held from their CREATE on, by node-holder's webhook.
    created_held(a.cp(), &waves.first);
    let deadline = at(&window(&records).await, "/open/deadline").expect("an open window");

    // Karpenter's consolidateAfter ran out and it looked twice, yet it found
    // no empty node it may disrupt and deleted nothing; the second wave ran
    // on the held nodes and Karpenter launched nothing for it.
    assert!(a.nodes_deleted().is_empty(), "{:?}", a.nodes_deleted());
    assert_eq!(waves.second, waves.first);
    assert_eq!(waves.launched_after_second, waves.launched_before_second);
    assert_eq!(waves.launched_before_second, 3);
    a.end_wave("wave-2").await;

    // Karpenter says why, on every held node, before the window closes.
    let first = waves.first.clone();
    let open_for =
        Duration::try_from(deadline.duration_since(Timestamp::now())).unwrap_or(Duration::ZERO);
    a.until(
        "Karpenter blames the hold on every node",
        open_for,
        async |a| {
            for node in &first {
                if !a
                    .node_events(node, "DisruptionBlocked")
                    .await
                    .iter()
                    .any(|m| m == BLOCKED_BY_HOLD)
                {
                    return false;
                }
            }
            true
        },
    )
    .await;
    assert_eq!(a.eligible_empty_nodes().await, 0.0);
    assert!(a.nodes_deleted().is_empty(), "{:?}", a.nodes_deleted());

    // The window closes, node-holder strips its holds, and Karpenter
    // consolidates every node, none of them before the deadline.
    a.until(
        "the held nodes consolidated after the window",
        KARPENTER_ROUND * 3,
        async |a| first.iter().all(|n| a.nodes_deleted().contains_key(n)),
    )
    .await;
    let deleted = a.nodes_deleted();
    for node in &waves.first {
        assert!(
            deleted[node] >= deadline,
            "{node} deleted at {} < {deadline}",
            deleted[node]
        );
    }
}

#[tokio::test]
async fn a_hold_a_user_put_on_a_karpenter_node_outlives_node_holders_release() {
    let mut a = Autoscaled::start(&Disruption::default()).await;
    // A node Karpenter launched before node-holder came, held by hand.
    let kept = a.wave("kept", 1).await;
    let kept = kept.first().unwrap().clone();
    annotate(&a.nodes, &kept, HOLD, "true").await;

    let served = install_node_holder(&a, &["--hold-duration=30s"]).await;
    let records = records(&a);
    let wave = a.wave("wave", 2).await;
    created_held(a.cp(), &wave);
    let deadline = at(&window(&records).await, "/open/deadline").expect("an open window");
    a.end_wave("kept").await;
    a.end_wave("wave").await;

    // After the window node-holder's nodes go, the user's stays.
    a.until(
        "node-holder's nodes consolidated",
        KARPENTER_ROUND * 2,
        async |a| wave.iter().all(|n| a.nodes_deleted().contains_key(n)),
    )
    .await;
    let deleted = a.nodes_deleted();
    for node in &wave {
        assert!(deleted[node] >= deadline, "{node}");
    }
    a.karpenter_passes(2.0).await;
    assert!(!a.nodes_deleted().contains_key(&kept));
    let node = a.nodes.get(&kept).await.unwrap();
    let annotations = node.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get(HOLD).map(String::as_str),
        Some("true"),
        "{annotations:?}"
    );
    assert_eq!(a.eligible_empty_nodes().await, 0.0);
    drop(served);
}

/// Drift is a change the operator made, not churn: a drifted node is
/// released inside its window and Karpenter replaces it at once; the
/// replacement, a new node, is held.
#[tokio::test]
async fn a_drifted_node_is_released_inside_its_window_and_its_replacement_held() {
    let mut a = Autoscaled::start(&Disruption::default()).await;
    let hold = Duration::from_secs(600);
    let _served = install_node_holder(&a, &["--hold-duration=10m"]).await;
    let nodes = a.deployment("busy", 1).await;
    let drifting = nodes.first().unwrap().clone();
    let held_until: Timestamp = a.nodes_launched()[&drifting] + hold;
    a.until("the new node held", KARPENTER_ROUND, async |a| {
        carries_hold(a, &drifting).await
    })
    .await;

    drift_the_pool(&a).await;
    a.until(
        "node-holder releases the drifted node",
        KARPENTER_ROUND,
        async |a| !carries_hold(a, &drifting).await,
    )
    .await;
    a.until_node_said(&drifting, "HoldReleased", "drifted")
        .await;
    a.until(
        "the drifted node replaced",
        KARPENTER_ROUND * 2,
        async |a| a.nodes_deleted().contains_key(&drifting),
    )
    .await;
    let deleted = a.nodes_deleted()[&drifting];
    assert!(
        deleted < held_until,
        "deleted {deleted}, window until {held_until}"
    );
    let replacement = replaced_for_drift(&mut a, &drifting).await;
    assert!(
        carries_hold(&a, &replacement).await,
        "the replacement {replacement} is a new node of the window: held"
    );
}

/// Karpenter said it disrupted `drifted` for drift, and the `busy` pod runs
/// on its replacement, a new node; the replacement.
async fn replaced_for_drift(a: &mut Autoscaled, drifted: &str) -> String {
    a.until_node_said(drifted, "DisruptionTerminating", "Drifted")
        .await;
    a.until(
        "the pod runs on the replacement",
        KARPENTER_ROUND,
        async |a| {
            let now = a.running_nodes("busy").await;
            now.len() == 1 && !now.contains(drifted)
        },
    )
    .await;
    a.running_nodes("busy").await.into_iter().next().unwrap()
}

/// Changes the NodePool's template (a new label): every node of the pool
/// has drifted.
async fn drift_the_pool(a: &Autoscaled) {
    testenv::node_pools(&a.client)
        .patch(
            testenv::NODE_POOL,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"template": {"metadata": {"labels": {"rollout": "2"}}}}}),
            ),
        )
        .await
        .unwrap();
}

async fn carries_hold(a: &Autoscaled, node: &str) -> bool {
    a.nodes
        .get_opt(node)
        .await
        .unwrap()
        .and_then(|n| n.metadata.annotations)
        .is_some_and(|an| an.get(HOLD).is_some_and(|v| v == "true"))
}

/// A rolling drift is not held up by the windows its replacements open:
/// each replacement is a new node and opens (or extends) the window, but
/// the drifted nodes waiting their turn are not held by it, so Karpenter
/// replaces them one after another (its 10% budget), all inside the first
/// replacement's window.
#[tokio::test]
async fn a_rolling_drift_goes_on_through_the_window_its_replacements_open() {
    let mut a = Autoscaled::start(&Disruption::default()).await;
    let nodes = a.deployment("busy", 2).await;
    assert_eq!(nodes.len(), 2, "one node a pod: {nodes:?}");
    let _served = install_node_holder(&a, &["--hold-duration=10m"]).await;
    let records = records(&a);

    drift_the_pool(&a).await;
    a.until(
        "the first replacement opens a window",
        KARPENTER_ROUND * 2,
        async |_| at(&window(&records).await, "/open/deadline").is_some(),
    )
    .await;
    let deadline = at(&window(&records).await, "/open/deadline").unwrap();
    a.until(
        "both drifted nodes replaced",
        KARPENTER_ROUND * 3,
        async |a| {
            let deleted = a.nodes_deleted();
            nodes.iter().all(|n| deleted.contains_key(n))
        },
    )
    .await;
    let deleted = a.nodes_deleted();
    for node in &nodes {
        assert!(
            deleted[node] < deadline,
            "{node} deleted {}, window until {deadline}",
            deleted[node]
        );
        a.until_node_said(node, "DisruptionTerminating", "Drifted")
            .await;
    }
    // A replacement launched while Karpenter still read the old template
    // drifts in turn and is replaced again (unheld, as drifted); the pods
    // end on replacements of the new template, which the window holds.
    a.until(
        "the nodes the pods end on are held",
        KARPENTER_ROUND * 3,
        async |a| {
            let running = a.running_nodes("busy").await;
            let mut held = !running.is_empty();
            for node in &running {
                held &= carries_hold(a, node).await;
            }
            held
        },
    )
    .await;
}

#[tokio::test]
async fn a_manual_hold_pauses_consolidation_until_release_ends_it() {
    let mut a = Autoscaled::start(&Disruption::default()).await;
    // A rollout's nodes, launched before node-holder came; its own window
    // (2 s a node) has long ended for them by the time they are empty.
    let rollout = a.wave("rollout", 2).await;
    let served = install_node_holder(&a, &["--hold-duration=2s"]).await;
    let out = succeeded(&operator(
        a.cp(),
        &["hold", "--for", "10m", "--reason", "payments rollout"],
    ));
    assert!(out.contains("2 node(s) carry node-holder's hold"), "{out}");
    a.end_wave("rollout").await;

    // Karpenter's consolidateAfter runs out and it looks twice at the empty
    // nodes, yet finds none it may disrupt and deletes nothing.
    a.until(
        "the rollout's nodes consolidatable",
        KARPENTER_ROUND,
        async |a| a.consolidatable_or_gone(&rollout).await,
    )
    .await;
    a.karpenter_passes(2.0).await;
    assert!(a.nodes_deleted().is_empty(), "{:?}", a.nodes_deleted());
    assert_eq!(a.eligible_empty_nodes().await, 0.0);

    // The rollout is done early: release ends the hold, and Karpenter
    // consolidates both nodes, none before the release.
    let released_at = Timestamp::now();
    let out = succeeded(&operator(a.cp(), &["release"]));
    assert!(out.contains("released"), "{out}");
    a.until(
        "the rollout's nodes consolidated after the release",
        KARPENTER_ROUND * 2,
        async |a| rollout.iter().all(|n| a.nodes_deleted().contains_key(n)),
    )
    .await;
    let deleted = a.nodes_deleted();
    for node in &rollout {
        assert!(
            deleted[node] >= released_at,
            "{node} deleted at {}",
            deleted[node]
        );
    }
    drop(served);
}

/// Policy mode (`admission.mode: policy`): with no node-holder process at
/// all, every node Karpenter launches is held at its CREATE by the API server
/// itself, and Karpenter keeps the empty nodes past `consolidateAfter`; once
/// node-holder runs (`--admission policy`), its window task finds the
/// window long over, releases them, and Karpenter consolidates them.
#[tokio::test]
async fn in_policy_mode_karpenters_nodes_are_held_at_create_with_node_holder_down() {
    let mut a = Autoscaled::start(&Disruption::default()).await;
    let objects = policy::objects(&[]);
    policy::apply(a.cp(), &objects, &common::node("probe"), HOLD).await;

    let wave = a.wave("wave", 2).await;
    assert_eq!(wave.len(), 2, "one node a pod: {wave:?}");
    for name in &wave {
        // Nothing else runs that could have put it there.
        let node = a.nodes.get(name).await.unwrap();
        assert!(held(&node), "{name}: {:?}", node.metadata);
    }
    a.end_wave("wave").await;
    a.until(
        "the wave's nodes consolidatable",
        KARPENTER_ROUND,
        async |a| a.consolidatable_or_gone(&wave).await,
    )
    .await;
    a.karpenter_passes(2.0).await;
    assert!(a.nodes_deleted().is_empty(), "{:?}", a.nodes_deleted());
    assert_eq!(a.eligible_empty_nodes().await, 0.0);

    let served = policy::serve(a.cp(), &["--hold-duration=10s"]).await;
    a.until(
        "the nodes consolidated once node-holder released them",
        KARPENTER_ROUND * 3,
        async |a| wave.iter().all(|n| a.nodes_deleted().contains_key(n)),
    )
    .await;
    drop(served);
}
