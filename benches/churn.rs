//! The churn node-holder saves, with the real Karpenter: `cargo bench --bench churn`.
//!
//! A compressed day of batch work, the same for both runs (a fixed seed):
//! waves of Jobs of different sizes and lengths, with gaps both shorter and
//! longer than the hold duration. Two Karpenter clusters (testenv: control
//! plane, scheduler, controller-manager, kwok, Karpenter's KWOK provider) play
//! it side by side on the same machine, one without node-holder and one with
//! `node-holder serve` registered as the webhook; then each waits until
//! Karpenter has removed every node. Reported for each:
//! - nodes launched and terminated by Karpenter (the API server's audit log
//!   of its identity's Node creates and deletes);
//! - node-seconds from the first wave until the last node is gone (the cost);
//! - each pod's wait from creation to `PodScheduled` (p50, p95; the API
//!   records both to the second);
//! - Job pods interrupted: evicted by a disruption while they ran, so their
//!   Job ran them again (the Jobs' `failed` counts);
//! - Karpenter's disruption decisions (its `decisions_total` metric);
//! - the node count over time of both runs, drawn to
//!   `docs/churn-budget-<N>-hold-<S>s.svg`.
//!
//! The NodePool has Karpenter's default disruption settings
//! (`WhenEmptyOrUnderutilized`, `consolidateAfter: 0s`, budget `nodes: 10%`);
//! `NODE_HOLDER_BENCH_BUDGET=100%` sets another budget,
//! `NODE_HOLDER_BENCH_HOLD=180s` another hold duration, and
//! `NODE_HOLDER_BENCH_SEED` changes the day. `NODE_HOLDER_BENCH_DAY=working`
//! plays a working day at time scales closer to a real cluster's instead
//! (minutes-long Jobs in two busy stretches, a 10-minute hold; about 70
//! minutes). Loopback only; the compressed day takes about 15 minutes once the
//! tools are built.

use testsupport as common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use plotters::prelude::*;
use testenv::{Disruption, KarpenterCluster};

/// How long a run may take to lose its last node after the last Job ends,
/// on top of the hold duration.
const DRAIN_LIMIT: Duration = Duration::from_secs(600);

/// One wave: a Job of `pods` pods that run for `run_for`, started `gap`
/// after the previous wave started.
#[derive(Debug, Clone)]
struct Wave {
    gap: Duration,
    pods: i32,
    run_for: Duration,
}

/// A day to play, and the hold duration an operator would choose for it.
#[derive(Debug)]
struct Day {
    name: &'static str,
    waves: Vec<Wave>,
    hold: Duration,
}

impl Day {
    /// `NODE_HOLDER_BENCH_DAY`: `compressed` (the default) or `working`.
    fn from_env(seed: u64) -> Result<Self> {
        match std::env::var("NODE_HOLDER_BENCH_DAY").as_deref() {
            Err(_) | Ok("compressed") => Ok(Self::compressed(seed)),
            Ok("working") => Ok(Self::working(seed)),
            Ok(other) => bail!("NODE_HOLDER_BENCH_DAY={other}: expected compressed or working"),
        }
    }

    /// Eight waves: gaps of 30-200 s, 1-6 pods, 20-80 s each; a 120 s hold,
    /// longer than a Job and shorter than the longer gaps.
    fn compressed(seed: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let waves = (0..8)
            .map(|n| Wave {
                gap: Duration::from_secs(if n == 0 { 0 } else { rng.u64(30..=200) }),
                pods: rng.i32(1..=6),
                run_for: Duration::from_secs(rng.u64(20..=80)),
            })
            .collect();
        let hold = Duration::from_secs(120);
        Self {
            name: "compressed",
            waves,
            hold,
        }
    }

    /// Two busy stretches of six waves, 1-5 minutes apart, with a quiet
    /// 15-20 minutes between them; 1-6 pods that run 1-3 minutes. The
    /// 10-minute hold covers the gaps of a busy stretch, not the quiet one.
    fn working(seed: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let waves = (0..12)
            .map(|n| Wave {
                gap: Duration::from_secs(match n {
                    0 => 0,
                    6 => rng.u64(900..=1200),
                    _ => rng.u64(60..=300),
                }),
                pods: rng.i32(1..=6),
                run_for: Duration::from_secs(rng.u64(60..=180)),
            })
            .collect();
        let hold = Duration::from_secs(600);
        Self {
            name: "working",
            waves,
            hold,
        }
    }
}

