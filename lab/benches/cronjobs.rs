//! The schedule hold's whole process at scale:
//! `cargo bench -p node-holder-lab --bench cronjobs` (`NODE_HOLDER_BENCH_NODES`,
//! default 50,000; `NODE_HOLDER_BENCH_CRONJOBS`, default 5,000;
//! `NODE_HOLDER_BENCH_PODS`, each CronJob's last run, default 10 pods;
//! `NODE_HOLDER_BENCH_PASSES`, the passes timed, default 10: more for a
//! profiler attached to `serve` meanwhile).
//!
//! Against a real control plane (no CronJob controller: the CronJobs are
//! read, never fired):
//!
//! 1. creates the nodes in 100 NodePools (their `karpenter.sh/nodepool`
//!    label), the CronJobs (daily, spread over the day) and, for each, the
//!    pods of a finished run on as many nodes (labelled with their Job's
//!    name, bound, `Succeeded`), 32 creates in flight;
//! 2. starts the release build of `node-holder serve --launch-cost=5m` as
//!    node-holder's restricted identity (`webhook-config/rbac.yaml` and
//!    `rbac-schedules.yaml`), no webhook registered; waits for its first
//!    pass and for the holds it places to settle;
//! 3. changes one node's label ten times (each change runs a pass that
//!    reads all 50,000 nodes and 5,000 CronJobs and changes little: the
//!    holds of the few nodes whose run comes or goes that minute) and takes
//!    the passes' mean time from node-holder's own histogram;
//! 4. reads `serve`'s RSS then and its peak (VmHWM).
//!
//! Targets (issue 40): RSS under 100 MiB, a pass under 100 ms.

use testsupport as common;

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::batch::v1::CronJob;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use testenv::ControlPlane;

use node_holder_lab::fleet::{self, pool_node};
use node_holder_lab::measure::machine::Machine;
use node_holder_lab::measure::node_holder::{NodeHolderMetrics, PASS_SECONDS, wait_first_pass};
use node_holder_lab::measure::process::{ProcMemory, mib};

const POOLS: usize = 100;
const CREATE_IN_FLIGHT: usize = 32;
/// How old the newest node is when `serve` starts: past the schedule's
/// settle for new nodes (60 s).
const SETTLED: Duration = Duration::from_secs(75);

fn main() -> Result<()> {
    node_holder_lab::run_bench(run)
}

async fn run() -> Result<()> {
    let nodes = node_holder_lab::env_count("NODE_HOLDER_BENCH_NODES", 50_000);
    let cronjobs = node_holder_lab::env_count("NODE_HOLDER_BENCH_CRONJOBS", 5_000);
    let pods = node_holder_lab::env_count("NODE_HOLDER_BENCH_PODS", 10);
    println!(
        "node-holder schedule hold at scale: {nodes} nodes, {cronjobs} CronJobs, \
         {pods} pods a last run; load average {}",
        Machine::read().loadavg
    );
    let cp = ControlPlane::start()
        .await
        .context("starting the control plane")?;
    let admin = cp.admin_client().await?;
    let t = Instant::now();
    let nodes_created = create_cluster(&admin, nodes, cronjobs, pods).await?;
    println!("created the cluster in {:.0} s", t.elapsed().as_secs_f64());
    // Nodes younger than the schedule's settle (60 s) would all be kept as
    // new ones waiting for their pods: wait until none is.
    tokio::time::sleep_until((nodes_created + SETTLED).into()).await;

    common::install_node_holder_rbac(&cp).await;
    common::install_rbac_for(&cp, "schedules").await;
    let t = Instant::now();
    let served = common::serve(&cp, &["--launch-cost=5m", "--hold-duration=30s"]).await;
    wait_first_pass(
        &served,
        Duration::from_secs(600),
        Duration::from_millis(200),
    )
    .await?;
    println!("first pass {:.1} s after start", t.elapsed().as_secs_f64());
    settle(&served).await?;
    let passes = node_holder_lab::env_count("NODE_HOLDER_BENCH_PASSES", 10);
    println!("timing {passes} passes (serve's pid {})", served.child.id());
    let pass = quiet_passes(&admin, &served, passes).await?;
    let memory = ProcMemory::read(served.child.id())?;
    let (rss, peak) = (mib(memory.rss_kb), mib(memory.hwm_kb));
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    println!(
        "a pass that changes nothing: {:.1} ms (mean of {passes}; target < 100 ms: {})",
        pass * 1e3,
        met(pass < 0.1)
    );
    println!(
        "serve RSS {rss:.1} MiB, peak {peak:.1} MiB (target < 100 MiB: {}); load average {}",
        met(peak < 100.0),
        Machine::read().loadavg
    );
    drop(served);
    Ok(())
}

