//! The churn frontier, with the real Karpenter: `cargo bench --bench churn`.
//!
//! What an operator who is tired of churn would do instead of installing
//! node-holder is one line in the NodePool, `consolidateAfter`. This bench
//! plays the same day of batch work against every choice side by side and
//! prices each against the clairvoyant optimum of that day:
//! - **arms**: Karpenter alone at `consolidateAfter` 0s (its default), 30s,
//!   1m, 2m, 5m and 10m (`ka-*`); node-holder (a webhook and a window per
//!   pool, the pool at Karpenter's defaults) with fixed holds of 2m, 5m and
//!   10m (`nh-*`), the same holds with `--window-follows-work` (`nf-*`), and
//!   the learned hold at its default terms, following the work (`nl-5m`).
//!   Every arm is a NodePool of its own, its pods pinned to it; the `ka` and
//!   `nh` arms share one cluster (one control plane, one Karpenter), the `nf`
//!   and `nl` arms a second (one node-holder install per cluster), and both play
//!   on one clock, so every arm sees exactly the same work at the same
//!   instants on the same machine load. The knobs are the same fixed grid on
//!   every day, tuned on none.
//! - **days**: `compressed` (8 waves 30-200 s apart), `cron` (a Job every 5
//!   minutes with a little jitter: idle gaps between the 2m and 5m knobs),
//!   `poisson` (a busy and a quiet phase of random arrivals) and `working`
//!   (two busy stretches of minutes-long Jobs around a quiet 15-20 minutes).
//!   Each arm's pool also runs two steady pods (whole nodes, all day) and a
//!   service of small pods (several to a node) that scales down and up again,
//!   so a hold's cost on the rest of the fleet shows.
//! - **a cloud's launch**: Karpenter's KWOK nodes register 45 s after launch
//!   (`nodeRegistrationDelay`); launches are timed from NodeClaim creation.
//! - **measured**: from the bench's own watches, at receipt (sub-second):
//!   NodeClaims launched, node-seconds from each NodeClaim's creation until it
//!   is gone, each pod's wait from its creation to its binding, the pods that
//!   waited for a launch (bound to a node launched after they appeared), Job
//!   pods evicted while they ran; the machine's load.
//! - **scored**: total cost = node-seconds + launches x launch cost, for a
//!   launch cost of 1, 5 and 15 node-minutes; each as a ratio to the day's
//!   clairvoyant optimum (`testsupport::frontier`).
//!
//! Environment: `NODE_HOLDER_BENCH_DAYS` (comma-separated; default all four),
//! `NODE_HOLDER_BENCH_SEEDS` (default `1,2,3`), `NODE_HOLDER_BENCH_PARALLEL`
//! (clusters at once; default 2), `NODE_HOLDER_BENCH_QUICK=1` (the quick
//! variant: the compressed and cron days, seed 1, at once: about 50 minutes), and
//! `NODE_HOLDER_BENCH_OUT` (default `target/frontier`): each run's raw trace
//! and the report go there; the frontier pictures go to `docs/`.

use testsupport as common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde::{Deserialize, Serialize};
use serde_json::json;
use testenv::{ClusterOptions, Disruption, KarpenterCluster};
use testsupport::frontier::{self, Costs};

#[path = "churn/days.rs"]
mod days;
#[path = "churn/report.rs"]
mod report;

use testsupport::frontier::days::{self as day_plan, Day};

/// How long an instance takes from launch to a registered Node.
const BOOT: Duration = Duration::from_secs(45);
/// Karpenter's fastest release of an empty node: the disruption loop's
/// validation delay (`commandValidationDelay`, 15 s) before it acts.
const RELEASE: f64 = 15.0;
/// The launch costs the report prices, in node-seconds.
pub const LAUNCH_COSTS: [f64; 3] = [60.0, 300.0, 900.0];
/// How long the pools may take to lose their last node once the day's work
/// is over, on top of the longest knob.
const DRAIN_LIMIT: Duration = Duration::from_secs(900);
/// The label every pod of an arm carries: its arm's name.
const ARM_LABEL: &str = "bench-arm";

/// One way of running the day.
#[derive(Debug, Clone, Serialize)]
pub struct Arm {
    /// Its NodePool's name, and its label on everything it runs.
    pub name: String,
    /// The NodePool's `consolidateAfter`, in seconds.
    pub consolidate_after: u64,
    /// node-holder's `--hold-duration` in seconds, if node-holder holds it.
    pub hold: Option<u64>,
    /// node-holder with `--window-follows-work`.
    pub follows_work: bool,
    /// node-holder with `--hold-policy learned` at this launch cost (in
    /// seconds); its `hold` is the fallback until it has learned.
    pub learned: Option<u64>,
}

