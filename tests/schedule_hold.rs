//! `--launch-cost` with the real Karpenter and the real CronJob controller:
//! node-holder keeps exactly the nodes a scheduled run due within the launch
//! cost will use, and lets the others go at once, whatever its (long) hold
//! window would say.

use testsupport as common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::karpenter::{Autoscaled, KARPENTER_ROUND};
use common::{Served, register_webhook, serve};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::CronJob;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use node_holder::core::schedule::Schedule;
use testenv::Disruption;

const HOLD: &str = "karpenter.sh/do-not-disrupt";
/// How long each run's pod runs (kwok finishes it then).
const RUN_FOR: Duration = Duration::from_secs(15);

fn cronjob(name: &str, schedule: &str) -> CronJob {
    testenv::filler_cronjob(name, schedule, RUN_FOR)
}

/// node-holder's flags here.
const ARGS: [&str; 3] = [
    "--lease-duration=3s",
    // A window would hold every node for 20 minutes: the schedule's nodes
    // must open none.
    "--hold-duration=20m",
    "--launch-cost=2m",
];

async fn install(a: &Autoscaled) -> Served {
    common::install_node_holder_rbac(a.cp()).await;
    common::install_rbac_for(a.cp(), "schedules").await;
    let served = serve(a.cp(), &ARGS).await;
    register_webhook(a.cp(), &served).await;
    served
}

/// Waits until `served` leads.
async fn leads(a: &mut Autoscaled, served: &Served) {
    a.until("node-holder leads", Duration::from_secs(30), async |_| {
        common::window::metric(served, "node_holder_leader").await == Some(1.0)
    })
    .await;
}

async fn carries_hold(a: &Autoscaled, node: &str) -> bool {
    a.nodes.get(node).await.is_ok_and(|n| {
        n.metadata
            .annotations
            .is_some_and(|an| an.get(HOLD).is_some_and(|v| v == "true"))
    })
}

/// The pods of `cronjob`'s runs, oldest run first: (job, node, phase).
async fn runs(a: &Autoscaled, cronjob: &str) -> Vec<(String, Option<String>, String)> {
    let pods: Api<Pod> = Api::namespaced(a.client.clone(), "default");
    let params = ListParams::default().labels(&format!("cronjob={cronjob}"));
    let mut runs: Vec<(String, Option<String>, String)> = pods
        .list(&params)
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|pod| {
            let job = pod.metadata.labels.unwrap()["batch.kubernetes.io/job-name"].clone();
            let node = pod.spec.and_then(|s| s.node_name);
            let phase = pod.status.and_then(|s| s.phase).unwrap_or_default();
            (job, node, phase)
        })
        .collect();
    runs.sort();
    runs
}

/// The next whole minute at least 20 s away: a CronJob created now first
/// runs then.
fn next_minute() -> Timestamp {
    Schedule::parse("* * * * *", None)
        .unwrap()
        .next_after(Timestamp::now() + Duration::from_secs(20))
        .unwrap()
}

/// Waits until `cronjob`'s run number `n` (from 1) has run on a node and
/// finished; returns its node.
async fn run_done(a: &mut Autoscaled, cronjob: &str, n: usize, by: Timestamp) -> String {
    let limit = Duration::try_from(by.duration_since(Timestamp::now())).unwrap_or_default()
        + KARPENTER_ROUND;
    let what = format!("run {n} of {cronjob} done");
    a.until(&what, limit, async |a| {
        runs(a, cronjob)
            .await
            .get(n - 1)
            .is_some_and(|(_, node, phase)| node.is_some() && phase == "Succeeded")
    })
    .await;
    runs(a, cronjob).await[n - 1].1.clone().unwrap()
}

