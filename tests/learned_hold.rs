//! `--hold-policy learned`, against the real API server: the hold follows the
//! idle gaps a group shows between its new nodes (shortest after quiet
//! spells, longer in a busy stretch, priced against `--launch-cost`), what
//! it learned is kept in the record across a new leader, and `status` and a
//! metric say the hold and why.

use testsupport as common;

use std::time::Duration;

use jiff::Timestamp;

use common::window::{
    Cluster, create, eventually_logging, fast, metric, sigkill, sleep_until, strs,
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
