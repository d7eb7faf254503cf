//! The churn frontier, with the real Karpenter:
//! `cargo bench -p node-holder-lab --bench churn`.
//!
//! What an operator who is tired of churn would do instead of installing
//! node-holder is one line in the NodePool, `consolidateAfter`. This bench
//! plays the same day of batch work against every choice side by side and
//! prices each against the clairvoyant optimum of that day:
//! - **arms**: Karpenter alone at `consolidateAfter` 0s (its default), 30s,
//!   1m, 2m, 5m and 10m (`ka-*`); node-holder (a webhook and a window, the
//!   pool at Karpenter's defaults) with fixed holds of 2m, 5m and 10m
//!   (`nh-*`); with the pool at `WhenEmpty`, Karpenter alone at 0s, 30s,
//!   2m and 5m (`kaw-*`) and at `Balanced` (`kab-*`); node-holder's schedule
//!   hold (`--launch-cost=5m`, `ns-5m`; its pool at `WhenEmpty`, `nsw-5m`;
//!   and with `--warm-before-runs=90s`, `nsx-5m`). The per-node and learned
//!   holds measured in earlier rounds (`ni-*`, `nil-5m`, `niw-5m`, `nilw-5m`,
//!   `nl-5m`) and the holds with `--window-follows-work` (`nf-*`) were
//!   removed with their modes; their figures stay in lab/REPORT.md.
//!   `NODE_HOLDER_BENCH_ARMS=ka-,nh-` plays only the arms so named.
//!   Every arm is a NodePool of its own, its pods pinned to it; each
//!   node-holder arm has a cluster of its own (one install per cluster),
//!   Karpenter's own arms share the first (that of the first node-holder arm
//!   that plays), and all play on one clock, so every
//!   arm sees exactly the same work at the same instants on the same machine
//!   load. The knobs are the same fixed grid on every day, tuned on none.
//! - **days**: `compressed` (8 waves 30-200 s apart), `cron` (a Job every 5
//!   minutes with a little jitter: idle gaps between the 2m and 5m knobs),
//!   `poisson` (a busy and a quiet phase of random arrivals) and `working`
//!   (two busy stretches of minutes-long Jobs around a quiet 15-20 minutes).
//!   The scheduled days run real CronJobs, fired by kube-controller-manager
//!   at whole minutes of the day: `cronjob` (every 5 minutes), `two-schedules`
//!   (every 3 and every 15 minutes in one pool) and `mixed` (every 4 minutes
//!   beside random Jobs), and `long-gaps` (one every 15 minutes: gaps no
//!   hold pays for); `NODE_HOLDER_BENCH_DAYS=cronjob,two-schedules,mixed`.
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
//!   clairvoyant optimum (`node_holder_lab::frontier`).
//!
//! Environment: `NODE_HOLDER_BENCH_DAYS` (comma-separated; default all four),
//! `NODE_HOLDER_BENCH_SEEDS` (default `1,2,3`), `NODE_HOLDER_BENCH_PARALLEL`
//! (clusters at once; default 2), `NODE_HOLDER_BENCH_QUICK=1` (the quick
//! variant: the compressed day, seed 1: about 30 minutes), and
//! `NODE_HOLDER_BENCH_OUT` (default `target/frontier`): each run's raw trace,
//! the report and its pictures (`frontier-<day>.svg`) go there; the ones
//! lab/REPORT.md keeps are copied into `lab/results/` by hand. A relative
//! path in these variables is from the workspace's root, as before the bench
//! moved into `lab/` (Cargo runs a bench in its own package's directory).

use testsupport as common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{ConfigMap, PodTemplate};
use kube::api::{Api, PostParams};
use testenv::{ClusterOptions, Disruption, KarpenterCluster};

use node_holder_lab::frontier::arms::{self, Arm};
use node_holder_lab::frontier::days::{self, Day};
use node_holder_lab::frontier::recorder::Recorder;
use node_holder_lab::frontier::trace::Trace;
use node_holder_lab::frontier::{BOOT, report, workload};

/// How long the pools may take to lose their last node once the day's work
/// is over, on top of the longest knob.
const DRAIN_LIMIT: Duration = Duration::from_secs(900);

#[tokio::main]
async fn main() -> Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let plan = Plan::from_env()?;
    std::fs::create_dir_all(&plan.out)?;
    if let Ok(dir) = std::env::var("NODE_HOLDER_BENCH_TRACES") {
        return report_traces(&in_workspace(&dir), &plan.out);
    }
    tokio::task::spawn_blocking(node_holder_lab::build_node_holder).await??;
    tokio::task::spawn_blocking(testenv::ensure_cluster_built).await??;
    let arms = plan.arms();
    let runs = plan.runs()?;
    eprintln!(
        "churn: {} runs ({} days x {} seeds), {} at once, {} arms each",
        runs.len(),
        plan.days.len(),
        plan.seeds.len(),
        plan.parallel,
        arms.len()
    );
    let results: Vec<(Day, Result<Trace>)> = futures::stream::iter(runs)
        .map(|day| run_and_save(day, &arms, &plan.out))
        .buffer_unordered(plan.parallel)
        .collect()
        .await;
    report::write(&plan.out, &arms, &results)
}

