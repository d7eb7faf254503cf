//! The hold window's bulk release through a fault of the process: the leader
//! SIGKILLed while it strips the holds of more than a thousand nodes, then
//! restarted.
//!
//! Which process sent which PATCH is read from the API server's audit log:
//! both run as node-holder's identity, so the time the API server received a
//! PATCH (before the kill, or after the restart) tells them apart, and its
//! time against the window's deadline tells a hold from a release (the audit
//! policy records PATCHes at Metadata level, without their body).

use testsupport as common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::window::{
    Cluster, HOLD, at, carries_anything_of_node_holders, create, created, eventually,
    eventually_logging, fast, held, logged, many_old_nodes, marked_count, metric,
    node_holder_patch_log, patched, secs, sigkill, strs, window,
};
use common::{register_webhook, serve};
use jiff::Timestamp;
use kube::api::ListParams;

/// The nodes there before the window opens: all held by the window task,
/// then all released in one long run of PATCHes.
const NODES: usize = 1_200;
/// Releases the first process must have done before it is killed: enough
/// that the kill lands in the middle of the run, not at its start.
const RELEASED_BEFORE_KILL: usize = 200;
/// `--api-qps` here.
const QPS: u32 = 200;

#[tokio::test]
async fn a_leader_killed_in_the_middle_of_a_bulk_release_leaves_no_hold_behind_after_a_restart() {
    let Cluster { cp, nodes, records } = Cluster::start().await;
    // At 200 PATCHes a second the 1,200 holds take about 6 s, and the
    // releases as long again: a run long enough to be killed in the middle
    // of. The suite's load once slowed them to 19 a second (63 s for the
    // holds), so the window is 90 s and each wait runs to its condition.
    let hold = secs(90);
    let args = fast("90s", &[&format!("--api-qps={QPS}")]);
    let names: Vec<String> = (0..NODES).map(|i| format!("bulk-{i:04}")).collect();
    let started = Timestamp::now();
    many_old_nodes(&nodes, &names, hold).await;
    eprintln!(
        "{NODES} nodes created and aged in {:?}",
        Timestamp::now().duration_since(started)
    );

    let mut first = serve(&cp, &strs(&args)).await;
    register_webhook(&cp, &first).await;
    let new_1 = create(&nodes, "new-1", &[], &[]).await;
    assert!(held(&new_1), "held by the webhook");
    let deadline = created(&new_1) + hold;
    let total = NODES + 1;
    // Held before the window ends: that is what the rest needs.
    let before_the_deadline =
        Duration::try_from(deadline.duration_since(Timestamp::now())).unwrap();
    eventually_logging("every node held", before_the_deadline, &first, || async {
        marked_count(&nodes).await == total
    })
    .await;
    eprintln!(
        "every node held {:?} before the deadline",
        deadline.duration_since(Timestamp::now())
    );
    assert!(
        Timestamp::now() < deadline,
        "the nodes were held only after the window ended"
    );

    eventually_logging(
        "the release under way",
        Duration::try_from(deadline.duration_since(Timestamp::now())).unwrap() + secs(15),
        &first,
        || async { marked_count(&nodes).await <= total - RELEASED_BEFORE_KILL },
    )
    .await;
    sigkill(&mut first);
    let killed = Timestamp::now();
    let listed_at_kill = marked_count(&nodes).await;
    eprintln!("killed at {killed} with {listed_at_kill} of {total} nodes still held");
    assert!(
        0 < listed_at_kill && listed_at_kill < total,
        "the kill did not land in the middle of the release: {listed_at_kill} of {total} held"
    );
    // The requests the process wrote just before it died still reach the
    // API server, a moment after the kill, and it settles them; after that
    // nothing changes while no process runs.
    tokio::time::sleep(secs(1)).await;
    let held_while_down = marked_count(&nodes).await;
    let planned = logged(&first, "patching nodes");
    assert!(
        planned
            .iter()
            .any(|l| l["action"] == "release" && l["nodes"] == total),
        "the killed process had set out to release every node: {planned:?}"
    );
    assert!(
        !logged(&first, "nodes patched")
            .iter()
            .any(|l| l["action"] == "release"),
        "the killed process finished its release run"
    );

    // Every PATCH of the killed process reached the API server before this.
    let restarted = Timestamp::now();
    let second = serve(&cp, &strs(&args)).await;
    eventually_logging("every hold released", secs(120), &second, || async {
        marked_count(&nodes).await == 0
    })
    .await;
    eprintln!(
        "every hold released {:?} after the restart",
        Timestamp::now().duration_since(restarted)
    );
    let all = nodes.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(all.len(), total);
    for node in &all {
        assert!(
            !carries_anything_of_node_holders(node)
                && node
                    .metadata
                    .annotations
                    .as_ref()
                    .is_none_or(|a| !a.contains_key(HOLD)),
            "{:?} kept something of node-holder's: {:?}",
            node.metadata.name,
            node.metadata
        );
    }
    let all_names: Vec<&str> = all
        .iter()
        .map(|n| n.metadata.name.as_deref().unwrap())
        .collect();

    // The restarted process's run is over once it logs it; its PATCHes'
    // audit events trail the responses a little.
    eventually_logging(
        "the restarted process's run logged",
        secs(10),
        &second,
        || std::future::ready(!logged(&second, "nodes patched").is_empty()),
    )
    .await;
    let released_by_second = patched(&second, "release") as usize;
    eventually("its releases in the audit log", secs(10), || async {
        tally(&node_holder_patch_log(&cp), &all_names, deadline, restarted).by_second
            == released_by_second
    })
    .await;
    let tally = tally(&node_holder_patch_log(&cp), &all_names, deadline, restarted);
    eprintln!(
        "{listed_at_kill} of {total} held when listed at the kill, {held_while_down} while no \
         process ran; {tally:?}"
    );
    let by_first = tally.by_first + tally.cut_off_applied;
    assert!(
        0 < by_first && by_first < total,
        "the kill did not land in the middle of the release: {by_first} of {total} released"
    );
    assert_eq!(by_first + tally.by_second, total, "{tally:?}");
    assert_eq!(
        held_while_down,
        total - by_first,
        "the nodes held while no process ran are those the audit log shows unreleased: \
         {tally:?}"
    );
    // At most the PATCHes in flight can be cut off by the kill.
    let in_flight = node_holder::controller::patcher::MAX_IN_FLIGHT;
    assert!(tally.cut_off.len() <= in_flight, "{tally:?}");

    // The restarted process planned exactly the releases left and made them,
    // and held nothing again: its log and metrics agree with the audit log.
    let planned: Vec<_> = logged(&second, "patching nodes")
        .into_iter()
        .map(|l| (l["action"].clone(), l["nodes"].clone()))
        .collect();
    assert_eq!(
        planned,
        [(
            serde_json::json!("release"),
            serde_json::json!(total - by_first)
        )]
    );
    assert_eq!(released_by_second, total - by_first);
    assert_eq!(patched(&second, "hold"), 0);
    assert_eq!(
        metric(&second, "node_holder_holds_released_total").await,
        Some(released_by_second as f64)
    );
    assert_eq!(
        metric(&second, "node_holder_holds_applied_total").await,
        Some(0.0)
    );
    let window = window(&records).await;
    assert!(window.get("open").is_none(), "{window}");
    assert_eq!(
        at(&window, "/closedThrough"),
        Some(created(&new_1)),
        "{window}"
    );
}

