//! `--warm-before-runs` with the real Karpenter, kube-scheduler and CronJob
//! controller: before a run whose gap was too long to hold, node-holder's
//! placeholders make Karpenter launch its node, so the run's pod binds within
//! seconds instead of waiting for a launch; placeholders never outlive the
//! run's start by more than the grace, are gone when the run is suspended,
//! end by their own deadline when node-holder is killed, and give way to
//! any real pod.

use testsupport as common;

use std::time::Duration;

use common::karpenter::{Autoscaled, KARPENTER_ROUND};
use common::{Served, register_webhook, serve};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use node_holder::core::schedule::Schedule;
use testenv::{ClusterOptions, Disruption};

/// How long each run's pod runs (kwok finishes it then).
const RUN_FOR: Duration = Duration::from_secs(15);
/// The launch cost: a gap of minutes is not worth holding.
const LAUNCH_COST: &str = "--launch-cost=1m";
/// How long after its launch a node registers here: a cloud's boot.
const BOOT: Duration = Duration::from_secs(30);
/// The boot, and Karpenter's batching of pending pods (a few seconds), with
/// room to spare on a busy machine.
const LEAD: Duration = Duration::from_secs(90);
/// The placeholders' label.
const WARM: &str = node_holder::core::warm::WARM_SELECTOR;

/// A cluster whose nodes boot for [`BOOT`].
async fn cluster() -> Autoscaled {
    let options = ClusterOptions {
        registration_delay: Some(BOOT),
        ..ClusterOptions::default()
    };
    Autoscaled::start_with(&options, &Disruption::default()).await
}

async fn install(a: &Autoscaled) -> Served {
    common::install_node_holder_rbac(a.cp()).await;
    common::install_rbac_for(a.cp(), "schedules").await;
    common::install_rbac_for(a.cp(), "warm").await;
    let served = serve(a.cp(), &ARGS).await;
    register_webhook(a.cp(), &served).await;
    served
}

/// node-holder's flags here: `--warm-before-runs` is [`LEAD`].
const ARGS: [&str; 4] = [
    "--lease-duration=3s",
    "--hold-duration=20m",
    LAUNCH_COST,
    "--warm-before-runs=90s",
];

/// The next whole minute at least 20 s away, and a schedule that runs then
/// and `gap` minutes later.
fn two_runs(gap: i64) -> (Timestamp, String) {
    let first = Schedule::parse("* * * * *", None)
        .unwrap()
        .next_after(Timestamp::now() + Duration::from_secs(20))
        .unwrap();
    let minute = first.as_second() / 60 % 60;
    (first, format!("{minute},{} * * * *", (minute + gap) % 60))
}

async fn create_cronjob(a: &Autoscaled, name: &str, schedule: &str) {
    let cronjob = testenv::filler_cronjob(name, schedule, RUN_FOR);
    cronjobs(a)
        .create(&PostParams::default(), &cronjob)
        .await
        .unwrap();
}

fn cronjobs(a: &Autoscaled) -> Api<CronJob> {
    Api::namespaced(a.client.clone(), "default")
}

/// The pod of `cronjob`'s run at `at` (its Job is `<cronjob>-<minute>`; the
/// pods of an earlier run go with their node, by the pod garbage collector).
async fn run_pod(a: &Autoscaled, cronjob: &str, at: Timestamp) -> Option<Pod> {
    let pods: Api<Pod> = Api::namespaced(a.client.clone(), "default");
    let job = format!("{cronjob}-{}", at.as_second() / 60);
    let params = ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}"));
    pods.list(&params).await.unwrap().items.into_iter().next()
}

/// node-holder's placeholder pods.
async fn placeholders(a: &Autoscaled) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(a.client.clone(), "node-holder");
    pods.list(&ListParams::default().labels(WARM))
        .await
        .unwrap()
        .items
}

async fn placeholder_jobs(a: &Autoscaled) -> Vec<Job> {
    let jobs: Api<Job> = Api::namespaced(a.client.clone(), "node-holder");
    jobs.list(&ListParams::default().labels(WARM))
        .await
        .unwrap()
        .items
}

/// The warms under way as `node-holder status -o json` shows them.
fn status_warms(a: &Autoscaled) -> Vec<serde_json::Value> {
    let out = common::operator(a.cp(), &["status", "-o", "json"]);
    let status: serde_json::Value = serde_json::from_str(&common::succeeded(&out)).unwrap();
    status["warms"].as_array().cloned().unwrap_or_default()
}

/// Whether `pod` is bound to a node.
fn bound(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|s| s.node_name.is_some())
}

fn node_of(pod: &Pod) -> String {
    pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap()
}

