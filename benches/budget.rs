//! The budget mechanism at scale: `cargo bench --bench budget`
//! (`NODE_HOLDER_BENCH_NODES`, default 50,000; `NODE_HOLDER_BENCH_POOLS`,
//! default 10).
//!
//! Against a real control plane with Karpenter's CRDs (no Karpenter: what
//! it does with the budget is `tests/karpenter.rs`'s):
//!
//! 1. creates the NodePools and the Nodes (spread over the pools by their
//!    `karpenter.sh/nodepool` label, 32 creates in flight) and waits until the
//!    newest node is older than the hold, so that none opens a window;
//! 2. starts the release build of `node-holder serve --hold-mechanism budget`
//!    as node-holder's restricted identity (`webhook-config/rbac.yaml` and
//!    `rbac-nodepools.yaml`), no webhook registered; measures the start-up:
//!    until the first pass over every node is done, and the idle RSS;
//! 3. creates one new node and measures the time until every pool carries
//!    node-holder's budget (the pools polled every 20 ms), then from the
//!    window's deadline until none does;
//! 4. counts node-holder's writes from the API server's audit log (NodePool
//!    and Node PATCHes) and reads `serve`'s peak RSS (VmHWM).
//!
//! Targets (issue 15): hold and release in under 2 s each with one write per
//! pool.

use testsupport as common;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use futures::StreamExt as _;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, ListParams, ObjectMeta, PostParams};
use serde_json::json;
use testenv::{ControlPlane, Disruption};

const HOLD: Duration = Duration::from_secs(30);
const CREATE_IN_FLIGHT: usize = 32;
const POLL: Duration = Duration::from_millis(20);
const TARGET: Duration = Duration::from_secs(2);

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

fn main() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run())
}

