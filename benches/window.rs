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

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use futures::{StreamExt as _, TryStreamExt as _};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{
    Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::Value;
use testenv::ControlPlane;

/// Nodes in the cluster before the window opens (`NODE_HOLDER_BENCH_NODES`
/// overrides it, to see how memory scales).
const DEFAULT_NODES: usize = 5_000;
static NODES: std::sync::LazyLock<usize> = std::sync::LazyLock::new(|| {
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
static HOLD: std::sync::LazyLock<Duration> = std::sync::LazyLock::new(|| {
    let patching = *NODES as u64 / 250;
    Duration::from_secs((patching * 3 / 2 + 20).max(40))
});
/// How long the release may take after the deadline: a minute, or one and
/// a half times the patching time at 250 PATCH/s for more nodes.
static RELEASE_SLACK: std::sync::LazyLock<Duration> =
    std::sync::LazyLock::new(|| Duration::from_secs((*NODES as u64 / 250 * 3 / 2).max(60)));
/// Unrelated node changes of the churn probe.
const CHURN_NODES: usize = 50;
/// After a phase, how long to wait for the follow-up pass (coalescing: 1 s
/// idle by default) and the audit events that trail their responses.
const SETTLE: Duration = Duration::from_secs(3);
/// How often the poller lists, in `list` observation mode.
const POLL: Duration = Duration::from_millis(250);
/// RSS sampling period.
const SAMPLE: Duration = Duration::from_millis(100);

const MARKER_SELECTOR: &str = "node-holder.dev/held=true";
const RECORD: &str = "node-holder-window";

/// Targets from the issue.
const TARGET_DIRECTION: Duration = Duration::from_secs(30);
const TARGET_RSS_BYTES: f64 = 40e6;

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
    let observe = match std::env::var("NODE_HOLDER_BENCH_OBSERVE").as_deref() {
        Ok("list") => Observe::List,
        Ok("watch") | Err(_) => Observe::Watch,
        Ok(other) => bail!("NODE_HOLDER_BENCH_OBSERVE={other}: expected `watch` or `list`"),
    };
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

    let cp = ControlPlane::start()
        .await
        .context("starting the control plane")?;
    println!(
        "\ncontrol plane up at {} in {:.1} s",
        cp.url(),
        started.elapsed().as_secs_f64()
    );
    let admin = cp.admin_client().await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    let own = Arc::new(OwnRequests::default());

    // 1. The cluster before the window.
    let t = Instant::now();
    create_nodes(&nodes).await?;
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

    // 2. node-holder.
    let api0 = ApiMetrics::scrape(&admin).await?;
    let mut raw = vec![api0.raw_nodes("before serve", &own.snapshot())];
    let t = Instant::now();
    let hold_arg = format!("--hold-duration={}s", HOLD.as_secs());
    let served = common::serve(&cp, &[hold_arg.as_str()]).await;
    let pid = served.child.id();
    println!(
        "\n`node-holder serve` ready in {:.2} s (pid {pid}); admin port {}",
        t.elapsed().as_secs_f64(),
        served.admin_port
    );
    let first_pass = wait_first_pass(&served).await?;
    println!(
        "leading, first pass done {:.2} s after start",
        first_pass.duration_since(t).as_secs_f64()
    );
    let sampler = RssSampler::start(pid);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held_before = count_held(&nodes, &own).await?;
    ensure!(
        held_before == 0,
        "{held_before} nodes held before any new node: the setup nodes opened a window"
    );
    let record = window_record(&admin).await?;
    ensure!(
        record.get("open").is_none(),
        "a window is open before any new node: {record}"
    );
    let idle = ProcMemory::read(pid)?;
    let cpu_idle = process_cpu(pid)?;
    println!(
        "idle, {} nodes watched, no window: {idle}; CPU so far {cpu_idle:.2?}",
        *NODES
    );

    let observer = Observer::start(observe, nodes.clone(), own.clone()).await?;
    let api1 = ApiMetrics::scrape(&admin).await?;
    let own1 = own.snapshot();
    raw.push(api1.raw_nodes("before the new node", &own1));
    let nh1 = NodeHolderMetrics::scrape(&served).await?;

    // 3a. One new node opens the window: everything is held.
    let hold_start_wall = Timestamp::now();
    let hold_start = Instant::now();
    let opener = nodes
        .create(&PostParams::default(), &bench_node("scale-up-0"))
        .await?;
    let opened_at = created(&opener)?;
    let hold_target = *NODES + 1;
    let hold_limit = *HOLD + Duration::from_secs(5);
    let held = observer.wait_for(hold_target, hold_limit).await;
    let hold_time = held.map(|at| at.duration_since(hold_start));
    match hold_time {
        Some(d) => println!(
            "\nHOLD: all {hold_target} nodes carry {MARKER_SELECTOR} {:.2} s after the new node's create \
             (created {opened_at}, window until {})",
            d.as_secs_f64(),
            opened_at + *HOLD
        ),
        None => println!(
            "\nHOLD: NOT all held within {hold_limit:?}: {} of {hold_target} at most",
            observer.max_seen()
        ),
    }
    tokio::time::sleep(SETTLE).await;
    let hold_end_wall = Timestamp::now();
    let cpu_hold = process_cpu(pid)?;
    let api2 = ApiMetrics::scrape(&admin).await?;
    let own2 = own.snapshot();
    raw.push(api2.raw_nodes("hold settled", &own2));
    let nh2 = NodeHolderMetrics::scrape(&served).await?;
    let rss_hold = sampler.max_between(hold_start, Instant::now());

    // 3b. Probes while the window is open (only when it holds everything).
    let mut probes = None;
    if hold_time.is_some() {
        let t = Instant::now();
        churn(&nodes, CHURN_NODES).await?;
        tokio::time::sleep(SETTLE).await;
        let churn_end_wall = Timestamp::now();
        let api3 = ApiMetrics::scrape(&admin).await?;
        let own3 = own.snapshot();
        raw.push(api3.raw_nodes("churn probe settled", &own3));
        let nh3 = NodeHolderMetrics::scrape(&served).await?;
        let churn_secs = t.elapsed().as_secs_f64();

        let t = Instant::now();
        let extender = nodes
            .create(&PostParams::default(), &bench_node("scale-up-1"))
            .await?;
        let extend_time = observer
            .wait_for(*NODES + 2, Duration::from_secs(15))
            .await
            .map(|at| at.duration_since(t));
        tokio::time::sleep(SETTLE).await;
        let extend_end_wall = Timestamp::now();
        let api4 = ApiMetrics::scrape(&admin).await?;
        let own4 = own.snapshot();
        raw.push(api4.raw_nodes("extend probe settled", &own4));
        let nh4 = NodeHolderMetrics::scrape(&served).await?;
        probes = Some(Probes {
            churn_secs,
            churn_window: (hold_end_wall, churn_end_wall),
            churn_api: api3.since(&api2, &own3.since(&own2)),
            churn_passes: nh3.get("node_holder_reconcile_duration_seconds_count")
                - nh2.get("node_holder_reconcile_duration_seconds_count"),
            extend_window: (churn_end_wall, extend_end_wall),
            extend_time,
            extend_api: api4.since(&api3, &own4.since(&own3)),
            extender_created: created(&extender)?,
            extend_applied: nh4.get("node_holder_holds_applied_total")
                - nh3.get("node_holder_holds_applied_total"),
        });
    }
    let release_phase = Instant::now();

    // 3c. The window closes: every hold goes.
    let record = window_record(&admin).await?;
    let deadline: Timestamp = record["open"]["deadline"]
        .as_str()
        .with_context(|| format!("no open window in the record: {record}"))?
        .parse()?;
    let until_deadline = signed_secs(deadline.duration_since(Timestamp::now()));
    println!("window deadline {deadline} (in {until_deadline:.1} s); waiting for the release...");
    let api5 = ApiMetrics::scrape(&admin).await?;
    let own5 = own.snapshot();
    raw.push(api5.raw_nodes("before the release", &own5));
    let cpu_before_release = process_cpu(pid)?;
    let release_limit = Duration::try_from(deadline.duration_since(Timestamp::now()))
        .unwrap_or_default()
        + *RELEASE_SLACK;
    let released = observer.wait_for(0, release_limit).await;
    let released_wall = Timestamp::now();
    let release_time = released.map(|_| signed_secs(released_wall.duration_since(deadline)));
    let release_target = if probes.is_some() {
        *NODES + 2
    } else {
        *NODES + 1
    };
    match release_time {
        Some(secs) => println!(
            "RELEASE: no node carries {MARKER_SELECTOR} {secs:.2} s after the deadline ({release_target} nodes released)"
        ),
        None => println!(
            "RELEASE: NOT all released within {release_limit:?} ({} still held)",
            observer.current()
        ),
    }
    tokio::time::sleep(SETTLE).await;
    let release_end_wall = Timestamp::now();
    let api6 = ApiMetrics::scrape(&admin).await?;
    let own6 = own.snapshot();
    raw.push(api6.raw_nodes("release settled", &own6));
    let nh6 = NodeHolderMetrics::scrape(&served).await?;
    let cpu_end = process_cpu(pid)?;
    let end_memory = ProcMemory::read(pid)?;
    let rss_release = sampler.max_between(release_phase, Instant::now());
    observer.stop();

    // 4. Requests.
    let patches = node_holder_patches(&cp)?;
    let in_window = |from: Timestamp, to: Timestamp| -> Vec<&AuditPatch> {
        patches
            .iter()
            .filter(|p| p.at >= from && p.at < to)
            .collect()
    };
    let before = in_window(Timestamp::MIN, hold_start_wall);
    let hold_patches = in_window(hold_start_wall, hold_end_wall);
    let open_patches = in_window(
        probes.as_ref().map_or(hold_end_wall, |p| p.extend_window.1),
        deadline,
    );
    let release_patches = in_window(deadline, release_end_wall);
    let after = in_window(release_end_wall, Timestamp::MAX);

    let serve_api = api1.since(&api0, &own1);
    let hold_api = api2.since(&api1, &own2.since(&own1));
    let release_api = api6.since(&api5, &own6.since(&own5));
    let whole_api = api6.since(&api0, &own6);

    println!("\n== node-holder's requests ==");
    println!(
        "start-up and first pass (serve start .. before the new node): node LIST {} (pages of 500), \
         node WATCH ended / open {} / {}; node PATCH {}",
        serve_api.nodes("LIST"),
        serve_api.nodes("WATCH"),
        api1.open_watches("nodes") - api0.open_watches("nodes") - own1.open_watches as f64,
        before.len()
    );
    println!(
        "hold phase (new node .. settled):   {}",
        describe_patches(&hold_patches)
    );
    println!(
        "                                   node LIST {}, WATCH ended {} (closed as too slow: {}); \
         Event writes {}",
        hold_api.nodes("LIST"),
        hold_api.nodes("WATCH"),
        api2.terminated_nodes() - api1.terminated_nodes(),
        hold_api.event_writes()
    );
    if let Some(p) = &probes {
        let churn_patches = in_window(p.churn_window.0, p.churn_window.1);
        let extend_patches = in_window(p.extend_window.0, p.extend_window.1);
        println!(
            "churn probe ({CHURN_NODES} unrelated label changes, {:.1} s, {} pass(es) ran): \
             node PATCH {}, LIST {}, WATCH ended {}",
            p.churn_secs,
            p.churn_passes,
            churn_patches.len(),
            p.churn_api.nodes("LIST"),
            p.churn_api.nodes("WATCH")
        );
        println!(
            "extend probe (one more new node, created {}): node PATCH {} ({}; holds_applied +{}), LIST {}; held {}",
            p.extender_created,
            extend_patches.len(),
            extend_patches
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            p.extend_applied,
            p.extend_api.nodes("LIST"),
            p.extend_time
                .map_or("NOT within 15 s".to_string(), |d| format!(
                    "{:.2} s after its create",
                    d.as_secs_f64()
                ))
        );
    }
    println!(
        "rest of the open window:           node PATCH {}",
        open_patches.len()
    );
    println!(
        "release phase (deadline .. settled): {}",
        describe_patches(&release_patches)
    );
    println!(
        "                                   node LIST {}, WATCH ended {} (closed as too slow: {}); \
         Event writes {}",
        release_api.nodes("LIST"),
        release_api.nodes("WATCH"),
        api6.terminated_nodes() - api5.terminated_nodes(),
        release_api.event_writes()
    );
    println!(
        "after the release settled:         node PATCH {}",
        after.len()
    );
    println!(
        "whole run, node-holder: node LIST {}, WATCH ended {}, open now {}; node PATCH {}; \
         Event writes {}; lease writes {}; ConfigMap writes {}",
        whole_api.nodes("LIST"),
        whole_api.nodes("WATCH"),
        api6.open_watches("nodes") - api0.open_watches("nodes") - own6.open_watches as f64,
        patches.len(),
        whole_api.event_writes(),
        whole_api.writes("leases"),
        whole_api.writes("configmaps")
    );
    println!(
        "node-holder /metrics: holds_applied {} (+{} in the hold phase), holds_released {}, \
         patch_errors {}, passes {} ({} in the hold phase), held_nodes {}",
        nh6.get("node_holder_holds_applied_total"),
        nh2.get("node_holder_holds_applied_total") - nh1.get("node_holder_holds_applied_total"),
        nh6.get("node_holder_holds_released_total"),
        nh6.sum("node_holder_patch_errors_total"),
        nh6.get("node_holder_reconcile_duration_seconds_count"),
        nh2.get("node_holder_reconcile_duration_seconds_count")
            - nh1.get("node_holder_reconcile_duration_seconds_count"),
        nh6.get("node_holder_held_nodes")
    );
    println!("\nAPI server counters for nodes (all clients) at each step:");
    for line in &raw {
        println!("  {line}");
    }
    let apiserver_log =
        std::fs::read_to_string(cp.dir().join("kube-apiserver.log")).unwrap_or_default();
    let slow: Vec<&str> = apiserver_log
        .lines()
        .filter(|l| l.contains("unresponsive") || l.contains("Forcing") || l.contains("too slow"))
        .collect();
    println!(
        "kube-apiserver log: {} line(s) about watchers closed for not keeping up",
        slow.len()
    );
    for line in slow.iter().take(4) {
        println!("  {}", truncate(line, 300));
    }
    let metadata = MetadataSize::measure(&nodes).await?;
    println!("{metadata}");

    println!("\n== node-holder's log: bulk patching ==");
    let log = served.log_lines();
    for line in &log {
        if line["message"] == "nodes patched" {
            println!(
                "{} {:<7} nodes {:>5} applied {:>5} changed meanwhile {} failed {} in {:.2} s",
                line["timestamp"].as_str().unwrap_or("?"),
                line["action"].as_str().unwrap_or("?"),
                line["nodes"],
                line["applied"],
                line["changed_meanwhile"],
                line["failed"],
                line["elapsed_ms"].as_f64().unwrap_or(0.0) / 1000.0
            );
        }
    }
    let warnings: Vec<&Value> = log
        .iter()
        .filter(|l| l["level"] == "WARN" || l["level"] == "ERROR")
        .collect();
    println!("warnings and errors in the log: {}", warnings.len());
    for line in warnings.iter().take(5) {
        println!("  {line}");
    }

    // 5. Memory and CPU.
    println!("\n== `serve` memory and CPU ==");
    println!("idle before the window: {idle}");
    println!(
        "hold phase: max sampled VmRSS {:.1} MiB; CPU {:.2?}",
        mib(rss_hold),
        cpu_hold.saturating_sub(cpu_idle)
    );
    println!(
        "release phase: max sampled VmRSS {:.1} MiB; CPU {:.2?}",
        mib(rss_release),
        cpu_end.saturating_sub(cpu_before_release)
    );
    println!("at the end: {end_memory}; CPU in all {cpu_end:.2?}");
    if let Some(linger) = std::env::var("NODE_HOLDER_BENCH_LINGER")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        // To inspect the process after the run (gdb, /proc); its log is in
        // the directory shown.
        println!(
            "lingering {linger} s: serve pid {pid}, log {}",
            served.cert_dir().join("serve.log").display()
        );
        tokio::time::sleep(Duration::from_secs(linger)).await;
        println!("after lingering: {}", ProcMemory::read(pid)?);
    }
    let serve_log = served.log();
    drop(served);

    // Summary.
    let summary = Summary {
        machine: &machine,
        observe,
        create_secs,
        hold_time,
        release_time,
        hold_patches: hold_patches.len(),
        hold_unique: unique(&hold_patches),
        release_patches: release_patches.len(),
        release_unique: unique(&release_patches),
        release_target,
        stray_patches: before.len() + open_patches.len() + after.len(),
        probes: probes.as_ref().map(|p| {
            (
                in_window(p.churn_window.0, p.churn_window.1).len(),
                p.churn_api.nodes("LIST") + p.churn_api.nodes("WATCH"),
                in_window(p.extend_window.0, p.extend_window.1).len(),
            )
        }),
        initial_lists: serve_api.nodes("LIST"),
        later_lists: whole_api.nodes("LIST") - serve_api.nodes("LIST"),
        rewatches: whole_api.nodes("WATCH"),
        terminated: api6.terminated_nodes() - api0.terminated_nodes(),
        idle_kb: idle.rss_kb,
        peak_kb: end_memory.hwm_kb,
        patch_errors: nh6.sum("node_holder_patch_errors_total"),
    };
    println!("\n{}", summary.render());
    println!(
        "load average at the end: {}; total {:.0} s",
        Machine::read().loadavg,
        started.elapsed().as_secs_f64()
    );
    if hold_time.is_none() || release_time.is_none() {
        eprintln!("node-holder serve's log (last 40 lines):");
        for line in serve_log
            .lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            eprintln!("{line}");
        }
        bail!("the window did not hold or release every node; see above");
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The cluster.

const INSTANCE_TYPES: [&str; 4] = ["m6i.large", "m6i.2xlarge", "c6i.4xlarge", "r6i.xlarge"];
const ZONES: [&str; 3] = ["eu-west-1a", "eu-west-1b", "eu-west-1c"];

/// A Node as a cloud node would be named and labelled; no spec or status.
fn bench_node(name: &str) -> Node {
    let hash = name
        .bytes()
        .fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b.into()));
    let labels = [
        ("kubernetes.io/hostname", name),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
        ("node.kubernetes.io/instance-type", INSTANCE_TYPES[hash % 4]),
        ("topology.kubernetes.io/region", "eu-west-1"),
        ("topology.kubernetes.io/zone", ZONES[hash % 3]),
        ("karpenter.sh/nodepool", "batch"),
        (
            "karpenter.sh/capacity-type",
            if hash % 5 == 0 { "on-demand" } else { "spot" },
        ),
    ];
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

fn node_name(i: usize) -> String {
    format!(
        "ip-10-24-{}-{}.eu-west-1.compute.internal",
        i / 250,
        i % 250 + 1
    )
}

async fn create_nodes(nodes: &Api<Node>) -> Result<()> {
    let mut results = futures::stream::iter(0..*NODES)
        .map(|i| async move {
            nodes
                .create(&PostParams::default(), &bench_node(&node_name(i)))
                .await
        })
        .buffer_unordered(CREATE_IN_FLIGHT);
    while let Some(result) = results.next().await {
        result.context("creating a node")?;
    }
    Ok(())
}

/// Changes a label node-holder does not care about on `count` nodes.
async fn churn(nodes: &Api<Node>, count: usize) -> Result<()> {
    let patch = Patch::Merge(serde_json::json!({
        "metadata": {"labels": {"bench.node-holder.dev/churn": "1"}}
    }));
    futures::stream::iter(0..count)
        .map(|i| {
            let patch = &patch;
            async move {
                nodes
                    .patch_metadata(&node_name(i * 97 % *NODES), &PatchParams::default(), patch)
                    .await
            }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<_>>()
        .await
        .context("changing unrelated labels")?;
    Ok(())
}

fn created(node: &Node) -> Result<Timestamp> {
    Ok(node
        .metadata
        .creation_timestamp
        .as_ref()
        .context("no creationTimestamp")?
        .0)
}

/// The window as the record holds it (`window.json`).
async fn window_record(admin: &kube::Client) -> Result<Value> {
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), testenv::NODE_HOLDER_NAMESPACE);
    let config_map = api.get(RECORD).await.context("reading the window record")?;
    let text = config_map
        .data
        .as_ref()
        .and_then(|d| d.get("window.json"))
        .context("no window.json in the record")?;
    Ok(serde_json::from_str(text)?)
}

/// Waits until the window task has led and finished a pass.
async fn wait_first_pass(served: &common::Served) -> Result<Instant> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let metrics = NodeHolderMetrics::scrape(served).await?;
        if metrics.get("node_holder_leader") == 1.0
            && metrics.get("node_holder_reconcile_duration_seconds_count") >= 1.0
        {
            return Ok(Instant::now());
        }
        ensure!(
            Instant::now() < deadline,
            "no pass of the window task within 60 s:\n{}",
            served.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------
// Following the held count.

/// The benchmark's own node LIST and WATCH requests, to subtract from the API
/// server's counters.
#[derive(Default)]
struct OwnRequests {
    lists: AtomicU64,
    watches: AtomicU64,
    open_watches: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default)]
struct OwnSnapshot {
    lists: u64,
    /// Watches ended (what `apiserver_request_total` counts).
    watches_ended: u64,
    open_watches: u64,
}

impl OwnRequests {
    fn snapshot(&self) -> OwnSnapshot {
        let watches = self.watches.load(Ordering::SeqCst);
        let open = self.open_watches.load(Ordering::SeqCst);
        OwnSnapshot {
            lists: self.lists.load(Ordering::SeqCst),
            watches_ended: watches - open,
            open_watches: open,
        }
    }
}

impl OwnSnapshot {
    fn since(&self, earlier: &OwnSnapshot) -> OwnSnapshot {
        OwnSnapshot {
            lists: self.lists - earlier.lists,
            watches_ended: self.watches_ended - earlier.watches_ended,
            open_watches: self.open_watches,
        }
    }
}

async fn count_held(nodes: &Api<Node>, own: &OwnRequests) -> Result<usize> {
    own.lists.fetch_add(1, Ordering::SeqCst);
    Ok(nodes
        .list_metadata(&ListParams::default().labels(MARKER_SELECTOR))
        .await?
        .items
        .len())
}

#[derive(Debug, Clone, Copy)]
enum Observe {
    Watch,
    List,
}

impl Observe {
    fn describe(self) -> &'static str {
        match self {
            Observe::Watch => {
                "a label-selector metadata WATCH (NODE_HOLDER_BENCH_OBSERVE=list to poll)"
            }
            Observe::List => "a label-selector metadata LIST every 250 ms",
        }
    }
}