/// Waits until the pod of `cronjob`'s run at `at` is bound; returns it and
/// how long it waited for its node, from its creation (whole seconds) until
/// it was seen bound (polled every 200 ms).
async fn run_bound(a: &mut Autoscaled, cronjob: &str, at: Timestamp) -> (Pod, Duration) {
    let limit = Duration::try_from(at.duration_since(Timestamp::now())).unwrap_or_default()
        + KARPENTER_ROUND;
    let what = format!("the run of {cronjob} at {at} bound");
    a.until(&what, limit, async |a| {
        run_pod(a, cronjob, at).await.is_some_and(|p| bound(&p))
    })
    .await;
    let seen = Timestamp::now();
    let pod = run_pod(a, cronjob, at).await.unwrap();
    let created = pod.metadata.creation_timestamp.as_ref().unwrap().0;
    let wait = Duration::try_from(seen.duration_since(created)).unwrap_or_default();
    (pod, wait)
}

/// A CronJob that runs, then again three minutes later: the gap is longer
/// than the launch cost, so its node goes after the first run. Ninety
/// seconds before the second, node-holder's placeholder makes Karpenter
/// launch a node; the run's pod binds within seconds of its creation; the
/// placeholder Job is gone by the run's start plus the grace, and the
/// CronJob's Event and the metrics say what the warm did.
#[tokio::test]
async fn a_run_after_a_long_gap_finds_its_node_launched_before_it() {
    let mut a = cluster().await;
    let served = install(&a).await;
    let (first, schedule) = two_runs(3);
    create_cronjob(&a, "hourly", &schedule).await;
    let second = first + Duration::from_secs(180);

    let (pod, cold) = run_bound(&mut a, "hourly", first).await;
    let first_node = node_of(&pod);
    // The first run found no node: it waited for a launch and the boot.
    assert!(cold >= BOOT, "the first run waited {cold:?} for its node");
    // Its node goes once the run is over (nothing is due within the launch
    // cost), before the warm starts: the warm's node is a launch.
    let warm_starts = second - LEAD;
    a.until(
        "the first run's node removed",
        Duration::try_from(warm_starts.duration_since(Timestamp::now())).unwrap_or_default(),
        async |a| a.nodes_deleted().contains_key(&first_node),
    )
    .await;

    // The warm starts the lead before the second run; its placeholder's
    // node is launched, registers and takes the placeholder before the run.
    let mut warm_node = None;
    a.until(
        "a placeholder pod bound",
        LEAD + KARPENTER_ROUND,
        async |a| {
            warm_node = placeholders(a).await.iter().find(|p| bound(p)).map(node_of);
            warm_node.is_some()
        },
    )
    .await;
    let warm_node = warm_node.unwrap();
    assert!(
        a.nodes_launched()[&warm_node] > warm_starts,
        "launched for the warm"
    );
    // `status` shows the warm: for which run, where, and what it costs.
    let warms = status_warms(&a);
    assert_eq!(warms.len(), 1, "{warms:?}");
    assert_eq!(warms[0]["cronjob"], "default/hourly");
    assert_eq!(
        warms[0]["runAt"].as_str(),
        Some(second.to_string().as_str())
    );
    assert_eq!(warms[0]["nodes"], serde_json::json!([warm_node]));
    assert_eq!(warms[0]["soFar"]["ready"], 1);
    assert!(warms[0]["soFar"]["nodeSeconds"].as_f64() > Some(0.0));

    let (pod, wait) = run_bound(&mut a, "hourly", second).await;
    assert!(
        wait.as_secs() <= 5,
        "the run's pod waited {wait:?} for a node (a launch takes 45 s and more)"
    );
    assert_eq!(node_of(&pod), warm_node, "the run took the warm node");
    a.until(
        "no placeholder left after the run's start",
        Duration::from_secs(60) + Duration::from_secs(30),
        async |a| placeholders(a).await.is_empty() && placeholder_jobs(a).await.is_empty(),
    )
    .await;
    assert!(status_warms(&a).is_empty(), "no warm under way");
    a.until("the warm's Event", Duration::from_secs(20), async |a| {
        let warming = a.events_about("CronJob", "hourly", "WarmingForRun").await;
        let warmed = a.events_about("CronJob", "hourly", "WarmedForRun").await;
        warming
            .iter()
            .any(|m| m.contains("cronjob default/hourly runs at"))
            && warmed
                .iter()
                .any(|m| m.contains("1 of 1 placeholder pod(s) were on 1 node(s)"))
    })
    .await;
    let ready = r#"node_holder_warm_placeholders_total{outcome="ready"}"#;
    assert_eq!(common::window::metric(&served, ready).await, Some(1.0));
    let node_seconds = "node_holder_warm_node_seconds_total";
    assert!(common::window::metric(&served, node_seconds).await > Some(0.0));
}