impl Arm {
    fn karpenter(after: u64) -> Arm {
        Arm {
            name: format!("ka-{}", knob(after)),
            consolidate_after: after,
            hold: None,
            follows_work: false,
            learned: None,
        }
    }

    fn node_holder(hold: u64) -> Arm {
        Arm {
            name: format!("nh-{}", knob(hold)),
            consolidate_after: 0,
            hold: Some(hold),
            follows_work: false,
            learned: None,
        }
    }

    fn following_work(hold: u64) -> Arm {
        Arm {
            name: format!("nf-{}", knob(hold)),
            follows_work: true,
            ..Arm::node_holder(hold)
        }
    }

    /// The learned hold at node-holder's default terms (a launch counts as
    /// 5 node-minutes; holds of 1-30 minutes; 10 minutes until it has
    /// learned), following the work.
    fn learning() -> Arm {
        Arm {
            name: "nl-5m".into(),
            learned: Some(300),
            ..Arm::following_work(600)
        }
    }

    /// The same grid on every day: nothing tuned per day or per arm.
    fn all() -> Vec<Arm> {
        let karpenter = [0, 30, 60, 120, 300, 600].map(Arm::karpenter);
        let holder = [120, 300, 600].map(Arm::node_holder);
        let following = [120, 300, 600].map(Arm::following_work);
        karpenter
            .into_iter()
            .chain(holder)
            .chain(following)
            .chain([Arm::learning()])
            .collect()
    }
}

/// `30s`, `2m`: a knob as Karpenter and node-holder write it.
fn knob(seconds: u64) -> String {
    if seconds >= 60 && seconds.is_multiple_of(60) {
        format!("{}m", seconds / 60)
    } else {
        format!("{seconds}s")
    }
}

/// One NodeClaim as the bench's watch saw it, in seconds since the day began.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Claim {
    pub pool: String,
    pub created: f64,
    pub gone: Option<f64>,
    pub node: Option<String>,
}

/// One pod as the bench's watch saw it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PodSeen {
    pub arm: String,
    pub seen: f64,
    pub bound: Option<f64>,
    pub node: Option<String>,
}

/// Everything one run of one day recorded: its raw trace.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Trace {
    pub day: String,
    pub seed: u64,
    pub claims: BTreeMap<String, Claim>,
    pub pods: BTreeMap<String, PodSeen>,
    /// Job pods that failed (evicted while running) per arm.
    pub interrupted: BTreeMap<String, i32>,
    /// (seconds, 1-minute load average), every 10 s.
    pub load: Vec<(f64, f64)>,
    /// When the day's work was over and the steady pods were let go.
    pub end: f64,
}

/// What one arm cost on one run.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub launches: usize,
    pub node_seconds: f64,
    pub pods: usize,
    pub waited_for_launch: usize,
    pub wait_p50: f64,
    pub wait_p95: f64,
    pub interrupted: i32,
}

impl Outcome {
    fn of(trace: &Trace, arm: &str) -> Outcome {
        let claims: Vec<&Claim> = trace.claims.values().filter(|c| c.pool == arm).collect();
        let node_seconds = claims
            .iter()
            .map(|c| c.gone.unwrap_or(trace.end) - c.created)
            .sum();
        let launched_at: BTreeMap<&str, f64> = claims
            .iter()
            .filter_map(|c| Some((c.node.as_deref()?, c.created)))
            .collect();
        let pods: Vec<&PodSeen> = trace.pods.values().filter(|p| p.arm == arm).collect();
        let waited_for_launch = pods
            .iter()
            .filter(|p| {
                let launched = p.node.as_deref().and_then(|n| launched_at.get(n));
                launched.is_some_and(|&at| at > p.seen)
            })
            .count();
        let mut waits: Vec<f64> = pods
            .iter()
            .filter_map(|p| Some(p.bound? - p.seen))
            .collect();
        waits.sort_by(f64::total_cmp);
        Outcome {
            launches: claims.len(),
            node_seconds,
            pods: pods.len(),
            waited_for_launch,
            wait_p50: report::percentile(&waits, 50.0),
            wait_p95: report::percentile(&waits, 95.0),
            interrupted: trace.interrupted.get(arm).copied().unwrap_or(0),
        }
    }