/// The number of nodes carrying the marker, kept current by a task.
struct Observer {
    count: tokio::sync::watch::Receiver<usize>,
    max: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<Result<()>>,
}

impl Observer {
    /// Starts following; the initial LIST (and, watching, the WATCH) are
    /// made before it returns, so that they count before the next scrape.
    async fn start(mode: Observe, nodes: Api<Node>, own: Arc<OwnRequests>) -> Result<Observer> {
        let selector = ListParams::default().labels(MARKER_SELECTOR);
        own.lists.fetch_add(1, Ordering::SeqCst);
        let list = nodes.list_metadata(&selector).await?;
        let mut held: HashSet<String> = list
            .items
            .iter()
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        let mut version = list.metadata.resource_version.unwrap_or_default();
        let (tx, count) = tokio::sync::watch::channel(held.len());
        let max = Arc::new(AtomicU64::new(held.len() as u64));
        let max_task = max.clone();
        let publish = move |n: usize| {
            max_task.fetch_max(n as u64, Ordering::SeqCst);
            tx.send_replace(n);
        };
        let task = match mode {
            Observe::List => tokio::spawn(async move {
                loop {
                    tokio::time::sleep(POLL).await;
                    publish(count_held(&nodes, &own).await?);
                }
            }),
            Observe::Watch => {
                let params = WatchParams::default().labels(MARKER_SELECTOR).timeout(290);
                own.watches.fetch_add(1, Ordering::SeqCst);
                own.open_watches.fetch_add(1, Ordering::SeqCst);
                let first = nodes.watch_metadata(&params, &version).await?.boxed();
                tokio::spawn(async move {
                    let mut next = Some(first);
                    loop {
                        let stream = match next.take() {
                            Some(stream) => stream,
                            None => {
                                own.watches.fetch_add(1, Ordering::SeqCst);
                                own.open_watches.fetch_add(1, Ordering::SeqCst);
                                nodes.watch_metadata(&params, &version).await?.boxed()
                            }
                        };
                        let result = follow(stream, &mut held, &mut version, &publish).await;
                        own.open_watches.fetch_sub(1, Ordering::SeqCst);
                        result?;
                    }
                })
            }
        };
        Ok(Observer { count, max, task })
    }