/// Who released the nodes, by node-holder's PATCHes in the audit log.
#[derive(Debug, Default)]
struct Tally {
    /// Releases the API server answered with 200: received before the
    /// restart (the killed process's), and after it.
    by_first: usize,
    by_second: usize,
    /// Release PATCHes the kill cut off, by node and the API server's answer
    /// (`504`: the client went away while it was handling them).
    cut_off: Vec<(String, u16)>,
    /// Of those, the ones applied nonetheless: the API server can finish
    /// writing a PATCH after it gave up on its client, and then the node
    /// needs no release by the restarted process.
    cut_off_applied: usize,
}

/// Tallies the releases of `names` and asserts what must hold of every
/// node's PATCHes: an old node's one hold before the `deadline` (the webhook
/// held new-1), no PATCH applied after it but one release (no re-hold, no
/// second release), and a failed PATCH only where the kill cut one off,
/// before the `restarted` process ran. A node whose only release is one the
/// kill cut off, and which carries nothing of node-holder's, was released by
/// that PATCH: no other PATCH of node-holder's touched it.
fn tally(
    log: &BTreeMap<String, Vec<(Timestamp, u16)>>,
    names: &[&str],
    deadline: Timestamp,
    restarted: Timestamp,
) -> Tally {
    let mut tally = Tally::default();
    for &name in names {
        let patches = log.get(name).map(Vec::as_slice).unwrap_or_default();
        let (before, after): (Vec<_>, Vec<_>) = patches.iter().partition(|&&(at, _)| at < deadline);
        let holds = if name == "new-1" { 0 } else { 1 };
        assert!(
            before.len() == holds && before.iter().all(|&&(_, code)| code == 200),
            "{name}: PATCHes before the deadline {deadline}: {patches:?}"
        );
        let (applied, failed): (Vec<_>, Vec<_>) =
            after.iter().partition(|&&&(_, code)| code == 200);
        assert!(
            applied.len() <= 1 && failed.len() <= 1,
            "{name}: PATCHes after the deadline {deadline}: {patches:?}"
        );
        for &&&(at, code) in &failed {
            assert!(
                at < restarted,
                "{name}: a PATCH refused with {code} after the restart: {patches:?}"
            );
            tally.cut_off.push((name.to_string(), code));
        }
        match (applied.first(), failed.is_empty()) {
            (Some(&&&(at, _)), _) if at < restarted => tally.by_first += 1,
            (Some(_), _) => tally.by_second += 1,
            (None, false) => tally.cut_off_applied += 1,
            // Not in the audit log yet.
            (None, true) => {}
        }
    }
    tally
}