/// Plays `day` and saves its raw trace in `out` (`<day>-seed<N>.json`),
/// saying how it went.
async fn run_and_save(day: Day, arms: &[Arm], out: &Path) -> (Day, Result<Trace>) {
    let clock = Instant::now();
    let trace = run(&day, arms).await;
    match &trace {
        Ok(trace) => {
            let (path, saved) = trace.save(out);
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

/// One day, one seed, every arm side by side: each node-holder arm in a
/// cluster of its own (two installs in one cluster would strip each other's
/// holds), every cluster on one clock.
async fn run(day: &Day, arms: &[Arm]) -> Result<Trace> {
    let parts = arms::by_cluster(arms);
    let clusters =
        futures::future::try_join_all(parts.iter().map(|part| Prepared::start(part))).await?;
    let (started, origin) = next_minute();
    let traces = futures::future::try_join_all(
        clusters
            .into_iter()
            .zip(&parts)
            .map(|(cluster, part)| cluster.play(day, part, (started, origin))),
    )
    .await?;
    Ok(Trace::merge(day.name, day.seed, traces))
}

/// When the day starts: at the next minute at least 20 s away (so that the
/// CronJobs exist by then and their runs fall on whole minutes of the day),
/// as an instant and as the minute of its hour (UTC).
fn next_minute() -> (Instant, u32) {
    let now = jiff::Timestamp::now();
    let soon = now.as_second() + 20;
    let minute = soon.div_euclid(60) + 1;
    let wait =
        Duration::from_millis(u64::try_from(minute * 60_000 - now.as_millisecond()).unwrap_or(0));
    let of_hour = u32::try_from(minute.rem_euclid(60)).unwrap_or(0);
    (Instant::now() + wait, of_hour)
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
            feature_gates: arms
                .iter()
                .any(|a| a.buffer)
                .then_some("CapacityBuffer=true"),
        };
        let cluster = KarpenterCluster::start_with(&options, &Disruption::default()).await?;
        for arm in arms {
            cluster.add_node_pool(&arm.name, &arm.disruption()).await?;
        }
        let holder = start_node_holder(cluster.control_plane(), arms).await?;
        Ok(Prepared { cluster, holder })
    }

    /// Plays the day from `started` and records it until the last node is
    /// gone.
    async fn play(self, day: &Day, arms: &[Arm], start: (Instant, u32)) -> Result<Trace> {
        let started = start.0;
        let admin = self.cluster.control_plane().admin_client().await?;
        let recorder = Recorder::start(admin.clone(), started);
        play(&admin, day, arms, start).await?;
        let end = started.elapsed().as_secs_f64();
        let interrupted = workload::wait_jobs_done(&admin, arms, DRAIN_LIMIT).await?;
        recorder
            .wait_claims_gone(DRAIN_LIMIT + Duration::from_secs(600))
            .await?;
        // What the record says is a diagnostic: a failed read loses it,
        // not the day's trace.
        let record = match &self.holder {
            Some(_) => node_holder_record(&admin).await.unwrap_or_else(|err| {
                eprintln!("churn: node-holder's record not read: {err:#}");
                None
            }),
            None => None,
        };
        let log = self.holder.as_ref().map(common::Served::log);
        drop(self.holder);
        let mut trace = recorder.stop();
        trace.interrupted = interrupted;
        trace.end = end;
        let names: Vec<&str> = arms.iter().map(|a| a.name.as_str()).collect();
        if let Some(data) = record {
            trace.records.insert(names.join(","), data);
        }
        if let Some(log) = log {
            trace.logs.insert(names.join(","), log);
        }
        Ok(trace)
    }
}

/// node-holder's record as it is now: what its window ended the day with.
async fn node_holder_record(
    admin: &kube::Client,
) -> Result<Option<std::collections::BTreeMap<String, String>>> {
    let config_maps: Api<ConfigMap> =
        Api::namespaced(admin.clone(), testenv::NODE_HOLDER_NAMESPACE);
    let record = config_maps
        .get_opt("node-holder-window")
        .await
        .context("reading node-holder's record")?;
    Ok(record.and_then(|c| c.data))
}

/// The `node-holder serve` of the cluster's node-holder arm
/// (`arms::serve_args`; [`arms::by_cluster`] gives each its own cluster),
/// its webhook registered and probed with a node of its pool.
async fn start_node_holder(
    cp: &testenv::ControlPlane,
    arms: &[Arm],
) -> Result<Option<common::Served>> {
    let Some(arm) = arms.iter().find(|a| a.hold.is_some()) else {
        return Ok(None);
    };
    // The namespace and the base RBAC first: the warm's Role lives in it.
    common::install_node_holder_rbac(cp).await;
    if arm.launch_cost.is_some() {
        common::install_rbac_for(cp, "schedules").await;
    }
    if arm.warm.is_some() {
        common::install_rbac_for(cp, "warm").await;
    }
    let args = arms::serve_args(arm);
    let served = common::serve(cp, &common::window::strs(&args)).await;
    let pool = ("karpenter.sh/nodepool", arm.name.as_str());
    let probe = common::node_with("webhook-probe", &[pool], &[]);
    common::register_webhook_probing(cp, &served, probe).await;
    Ok(Some(served))
}

/// The day's schedule on an absolute clock: each Job and each change of the
/// service's size happens for every arm at the same instant, and each arm's
/// CronJobs run at the same whole minutes (the day starts at minute
/// `start.1` of its hour); they are suspended when the day's work ends.
async fn play(client: &kube::Client, day: &Day, arms: &[Arm], start: (Instant, u32)) -> Result<()> {
    let (started, origin) = start;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let cronjobs: Api<CronJob> = Api::namespaced(client.clone(), "default");
    let templates: Api<PodTemplate> = Api::namespaced(client.clone(), "default");
    let buffers = workload::buffers(client);
    for arm in arms {
        for scheduled in &day.cronjobs {
            let cronjob = workload::cronjob(&arm.name, scheduled, origin)?;
            cronjobs.create(&PostParams::default(), &cronjob).await?;
            if arm.buffer {
                let (template, buffer) = workload::buffer(&arm.name, scheduled, origin)?;
                templates.create(&PostParams::default(), &template).await?;
                let buffer = serde_json::from_value(buffer)?;
                buffers.create(&PostParams::default(), &buffer).await?;
            }
        }
        let steady = workload::deployment(&arm.name, "steady", day.steady, testenv::POD_CPU)?;
        let service = workload::deployment(&arm.name, "service", day.service.0, days::SERVICE_CPU)?;
        for object in [steady, service] {
            deployments.create(&PostParams::default(), &object).await?;
        }
    }
    for step in day.steps() {
        tokio::time::sleep_until((started + Duration::from_secs_f64(step.at())).into()).await;
        let creates = arms
            .iter()
            .map(|arm| workload::apply(&step, &jobs, &deployments, &arm.name));
        futures::future::try_join_all(creates).await?;
    }
    tokio::time::sleep_until((started + Duration::from_secs_f64(day.end)).into()).await;
    for arm in arms {
        for scheduled in &day.cronjobs {
            let name = format!("{}-{}", arm.name, scheduled.name);
            workload::suspend(&cronjobs, &name).await?;
            if arm.buffer {
                buffers.delete(&name, &Default::default()).await?;
            }
        }
        for part in ["steady", "service"] {
            workload::scale(&deployments, &format!("{}-{part}", arm.name), 0).await?;
        }
    }
    Ok(())
}

/// `NODE_HOLDER_BENCH_TRACES=DIR`: the report of the raw traces a run left
/// in `DIR` (`<day>-seed<N>*.json`), without playing anything. Traces of one
/// seed of a day from separate runs are one run (each arm from the first
/// file, by name, that played it).
fn report_traces(dir: &Path, out: &Path) -> Result<()> {
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("{}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "json") {
            paths.push(path);
        }
    }
    paths.sort();
    let mut results = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(&path)?;
        let trace: Trace =
            serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?;
        let day = Day::generate(&trace.day, trace.seed)?;
        results.push((day, Ok(trace)));
    }
    results.sort_by(|a, b| (a.0.name, a.0.seed).cmp(&(b.0.name, b.0.seed)));
    report::write(out, &Arm::all(), &results)
}