    pub fn total(&self, launch: f64) -> f64 {
        frontier::total(self.node_seconds, self.launches, launch)
    }
}

/// The clairvoyant optimum at launch cost `launch`.
pub fn optimum_at(day: &Day, launch: f64) -> frontier::Optimum {
    frontier::optimum(
        &day.demand(),
        Costs {
            launch,
            boot: BOOT.as_secs_f64(),
            release: RELEASE,
        },
    )
}

/// One day, one seed, every arm side by side: the arms of each node-holder
/// configuration in a cluster of their own (two installs in one cluster
/// would strip each other's holds), every cluster on one clock.
async fn run(day: &Day, arms: &[Arm]) -> Result<Trace> {
    let parts: Vec<Vec<Arm>> = [false, true]
        .iter()
        .map(|&follows| {
            arms.iter()
                .filter(|a| a.follows_work == follows)
                .cloned()
                .collect()
        })
        .filter(|part: &Vec<Arm>| !part.is_empty())
        .collect();
    let clusters =
        futures::future::try_join_all(parts.iter().map(|part| Prepared::start(part))).await?;
    let started = Instant::now();
    let traces = futures::future::try_join_all(
        clusters
            .into_iter()
            .zip(&parts)
            .map(|(cluster, part)| cluster.play(day, part, started)),
    )
    .await?;
    let mut trace = Trace {
        day: day.name.to_string(),
        seed: day.seed,
        ..Trace::default()
    };
    for part in traces {
        trace.claims.extend(part.claims);
        trace.pods.extend(part.pods);
        trace.interrupted.extend(part.interrupted);
        trace.load.extend(part.load);
        trace.end = trace.end.max(part.end);
    }
    trace.load.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(trace)
}

/// A cluster with its arms' NodePools and node-holder, ready to play.
struct Prepared {
    cluster: KarpenterCluster,
    holder: Option<common::Served>,
}

impl Prepared {
    async fn start(arms: &[Arm]) -> Result<Prepared> {
        let options = ClusterOptions {
            registration_delay: Some(BOOT),
            log_level: "info",
        };
        let cluster = KarpenterCluster::start_with(&options, &Disruption::default()).await?;
        for arm in arms {
            cluster
                .add_node_pool(&arm.name, &pool_disruption(arm))
                .await?;
        }
        let holder = start_node_holder(cluster.control_plane(), arms).await?;
        Ok(Prepared { cluster, holder })
    }

    /// Plays the day from `started` and records it until the last node is
    /// gone.
    async fn play(self, day: &Day, arms: &[Arm], started: Instant) -> Result<Trace> {
        let admin = self.cluster.control_plane().admin_client().await?;
        let recorder = Recorder::start(admin.clone(), started);
        play(&admin, day, arms, started).await?;
        let end = started.elapsed().as_secs_f64();
        let interrupted = wait_jobs_done(&admin, arms, DRAIN_LIMIT).await?;
        wait_claims_gone(&recorder, DRAIN_LIMIT + Duration::from_secs(600)).await?;
        drop(self.holder);
        let mut trace = recorder.stop();
        trace.interrupted = interrupted;
        trace.end = end;
        Ok(trace)
    }
}

/// Karpenter's defaults (`WhenEmptyOrUnderutilized`, budget `nodes: 10%`)
/// with the arm's `consolidateAfter`.
fn pool_disruption(arm: &Arm) -> Disruption {
    Disruption {
        consolidation_policy: "WhenEmptyOrUnderutilized".into(),
        consolidate_after: format!("{}s", arm.consolidate_after),
        budgets: json!([{"nodes": "10%"}]),
    }
}

