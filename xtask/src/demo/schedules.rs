//! The demo's second act: node-holder with `--launch-cost`, and two
//! CronJobs in one pool. `often` runs every minute: keeping its node idle
//! through a gap of under a minute costs less than a 2-minute launch, so
//! node-holder keeps it and the next run launches nothing. `rare` runs
//! again ten minutes later: its node goes as soon as its run is over. Then
//! `often` is suspended and its node goes too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::batch::v1::CronJob;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use testenv::{KarpenterCluster, ManagedChild};

use super::{Story, start_node_holder};

/// What a launch costs in the second act.
const LAUNCH_COST: &str = "2m";
/// How long each run's pod runs.
const RUN_FOR: Duration = Duration::from_secs(15);

/// Replaces the first node-holder (already stopped) with one that also holds
/// for scheduled runs: its webhook registration goes, the RBAC to read
/// CronJobs and pods comes, and the new process registers its own.
pub(super) async fn restart_node_holder(
    cluster: &KarpenterCluster,
    hold: Duration,
) -> Result<(ManagedChild, PathBuf)> {
    let admin = cluster.control_plane().admin_client().await?;
    let configs: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    for config in configs.list(&ListParams::default()).await?.items {
        let name = config.metadata.name.unwrap_or_default();
        configs.delete(&name, &DeleteParams::default()).await?;
    }
    let rbac = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../webhook-config/rbac-schedules.yaml"
    );
    let rbac = std::fs::read_to_string(rbac).context("reading rbac-schedules.yaml")?;
    testenv::apply_manifests(&admin, &rbac).await?;
    let flag = format!("--launch-cost={LAUNCH_COST}");
    start_node_holder(cluster, hold, &[&flag]).await
}

/// The next minute at least 20 s away (both CronJobs exist by then).
fn first_minute() -> jiff::Timestamp {
    let soon = jiff::Timestamp::now() + Duration::from_secs(80);
    jiff::Timestamp::from_second(soon.as_second() / 60 * 60).unwrap_or(soon)
}

impl Story {
    /// The second act, told as it happens.
    pub(super) async fn schedules(&mut self, cluster: &mut KarpenterCluster) -> Result<()> {
        let cronjobs: Api<CronJob> = Api::namespaced(self.pods.clone().into_client(), "default");
        let first = first_minute();
        let minute = first.as_second() / 60 % 60;
        let rare = format!("{minute},{} * * * *", (minute + 10) % 60);
        for (name, schedule) in [("often", "* * * * *"), ("rare", rare.as_str())] {
            let cronjob = testenv::filler_cronjob(name, schedule, RUN_FOR);
            cronjobs.create(&PostParams::default(), &cronjob).await?;
        }
        self.tell(&format!(
            "cronjob often runs every minute, cronjob rare at :{minute:02} and :{:02}, each run \
             a pod that fills a node for {}s; node-holder keeps an idle node only for a run \
             due within its launch cost, {LAUNCH_COST}",
            (minute + 10) % 60,
            RUN_FOR.as_secs()
        ));
        self.follow(cluster, "both first runs done", |s| {
            s.runs_done("often") >= 1 && s.runs_done("rare") >= 1
        })
        .await?;
        self.follow(cluster, "rare's node let go", |s| s.ended > 0)
            .await?;
        let before = self.launched.clone();
        self.follow(cluster, "often's second run done", |s| {
            s.runs_done("often") >= 2
        })
        .await?;
        self.tell(&if self.launched == before {
            "often's second run ran on the node kept for it: Karpenter launched no node".into()
        } else {
            format!(
                "often's second run needed {:?}",
                self.launched.difference(&before)
            )
        });
        let suspend = serde_json::json!({"spec": {"suspend": true}});
        cronjobs
            .patch("often", &PatchParams::default(), &Patch::Merge(&suspend))
            .await?;
        self.tell("cronjob often suspended: no run is due for its node any more");
        self.follow(cluster, "Karpenter removes every node", |s| {
            s.gone.is_superset(&s.launched)
        })
        .await?;
        for name in ["often", "rare"] {
            cronjobs.delete(name, &DeleteParams::default()).await?;
        }
        Ok(())
    }

    /// Runs of `cronjob` whose pod has finished.
    fn runs_done(&self, cronjob: &str) -> usize {
        self.runs.get(cronjob).map_or(0, BTreeSet::len)
    }

    /// Tells each CronJob run's pod once it has finished, and on which node.
    pub(super) async fn look_at_runs(&mut self) -> Result<()> {
        let params = ListParams::default().labels("cronjob");
        let mut done: BTreeMap<(String, String), String> = BTreeMap::new();
        for pod in self.pods.list(&params).await?.items {
            if let Some((cronjob, job, node)) = finished_run(pod) {
                done.insert((cronjob, job), node);
            }
        }
        for ((cronjob, job), node) in done {
            if self
                .runs
                .entry(cronjob.clone())
                .or_default()
                .insert(job.clone())
            {
                self.tell(&format!("cronjob {cronjob}: run {job} done on node {node}"));
            }
        }
        Ok(())
    }
}

/// A finished run's (cronjob, job, node), from its pod.
fn finished_run(pod: Pod) -> Option<(String, String, String)> {
    let labels = pod.metadata.labels?;
    let phase = pod.status.and_then(|s| s.phase);
    if phase.as_deref() != Some("Succeeded") {
        return None;
    }
    Some((
        labels.get("cronjob")?.clone(),
        labels.get("batch.kubernetes.io/job-name")?.clone(),
        pod.spec?.node_name?,
    ))
}
