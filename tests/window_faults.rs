//! The hold window through faults and variants, against the real API server:
//! a SIGKILL mid-window (restarted before and after the deadline), the
//! backstop for nodes the webhook missed, a label-selector scope, the
//! maxHold cap, two replicas with a failover, and a leader whose
//! Lease another took (its passes fail as `not_leading` and act not).
//!
//! When a hold is released is read from the API server's audit log: the time
//! it received node-holder's PATCH (microseconds), compared with deadlines
//! computed from the nodes' creationTimestamps (whole seconds), on the same
//! clock. So "not before the deadline" is exact, not sampled.

use testsupport as common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::window::{
    Cluster, SLACK, all_held, at, carries_anything_of_node_holders, create, created, eventually,
    eventually_logging, failed_open, fast, held, leader_flags, logged, metric, never_patched,
    none_carries_anything, old_nodes, patched, patched_exactly, record_at,
    register_unreachable_webhook, released_on_time, releases, secs, sigkill, sleep_until, strs,
    window,
};
use common::{Served, node, register_webhook, register_webhook_probing, serve};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use node_holder::state::{lease, record};
use serde_json::json;
use testenv::ControlPlane;

const NODEPOOL: &str = "karpenter.sh/nodepool";
/// The nodes that are there before node-holder.
const OLD: [&str; 2] = ["old-1", "old-2"];
/// node-holder's PATCHes once a window over [`OLD`] and new-1 closes: each
/// old node's hold and release, new-1's release (the webhook held it).
const OLD_AND_NEW_1: [(&str, usize); 3] = [("old-1", 2), ("old-2", 2), ("new-1", 1)];

/// Creates new-1, held by the webhook, and waits until every [`OLD`] node is
/// held.
async fn new_1_holds_the_old(nodes: &Api<Node>) -> Node {
    let new_1 = create(nodes, "new-1", &[], &[]).await;
    assert!(held(&new_1), "held by the webhook");
    eventually("every old node held", secs(10), || all_held(nodes, &OLD)).await;
    new_1
}

/// The [`OLD`] nodes, node-holder serving with `args` behind the webhook, and
/// a window new-1 opened with every old node held: the process and new-1.
async fn window_over_old_and_new_1(
    cp: &ControlPlane,
    nodes: &Api<Node>,
    hold: Duration,
    args: &[String],
) -> (Served, Node) {
    old_nodes(nodes, &OLD, &[], hold).await;
    let served = serve(cp, &strs(args)).await;
    register_webhook(cp, &served).await;
    (served, new_1_holds_the_old(nodes).await)
}

/// Asserts `who` took over before `deadline`, and says how long before.
fn took_over_before(who: &str, deadline: Timestamp) {
    eprintln!(
        "{who} took over {:?} before the deadline",
        deadline.duration_since(Timestamp::now())
    );
    assert!(
        Timestamp::now() < deadline,
        "{who} took over only after the deadline {deadline}"
    );
}

#[tokio::test]
async fn after_a_sigkill_mid_window_the_restart_reads_the_window_back_and_releases_on_time() {
    let Cluster { cp, nodes, records } = Cluster::start().await;
    let hold = secs(9);
    let args = fast("9s", &[]);
    let (mut first, new_1) = window_over_old_and_new_1(&cp, &nodes, hold, &args).await;
    // A second new node, a whole second later at least, extends the window.
    sleep_until(created(&new_1) + secs(2)).await;
    let new_2 = create(&nodes, "new-2", &[], &[]).await;
    let deadline = created(&new_2) + hold;
    assert!(deadline > created(&new_1) + hold);
    eventually("the record extended to new-2", secs(5), || async {
        record_at(&records, "/open/deadline").await == Some(deadline)
    })
    .await;

    sigkill(&mut first);
    // While nobody runs, the node that set the deadline goes: the cluster
    // alone now says the window ends at new-1's deadline, earlier; only the
    // record still knows new-2's.
    nodes
        .delete("new-2", &DeleteParams::default())
        .await
        .unwrap();
    let second = serve(&cp, &strs(&args)).await;
    eventually(
        "the restarted process leads with the recorded deadline",
        secs(10),
        || async {
            metric(&second, "node_holder_leader").await == Some(1.0)
                && metric(&second, "node_holder_window_deadline_seconds").await
                    == Some(deadline.as_second() as f64)
        },
    )
    .await;
    took_over_before("the restarted process", deadline);

    released_on_time(
        &cp,
        &nodes,
        &OLD_AND_NEW_1,
        Duration::try_from(deadline.duration_since(Timestamp::now())).unwrap() + SLACK + secs(5),
        deadline,
    )
    .await;
    assert_eq!(
        patched(&first, "release"),
        0,
        "the killed process released nothing"
    );
    // The restarted process released all.
    patched_exactly(&second, "release", 3).await;
    let window = window(&records).await;
    assert!(window.get("open").is_none(), "{window}");
    assert_eq!(
        at(&window, "/closedThrough"),
        Some(created(&new_2)),
        "the deleted node's contribution survived the restart: {window}"
    );
}