/// One `node-holder serve` for every node-holder arm: a window per pool
/// (`--window-per-label karpenter.sh/nodepool`), each with the arm's hold
/// (`--group-hold-duration`), and only those pools in scope. Two installs
/// in one cluster would strip each other's holds, so the arms share one.
async fn start_node_holder(
    cp: &testenv::ControlPlane,
    arms: &[Arm],
) -> Result<Option<common::Served>> {
    let held: Vec<(&str, u64)> = arms
        .iter()
        .filter_map(|a| Some((a.name.as_str(), a.hold?)))
        .collect();
    let Some(&(first, _)) = held.first() else {
        return Ok(None);
    };
    let pools: Vec<&str> = held.iter().map(|h| h.0).collect();
    let selector = format!(
        "--node-selector=karpenter.sh/nodepool in ({})",
        pools.join(",")
    );
    let fixed: Vec<String> = arms
        .iter()
        .filter(|a| a.learned.is_none())
        .filter_map(|a| Some(format!("{}={}s", a.name, a.hold?)))
        .collect();
    let holds = format!("--group-hold-duration={}", fixed.join(","));
    let learned = arms.iter().find_map(|a| Some((a.learned?, a.hold?)));
    let mut args = vec![
        selector.as_str(),
        "--window-per-label=karpenter.sh/nodepool",
        "--max-hold=4h",
    ];
    if !fixed.is_empty() {
        args.push(&holds);
    }
    let learned_args = learned.map(|(launch, fallback)| {
        [
            "--hold-policy=learned".to_string(),
            format!("--launch-cost={launch}s"),
            format!("--hold-duration={fallback}s"),
        ]
    });
    args.extend(learned_args.iter().flatten().map(String::as_str));
    if arms.iter().any(|a| a.follows_work) {
        common::install_nodeclaim_rbac(cp).await;
        args.push("--window-follows-work");
    }
    let served = common::serve(cp, &args).await;
    let mut probe = common::node("webhook-probe");
    probe.metadata.labels = Some([("karpenter.sh/nodepool".to_string(), first.to_string())].into());
    common::register_webhook_probing(cp, &served, probe).await;
    Ok(Some(served))
}

/// The day's schedule on an absolute clock: each Job and each change of the
/// service's size happens for every arm at the same instant.
async fn play(client: &kube::Client, day: &Day, arms: &[Arm], started: Instant) -> Result<()> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    for arm in arms {
        let steady = deployment(&arm.name, "steady", day.steady, testenv::POD_CPU)?;
        let service = deployment(&arm.name, "service", day.service.0, day_plan::SERVICE_CPU)?;
        for object in [steady, service] {
            deployments.create(&PostParams::default(), &object).await?;
        }
    }
    for step in day.steps() {
        tokio::time::sleep_until((started + Duration::from_secs_f64(step.at())).into()).await;
        let creates = arms
            .iter()
            .map(|arm| days::apply(&step, &jobs, &deployments, &arm.name));
        futures::future::try_join_all(creates).await?;
    }
    tokio::time::sleep_until((started + Duration::from_secs_f64(day.end)).into()).await;
    for arm in arms {
        for part in ["steady", "service"] {
            scale(&deployments, &format!("{}-{part}", arm.name), 0).await?;
        }
    }
    Ok(())
}

/// A Deployment `<arm>-<part>` of `replicas` pods of `cpu`, pinned to the
/// arm's pool.
pub fn deployment(arm: &str, part: &str, replicas: i32, cpu: &str) -> Result<Deployment> {
    let mut object = serde_json::to_value(testenv::filler_deployment(
        &format!("{arm}-{part}"),
        replicas,
    ))?;
    let template = &mut object["spec"]["template"];
    template["metadata"]["labels"][ARM_LABEL] = json!(arm);
    template["spec"]["containers"][0]["resources"]["requests"]["cpu"] = json!(cpu);
    testenv::in_pool(&mut template["spec"], arm);
    Ok(serde_json::from_value(object)?)
}

/// A Job `<arm>-<n>` of `pods` pods running `run_for`, pinned to the arm's
/// pool.
pub fn job(arm: &str, n: usize, pods: i32, run_for: Duration) -> Result<Job> {
    let mut object =
        serde_json::to_value(testenv::filler_job(&format!("{arm}-{n}"), pods, run_for))?;
    let template = &mut object["spec"]["template"];
    template["metadata"]["labels"][ARM_LABEL] = json!(arm);
    testenv::in_pool(&mut template["spec"], arm);
    Ok(serde_json::from_value(object)?)
}

pub async fn scale(deployments: &Api<Deployment>, name: &str, replicas: i32) -> Result<()> {
    deployments
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .with_context(|| format!("scaling {name} to {replicas}"))?;
    Ok(())
}

/// Until every arm's Jobs are done; the failed pods (evicted while they
/// ran, run again) per arm.
async fn wait_jobs_done(
    client: &kube::Client,
    arms: &[Arm],
    limit: Duration,
) -> Result<BTreeMap<String, i32>> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + limit;
    loop {
        let listed = jobs.list(&ListParams::default()).await?.items;
        let running = listed.iter().filter(|j| !finished(j)).count();
        if running == 0 {
            let mut failed = BTreeMap::new();
            for arm in arms {
                let prefix = format!("{}-", arm.name);
                let of_arm = listed.iter().filter(|j| {
                    j.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.starts_with(&prefix))
                });
                let count = of_arm.filter_map(|j| j.status.as_ref()?.failed).sum();
                failed.insert(arm.name.clone(), count);
            }
            return Ok(failed);
        }
        if Instant::now() > deadline {
            bail!("{running} Jobs still running {limit:?} after the day's end");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

fn finished(job: &Job) -> bool {
    let conditions = job.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|cs| {
        cs.iter()
            .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
    })
}

