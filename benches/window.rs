//! Performance of the hold window at 5,000 nodes: `cargo bench --bench window`.
//!
//! Against a real control plane (testenv: kube-apiserver + etcd on loopback):
//!
//! 1. creates 5,000 Nodes (metadata and a few realistic labels only) from the
//!    admin client, 32 creates in flight, and waits until the newest is older
//!    than the hold duration, so that none of them opens a window itself;
//! 2. starts the release build of `node-holder serve` as node-holder's
//!    restricted identity with the RBAC of `webhook-config/rbac.yaml` (the
//!    fixture of `testsupport`), at the default `--api-qps` and
//!    `--api-max-in-flight`, JSON log to a file; no webhook is registered,
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

use anyhow::{Result, bail, ensure};
use jiff::Timestamp;

use common::Served;
use common::fleet::{self, cloud_node, cloud_node_name};
use common::measure::audit;
use common::measure::machine::Machine;
use common::measure::metadata::MetadataSize;
use common::measure::node_holder::{NodeHolderMetrics, wait_first_pass};
use common::measure::observer::{self, MARKER_SELECTOR, Observe, Observer};
use common::measure::process::{self, ProcMemory};
use common::measure::rss::RssSampler;
use common::scale::cluster::{Cluster, created};
use common::scale::{self, Hold, Probes, Release, Run, Serving, Start};

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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run())
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
    let (serving, start) = serve(&mut cluster, observe).await?;
    let hold = hold(&mut cluster, &serving).await?;
    let probes = match hold.time {
        Some(_) => Some(probes(&mut cluster, &serving, &hold).await?),
        None => None,
    };
    let release = release(&mut cluster, &serving, probes.is_some()).await?;
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
        "serve: --hold-duration={}s, default --api-qps (250) and --api-max-in-flight (16), \
         default coalescing (1s idle, 10s max); held count observed by {}",
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

/// Step 2, node-holder: started, leading, idle with no window; the held
/// count followed from then on.
async fn serve(cluster: &mut Cluster, observe: Observe) -> Result<(Serving, Start)> {
    let before = cluster.checkpoint("before serve").await?;
    let t = Instant::now();
    let hold_arg = format!("--hold-duration={}s", HOLD.as_secs());
    let served = common::serve(&cluster.cp, &[hold_arg.as_str()]).await;
    let pid = served.child.id();
    println!(
        "\n`node-holder serve` ready in {:.2} s (pid {pid}); admin port {}",
        t.elapsed().as_secs_f64(),
        served.admin_port
    );
    let limit = Duration::from_secs(60);
    let first_pass = wait_first_pass(&served, limit, Duration::from_millis(50)).await?;
    println!(
        "leading, first pass done {:.2} s after start",
        first_pass.duration_since(t).as_secs_f64()
    );
    let sampler = RssSampler::start(pid, SAMPLE);
    tokio::time::sleep(Duration::from_secs(2)).await;
    check_no_window(cluster).await?;
    let idle = ProcMemory::read(pid)?;
    let cpu_idle = process::cpu(pid)?;
    println!(
        "idle, {} nodes watched, no window: {idle}; CPU so far {cpu_idle:.2?}",
        *NODES
    );
    let observer = Observer::start(observe, cluster.nodes.clone(), cluster.own.clone()).await?;
    let ready = cluster.checkpoint("before the new node").await?;
    let nh = NodeHolderMetrics::scrape(&served).await?;
    let serving = Serving {
        served,
        pid,
        sampler,
        observer,
    };
    let start = Start {
        before,
        ready,
        nh,
        idle,
        cpu_idle,
    };
    Ok((serving, start))
}

/// No node is held and no window is open before any new node.
async fn check_no_window(cluster: &Cluster) -> Result<()> {
    let held_before = observer::count_held(&cluster.nodes, &cluster.own).await?;
    ensure!(
        held_before == 0,
        "{held_before} nodes held before any new node: the setup nodes opened a window"
    );
    let record = cluster.window_record().await?;
    ensure!(
        record.get("open").is_none(),
        "a window is open before any new node: {record}"
    );
    Ok(())
}