    /// Waits until exactly `target` nodes are held; the instant it saw that.
    async fn wait_for(&self, target: usize, limit: Duration) -> Option<Instant> {
        let mut count = self.count.clone();
        match tokio::time::timeout(limit, count.wait_for(|&n| n == target)).await {
            Ok(Ok(_)) => Some(Instant::now()),
            _ => None,
        }
    }

    fn current(&self) -> usize {
        *self.count.borrow()
    }

    fn max_seen(&self) -> u64 {
        self.max.load(Ordering::SeqCst)
    }

    fn stop(self) {
        self.task.abort();
    }
}

/// Applies one watch's events to the held set until the watch ends.
async fn follow(
    mut stream: futures::stream::BoxStream<'static, kube::Result<WatchEvent<NodeMeta>>>,
    held: &mut HashSet<String>,
    version: &mut String,
    publish: &impl Fn(usize),
) -> Result<()> {
    while let Some(event) = stream.try_next().await? {
        match event {
            WatchEvent::Added(n) | WatchEvent::Modified(n) => {
                if let Some(rv) = n.metadata.resource_version {
                    *version = rv;
                }
                held.extend(n.metadata.name);
            }
            WatchEvent::Deleted(n) => {
                if let Some(rv) = n.metadata.resource_version {
                    *version = rv;
                }
                if let Some(name) = n.metadata.name {
                    held.remove(&name);
                }
            }
            WatchEvent::Bookmark(b) => *version = b.metadata.resource_version,
            WatchEvent::Error(e) => bail!("watch error: {e:?}"),
        }
        publish(held.len());
    }
    Ok(())
}