/// Two CronJobs due at the same minute, both warming. A pod of no
/// CronJob, at the default priority, pinned to one placeholder's node,
/// preempts it and binds; that CronJob is then suspended before it fires and
/// its placeholder Job goes at once. node-holder is killed: the other run's
/// pod preempts its placeholder and binds within seconds, and the
/// placeholder Job ends by its own deadline (the run's start plus the grace).
#[tokio::test]
async fn placeholders_give_way_to_real_pods_and_end_without_node_holder() {
    let mut a = cluster().await;
    let served = install(&a).await;
    let (first, schedule) = two_runs(3);
    for name in ["kept", "dropped"] {
        create_cronjob(&a, name, &schedule).await;
    }
    let second = first + Duration::from_secs(180);
    run_bound(&mut a, "kept", first).await;
    run_bound(&mut a, "dropped", first).await;
    // Their nodes go once the runs are over; the warms launch new ones.

    a.until(
        "both placeholders bound",
        LEAD + KARPENTER_ROUND * 2,
        async |a| {
            let bound = placeholders(a).await.iter().filter(|p| bound(p)).count();
            bound == 2 && placeholder_jobs(a).await.len() == 2
        },
    )
    .await;
    let dropped_node = placeholder_node(&a, "default/dropped").await;
    let mut urgent = serde_json::to_value(testenv::filler_pod("urgent")).unwrap();
    // Pinned by the node's name (KWOK nodes carry no hostname label).
    urgent["spec"]["affinity"] = serde_json::json!({"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": [dropped_node]}]
        }]}
    }});
    let urgent: Pod = serde_json::from_value(urgent).unwrap();
    let pods: Api<Pod> = Api::namespaced(a.client.clone(), "default");
    pods.create(&PostParams::default(), &urgent).await.unwrap();
    a.until(
        "the urgent pod bound in the placeholder's place",
        Duration::from_secs(30),
        async |a| {
            let pods: Api<Pod> = Api::namespaced(a.client.clone(), "default");
            pods.get("urgent").await.is_ok_and(|p| bound(&p))
        },
    )
    .await;

    let suspend = serde_json::json!({"spec": {"suspend": true}});
    cronjobs(&a)
        .patch("dropped", &PatchParams::default(), &Patch::Merge(&suspend))
        .await
        .unwrap();
    a.until(
        "the suspended run's warm gone",
        Duration::from_secs(20),
        async |a| {
            placeholder_jobs(a).await.len() == 1
                && !a
                    .events_about("CronJob", "dropped", "WarmCancelled")
                    .await
                    .is_empty()
        },
    )
    .await;
    drop(served);

    let (_, wait) = run_bound(&mut a, "kept", second).await;
    assert!(
        wait.as_secs() <= 10,
        "the run preempted its placeholder: waited {wait:?}"
    );
    // The Job controller ends the Job at the run's start plus the grace.
    let end = second + Duration::from_secs(60);
    let limit = Duration::try_from(end.duration_since(Timestamp::now())).unwrap_or_default();
    a.until(
        "the placeholders gone by their own deadline",
        limit + Duration::from_secs(30),
        async |a| placeholders(a).await.iter().all(|p| !running(p)),
    )
    .await;

    // `uninstall` removes what warms made: the Jobs and the PriorityClass.
    let out = common::operator(a.cp(), &["uninstall", "--timeout=60s"]);
    let text = common::succeeded(&out);
    assert!(text.contains("deleted the placeholder Jobs"), "{text}");
    let classes: Api<PriorityClass> = Api::all(a.client.clone());
    a.until(
        "nothing of the warms left",
        Duration::from_secs(30),
        async |a| {
            placeholder_jobs(a).await.is_empty()
                && placeholders(a).await.is_empty()
                && classes.get_opt("node-holder-warm").await.unwrap().is_none()
        },
    )
    .await;
}

/// The node of the placeholder warming for `cronjob` (`namespace/name`).
async fn placeholder_node(a: &Autoscaled, cronjob: &str) -> String {
    let jobs = placeholder_jobs(a).await;
    let job = jobs
        .iter()
        .find(|j| {
            let annotations = j.metadata.annotations.as_ref();
            annotations
                .and_then(|an| an.get("node-holder.dev/warm-for"))
                .map(String::as_str)
                == Some(cronjob)
        })
        .and_then(|j| j.metadata.name.clone())
        .unwrap();
    placeholders(a)
        .await
        .into_iter()
        .find(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("batch.kubernetes.io/job-name"))
                == Some(&job)
        })
        .and_then(|p| p.spec.and_then(|s| s.node_name))
        .unwrap()
}

/// Whether a placeholder pod still holds its place: not deleted, not failed.
fn running(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Failed" | "Succeeded"))
}