/// The nodes, the CronJobs and their last runs' pods; when the last node
/// was created.
async fn create_cluster(
    admin: &kube::Client,
    nodes: usize,
    cronjobs: usize,
    pods: usize,
) -> Result<Instant> {
    let node_api: Api<Node> = Api::all(admin.clone());
    fleet::create(&node_api, nodes, CREATE_IN_FLIGHT, |i| {
        pool_node(&node_name(i), &format!("pool-{:02}", i % POOLS))
    })
    .await?;
    let nodes_created = Instant::now();
    let cronjob_api: Api<CronJob> = Api::namespaced(admin.clone(), "default");
    fleet::create(&cronjob_api, cronjobs, CREATE_IN_FLIGHT, cronjob).await?;
    let pod_api: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let count = cronjobs * pods;
    fleet::create(&pod_api, count, CREATE_IN_FLIGHT, |i| {
        run_pod(i / pods, i % pods, &node_name(i % nodes))
    })
    .await?;
    let succeeded = json!({"status": {"phase": "Succeeded"}});
    let finish = |i: usize| {
        let (pod_api, succeeded) = (&pod_api, &succeeded);
        async move {
            let name = pod_name(i / pods, i % pods);
            pod_api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(succeeded))
                .await
        }
    };
    use futures::StreamExt;
    let mut done = futures::stream::iter(0..count)
        .map(finish)
        .buffer_unordered(CREATE_IN_FLIGHT);
    while let Some(result) = done.next().await {
        result.context("finishing a run's pod")?;
    }
    Ok(nodes_created)
}

fn node_name(i: usize) -> String {
    format!("node-{i:06}")
}

fn cronjob_name(c: usize) -> String {
    format!("report-{c:05}")
}

/// The Job name the CronJob controller gives the run at minute 29,000,000.
fn job_name(c: usize) -> String {
    format!("{}-29000000", cronjob_name(c))
}

fn pod_name(c: usize, p: usize) -> String {
    format!("{}-{p:02}", job_name(c))
}

/// CronJob `c`: daily, at its own minute of the day (5,000 spread over the
/// 1,440 minutes: a handful due within any five minutes, so that a pass
/// changes the holds of a few nodes, not of thousands).
fn cronjob(c: usize) -> CronJob {
    let minute = c * 7 % 1440;
    let schedule = format!("{} {} * * *", minute % 60, minute / 60);
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": cronjob_name(c), "namespace": "default"},
        "spec": {
            "schedule": schedule,
            "jobTemplate": {"spec": {"template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "work", "image": "pause",
                    "resources": {"requests": {"cpu": "1"}}}],
            }}}},
        },
    }))
    .expect("a valid CronJob")
}

/// Pod `p` of CronJob `c`'s last run, bound to `node`.
fn run_pod(c: usize, p: usize, node: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name(c, p), "namespace": "default",
            "labels": {"batch.kubernetes.io/job-name": job_name(c)}},
        "spec": {"nodeName": node, "restartPolicy": "Never",
            "containers": [{"name": "work", "image": "pause"}]},
    }))
    .expect("a valid Pod")
}

/// Waits until no pass has run for five seconds: the holds the schedule
/// placed after the first pass are on.
async fn settle(served: &common::Served) -> Result<()> {
    let mut last = NodeHolderMetrics::scrape(served)
        .await?
        .get(&format!("{PASS_SECONDS}_count"));
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = NodeHolderMetrics::scrape(served)
            .await?
            .get(&format!("{PASS_SECONDS}_count"));
        if now == last {
            return Ok(());
        }
        last = now;
    }
}

/// The mean time of the passes that one node's label changes run (each
/// change, once the pass before it has run).
async fn quiet_passes(admin: &kube::Client, served: &common::Served, passes: usize) -> Result<f64> {
    let nodes: Api<Node> = Api::all(admin.clone());
    let read = || async {
        let m = NodeHolderMetrics::scrape(served).await?;
        anyhow::Ok((
            m.get(&format!("{PASS_SECONDS}_sum")),
            m.get(&format!("{PASS_SECONDS}_count")),
        ))
    };
    let (sum0, count0) = read().await?;
    for i in 0..passes {
        let before = read().await?.1;
        let patch = json!({"metadata": {"labels": {"bench.node-holder.dev/touch": i.to_string()}}});
        nodes
            .patch(
                &node_name(0),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while read().await?.1 <= before {
            anyhow::ensure!(Instant::now() < deadline, "no pass after a node change");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let (sum1, count1) = read().await?;
    Ok((sum1 - sum0) / (count1 - count0))
}