type NodeMeta = kube::core::PartialObjectMeta<Node>;

// ---------------------------------------------------------------------------
// Counting requests.

/// One node PATCH by node-holder, from the audit log.
struct AuditPatch {
    at: Timestamp,
    name: String,
    code: i64,
}

fn node_holder_patches(cp: &ControlPlane) -> Result<Vec<AuditPatch>> {
    let mut patches = Vec::new();
    for event in cp.audit_events()? {
        if event["user"]["username"] != testenv::NODE_HOLDER_USER
            || event["verb"] != "patch"
            || event["objectRef"]["resource"] != "nodes"
            || event["stage"] != "ResponseComplete"
        {
            continue;
        }
        patches.push(AuditPatch {
            at: event["requestReceivedTimestamp"]
                .as_str()
                .context("requestReceivedTimestamp")?
                .parse()?,
            name: event["objectRef"]["name"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            code: event["responseStatus"]["code"].as_i64().unwrap_or(0),
        });
    }
    patches.sort_by_key(|p| p.at);
    Ok(patches)
}

fn unique(patches: &[&AuditPatch]) -> usize {
    patches
        .iter()
        .map(|p| p.name.as_str())
        .collect::<HashSet<_>>()
        .len()
}

fn describe_patches(patches: &[&AuditPatch]) -> String {
    let (Some(first), Some(last)) = (patches.first(), patches.last()) else {
        return "node PATCH 0".to_string();
    };
    let span = signed_secs(last.at.duration_since(first.at));
    let failed = patches
        .iter()
        .filter(|p| !(200..300).contains(&p.code))
        .count();
    format!(
        "node PATCH {} ({} nodes, {failed} not 2xx) received over {span:.2} s: {:.0}/s",
        patches.len(),
        unique(patches),
        if span > 0.0 {
            (patches.len() - 1) as f64 / span
        } else {
            0.0
        }
    )
}

/// The API server's request counters (`apiserver_request_total`, by resource
/// and verb, all codes) and open long-running requests.
#[derive(Debug, Clone, Default)]
struct ApiMetrics {
    requests: BTreeMap<(String, String), f64>,
    longrunning: BTreeMap<(String, String), f64>,
    /// `apiserver_terminated_watchers_total`: watchers the watch cache closed
    /// because they did not keep up.
    terminated: BTreeMap<(String, String), f64>,
}

impl ApiMetrics {
    async fn scrape(admin: &kube::Client) -> Result<ApiMetrics> {
        let request = hyper::Request::get("/metrics").body(Vec::new())?;
        let text = admin
            .request_text(request)
            .await
            .context("API server /metrics")?;
        let mut metrics = ApiMetrics::default();
        for line in text.lines() {
            let Some(testenv::metrics::Sample {
                name,
                labels,
                value,
            }) = testenv::metrics::sample(line)
            else {
                continue;
            };
            let target = match name {
                "apiserver_request_total" => &mut metrics.requests,
                "apiserver_longrunning_requests" => &mut metrics.longrunning,
                "apiserver_terminated_watchers_total" => &mut metrics.terminated,
                _ => continue,
            };
            if labels.get("component").is_some_and(|c| c != "apiserver") {
                continue;
            }
            let key = (
                labels.get("resource").cloned().unwrap_or_default(),
                labels.get("verb").cloned().unwrap_or_default(),
            );
            *target.entry(key).or_default() += value;
        }
        Ok(metrics)
    }

    /// Requests between `earlier` and now, less the benchmark's own node
    /// LISTs and WATCHes in `own`.
    fn since(&self, earlier: &ApiMetrics, own: &OwnSnapshot) -> ApiDelta {
        let mut delta = BTreeMap::new();
        for (key, value) in &self.requests {
            let before = earlier.requests.get(key).copied().unwrap_or(0.0);
            delta.insert(key.clone(), value - before);
        }
        let key = |verb: &str| ("nodes".to_string(), verb.to_string());
        *delta.entry(key("LIST")).or_default() -= own.lists as f64;
        *delta.entry(key("WATCH")).or_default() -= own.watches_ended as f64;
        ApiDelta(delta)
    }

    /// The raw node counters, for the record.
    fn raw_nodes(&self, label: &str, own: &OwnSnapshot) -> String {
        let get = |map: &BTreeMap<(String, String), f64>, verb: &str| {
            map.get(&("nodes".to_string(), verb.to_string()))
                .copied()
                .unwrap_or(0.0)
        };
        format!(
            "{label:<22} LIST {:>5} WATCH ended {:>3} open {:>2} terminated {:>2} PATCH {:>6} POST {:>5} \
             | bench's own: LIST {} WATCH ended {} open {}",
            get(&self.requests, "LIST"),
            get(&self.requests, "WATCH"),
            self.open_watches("nodes"),
            self.terminated_nodes(),
            get(&self.requests, "PATCH"),
            get(&self.requests, "POST"),
            own.lists,
            own.watches_ended,
            own.open_watches
        )
    }

    fn terminated_nodes(&self) -> f64 {
        self.terminated
            .iter()
            .filter(|((resource, _), _)| resource == "nodes")
            .fold(0.0, |sum, (_, v)| sum + v)
    }

    fn open_watches(&self, resource: &str) -> f64 {
        self.longrunning
            .get(&(resource.to_string(), "WATCH".to_string()))
            .copied()
            .unwrap_or(0.0)
    }
}

struct ApiDelta(BTreeMap<(String, String), f64>);

impl ApiDelta {
    fn get(&self, resource: &str, verb: &str) -> f64 {
        self.0
            .get(&(resource.to_string(), verb.to_string()))
            .copied()
            .unwrap_or(0.0)
    }

    fn nodes(&self, verb: &str) -> f64 {
        self.get("nodes", verb)
    }

    fn writes(&self, resource: &str) -> f64 {
        ["POST", "PATCH", "PUT"]
            .iter()
            .fold(0.0, |sum, verb| sum + self.get(resource, verb))
    }

    fn event_writes(&self) -> f64 {
        self.writes("events")
    }
}

/// node-holder's own `/metrics`.
struct NodeHolderMetrics(Vec<(String, BTreeMap<String, String>, f64)>);

impl NodeHolderMetrics {
    async fn scrape(served: &common::Served) -> Result<NodeHolderMetrics> {
        let (status, body) = common::http_get(served.admin_port, "/metrics").await?;
        ensure!(status == 200, "node-holder /metrics: {status}");
        Ok(NodeHolderMetrics(
            body.lines()
                .filter_map(testenv::metrics::sample)
                .map(|s| (s.name.to_string(), s.labels, s.value))
                .collect(),
        ))
    }

    /// The unlabelled sample `name` (0 when absent).
    fn get(&self, name: &str) -> f64 {
        self.0
            .iter()
            .find(|(n, labels, _)| n == name && labels.is_empty())
            .map_or(0.0, |(_, _, v)| *v)
    }

    /// Every sample of `name`, summed over labels.
    fn sum(&self, name: &str) -> f64 {
        self.0
            .iter()
            .filter(|(n, _, _)| n == name)
            .fold(0.0, |sum, (_, _, v)| sum + v)
    }
}

struct Probes {
    churn_secs: f64,
    churn_window: (Timestamp, Timestamp),
    churn_api: ApiDelta,
    churn_passes: f64,
    extend_window: (Timestamp, Timestamp),
    extend_time: Option<Duration>,
    extend_api: ApiDelta,
    extender_created: Timestamp,
    /// node-holder's holds_applied during the extend probe.
    extend_applied: f64,
}

// ---------------------------------------------------------------------------
// The process.

/// The machine the bench runs on.
struct Machine {
    cores: usize,
    cpu_model: String,
    loadavg: String,
}

impl Machine {
    fn read() -> Machine {
        use procfs::Current as _;
        let cpus = procfs::CpuInfo::current().ok();
        Machine {
            cores: cpus.as_ref().map_or(0, procfs::CpuInfo::num_cores),
            cpu_model: cpus
                .as_ref()
                .and_then(|c| c.model_name(0))
                .unwrap_or("unknown CPU")
                .to_string(),
            loadavg: procfs::LoadAverage::current()
                .map(|l| format!("{:.2} {:.2} {:.2}", l.one, l.five, l.fifteen))
                .unwrap_or_default(),
        }
    }
}

/// A process's resident memory now and at its peak, in KiB.
#[derive(Debug, Clone, Copy)]
struct ProcMemory {
    rss_kb: u64,
    hwm_kb: u64,
}

impl ProcMemory {
    fn read(pid: u32) -> Result<ProcMemory> {
        let status = procfs::process::Process::new(i32::try_from(pid)?)?.status()?;
        Ok(ProcMemory {
            rss_kb: status.vmrss.context("VmRSS")?,
            hwm_kb: status.vmhwm.context("VmHWM")?,
        })
    }
}

impl std::fmt::Display for ProcMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "VmRSS {:.1} MiB (peak VmHWM {:.1} MiB = {:.1} MB)",
            mib(self.rss_kb),
            mib(self.hwm_kb),
            decimal_mb(self.hwm_kb)
        )
    }
}

