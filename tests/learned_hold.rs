//! `--hold-policy learned`, against the real API server: the hold follows the
//! idle gaps a group shows between its new nodes (shortest after quiet
//! spells, longer in a busy stretch, priced against `--launch-cost`), what
//! it learned is kept in the record across a new leader, and `status` and a
//! metric say the hold and why. In `node` scope the gaps are the nodes':
//! a node that went away counts until the group's next launch.

use testsupport as common;

use std::time::Duration;

use jiff::Timestamp;

use common::window::{
    Cluster, all_held, create, eventually_logging, fast, metric, sigkill, sleep_until, strs, window,
};
use common::{Served, operator, succeeded};

/// A launch counts as 20 s of an idle node; holds between 4 s and 20 s. A
/// gap of 25 s is longer than any hold may be (letting go pays); gaps of
/// about 12 s pay for holding over them once enough of them are seen. The
/// margins hold when a busy machine delays a create by a few seconds.
fn learned_flags() -> Vec<String> {
    fast(
        "30s",
        &[
            "--hold-policy=learned",
            "--window-follows-work",
            "--launch-cost=20s",
            "--hold-floor=4s",
            "--hold-ceiling=20s",
        ],
    )
}

fn status_json(c: &Cluster) -> serde_json::Value {
    serde_json::from_str(&succeeded(&operator(&c.cp, &["status", "-o", "json"]))).unwrap()
}

/// The learned hold `status` reports, in seconds, once `gaps` gaps are in.
async fn hold_after(c: &Cluster, served: &Served, gaps: usize) -> u64 {
    let seen = |status: &serde_json::Value| {
        status["learnedHolds"][0]["why"]
            .as_str()
            .is_some_and(|why| why.contains(&format!(" of the last {gaps} gaps")))
    };
    eventually_logging(
        &format!("the hold learned from {gaps} gaps"),
        Duration::from_secs(30),
        served,
        || async { seen(&status_json(c)) },
    )
    .await;
    status_json(c)["learnedHolds"][0]["holdSeconds"]
        .as_u64()
        .unwrap()
}

/// Creates a node `gap` after `from`; returns when it was asked for.
async fn node_after(c: &Cluster, name: &str, from: Timestamp, gap: u64) -> Timestamp {
    let at = from + Duration::from_secs(gap);
    sleep_until(at).await;
    create(&c.nodes, name, &[], &[]).await;
    at
}

#[tokio::test]
async fn the_learned_hold_shortens_after_quiet_spells_lengthens_in_a_busy_stretch_and_survives_a_new_leader()
 {
    let c = Cluster::start().await;
    // No Karpenter here: the NodeClaim watch finds no API, and the gaps are
    // those between new nodes.
    common::install_node_holder_rbac(&c.cp).await;
    common::install_nodeclaim_rbac(&c.cp).await;
    let mut first = common::serve(&c.cp, &strs(&learned_flags())).await;
    create(&c.nodes, "quiet-0", &[], &[]).await;
    let mut at = Timestamp::now();

    // Three quiet gaps: no hold in the bounds pays for itself.
    for n in 1..=3 {
        at = node_after(&c, &format!("quiet-{n}"), at, 25).await;
    }
    assert_eq!(hold_after(&c, &first, 3).await, 4, "the floor");
    let text = succeeded(&operator(&c.cp, &["status"]));
    assert!(
        text.lines().any(|l| l.starts_with("Hold:")
            && l.ends_with(
                "holding 4s: 0 of the last 3 gaps were no longer; a launch counts as 20 node-seconds"
            )),
        "{text}"
    );
    assert_eq!(
        metric(&first, "node_holder_window_hold_seconds").await,
        Some(4.0)
    );

    // A busy stretch: gaps of about 12 s now pay for a hold over them.
    for n in 0..3 {
        at = node_after(&c, &format!("busy-{n}"), at, 12).await;
    }
    let busy = hold_after(&c, &first, 6).await;
    assert!(
        (5..=20).contains(&busy),
        "a hold over the busy gaps: {busy}s"
    );

    // A new leader takes up what the old one learned.
    let second = common::serve(&c.cp, &strs(&learned_flags())).await;
    sigkill(&mut first);
    eventually_logging(
        "the second replica leads and counts the hold as learned",
        Duration::from_secs(30),
        &second,
        || async { metric(&second, "node_holder_window_hold_seconds").await == Some(busy as f64) },
    )
    .await;

    // Quiet again: three more long gaps, and holding no longer pays.
    for n in 4..=6 {
        at = node_after(&c, &format!("quiet-{n}"), at, 25).await;
    }
    assert_eq!(hold_after(&c, &second, 9).await, 4, "back to the floor");
    let record = status_json(&c);
    assert_eq!(
        record["settings"]["learnedHold"]["launchCost"], "20s",
        "{record}"
    );
}