#[tokio::test]
async fn a_process_restarted_after_the_deadline_it_missed_releases_at_once() {
    let Cluster { cp, nodes, .. } = Cluster::start().await;
    let hold = secs(5);
    let args = fast("5s", &[]);
    let (mut first, new_1) = window_over_old_and_new_1(&cp, &nodes, hold, &args).await;
    let deadline = created(&new_1) + hold;
    sigkill(&mut first);
    let killed = Timestamp::now();

    // Past the deadline, and past the dead leader's lease (3 s).
    sleep_until((deadline + secs(1)).max(killed + secs(4))).await;
    assert!(
        all_held(&nodes, &["old-1", "old-2", "new-1"]).await,
        "nothing releases while no process runs"
    );
    let second = serve(&cp, &strs(&args)).await;
    let restarted = Timestamp::now();
    let released = releases(&cp, &nodes, &OLD_AND_NEW_1, secs(10)).await;
    eprintln!("restarted at {restarted}, released: {released:?}");
    for (name, &at) in &released {
        assert!(at > deadline, "{name} released at {at}");
        assert!(
            at <= restarted + secs(5),
            "{name} released at {at}, not at once after the restart at {restarted}"
        );
    }
    assert_eq!(patched(&first, "release"), 0);
    patched_exactly(&second, "release", 3).await;
    assert!(
        !logged(&second, "hold window closed").is_empty(),
        "{}",
        second.log()
    );
}