/// Kibibytes in mebibytes.
fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// Kibibytes in decimal megabytes, the unit of the targets.
fn decimal_mb(kb: u64) -> f64 {
    kb as f64 * 1024.0 / 1e6
}

/// VmRSS of a process every [`SAMPLE`].
struct RssSampler {
    samples: Arc<Mutex<Vec<(Instant, u64)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RssSampler {
    fn start(pid: u32) -> RssSampler {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let writer = samples.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(SAMPLE);
            loop {
                tick.tick().await;
                let Ok(memory) = ProcMemory::read(pid) else {
                    return;
                };
                writer.lock().unwrap().push((Instant::now(), memory.rss_kb));
            }
        });
        RssSampler { samples, task }
    }

    fn max_between(&self, from: Instant, to: Instant) -> u64 {
        self.samples
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, _)| *at >= from && *at <= to)
            .map(|(_, kb)| *kb)
            .max()
            .unwrap_or(0)
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// User + system CPU time of a process.
fn process_cpu(pid: u32) -> Result<Duration> {
    let stat = procfs::process::Process::new(i32::try_from(pid)?)?.stat()?;
    let ticks = stat.utime.saturating_add(stat.stime);
    Ok(Duration::from_secs_f64(
        ticks as f64 / procfs::ticks_per_second() as f64,
    ))
}