/// What one run measured.
#[derive(Debug, Default)]
struct Outcome {
    launched: usize,
    terminated: usize,
    node_seconds: f64,
    waits: Vec<f64>,
    /// Job pods that failed, evicted while they ran, and ran again.
    interrupted: i32,
    decisions: BTreeMap<String, f64>,
    /// (seconds since the first wave, nodes) at every change.
    nodes_over_time: Vec<(f64, usize)>,
    wall: Duration,
}

async fn run(
    day: &[Wave],
    budget: &str,
    hold: Duration,
    with_node_holder: bool,
) -> Result<Outcome> {
    // Karpenter's own defaults, but for the budget the run asks for.
    let disruption = Disruption {
        consolidation_policy: "WhenEmptyOrUnderutilized".into(),
        consolidate_after: "0s".into(),
        budgets: serde_json::json!([{"nodes": budget}]),
    };
    let mut cluster = KarpenterCluster::start(&disruption).await?;
    let served = if with_node_holder {
        let hold = format!("--hold-duration={}s", hold.as_secs());
        let served = common::serve(cluster.control_plane(), &[&hold]).await;
        common::register_webhook(cluster.control_plane(), &served).await;
        Some(served)
    } else {
        None
    };
    let client = cluster.control_plane().admin_client().await?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let waits = PodWaits::follow(client.clone());
    let started = Timestamp::now();
    let clock = Instant::now();
    for (n, wave) in day.iter().enumerate() {
        // The day's own schedule: the gaps are the workload, not a wait.
        tokio::time::sleep(wave.gap).await;
        cluster.check_running()?;
        let job = testenv::filler_job(&format!("wave-{n}"), wave.pods, wave.run_for);
        jobs.create(&PostParams::default(), &job).await?;
    }
    let limit = hold + DRAIN_LIMIT;
    let interrupted = wait_all_done(&jobs, day.len(), limit).await?;
    wait_no_nodes(&mut cluster, &client, limit).await?;
    let wall = clock.elapsed();
    let mut outcome = measure(&cluster, started, wall).await?;
    outcome.waits = waits.stop();
    outcome.interrupted = interrupted;
    drop(served);
    Ok(outcome)
}