#[tokio::test]
async fn a_node_the_webhook_missed_is_held_late_and_opens_and_extends_the_window_like_any_other() {
    let Cluster { cp, nodes, records } = Cluster::start().await;
    let hold = secs(5);
    old_nodes(&nodes, &["old-1"], &[], hold).await;
    let served = serve(&cp, &strs(&fast("5s", &[]))).await;
    register_unreachable_webhook(&cp, &served).await;

    let missed_1 = create(&nodes, "missed-1", &[], &[]).await;
    assert!(
        !carries_anything_of_node_holders(&missed_1),
        "the webhook failed open: {:?}",
        missed_1.metadata
    );
    assert!(failed_open(
        &cp.wait_for_node_create_event("missed-1").await.unwrap()
    ));
    eventually("the missed node and the old one held late", secs(5), || {
        all_held(&nodes, &["missed-1", "old-1"])
    })
    .await;
    let window_now = window(&records).await;
    assert_eq!(
        at(&window_now, "/open/openedAt"),
        Some(created(&missed_1)),
        "{window_now}"
    );

    sleep_until(created(&missed_1) + secs(2)).await;
    let missed_2 = create(&nodes, "missed-2", &[], &[]).await;
    assert!(!carries_anything_of_node_holders(&missed_2));
    let deadline = created(&missed_2) + hold;
    eventually("the second missed node held late", secs(5), || {
        all_held(&nodes, &["missed-2"])
    })
    .await;
    eventually("the window extended to the second", secs(5), || async {
        record_at(&records, "/open/deadline").await == Some(deadline)
    })
    .await;
    let counted = |message: &str| -> Vec<String> {
        logged(&served, message)
            .iter()
            .map(|l| l["node"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    assert_eq!(counted("hold window opened"), ["missed-1"]);
    assert_eq!(counted("hold window extended"), ["missed-2"]);

    released_on_time(
        &cp,
        &nodes,
        &[("old-1", 2), ("missed-1", 2), ("missed-2", 2)],
        secs(15),
        deadline,
    )
    .await;
}

#[tokio::test]
async fn with_a_node_selector_only_nodes_in_scope_open_the_window_and_get_held() {
    let Cluster { cp, nodes, records } = Cluster::start().await;
    let hold = secs(5);
    let in_scope = [(NODEPOOL, "default")];
    create(&nodes, "old-out", &[], &[]).await;
    old_nodes(&nodes, &["old-in"], &in_scope, hold).await;
    let served = serve(
        &cp,
        &strs(&fast("5s", &[&format!("--node-selector={NODEPOOL}")])),
    )
    .await;
    let mut probe = node("webhook-probe");
    probe.metadata.labels = Some(BTreeMap::from([(NODEPOOL.into(), "default".into())]));
    register_webhook_probing(&cp, &served, probe).await;

    let out = create(&nodes, "new-out", &[], &[]).await;
    assert!(!carries_anything_of_node_holders(&out), "out of scope");
    // Several passes' time: nothing opens, nothing is held.
    tokio::time::sleep(secs(2)).await;
    let window_now = window(&records).await;
    assert!(window_now.get("open").is_none(), "{window_now}");
    assert!(none_carries_anything(&nodes, &["old-in", "old-out", "new-out"]).await);

    sleep_until(created(&out) + secs(2)).await;
    let new_in = create(&nodes, "new-in", &in_scope, &[]).await;
    assert!(held(&new_in), "held by the webhook");
    let deadline = created(&new_in) + hold;
    eventually("the old node in scope held", secs(5), || {
        all_held(&nodes, &["old-in"])
    })
    .await;
    let window_now = window(&records).await;
    assert_eq!(
        at(&window_now, "/open/openedAt"),
        Some(created(&new_in)),
        "only the node in scope opened the window: {window_now}"
    );
    assert_eq!(at(&window_now, "/open/deadline"), Some(deadline));
    assert!(none_carries_anything(&nodes, &["old-out", "new-out"]).await);

    released_on_time(
        &cp,
        &nodes,
        &[("old-in", 2), ("new-in", 1)],
        secs(15),
        deadline,
    )
    .await;
    never_patched(&cp, &["old-out", "new-out"]);
}

#[tokio::test]
async fn max_hold_ends_the_window_however_many_nodes_arrive_and_they_do_not_reopen_it() {
    let Cluster { cp, nodes, records } = Cluster::start().await;
    let (hold, max_hold) = (secs(4), secs(7));
    old_nodes(&nodes, &["old-1"], &[], hold).await;
    let served = serve(&cp, &strs(&fast("4s", &["--max-hold=7s"]))).await;
    register_webhook(&cp, &served).await;

    let first = create(&nodes, "burst-0", &[], &[]).await;
    let opened = created(&first);
    let cap = opened + max_hold;
    let mut names = vec!["old-1".to_string(), "burst-0".to_string()];
    let mut last = first;
    // A node a second, for five seconds: uncapped, the window would last
    // until the last one's creation + 4 s, two seconds past the cap.
    for i in 1..=5 {
        sleep_until(opened + secs(i)).await;
        let name = format!("burst-{i}");
        last = create(&nodes, &name, &[], &[]).await;
        assert!(held(&last), "{name} held by the webhook");
        names.push(name);
    }
    let last_end = created(&last) + hold;
    assert!(created(&last) < cap && last_end > cap);
    eventually("the record capped", secs(5), || async {
        let w = window(&records).await;
        at(&w, "/open/openedAt") == Some(opened)
            && at(&w, "/open/deadline") == Some(cap)
            && at(&w, "/open/countedThrough") == Some(cap)
    })
    .await;
    eventually("the old node held", secs(5), || {
        all_held(&nodes, &["old-1"])
    })
    .await;

    let expect: Vec<(&str, usize)> = names
        .iter()
        .map(|n| (n.as_str(), if n == "old-1" { 2 } else { 1 }))
        .collect();
    released_on_time(&cp, &nodes, &expect, secs(15), cap).await;

    // Until every node's own hold would have ended: no window reopens.
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    while Timestamp::now() < last_end + Duration::from_millis(500) {
        let w = window(&records).await;
        assert!(w.get("open").is_none(), "the window reopened: {w}");
        assert_eq!(at(&w, "/closedThrough"), Some(cap), "{w}");
        assert!(none_carries_anything(&nodes, &names).await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A node created after the close opens a new window.
    let after = create(&nodes, "after", &[], &[]).await;
    eventually(
        "a new window for the node after the close",
        secs(5),
        || async {
            record_at(&records, "/open/openedAt").await == Some(created(&after))
                && all_held(&nodes, &["old-1"]).await
        },
    )
    .await;
}

#[tokio::test]
async fn of_two_replicas_both_answer_the_webhook_one_leads_and_a_failover_releases_on_time_once() {
    let Cluster { cp, nodes, records } = Cluster::start().await;
    // Long enough that the kill and the takeover (a 3 s Lease) fall inside
    // the window on a busy machine too: at 9 s one run on a loaded machine
    // saw the standby take over only after the deadline.
    let hold = secs(20);
    let args = fast("20s", &[]);
    old_nodes(&nodes, &OLD, &[], hold).await;
    let args = strs(&args);
    let (a, b) = tokio::join!(serve(&cp, &args), serve(&cp, &args));
    let mut replicas = [a, b];

    // Both answer the webhook...
    for (i, replica) in replicas.iter().enumerate() {
        let name = format!("direct-{i}");
        let body = common::node_create(&name);
        let reply = common::https(replica, "POST", "/mutate", Some("application/json"), body).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let response = &reply.json()["response"];
        assert_eq!(response["allowed"], true);
        assert_eq!(response["patchType"], "JSONPatch", "{response}");
        assert!(
            replica
                .log_lines()
                .iter()
                .any(|l| l["message"] == "admission decision" && l["node"] == name.as_str()),
            "replica {i} logged no audit line"
        );
    }
    // ...exactly one leads.
    eventually("a leader", secs(10), || async {
        leader_flags(&replicas).await.contains(&Some(1.0))
    })
    .await;
    // Started together, they must never both lead: watch past a renewal
    // (the lease lasts 3 s and is renewed 1 s before it ends).
    let mut flags = leader_flags(&replicas).await;
    let sampled = Instant::now();
    while sampled.elapsed() < secs(3) {
        flags = leader_flags(&replicas).await;
        assert_eq!(
            flags.iter().filter(|f| **f == Some(1.0)).count(),
            1,
            "exactly one leader: {flags:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let leader = flags.iter().position(|f| *f == Some(1.0)).unwrap();
    let standby = 1 - leader;
    assert_eq!(flags[standby], Some(0.0), "exactly one leader: {flags:?}");

    register_webhook(&cp, &replicas[standby]).await;
    let new_1 = new_1_holds_the_old(&nodes).await;
    let deadline = created(&new_1) + hold;
    // Only the leader patched.
    patched_exactly(&replicas[leader], "hold", 2).await;
    assert!(logged(&replicas[standby], "nodes patched").is_empty());
    assert_eq!(record_at(&records, "/open/deadline").await, Some(deadline));

    // The leader dies mid-window; the standby takes over within the lease.
    sigkill(&mut replicas[leader]);
    let killed = Instant::now();
    eventually("the standby leads", secs(8), || async {
        metric(&replicas[standby], "node_holder_leader").await == Some(1.0)
    })
    .await;
    eprintln!("took over {:?} after the SIGKILL", killed.elapsed());
    took_over_before("the standby", deadline);

    // The deadline is at most `hold` away; the releases follow it.
    released_on_time(&cp, &nodes, &OLD_AND_NEW_1, hold + secs(15), deadline).await;
    assert_eq!(patched(&replicas[leader], "release"), 0);
    // One release per node.
    patched_exactly(&replicas[standby], "release", 3).await;
    assert_eq!(patched(&replicas[standby], "hold"), 0, "nothing held twice");
}

#[tokio::test]
async fn of_two_competitors_taking_a_free_lease_at_once_exactly_one_leads() {
    let Cluster { cp, .. } = Cluster::start().await;
    cp.install_node_holder_rbac().await.unwrap();
    // With node-holder's own permissions, as `serve` competes.
    let client = cp.node_holder_client().await.unwrap();
    let admin = cp.admin_client().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(admin, testenv::NODE_HOLDER_NAMESPACE);
    let namespace = testenv::NODE_HOLDER_NAMESPACE;
    for round in 0..16 {
        match leases.delete(record::NAME, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => panic!("deleting the lease: {err}"),
        }
        let (id_a, id_b) = (format!("a-{round}"), format!("b-{round}"));
        let (a, b) = tokio::join!(
            lease::lease_manager(&client, namespace, &id_a, 3),
            lease::lease_manager(&client, namespace, &id_b, 3),
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        // Each returns once it leads; the one that loses waits for the lease
        // to end (3 s, and nobody renews it), so once one leads the other is
        // cut off 1 s later.
        let cut_off = Duration::from_millis(1000);
        let leading = tokio::time::timeout(secs(10), async {
            tokio::select! {
                took = a.changed() => leads(took) + leads_within(&b, cut_off).await,
                took = b.changed() => leads(took) + leads_within(&a, cut_off).await,
            }
        })
        .await
        .unwrap_or_else(|_| panic!("round {round}: neither competitor leads within 10 s"));
        let holder = leases
            .get(record::NAME)
            .await
            .unwrap()
            .spec
            .unwrap()
            .holder_identity;
        assert_eq!(
            leading, 1,
            "round {round}: {leading} leaders, holder {holder:?}"
        );
        a.release().await.unwrap();
        b.release().await.unwrap();
    }
}

/// 1 if `changed` said its manager leads now.
fn leads(changed: kube_lease_manager::Result<bool>) -> usize {
    usize::from(matches!(changed, Ok(true)))
}

/// 1 if `manager` leads within `limit`.
async fn leads_within(manager: &kube_lease_manager::LeaseManager, limit: Duration) -> usize {
    tokio::time::timeout(limit, manager.changed())
        .await
        .map_or(0, leads)
}

#[tokio::test]
async fn a_leader_whose_lease_was_taken_over_acts_no_more_until_it_leads_again() {
    let Cluster { cp, nodes, .. } = Cluster::start().await;
    // Long enough that new-1 is still within its hold when the old leader
    // leads again (the usurped Lease runs out about 3-4 s after `taken`).
    let hold = secs(10);
    old_nodes(&nodes, &["old-1"], &[], hold).await;
    // No webhook: only the window task's backstop holds.
    let served = serve(&cp, &strs(&fast("10s", &[]))).await;
    eventually("leading", secs(10), || async {
        metric(&served, "node_holder_leader").await == Some(1.0)
    })
    .await;

    // The lease manager of the old leader only notices at its next renewal
    // (a third of the 3 s lease before its end).
    let taken = another_replica_takes_the_lease(&cp, 60).await;
    create(&nodes, "new-1", &[], &[]).await;
    // The pass for new-1 comes 200 ms later (coalescing), before the lease
    // manager's renewal in most runs: it must not act. Watched until the old
    // leader has stood down and a little after; its renewal sets the Lease's
    // duration back to 3 s, so it can lead again only 3 s after `taken`.
    while Timestamp::now() < taken + Duration::from_millis(2500) {
        assert!(
            none_carries_anything(&nodes, &["old-1", "new-1"]).await,
            "a replica that no longer holds the Lease patched nodes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // It stands down at that renewal, which a busy machine can delay.
    eventually_logging("stood down", secs(10), &served, || {
        std::future::ready(!logged(&served, "lost the hold window's lease").is_empty())
    })
    .await;
    // The other replica never renews, so the Lease runs out and the old
    // leader takes it back and holds as usual.
    eventually_logging("leading again and holding", secs(10), &served, || {
        all_held(&nodes, &["old-1", "new-1"])
    })
    .await;
}

#[tokio::test]
async fn a_leader_whose_lease_was_taken_fails_its_passes_as_not_leading_before_its_renewal_notices()
{
    let Cluster { cp, nodes, .. } = Cluster::start().await;
    old_nodes(&nodes, &["old-1"], &[], secs(2)).await;
    // A 120 s Lease is renewed 40 s before it ends: for 80 s after it leads,
    // the lease manager believes it leads, and only the pass's own check of
    // the Lease can find out otherwise. No webhook: only the backstop holds.
    let mut args = fast("2s", &[]);
    args.retain(|arg| !arg.starts_with("--lease-duration"));
    args.push("--lease-duration=120s".into());
    let served = serve(&cp, &strs(&args)).await;
    eventually("leading", secs(10), || async {
        metric(&served, "node_holder_leader").await == Some(1.0)
    })
    .await;
    another_replica_takes_the_lease(&cp, 600).await;
    create(&nodes, "new-1", &[], &[]).await;
    let failed = r#"node_holder_pass_failures_total{kind="not_leading"}"#;
    eventually_logging(
        "a pass failed as not leading",
        secs(20),
        &served,
        || async { metric(&served, failed).await.is_some_and(|n| n >= 1.0) },
    )
    .await;
    assert_eq!(
        metric(&served, "node_holder_leader").await,
        Some(1.0),
        "the lease manager noticed before the pass did: the test raced its renewal"
    );
    never_patched(&cp, &["old-1", "new-1"]);
}

/// Another replica takes the Lease over for `seconds`, as one may after an
/// API server outage longer than the Lease; returns when.
async fn another_replica_takes_the_lease(cp: &ControlPlane, seconds: u32) -> Timestamp {
    let leases: Api<Lease> = Api::namespaced(
        cp.admin_client().await.unwrap(),
        testenv::NODE_HOLDER_NAMESPACE,
    );
    let taken = Timestamp::now();
    leases
        .patch(
            record::NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "holderIdentity": "another-replica",
                "renewTime": MicroTime(taken),
                "leaseDurationSeconds": seconds,
            }})),
        )
        .await
        .unwrap();
    taken
}