fn truncate(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

/// What node-holder's watch carries and its store keeps: the metadata of
/// every node, as JSON, with and without managedFields.
struct MetadataSize {
    nodes: usize,
    json_bytes: usize,
    managed_fields_bytes: usize,
}

impl MetadataSize {
    async fn measure(nodes: &Api<Node>) -> Result<MetadataSize> {
        let list = nodes.list_metadata(&ListParams::default()).await?;
        let mut size = MetadataSize {
            nodes: list.items.len(),
            json_bytes: 0,
            managed_fields_bytes: 0,
        };
        for item in &list.items {
            size.json_bytes += serde_json::to_vec(&item.metadata)?.len();
            if let Some(fields) = &item.metadata.managed_fields {
                size.managed_fields_bytes += serde_json::to_vec(fields)?.len();
            }
        }
        Ok(size)
    }
}

impl std::fmt::Display for MetadataSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "node metadata now (the watch's payload): {} nodes, {:.1} MB JSON ({:.0} B a node), \
             of which managedFields {:.1} MB",
            self.nodes,
            self.json_bytes as f64 / 1e6,
            self.json_bytes as f64 / self.nodes.max(1) as f64,
            self.managed_fields_bytes as f64 / 1e6
        )
    }
}

fn signed_secs(d: jiff::SignedDuration) -> f64 {
    d.as_secs_f64()
}

