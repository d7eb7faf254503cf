//! The runs node-holder predicts from a CronJob's schedule are the runs the
//! real CronJob controller (kube-controller-manager's `cronjob-controller`)
//! starts: the first Job of each CronJob is for the first scheduled time
//! after its creation, the next for the one after that, in the CronJob's
//! `timeZone` or, without one, in UTC (the controller's zone here, as in its
//! image). The Jobs are created suspended, so no pod runs and no node is
//! launched: only the controller's timing is under test.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use kube::api::{Api, ListParams, PostParams};
use node_holder::core::schedule::Schedule;
use testenv::{Disruption, KarpenterCluster};

/// The annotation the CronJob controller puts on each Job it starts.
const SCHEDULED: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";

fn cronjob(name: &str, schedule: &str, time_zone: Option<&str>) -> CronJob {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "schedule": schedule,
            "timeZone": time_zone,
            "jobTemplate": {"spec": {
                "suspend": true,
                "template": {"spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "run", "image": "registry.invalid/run:1"}]
                }}
            }}
        }
    }))
    .unwrap()
}

/// The Jobs the controller started for `cronjob`, by scheduled time.
async fn runs(jobs: &Api<Job>, cronjob: &str) -> Vec<(Timestamp, String)> {
    let mut runs: Vec<(Timestamp, String)> = jobs
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|job| {
            job.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|owner| owner.kind == "CronJob" && owner.name == cronjob)
        })
        .map(|job| {
            let at = job.metadata.annotations.as_ref().unwrap()[SCHEDULED]
                .parse()
                .unwrap();
            (at, job.metadata.name.unwrap())
        })
        .collect();
    runs.sort();
    runs
}

/// Waits until the controller has started `count` Jobs of `cronjob`: until a
/// minute past the last predicted run, which the controller starts within
/// seconds of its time.
async fn await_runs(
    jobs: &Api<Job>,
    cronjob: &str,
    count: usize,
    last: Timestamp,
) -> Vec<(Timestamp, String)> {
    let deadline = last + Duration::from_secs(60);
    loop {
        let seen = runs(jobs, cronjob).await;
        if seen.len() >= count {
            return seen;
        }
        assert!(
            Timestamp::now() < deadline,
            "{cronjob}: {} of {count} runs by {deadline}: {seen:?}",
            seen.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn the_predicted_runs_are_the_cronjob_controllers_in_each_time_zone() {
    let cluster = KarpenterCluster::start(&Disruption::default())
        .await
        .expect("the cluster starts");
    let admin = cluster.control_plane().admin_client().await.unwrap();
    let cronjobs: Api<CronJob> = Api::default_namespaced(admin.clone());
    let jobs: Api<Job> = Api::default_namespaced(admin);
    // Kathmandu is 5:45 ahead of UTC: its even minutes are UTC's odd ones,
    // so the two `*/2` CronJobs run a minute apart.
    let cases = [
        ("every-minute", "*/1 * * * *", None, 2),
        ("even-utc", "*/2 * * * *", None, 1),
        ("even-kathmandu", "*/2 * * * *", Some("Asia/Kathmandu"), 1),
    ];
    let mut predicted = Vec::new();
    for (name, schedule, zone, count) in cases {
        let created = cronjobs
            .create(&PostParams::default(), &cronjob(name, schedule, zone))
            .await
            .unwrap();
        let since = created.metadata.creation_timestamp.unwrap().0;
        let parsed = Schedule::parse(schedule, zone).unwrap();
        let runs: Vec<Timestamp> =
            std::iter::successors(parsed.next_after(since), |&t| parsed.next_after(t))
                .take(count)
                .collect();
        predicted.push((name, runs));
    }
    let (even_utc, even_kathmandu) = (predicted[1].1[0], predicted[2].1[0]);
    assert_eq!(
        even_utc.as_second().abs_diff(even_kathmandu.as_second()),
        60,
        "the zones' even minutes are a minute apart"
    );
    for (name, runs) in predicted {
        let last = *runs.last().unwrap();
        let started = await_runs(&jobs, name, runs.len(), last).await;
        let scheduled: Vec<Timestamp> =
            started.iter().map(|(at, _)| *at).take(runs.len()).collect();
        assert_eq!(scheduled, runs, "{name}: {started:?}");
        for (at, job) in &started {
            // The controller names each Job by its scheduled minute.
            assert_eq!(
                job.as_str(),
                format!("{name}-{}", at.as_second() / 60),
                "{name}"
            );
        }
    }
}