/// One pool, two CronJobs: one every minute (its idle gaps, under a minute,
/// cost less than a 2-minute launch) and one whose next run is ten minutes
/// away. The every-minute job's node stays held through its gap and its
/// second run launches nothing; the other's node loses its hold as soon as
/// its run is over and Karpenter removes it; once the every-minute job is
/// suspended its node goes at once too.
#[tokio::test]
async fn the_schedule_keeps_the_nodes_of_a_run_due_soon_and_lets_the_others_go_at_once() {
    let mut a = Autoscaled::start(&Disruption::default()).await;
    let served = install(&a).await;
    // A schedule node-holder cannot predict: said on the CronJob, and its
    // runs are other work.
    cronjobs_api(&a)
        .create(&PostParams::default(), &cronjob("odd", "@every 10m"))
        .await
        .unwrap();
    let cronjobs = cronjobs_api(&a);
    // `rare` first runs at the next minute (at least 20 s away), and again
    // ten minutes later.
    let first = next_minute();
    let minute = first.as_second() / 60 % 60;
    let rare = format!("{minute},{} * * * *", (minute + 10) % 60);
    cronjobs
        .create(&PostParams::default(), &cronjob("rare", &rare))
        .await
        .unwrap();
    let rare_node = run_done(&mut a, "rare", 1, first).await;
    // Nothing is due for `rare` within the launch cost: its node is let go
    // as soon as its run is over (not after the 20-minute window), and
    // Karpenter removes it.
    a.until("rare's node released", Duration::from_secs(20), async |a| {
        !carries_hold(a, &rare_node).await
    })
    .await;
    a.until("rare's node removed", KARPENTER_ROUND, async |a| {
        a.nodes_deleted().contains_key(&rare_node)
    })
    .await;
    // `often` joins the pool (created only now, so that no run of it can
    // land on rare's node while that is there).
    let often_first = next_minute();
    cronjobs
        .create(&PostParams::default(), &cronjob("often", "* * * * *"))
        .await
        .unwrap();
    let often_node = run_done(&mut a, "often", 1, often_first).await;
    // `often` runs again within the minute: its idle node stays held.
    assert!(carries_hold(&a, &often_node).await, "often's node kept");
    // And node-holder says so: `status`, the node's Event, the gauge.
    let kept_line = format!("Scheduled:   1 node ({often_node}) until ");
    a.until(
        "status shows often's node kept",
        Duration::from_secs(20),
        async |a| {
            let status = common::succeeded(&common::operator(a.cp(), &["status"]));
            status.contains(&kept_line) && status.contains("cronjob default/often runs at")
        },
    )
    .await;
    let kept_gauge = r#"node_holder_schedule_kept_nodes{reason="run"}"#;
    assert!(common::window::metric(&served, kept_gauge).await >= Some(1.0));
    let odd_gauge = "node_holder_schedule_unpredictable_cronjobs";
    assert_eq!(common::window::metric(&served, odd_gauge).await, Some(1.0));
    // The Events are sent beside the passes: waited for.
    a.until("the nodes' Events", Duration::from_secs(20), async |a| {
        let kept = a.node_events(&often_node, "HeldForScheduledRun").await;
        let ended = a.node_events(&rare_node, "ScheduledHoldEnded").await;
        kept.iter()
            .any(|m| m.contains("cronjob default/often runs at"))
            && ended
                .iter()
                .any(|m| m.contains("no scheduled run is due within the launch cost (2m)"))
            && a.events_about("CronJob", "odd", "UnpredictableSchedule")
                .await
                .iter()
                .any(|m| m.contains("@every runs from when the controller started"))
    })
    .await;
    // Killed and started again mid-gap, node-holder takes the plan up.
    drop(served);
    let served = serve(a.cp(), &ARGS).await;
    leads(&mut a, &served).await;
    assert!(
        carries_hold(&a, &often_node).await,
        "kept across the restart"
    );
    let launched: BTreeSet<String> = a.nodes_launched().into_keys().collect();

    let second = run_done(&mut a, "often", 2, often_first + Duration::from_secs(60)).await;
    let now_launched: BTreeSet<String> = a.nodes_launched().into_keys().collect();
    assert_eq!(
        now_launched, launched,
        "often's second run launched nothing"
    );
    assert!(
        !a.nodes_deleted().contains_key(&often_node),
        "often's node held through its gap"
    );

    // Suspended, `often` has no run due: its node goes at once.
    let suspend = serde_json::json!({"spec": {"suspend": true}});
    cronjobs
        .patch("often", &PatchParams::default(), &Patch::Merge(&suspend))
        .await
        .unwrap();
    a.until(
        "often's nodes released",
        Duration::from_secs(20),
        async |a| !carries_hold(a, &often_node).await && !carries_hold(a, &second).await,
    )
    .await;
    a.until("often's nodes removed", KARPENTER_ROUND, async |a| {
        let deleted = a.nodes_deleted();
        deleted.contains_key(&often_node) && deleted.contains_key(&second)
    })
    .await;
}

/// A run whose pods need more nodes than its last run occupied finds the
/// node kept for it and launches only the difference.
#[tokio::test]
async fn a_run_that_needs_more_than_last_time_launches_only_the_difference() {
    let mut a = Autoscaled::start(&Disruption::default()).await;
    let _served = install(&a).await;
    let cronjobs = cronjobs_api(&a);
    let first = next_minute();
    cronjobs
        .create(&PostParams::default(), &cronjob("grows", "* * * * *"))
        .await
        .unwrap();
    let kept = run_done(&mut a, "grows", 1, first).await;
    a.until(
        "its node kept for the next run",
        Duration::from_secs(20),
        async |a| carries_hold(a, &kept).await,
    )
    .await;
    let before: BTreeSet<String> = a.nodes_launched().into_keys().collect();
    // The next run has two pods, each filling a node.
    let grow = serde_json::json!({"spec": {"jobTemplate": {"spec": {"parallelism": 2, "completions": 2}}}});
    cronjobs
        .patch("grows", &PatchParams::default(), &Patch::Merge(&grow))
        .await
        .unwrap();
    let second = first + Duration::from_secs(60);
    a.until(
        "the second run's two pods done",
        Duration::try_from(second.duration_since(Timestamp::now())).unwrap_or_default()
            + KARPENTER_ROUND,
        async |a| {
            let runs = runs(a, "grows").await;
            let done = |(_, node, phase): &&(String, Option<String>, String)| {
                node.is_some() && phase == "Succeeded"
            };
            runs.iter().filter(done).count() >= 3
        },
    )
    .await;
    let nodes: BTreeSet<String> = runs(&a, "grows")
        .await
        .into_iter()
        .skip(1)
        .filter_map(|(_, node, _)| node)
        .collect();
    assert!(
        nodes.contains(&kept),
        "one pod ran on the kept node: {nodes:?}"
    );
    let after: BTreeSet<String> = a.nodes_launched().into_keys().collect();
    assert_eq!(
        after.difference(&before).count(),
        1,
        "one node launched for the second pod: {before:?} -> {after:?}"
    );
}

fn cronjobs_api(a: &Autoscaled) -> Api<CronJob> {
    Api::namespaced(a.client.clone(), "default")
}