// ---------------------------------------------------------------------------
// The report.

struct Summary<'a> {
    machine: &'a Machine,
    observe: Observe,
    create_secs: f64,
    hold_time: Option<Duration>,
    release_time: Option<f64>,
    hold_patches: usize,
    hold_unique: usize,
    release_patches: usize,
    release_unique: usize,
    release_target: usize,
    stray_patches: usize,
    /// (churn PATCHes, churn LIST+WATCH, extend PATCHes)
    probes: Option<(usize, f64, usize)>,
    initial_lists: f64,
    later_lists: f64,
    rewatches: f64,
    terminated: f64,
    idle_kb: u64,
    peak_kb: u64,
    patch_errors: f64,
}

impl Summary<'_> {
    fn render(&self) -> String {
        let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
        let mut out = String::new();
        let _ = writeln!(
            out,
            "== summary: {} nodes, {} cores ({}), held count by {} ==",
            *NODES,
            self.machine.cores,
            self.machine.cpu_model,
            match self.observe {
                Observe::Watch => "watch",
                Observe::List => "250 ms list",
            }
        );
        let _ = writeln!(
            out,
            "{:<52} {:>16}  {:<14} verdict",
            "measure", "value", "target"
        );
        let mut row = |what: &str, value: String, target: &str, verdict: &str| {
            let _ = writeln!(out, "{what:<52} {value:>16}  {target:<14} {verdict}");
        };
        row(
            &format!(
                "setup: create {} nodes ({CREATE_IN_FLIGHT} in flight)",
                *NODES
            ),
            format!("{:.1} s", self.create_secs),
            "-",
            "-",
        );
        row(
            &format!("hold: new node create -> all {} held", *NODES + 1),
            self.hold_time
                .map_or("never".into(), |d| format!("{:.2} s", d.as_secs_f64())),
            "<= 30 s",
            verdict(self.hold_time.is_some_and(|d| d <= TARGET_DIRECTION)),
        );
        row(
            &format!("release: deadline -> none of {} held", self.release_target),
            self.release_time
                .map_or("never".into(), |s| format!("{s:.2} s")),
            "<= 30 s",
            verdict(
                self.release_time
                    .is_some_and(|s| s <= TARGET_DIRECTION.as_secs_f64()),
            ),
        );
        row(
            "serve peak RSS (VmHWM, whole run)",
            format!(
                "{:.1} MiB/{:.1} MB",
                mib(self.peak_kb),
                self.peak_kb as f64 * 1024.0 / 1e6
            ),
            "< 40 MB",
            verdict((self.peak_kb as f64) * 1024.0 < TARGET_RSS_BYTES),
        );
        row(
            "serve RSS idle, nodes watched, no window",
            format!("{:.1} MiB", mib(self.idle_kb)),
            "-",
            "-",
        );
        row(
            "node PATCHes, hold phase (distinct nodes)",
            format!("{} ({})", self.hold_patches, self.hold_unique),
            &format!("= {}", *NODES + 1),
            verdict(self.hold_patches == *NODES + 1 && self.hold_unique == *NODES + 1),
        );
        row(
            "node PATCHes, release phase (distinct nodes)",
            format!("{} ({})", self.release_patches, self.release_unique),
            &format!("= {}", self.release_target),
            verdict(
                self.release_patches == self.release_target
                    && self.release_unique == self.release_target,
            ),
        );
        if let Some((churn, churn_reads, extend)) = self.probes {
            row(
                &format!("{CHURN_NODES} unrelated node changes: PATCH / LIST+WATCH"),
                format!("{churn} / {churn_reads}"),
                "0 / 0",
                verdict(churn == 0 && churn_reads == 0.0),
            );
            row(
                "one more new node in the open window: PATCH",
                extend.to_string(),
                "= 1",
                verdict(extend == 1),
            );
        }
        row(
            "node PATCHes outside those phases",
            self.stray_patches.to_string(),
            "0",
            verdict(self.stray_patches == 0),
        );
        row(
            "node LISTs: initial sync (500 a page) / after",
            format!("{} / {}", self.initial_lists, self.later_lists),
            "1 relist / 0",
            verdict(self.later_lists == 0.0),
        );
        row(
            "node WATCHes ended (re-opened) / closed as too slow",
            format!("{} / {}", self.rewatches, self.terminated),
            "0 / 0",
            verdict(self.rewatches == 0.0 && self.terminated == 0.0),
        );
        row(
            "node-holder patch_errors_total",
            self.patch_errors.to_string(),
            "0",
            verdict(self.patch_errors == 0.0),
        );
        out
    }
}
