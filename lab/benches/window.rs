//! Performance of the hold window at 5,000 nodes:
//! `cargo bench -p node-holder-lab --bench window`.
//!
//! Against a real control plane (testenv: kube-apiserver + etcd on loopback):
//!
//! 1. creates 5,000 Nodes (metadata and a few realistic labels only) from the
//!    admin client, 32 creates in flight, and waits until the newest is older
//!    than the hold duration, so that none of them opens a window itself;
//! 2. starts the release build of `node-holder serve` as node-holder's
//!    restricted identity with the RBAC of `webhook-config/rbac.yaml` (the
//!    fixture of `testsupport`), at the default `--api-qps` (250, so 16
//!    PATCHes in flight), JSON log to a file; no webhook is registered,
//!    so the window task's backstop holds new nodes too;
//! 3. creates one new node and measures the time until all 5,001 nodes carry
//!    the marker label `node-holder.dev/held=true` (from just before the
//!    create); then two probes while the window is open: 50 unrelated label
//!    changes (expect no node-holder request at all) and one more new node
//!    (expect exactly one PATCH); then the time from the window's deadline
//!    (`window.json` in ConfigMap `node-holder/node-holder-window`) until no
//!    node carries the marker;
//! 4. counts node-holder's requests: node PATCHes from the API server's audit
//!    log (user `testenv::NODE_HOLDER_USER`), node LIST and WATCH requests from
//!    the API server's `/metrics` less the benchmark's own (and watchers the
//!    watch cache closed for not keeping up), Event writes, and node-holder's
//!    own `/metrics` and log;
//! 5. samples `serve`'s VmRSS every 100 ms, and reads VmHWM at the end.
//!
//! The held count is followed by a label-selector WATCH (only held nodes
//! travel, and the instant the count reaches its target is exact). With
//! `NODE_HOLDER_BENCH_OBSERVE=list` it is polled instead with a metadata LIST
//! every 250 ms, which makes the API server serialize up to 5,001 objects
//! four times a second on the same cores (an observer effect to compare).
//! `NODE_HOLDER_BENCH_NODES=N` runs with N nodes instead of 5,000 (to see how
//! memory scales); `NODE_HOLDER_BENCH_LINGER=S` keeps `serve` running S
//! seconds after the measurements, for a look with gdb or heaptrack.
//!
//! Loopback only; about 2.5 minutes after the control plane is built, most of
//! it waiting for the hold duration to pass twice.

use testsupport as common;

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use common::Served;
use node_holder_lab::fleet::{self, cloud_node, cloud_node_name};
use node_holder_lab::measure::audit;
use node_holder_lab::measure::machine::Machine;
use node_holder_lab::measure::metadata::MetadataSize;
use node_holder_lab::measure::observer::Observe;
use node_holder_lab::measure::process::ProcMemory;
use node_holder_lab::scale::cluster::Cluster;
use node_holder_lab::scale::phases::Sizes;
use node_holder_lab::scale::{self, Run, Serving};

/// Nodes in the cluster before the window opens (`NODE_HOLDER_BENCH_NODES`
/// overrides it, to see how memory scales).
const DEFAULT_NODES: usize = 5_000;
static NODES: LazyLock<usize> = LazyLock::new(|| {
    std::env::var("NODE_HOLDER_BENCH_NODES")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > CHURN_NODES)
        .unwrap_or(DEFAULT_NODES)
});
/// Concurrent creates of the setup.
const CREATE_IN_FLIGHT: usize = 32;
/// `--hold-duration`: long enough that holding every node at the default
/// bounds (250 PATCH/s: 20 s for 5,001) ends well before the window does:
/// 40 s, or one and a half times that time plus 20 s for more nodes.
static HOLD: LazyLock<Duration> = LazyLock::new(|| {
    let patching = *NODES as u64 / 250;
    Duration::from_secs((patching * 3 / 2 + 20).max(40))
});
/// How long the release may take after the deadline: a minute, or one and
/// a half times the patching time at 250 PATCH/s for more nodes.
static RELEASE_SLACK: LazyLock<Duration> =
    LazyLock::new(|| Duration::from_secs((*NODES as u64 / 250 * 3 / 2).max(60)));
/// Unrelated node changes of the churn probe.
const CHURN_NODES: usize = 50;
/// After a phase, how long to wait for the follow-up pass (coalescing: 1 s
/// idle by default) and the audit events that trail their responses.
const SETTLE: Duration = Duration::from_secs(3);
/// RSS sampling period.
const SAMPLE: Duration = Duration::from_millis(100);

fn main() -> Result<()> {
    // `cargo bench` passes `--bench`; there are no options to read.
    node_holder_lab::run_bench(run)
}