/// Until the watch has seen every NodeClaim go.
async fn wait_claims_gone(recorder: &Recorder, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let left = recorder.claims_left();
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{left} NodeClaims left {limit:?} after the day's work");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The bench's watches: NodeClaims and pods as they change, and the load.
struct Recorder {
    trace: Arc<Mutex<Trace>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Recorder {
    fn start(client: kube::Client, started: Instant) -> Recorder {
        let trace = Arc::new(Mutex::new(Trace::default()));
        let tasks = vec![
            tokio::spawn(watch_claims(client.clone(), started, Arc::clone(&trace))),
            tokio::spawn(watch_pods(client, started, Arc::clone(&trace))),
            tokio::spawn(sample_load(started, Arc::clone(&trace))),
        ];
        Recorder { trace, tasks }
    }

    fn claims_left(&self) -> usize {
        let trace = self.trace.lock().unwrap_or_else(PoisonError::into_inner);
        trace.claims.values().filter(|c| c.gone.is_none()).count()
    }

    fn stop(self) -> Trace {
        for task in &self.tasks {
            task.abort();
        }
        let mut trace = self.trace.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::take(&mut *trace)
    }
}

fn seconds(started: Instant) -> f64 {
    started.elapsed().as_secs_f64()
}

async fn watch_claims(client: kube::Client, started: Instant, trace: Arc<Mutex<Trace>>) {
    let claims = testenv::node_claims(&client);
    let stream = watcher(claims, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    // The claims a relist has shown: one it no longer shows went while the
    // watch was down, and is gone as of the relist.
    let mut listed = std::collections::BTreeSet::new();
    while let Some(event) = stream.next().await {
        let Ok(event) = event else { continue };
        let at = seconds(started);
        let mut trace = trace.lock().unwrap_or_else(PoisonError::into_inner);
        match event {
            watcher::Event::Apply(claim) => saw_claim(&mut trace, &claim, at, false),
            watcher::Event::InitApply(claim) => {
                listed.extend(claim.metadata.name.clone());
                saw_claim(&mut trace, &claim, at, false);
            }
            watcher::Event::Delete(claim) => saw_claim(&mut trace, &claim, at, true),
            watcher::Event::Init => listed.clear(),
            watcher::Event::InitDone => {
                for (name, claim) in &mut trace.claims {
                    if !listed.contains(name) {
                        claim.gone.get_or_insert(at);
                    }
                }
            }
        }
    }
}

fn saw_claim(trace: &mut Trace, claim: &DynamicObject, at: f64, gone: bool) {
    let Some(name) = claim.metadata.name.clone() else {
        return;
    };
    let labels = claim.metadata.labels.as_ref();
    let pool = labels
        .and_then(|l| l.get("karpenter.sh/nodepool"))
        .cloned()
        .unwrap_or_default();
    let entry = trace.claims.entry(name).or_insert_with(|| Claim {
        pool,
        created: at,
        ..Claim::default()
    });
    if let Some(node) = claim.data["status"]["nodeName"].as_str() {
        entry.node = Some(node.to_string());
    }
    if gone {
        entry.gone.get_or_insert(at);
    }
}

async fn watch_pods(client: kube::Client, started: Instant, trace: Arc<Mutex<Trace>>) {
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let config = watcher::Config::default().labels(ARM_LABEL);
    let stream = watcher(pods, config).default_backoff().touched_objects();
    futures::pin_mut!(stream);
    loop {
        let pod = match stream.try_next().await {
            Ok(Some(pod)) => pod,
            Ok(None) => return,
            // The watch retries with its backoff; keep reading.
            Err(_) => continue,
        };
        let at = seconds(started);
        let (Some(uid), Some(arm)) = (
            pod.metadata.uid.clone(),
            pod.metadata.labels.as_ref().and_then(|l| l.get(ARM_LABEL)),
        ) else {
            continue;
        };
        let mut trace = trace.lock().unwrap_or_else(PoisonError::into_inner);
        let seen = trace.pods.entry(uid).or_insert_with(|| PodSeen {
            arm: arm.clone(),
            seen: at,
            ..PodSeen::default()
        });
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        if seen.bound.is_none() && node.is_some() {
            seen.bound = Some(at);
            seen.node = node;
        }
    }
}

async fn sample_load(started: Instant, trace: Arc<Mutex<Trace>>) {
    loop {
        if let Some(load) = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
        {
            let at = seconds(started);
            let mut trace = trace.lock().unwrap_or_else(PoisonError::into_inner);
            trace.load.push((at, load));
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
}

/// `NODE_HOLDER_BENCH_TRACES=DIR`: the report of the raw traces a run left
/// in `DIR` (`<day>-seed<N>.json`), without playing anything.
fn report_traces(dir: &std::path::Path, out: &std::path::Path) -> Result<()> {
    let mut results = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("{}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        let trace: Trace =
            serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?;
        let day = Day::generate(&trace.day, trace.seed)?;
        results.push((day, Ok(trace)));
    }
    results.sort_by(|a, b| (a.0.name, a.0.seed).cmp(&(b.0.name, b.0.seed)));
    report::write(out, &Arm::all(), &results)
}

/// What the environment asks for.
struct Plan {
    days: Vec<String>,
    seeds: Vec<u64>,
    parallel: usize,
    out: std::path::PathBuf,
}

impl Plan {
    fn from_env() -> Result<Plan> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let quick = var("NODE_HOLDER_BENCH_QUICK").is_some_and(|v| v != "0");
        let list = |name: &str, default: &str| -> Vec<String> {
            var(name)
                .unwrap_or_else(|| default.to_string())
                .split(',')
                .map(|s| s.trim().to_string())
                .collect()
        };
        let (days, seeds) = if quick {
            ("compressed,cron", "1")
        } else {
            ("compressed,cron,poisson,working", "1,2,3")
        };
        let days = list("NODE_HOLDER_BENCH_DAYS", days);
        for day in &days {
            Day::generate(day, 0)?;
        }
        let seeds = list("NODE_HOLDER_BENCH_SEEDS", seeds)
            .iter()
            .map(|s| s.parse().with_context(|| format!("a seed: {s:?}")))
            .collect::<Result<_>>()?;
        let parallel = var("NODE_HOLDER_BENCH_PARALLEL")
            .map(|p| p.parse::<usize>().context("NODE_HOLDER_BENCH_PARALLEL"))
            .transpose()?
            .unwrap_or(2)
            .max(1);
        let out = var("NODE_HOLDER_BENCH_OUT").map_or_else(
            || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/frontier"),
            std::path::PathBuf::from,
        );
        Ok(Plan {
            days,
            seeds,
            parallel,
            out,
        })
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let plan = Plan::from_env()?;
    std::fs::create_dir_all(&plan.out)?;
    if let Ok(dir) = std::env::var("NODE_HOLDER_BENCH_TRACES") {
        return report_traces(std::path::Path::new(&dir), &plan.out);
    }
    tokio::task::spawn_blocking(testenv::ensure_cluster_built).await??;
    let arms = Arm::all();
    let mut runs = Vec::new();
    for name in &plan.days {
        for &seed in &plan.seeds {
            runs.push(Day::generate(name, seed)?);
        }
    }
    eprintln!(
        "churn: {} runs ({} days x {} seeds), {} at once, {} arms each",
        runs.len(),
        plan.days.len(),
        plan.seeds.len(),
        plan.parallel,
        arms.len()
    );
    let results: Vec<(Day, Result<Trace>)> = futures::stream::iter(runs)
        .map(|day| {
            let arms = &arms;
            let out = &plan.out;
            async move {
                let clock = Instant::now();
                let trace = run(&day, arms).await;
                match &trace {
                    Ok(trace) => {
                        let path = out.join(format!("{}-seed{}.json", day.name, day.seed));
                        let saved = serde_json::to_vec_pretty(trace)
                            .map_err(anyhow::Error::from)
                            .and_then(|bytes| Ok(std::fs::write(&path, bytes)?));
                        eprintln!(
                            "churn: {} seed {} done in {:.0?}; trace {} ({saved:?})",
                            day.name,
                            day.seed,
                            clock.elapsed(),
                            path.display()
                        );
                    }
                    Err(err) => eprintln!("churn: {} seed {} failed: {err:#}", day.name, day.seed),
                }
                (day, trace)
            }
        })
        .buffer_unordered(plan.parallel)
        .collect()
        .await;
    report::write(&plan.out, &arms, &results)
}