/// How many gone nodes wait in the record for a launch to match them.
async fn gone_waiting(c: &Cluster) -> usize {
    window(&c.records).await["history"]["goneIdleSince"]
        .as_array()
        .map_or(0, Vec::len)
}

/// Waits until a pass has seen `names` (it holds them).
async fn seen(c: &Cluster, served: &Served, names: &[&str]) {
    eventually_logging(
        "the new nodes held",
        Duration::from_secs(30),
        served,
        || all_held(&c.nodes, names),
    )
    .await;
}

/// Deletes `names` and waits until the record counts them gone.
async fn gone(c: &Cluster, served: &Served, names: &[&str], waiting: usize) {
    for name in names {
        c.nodes.delete(name, &Default::default()).await.unwrap();
    }
    eventually_logging(
        &format!("{waiting} gone nodes waiting for a launch"),
        Duration::from_secs(30),
        served,
        || async { gone_waiting(c).await == waiting },
    )
    .await;
}

#[tokio::test]
async fn in_node_scope_a_launch_after_a_node_went_away_is_its_gap_and_one_that_never_comes_a_long_one()
 {
    let c = Cluster::start().await;
    common::install_node_holder_rbac(&c.cp).await;
    common::install_nodeclaim_rbac(&c.cp).await;
    let mut flags = learned_flags();
    flags.push("--scope=node".into());
    let served = common::serve(&c.cp, &strs(&flags)).await;
    // Without Karpenter no work is seen: a node is idle from its creation.
    // One node stays all along: the group is never without one, and its
    // own gaps are never seen; each other node goes, and the next comes
    // 12 s after the last one was created.
    create(&c.nodes, "steady", &[], &[]).await;
    let mut at = Timestamp::now();
    create(&c.nodes, "busy-0", &[], &[]).await;
    seen(&c, &served, &["steady", "busy-0"]).await;
    for n in 1..=3 {
        gone(&c, &served, &[&format!("busy-{}", n - 1)], 1).await;
        let name = format!("busy-{n}");
        at = node_after(&c, &name, at, 12).await;
        seen(&c, &served, &[&name]).await;
    }
    let busy = hold_after(&c, &served, 3).await;
    assert!(
        (5..=20).contains(&busy),
        "a hold over the 12 s gaps: {busy}s"
    );

    // Quiet: six nodes go and no launch comes within the 20 s ceiling.
    for n in 0..6 {
        create(&c.nodes, &format!("quiet-{n}"), &[], &[]).await;
    }
    let quiet: Vec<String> = (0..6).map(|n| format!("quiet-{n}")).collect();
    let mut names: Vec<&str> = quiet.iter().map(String::as_str).collect();
    seen(&c, &served, &names).await;
    names.push("busy-3");
    gone(&c, &served, &names, 7).await;
    let quiet_hold = hold_after(&c, &served, 10).await;
    let record = window(&c.records).await;
    let gaps: Vec<u64> = record["history"]["gapSeconds"]
        .as_array()
        .map(|gaps| gaps.iter().filter_map(serde_json::Value::as_u64).collect())
        .unwrap_or_default();
    assert!(
        gaps.len() == 10
            && gaps[..3].iter().all(|g| (5..=20).contains(g))
            && gaps[3..].iter().all(|g| *g > 20),
        "three busy gaps, then seven gone nodes no launch matched: {record}"
    );
    assert_eq!(quiet_hold, 4, "back to the floor: {record}");
    assert_eq!(gone_waiting(&c).await, 0, "all counted");
    let text = succeeded(&operator(&c.cp, &["status"]));
    assert!(
        text.contains("holding 4s: 0 of the last 10 gaps were no longer"),
        "{text}"
    );
}