/// Step 3a, one new node opens the window: everything is held.
async fn hold(cluster: &mut Cluster, serving: &Serving) -> Result<Hold> {
    let start_wall = Timestamp::now();
    let hold_start = Instant::now();
    let opened_at = created(&cluster.create_node("scale-up-0").await?)?;
    let target = *NODES + 1;
    let limit = *HOLD + Duration::from_secs(5);
    let held = serving.observer.wait_for(target, limit).await;
    let time = held.map(|at| at.duration_since(hold_start));
    match time {
        Some(d) => println!(
            "\nHOLD: all {target} nodes carry {MARKER_SELECTOR} {:.2} s after the new node's create \
             (created {opened_at}, window until {})",
            d.as_secs_f64(),
            opened_at + *HOLD
        ),
        None => println!(
            "\nHOLD: NOT all held within {limit:?}: {} of {target} at most",
            serving.observer.max_seen()
        ),
    }
    tokio::time::sleep(SETTLE).await;
    let end_wall = Timestamp::now();
    let cpu = process::cpu(serving.pid)?;
    let settled = cluster.checkpoint("hold settled").await?;
    let nh = NodeHolderMetrics::scrape(&serving.served).await?;
    let rss_kb = serving.sampler.max_between(hold_start, Instant::now());
    Ok(Hold {
        start_wall,
        end_wall,
        time,
        settled,
        nh,
        cpu,
        rss_kb,
    })
}

/// Step 3b, probes while the window is open (only when it holds
/// everything): unrelated label changes, then one more new node.
async fn probes(cluster: &mut Cluster, serving: &Serving, hold: &Hold) -> Result<Probes> {
    let t = Instant::now();
    let names = (0..CHURN_NODES).map(|i| cloud_node_name(i * 97 % *NODES));
    cluster.change_unrelated_labels(names.collect()).await?;
    tokio::time::sleep(SETTLE).await;
    let churn_end_wall = Timestamp::now();
    let churned = cluster.checkpoint("churn probe settled").await?;
    let nh3 = NodeHolderMetrics::scrape(&serving.served).await?;
    let churn_secs = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let extender = cluster.create_node("scale-up-1").await?;
    let held = serving
        .observer
        .wait_for(*NODES + 2, Duration::from_secs(15));
    let extend_time = held.await.map(|at| at.duration_since(t));
    tokio::time::sleep(SETTLE).await;
    let extend_end_wall = Timestamp::now();
    let extended = cluster.checkpoint("extend probe settled").await?;
    let nh4 = NodeHolderMetrics::scrape(&serving.served).await?;
    let passes = "node_holder_reconcile_duration_seconds_count";
    let applied = "node_holder_holds_applied_total";
    Ok(Probes {
        churn_secs,
        churn_window: (hold.end_wall, churn_end_wall),
        churn_api: churned.since(&hold.settled),
        churn_passes: nh3.get(passes) - hold.nh.get(passes),
        extend_window: (churn_end_wall, extend_end_wall),
        extend_time,
        extend_api: extended.since(&churned),
        extender_created: created(&extender)?,
        extend_applied: nh4.get(applied) - nh3.get(applied),
    })
}

/// Step 3c, the window closes: every hold goes.
async fn release(cluster: &mut Cluster, serving: &Serving, probed: bool) -> Result<Release> {
    let phase = Instant::now();
    let deadline = cluster.window_deadline().await?;
    let until_deadline = deadline.duration_since(Timestamp::now()).as_secs_f64();
    println!("window deadline {deadline} (in {until_deadline:.1} s); waiting for the release...");
    let before = cluster.checkpoint("before the release").await?;
    let cpu_before = process::cpu(serving.pid)?;
    let limit = Duration::try_from(deadline.duration_since(Timestamp::now())).unwrap_or_default()
        + *RELEASE_SLACK;
    let released = serving.observer.wait_for(0, limit).await;
    let released_wall = Timestamp::now();
    let time = released.map(|_| released_wall.duration_since(deadline).as_secs_f64());
    let target = if probed { *NODES + 2 } else { *NODES + 1 };
    match time {
        Some(secs) => println!(
            "RELEASE: no node carries {MARKER_SELECTOR} {secs:.2} s after the deadline ({target} nodes released)"
        ),
        None => println!(
            "RELEASE: NOT all released within {limit:?} ({} still held)",
            serving.observer.current()
        ),
    }
    tokio::time::sleep(SETTLE).await;
    let end_wall = Timestamp::now();
    let settled = cluster.checkpoint("release settled").await?;
    let nh = NodeHolderMetrics::scrape(&serving.served).await?;
    let cpu_end = process::cpu(serving.pid)?;
    let end_memory = ProcMemory::read(serving.pid)?;
    let rss_kb = serving.sampler.max_between(phase, Instant::now());
    Ok(Release {
        deadline,
        before,
        settled,
        nh,
        time,
        target,
        end_wall,
        cpu_before,
        cpu_end,
        end_memory,
        rss_kb,
    })
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