/// Until every Job has finished (complete, or failed for good); returns how
/// many of their pods failed on the way: a pod evicted by a disruption
/// counts as failed, and the Job runs it again.
async fn wait_all_done(jobs: &Api<Job>, count: usize, limit: Duration) -> Result<i32> {
    let deadline = Instant::now() + limit;
    loop {
        let listed = jobs.list(&ListParams::default()).await?.items;
        let finished = |j: &&Job| {
            j.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| {
                    cs.iter().any(|c| {
                        (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True"
                    })
                })
        };
        let done = listed.iter().filter(finished).count();
        if done == count {
            return Ok(listed
                .iter()
                .filter_map(|j| j.status.as_ref()?.failed)
                .sum());
        }
        if Instant::now() > deadline {
            bail!("{done} of {count} Jobs done {limit:?} after the last started");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Until Karpenter has removed its last node.
async fn wait_no_nodes(
    cluster: &mut KarpenterCluster,
    client: &kube::Client,
    limit: Duration,
) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + limit;
    loop {
        cluster.check_running()?;
        let left = nodes
            .list_metadata(&ListParams::default().labels("karpenter.sh/nodepool"))
            .await?
            .items
            .len();
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{left} nodes left {limit:?} after the last Job");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn measure(
    cluster: &KarpenterCluster,
    started: Timestamp,
    wall: Duration,
) -> Result<Outcome> {
    // Each node once, at its first request: Karpenter may ask to delete a
    // node again while it terminates.
    let by_karpenter = |verb: &str| -> Result<Vec<f64>> {
        let mut first = BTreeMap::new();
        for (node, at) in cluster.karpenter_node_requests(verb)? {
            first.entry(node).or_insert(at);
        }
        Ok(first
            .into_values()
            .map(|at| at.duration_since(started).as_secs_f64())
            .collect())
    };
    let (creates, deletes) = (by_karpenter("create")?, by_karpenter("delete")?);
    let nodes_over_time = step_series(&creates, &deletes);
    Ok(Outcome {
        launched: creates.len(),
        terminated: deletes.len(),
        node_seconds: node_seconds(&nodes_over_time),
        waits: Vec::new(),
        interrupted: 0,
        decisions: decisions(&cluster.karpenter_metrics().await?),
        nodes_over_time,
        wall,
    })
}

/// The node count after each create (+1) and delete (-1), in time order.
fn step_series(creates: &[f64], deletes: &[f64]) -> Vec<(f64, usize)> {
    let mut changes: Vec<(f64, i64)> = creates.iter().map(|&t| (t, 1)).collect();
    changes.extend(deletes.iter().map(|&t| (t, -1)));
    changes.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut count = 0i64;
    let mut series = vec![(0.0, 0)];
    for (at, change) in changes {
        count = (count + change).max(0);
        series.push((at, usize::try_from(count).unwrap_or(0)));
    }
    series
}

/// The area under the node count.
fn node_seconds(series: &[(f64, usize)]) -> f64 {
    series
        .windows(2)
        .map(|w| (w[1].0 - w[0].0) * w[0].1 as f64)
        .sum()
}

/// Each Job pod's seconds from creation to `PodScheduled`, read while the
/// day runs: the pod garbage collector deletes a finished pod once its node
/// is gone, so the pods are not all there at the end.
struct PodWaits {
    seen: std::sync::Arc<std::sync::Mutex<BTreeMap<String, f64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl PodWaits {
    fn follow(client: kube::Client) -> PodWaits {
        let seen = std::sync::Arc::default();
        let task = tokio::spawn(Self::poll(
            Api::namespaced(client, "default"),
            std::sync::Arc::clone(&seen),
        ));
        PodWaits { seen, task }
    }

    async fn poll(pods: Api<Pod>, seen: std::sync::Arc<std::sync::Mutex<BTreeMap<String, f64>>>) {
        loop {
            if let Ok(list) = pods.list(&ListParams::default()).await {
                let mut seen = seen
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                for pod in list.items {
                    if let (Some(uid), Some(wait)) =
                        (pod.metadata.uid.clone(), scheduled_after(&pod))
                    {
                        seen.entry(uid).or_insert(wait);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The waits seen, sorted.
    fn stop(self) -> Vec<f64> {
        self.task.abort();
        let seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut waits: Vec<f64> = seen.values().copied().collect();
        waits.sort_by(f64::total_cmp);
        waits
    }
}

/// Seconds from the pod's creation to its `PodScheduled=True`, once it has one.
fn scheduled_after(pod: &Pod) -> Option<f64> {
    let created = pod.metadata.creation_timestamp.as_ref()?.0;
    let scheduled = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "True")?
        .last_transition_time
        .as_ref()?
        .0;
    Some(scheduled.duration_since(created).as_secs_f64())
}

/// Karpenter's `voluntary_disruption_decisions_total`, by decision and reason.
fn decisions(metrics: &str) -> BTreeMap<String, f64> {
    let mut found = BTreeMap::new();
    for sample in testenv::metrics::named(metrics, "karpenter_voluntary_disruption_decisions_total")
    {
        let key = format!("{} {}", sample.label("decision"), sample.label("reason"));
        *found.entry(key).or_insert(0.0) += sample.value;
    }
    found
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p / 100.0 * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn plot(path: &str, day_name: &str, without: &Outcome, with: &Outcome) -> Result<()> {
    let end = without.wall.max(with.wall).as_secs_f64();
    let top = without
        .nodes_over_time
        .iter()
        .chain(&with.nodes_over_time)
        .map(|p| p.1)
        .max()
        .unwrap_or(1)
        + 3;
    let root = SVGBackend::new(path, (900, 360)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Karpenter nodes over a {day_name} batch day"),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(40)
        .build_cartesian_2d(0.0..end, 0usize..top)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the first wave")
        .y_desc("nodes")
        .draw()?;
    // The run with node-holder first and wider, so the other shows on top
    // where both have the same count.
    for (outcome, label, color, width) in [
        (with, "with node-holder", BLUE, 4),
        (without, "without node-holder", RED, 2),
    ] {
        let mut steps = Vec::new();
        for pair in outcome.nodes_over_time.windows(2) {
            steps.push((pair[0].0, pair[0].1));
            steps.push((pair[1].0, pair[0].1));
        }
        if let Some(&(at, n)) = outcome.nodes_over_time.last() {
            steps.push((at, n));
            steps.push((end, n));
        }
        chart
            .draw_series(LineSeries::new(steps, color.stroke_width(width)))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new([(x, y), (x + 16, y)], color.stroke_width(width))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn report(day: &[Wave], without: &Outcome, with: &Outcome) {
    println!("\nThe day ({} waves):", day.len());
    for (n, w) in day.iter().enumerate() {
        println!(
            "  wave {n}: +{}s, {} pods for {}s",
            w.gap.as_secs(),
            w.pods,
            w.run_for.as_secs()
        );
    }
    println!("\n| measure | without node-holder | with node-holder |");
    println!("| --- | --- | --- |");
    let row = |what: &str, a: String, b: String| println!("| {what} | {a} | {b} |");
    row(
        "nodes launched",
        without.launched.to_string(),
        with.launched.to_string(),
    );
    row(
        "nodes terminated",
        without.terminated.to_string(),
        with.terminated.to_string(),
    );
    row(
        "node-seconds",
        format!("{:.0}", without.node_seconds),
        format!("{:.0}", with.node_seconds),
    );
    for p in [50.0, 95.0] {
        row(
            &format!("pod wait p{p:.0} (s)"),
            format!("{:.0}", percentile(&without.waits, p)),
            format!("{:.0}", percentile(&with.waits, p)),
        );
    }
    row(
        "pods",
        without.waits.len().to_string(),
        with.waits.len().to_string(),
    );
    row(
        "Job pods interrupted (evicted while running, run again)",
        without.interrupted.to_string(),
        with.interrupted.to_string(),
    );
    let keys: std::collections::BTreeSet<&String> = without
        .decisions
        .keys()
        .chain(with.decisions.keys())
        .collect();
    for key in keys {
        row(
            &format!("Karpenter decisions: {key}"),
            format!("{:.0}", without.decisions.get(key).unwrap_or(&0.0)),
            format!("{:.0}", with.decisions.get(key).unwrap_or(&0.0)),
        );
    }
    row(
        "run (until the last node was gone)",
        format!("{:.0?}", without.wall),
        format!("{:.0?}", with.wall),
    );
}

#[tokio::main]
async fn main() -> Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let seed = std::env::var("NODE_HOLDER_BENCH_SEED")
        .ok()
        .map(|s| s.parse::<u64>())
        .transpose()
        .context("NODE_HOLDER_BENCH_SEED")?
        .unwrap_or(2026);
    let budget = std::env::var("NODE_HOLDER_BENCH_BUDGET").unwrap_or_else(|_| "10%".into());
    let day = Day::from_env(seed)?;
    let hold = match std::env::var("NODE_HOLDER_BENCH_HOLD") {
        Ok(text) => humantime::parse_duration(&text).context("NODE_HOLDER_BENCH_HOLD")?,
        Err(_) => day.hold,
    };
    eprintln!(
        "churn: {} day, seed {seed}, NodePool budget nodes: {budget}, hold {}s, {:?}",
        day.name,
        hold.as_secs(),
        day.waves
    );
    let day_name = day.name;
    let day = day.waves;
    tokio::task::spawn_blocking(testenv::ensure_cluster_built).await??;
    let (without, with) = tokio::try_join!(
        run(&day, &budget, hold, false),
        run(&day, &budget, hold, true)
    )?;
    // The compressed day keeps the pictures' first names.
    let prefix = match day_name {
        "compressed" => "churn".to_string(),
        other => format!("churn-{other}-day"),
    };
    let svg = format!(
        "{}/docs/{prefix}-budget-{}-hold-{}s.svg",
        env!("CARGO_MANIFEST_DIR"),
        budget.trim_end_matches('%'),
        hold.as_secs()
    );
    plot(&svg, day_name, &without, &with)?;
    report(&day, &without, &with);
    println!("\nnode count over time: {svg}");
    Ok(())
}