async fn run() -> Result<()> {
    let started = Instant::now();
    let machine = Machine::read();
    let observe = observe_mode()?;
    print_plan(&machine, observe);
    let mut cluster = Cluster::start().await?;
    println!(
        "\ncontrol plane up at {} in {:.1} s",
        cluster.cp.url(),
        started.elapsed().as_secs_f64()
    );
    let create_secs = create_fleet(&cluster).await?;
    let sizes = Sizes {
        nodes: *NODES,
        hold: *HOLD,
        release_slack: *RELEASE_SLACK,
        churn_nodes: CHURN_NODES,
        settle: SETTLE,
        sample: SAMPLE,
    };
    let (serving, start) = scale::phases::serve(&mut cluster, observe, &sizes).await?;
    let hold = scale::phases::hold(&mut cluster, &serving, &sizes).await?;
    let probes = match hold.time {
        Some(_) => Some(scale::phases::probes(&mut cluster, &serving, &hold, &sizes).await?),
        None => None,
    };
    let release = scale::phases::release(&mut cluster, &serving, probes.is_some(), &sizes).await?;
    let Serving {
        served, observer, ..
    } = serving;
    observer.stop();
    let run = Run {
        nodes: *NODES,
        create_in_flight: CREATE_IN_FLIGHT,
        churn_nodes: CHURN_NODES,
        machine,
        observe,
        create_secs,
        start,
        hold,
        probes,
        release,
        patches: audit::node_holder_patches(&cluster.cp, &["nodes"])?,
        raw: std::mem::take(&mut cluster.raw),
    };
    report(&cluster, &run, &served).await?;
    linger(&served).await?;
    let serve_log = served.log();
    drop(served);
    println!("\n{}", scale::summary::render(&run));
    println!(
        "load average at the end: {}; total {:.0} s",
        Machine::read().loadavg,
        started.elapsed().as_secs_f64()
    );
    check_held_and_released(&run, &serve_log)
}

/// `NODE_HOLDER_BENCH_OBSERVE`: `watch` (the default) or `list`.
fn observe_mode() -> Result<Observe> {
    match std::env::var("NODE_HOLDER_BENCH_OBSERVE").as_deref() {
        Ok("list") => Ok(Observe::List),
        Ok("watch") | Err(_) => Ok(Observe::Watch),
        Ok(other) => bail!("NODE_HOLDER_BENCH_OBSERVE={other}: expected `watch` or `list`"),
    }
}

fn print_plan(machine: &Machine, observe: Observe) {
    println!("node-holder hold window benchmark: {} nodes", *NODES);
    println!(
        "machine: {} cores ({}), load average at start {}",
        machine.cores, machine.cpu_model, machine.loadavg
    );
    println!(
        "serve: --hold-duration={}s, default --api-qps (250, 16 in flight), \
         coalescing 500ms idle, 5s max; held count observed by {}",
        HOLD.as_secs(),
        observe.describe()
    );
}

/// Step 1, the cluster before the window: the nodes, until the newest is
/// older than the hold duration. The seconds their creates took.
async fn create_fleet(cluster: &Cluster) -> Result<f64> {
    let t = Instant::now();
    let node = |i| cloud_node(&cloud_node_name(i));
    fleet::create(&cluster.nodes, *NODES, CREATE_IN_FLIGHT, node).await?;
    let last_create = Instant::now();
    let create_secs = t.elapsed().as_secs_f64();
    println!(
        "created {} nodes in {create_secs:.1} s ({:.0}/s, {CREATE_IN_FLIGHT} in flight)",
        *NODES,
        *NODES as f64 / create_secs
    );
    let ready_at = last_create + *HOLD + Duration::from_millis(1500);
    println!(
        "waiting {:.0} s until the newest node is older than the hold duration...",
        ready_at
            .saturating_duration_since(Instant::now())
            .as_secs_f64()
    );
    tokio::time::sleep_until(ready_at.into()).await;
    Ok(create_secs)
}

/// Steps 4 and 5: node-holder's requests, the logs, the nodes' metadata,
/// and `serve`'s memory and CPU.
async fn report(cluster: &Cluster, run: &Run, served: &Served) -> Result<()> {
    scale::requests::print(run);
    scale::logs::print_apiserver(&cluster.cp);
    println!("{}", MetadataSize::measure(&cluster.nodes).await?);
    scale::logs::print_node_holder(served);
    run.print_memory();
    Ok(())
}

/// `NODE_HOLDER_BENCH_LINGER=S`: keeps `serve` running S seconds, to inspect
/// the process after the run (gdb, /proc); its log is in the directory
/// shown.
async fn linger(served: &Served) -> Result<()> {
    let Some(linger) = std::env::var("NODE_HOLDER_BENCH_LINGER")
        .ok()
        .and_then(|s| s.parse().ok())
    else {
        return Ok(());
    };
    let pid = served.child.id();
    println!(
        "lingering {linger} s: serve pid {pid}, log {}",
        served.cert_dir().join("serve.log").display()
    );
    tokio::time::sleep(Duration::from_secs(linger)).await;
    println!("after lingering: {}", ProcMemory::read(pid)?);
    Ok(())
}

/// Fails the bench, showing the end of `serve`'s log, unless the window held
/// and released every node.
fn check_held_and_released(run: &Run, serve_log: &str) -> Result<()> {
    if run.hold.time.is_some() && run.release.time.is_some() {
        return Ok(());
    }
    eprintln!("node-holder serve's log (last 40 lines):");
    let tail: Vec<&str> = serve_log.lines().rev().take(40).collect();
    for line in tail.into_iter().rev() {
        eprintln!("{line}");
    }
    bail!("the window did not hold or release every node; see above");
}