async fn run() -> Result<()> {
    let (node_count, pool_count) = (
        env_count("NODE_HOLDER_BENCH_NODES", 50_000),
        env_count("NODE_HOLDER_BENCH_POOLS", 10),
    );
    println!(
        "node-holder budget mechanism benchmark: {node_count} nodes in {pool_count} NodePools"
    );
    let cp = ControlPlane::start()
        .await
        .context("starting the control plane")?;
    testenv::install_karpenter_crds(&cp).await?;
    let admin = cp.admin_client().await?;
    let pools = testenv::node_pools(&admin);
    let nodes: Api<Node> = Api::all(admin.clone());

    // 1. The cluster before the window.
    for p in 0..pool_count {
        create_pool(&pools, &pool_name(p)).await?;
    }
    let t = Instant::now();
    create_nodes(&nodes, node_count, pool_count).await?;
    let created_secs = t.elapsed().as_secs_f64();
    println!("created {node_count} nodes in {created_secs:.1} s");
    tokio::time::sleep(HOLD + Duration::from_millis(1500)).await;

    // 2. node-holder.
    common::install_nodepool_rbac(&cp).await;
    let t = Instant::now();
    let hold = format!("--hold-duration={}s", HOLD.as_secs());
    let served = common::serve(&cp, &[hold.as_str(), "--hold-mechanism=budget"]).await;
    let pid = served.child.id();
    wait_first_pass(&served).await?;
    let startup = t.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_rss = rss_kb(pid, Rss::Now)?;
    println!(
        "serve: first pass over {node_count} nodes {:.2} s after start; idle RSS {:.1} MiB",
        startup.as_secs_f64(),
        mib(idle_rss)
    );
    ensure!(
        carrying(&pools).await? == 0,
        "a pool is held before any new node"
    );

    // 3. One new node: every pool held, then released at the deadline.
    let hold_start = Instant::now();
    let hold_wall = Timestamp::now();
    nodes
        .create(
            &PostParams::default(),
            &bench_node("scale-up-0", &pool_name(0)),
        )
        .await?;
    let held = until_carrying(&pools, pool_count, HOLD).await?;
    let hold_time = held.duration_since(hold_start);
    println!(
        "HOLD: every pool carries node-holder's budget {:.3} s after the new node's create",
        hold_time.as_secs_f64()
    );
    let deadline = deadline(&admin).await?;
    let wait = Duration::try_from(deadline.duration_since(Timestamp::now())).unwrap_or_default();
    tokio::time::sleep(wait).await;
    // The instant of the deadline (the sleep may end a little after it).
    let at_deadline = Instant::now()
        .checked_sub(wait_since(deadline))
        .context("the deadline before the clock's start")?;
    let released = until_carrying(&pools, 0, Duration::from_secs(60)).await?;
    let release_wall = Timestamp::now();
    let release_time = released.saturating_duration_since(at_deadline);
    println!(
        "RELEASE: no pool carries it {:.3} s after the deadline",
        release_time.as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;

    // 4. Writes and memory.
    let writes = node_holder_writes(&cp, hold_wall, release_wall + Duration::from_secs(3))?;
    let peak_rss = rss_kb(pid, Rss::Peak)?;
    println!(
        "writes: {} NodePool PATCHes, {} Node PATCHes (no webhook here: the new node is held \
         by its pool's budget, never by annotation)",
        writes.pools, writes.nodes
    );
    println!(
        "serve RSS: idle {:.1} MiB, peak {:.1} MiB",
        mib(idle_rss),
        mib(peak_rss)
    );
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    println!(
        "targets: hold < 2 s {}, release < 2 s {}, writes = 2 x pools {}",
        met(hold_time < TARGET),
        met(release_time < TARGET),
        met(writes.pools == 2 * pool_count)
    );
    drop(served);
    Ok(())
}

/// How long ago `deadline` was.
fn wait_since(deadline: Timestamp) -> Duration {
    Duration::try_from(Timestamp::now().duration_since(deadline)).unwrap_or_default()
}

fn pool_name(p: usize) -> String {
    format!("pool-{p:02}")
}

async fn create_pool(pools: &Api<DynamicObject>, name: &str) -> Result<()> {
    let pool = testenv::node_pool_object(
        name,
        &Disruption {
            budgets: json!([{"nodes": "10%"}]),
            ..Disruption::default()
        },
    );
    let pool: DynamicObject = serde_json::from_value(pool)?;
    // The CRD may take a moment to serve.
    for _ in 0..100 {
        match pools.create(&PostParams::default(), &pool).await {
            Ok(_) => return Ok(()),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    anyhow::bail!("NodePool {name} could not be created")
}

fn bench_node(name: &str, pool: &str) -> Node {
    let labels = [
        ("kubernetes.io/hostname", name),
        ("kubernetes.io/os", "linux"),
        ("karpenter.sh/nodepool", pool),
        ("karpenter.sh/capacity-type", "spot"),
        ("topology.kubernetes.io/zone", "eu-west-1a"),
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

async fn create_nodes(nodes: &Api<Node>, count: usize, pools: usize) -> Result<()> {
    let mut results = futures::stream::iter(0..count)
        .map(|i| async move {
            let node = bench_node(&format!("node-{i:06}"), &pool_name(i % pools));
            nodes.create(&PostParams::default(), &node).await
        })
        .buffer_unordered(CREATE_IN_FLIGHT);
    while let Some(result) = results.next().await {
        result.context("creating a node")?;
    }
    Ok(())
}

/// Pools whose last budget is node-holder's.
async fn carrying(pools: &Api<DynamicObject>) -> Result<usize> {
    let ours = json!({"nodes": "0", "reasons": ["Underutilized", "Empty"]});
    Ok(pools
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|p| {
            p.data["spec"]["disruption"]["budgets"]
                .as_array()
                .and_then(|b| b.last())
                == Some(&ours)
        })
        .count())
}

/// When `count` pools carry node-holder's budget, within `limit`.
async fn until_carrying(
    pools: &Api<DynamicObject>,
    count: usize,
    limit: Duration,
) -> Result<Instant> {
    let give_up = Instant::now() + limit;
    loop {
        if carrying(pools).await? == count {
            return Ok(Instant::now());
        }
        ensure!(
            Instant::now() < give_up,
            "not {count} pools held within {limit:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

async fn deadline(admin: &kube::Client) -> Result<Timestamp> {
    let records = Api::namespaced(admin.clone(), testenv::NODE_HOLDER_NAMESPACE);
    common::window::record_at(&records, "/open/deadline")
        .await
        .context("no open window in the record")
}

/// Waits until the window task has finished a pass (over every node).
async fn wait_first_pass(served: &common::Served) -> Result<()> {
    let give_up = Instant::now() + Duration::from_secs(300);
    let passes = "node_holder_reconcile_duration_seconds_count";
    while common::window::metric(served, passes).await.unwrap_or(0.0) < 1.0 {
        ensure!(
            Instant::now() < give_up,
            "no pass within 300 s\n{}",
            served.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

struct Writes {
    pools: usize,
    nodes: usize,
}

fn node_holder_writes(cp: &ControlPlane, from: Timestamp, to: Timestamp) -> Result<Writes> {
    let mut writes = Writes { pools: 0, nodes: 0 };
    for event in cp.audit_events()? {
        let at: Option<Timestamp> = event["stageTimestamp"]
            .as_str()
            .and_then(|t| t.parse().ok());
        let ours = event["verb"] == "patch"
            && event["user"]["username"] == testenv::NODE_HOLDER_USER
            && event["stage"] == "ResponseComplete"
            && at.is_some_and(|at| at >= from && at <= to);
        match event["objectRef"]["resource"].as_str() {
            Some("nodepools") if ours => writes.pools += 1,
            Some("nodes") if ours => writes.nodes += 1,
            _ => {}
        }
    }
    Ok(writes)
}

enum Rss {
    Now,
    Peak,
}

fn rss_kb(pid: u32, which: Rss) -> Result<u64> {
    let process = procfs::process::Process::new(i32::try_from(pid)?)?;
    let status = process.status()?;
    let kb = match which {
        Rss::Now => status.vmrss,
        Rss::Peak => status.vmhwm,
    };
    kb.context("no VmRSS/VmHWM")
}

fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}