/// `path` from the workspace's root when it is relative.
fn in_workspace(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// What the environment asks for.
struct Plan {
    days: Vec<String>,
    seeds: Vec<u64>,
    /// `NODE_HOLDER_BENCH_ARMS`: name prefixes (`ka-,nh-`); empty: all.
    arms: Vec<String>,
    parallel: usize,
    out: PathBuf,
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
            ("compressed", "1")
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
        let out = in_workspace(
            var("NODE_HOLDER_BENCH_OUT")
                .as_deref()
                .unwrap_or("target/frontier"),
        );
        let arms = var("NODE_HOLDER_BENCH_ARMS")
            .map_or_else(Vec::new, |_| list("NODE_HOLDER_BENCH_ARMS", ""));
        Ok(Plan {
            days,
            seeds,
            arms,
            parallel,
            out,
        })
    }

    /// The arms asked for.
    fn arms(&self) -> Vec<Arm> {
        Arm::all()
            .into_iter()
            .filter(|arm| {
                self.arms.is_empty() || self.arms.iter().any(|p| arm.name.starts_with(p.as_str()))
            })
            .collect()
    }

    /// Every day asked for, with every seed.
    fn runs(&self) -> Result<Vec<Day>> {
        let mut runs = Vec::new();
        for name in &self.days {
            for &seed in &self.seeds {
                runs.push(Day::generate(name, seed)?);
            }
        }
        Ok(runs)
    }
}
