//! The phases of the hold window bench (`lab/benches/window.rs`), in order:
//! [`serve`] starts node-holder on the fleet, [`hold`] creates the node that
//! opens the window, [`probes`] changes unrelated labels and adds a node
//! while it is open, [`release`] waits for every hold to go. Each returns
//! what it recorded for the report.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use jiff::Timestamp;

use super::cluster::{Cluster, created};
use super::{Hold, Probes, Release, Serving, Start};
use crate::fleet::cloud_node_name;
use crate::measure::node_holder::{NodeHolderMetrics, wait_first_pass};
use crate::measure::observer::{self, MARKER_SELECTOR, Observe, Observer};
use crate::measure::process::{self, ProcMemory};
use crate::measure::rss::RssSampler;

/// The run's sizes and waits, which the bench chooses.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Nodes before the window opens.
    pub nodes: usize,
    /// `--hold-duration`.
    pub hold: Duration,
    /// How long the release may take after the deadline.
    pub release_slack: Duration,
    /// Unrelated node changes of the churn probe.
    pub churn_nodes: usize,
    /// After a phase, how long to wait for the follow-up pass and the audit
    /// events that trail their responses.
    pub settle: Duration,
    /// RSS sampling period.
    pub sample: Duration,
}

/// Step 2, node-holder: started, leading, idle with no window; the held
/// count followed from then on.
pub async fn serve(
    cluster: &mut Cluster,
    observe: Observe,
    sizes: &Sizes,
) -> Result<(Serving, Start)> {
    let before = cluster.checkpoint("before serve").await?;
    let t = Instant::now();
    let hold_arg = format!("--hold-duration={}s", sizes.hold.as_secs());
    let served = testsupport::serve(&cluster.cp, &[hold_arg.as_str()]).await;
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
    let sampler = RssSampler::start(pid, sizes.sample);
    tokio::time::sleep(Duration::from_secs(2)).await;
    check_no_window(cluster).await?;
    let idle = ProcMemory::read(pid)?;
    let cpu_idle = process::cpu(pid)?;
    println!(
        "idle, {} nodes watched, no window: {idle}; CPU so far {cpu_idle:.2?}",
        sizes.nodes
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
pub async fn hold(cluster: &mut Cluster, serving: &Serving, sizes: &Sizes) -> Result<Hold> {
    let start_wall = Timestamp::now();
    let hold_start = Instant::now();
    let opened_at = created(&cluster.create_node("scale-up-0").await?)?;
    let target = sizes.nodes + 1;
    let limit = sizes.hold + Duration::from_secs(5);
    let held = serving.observer.wait_for(target, limit).await;
    let time = held.map(|at| at.duration_since(hold_start));
    match time {
        Some(d) => println!(
            "\nHOLD: all {target} nodes carry {MARKER_SELECTOR} {:.2} s after the new node's create \
             (created {opened_at}, window until {})",
            d.as_secs_f64(),
            opened_at + sizes.hold
        ),
        None => println!(
            "\nHOLD: NOT all held within {limit:?}: {} of {target} at most",
            serving.observer.max_seen()
        ),
    }
    tokio::time::sleep(sizes.settle).await;
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
pub async fn probes(
    cluster: &mut Cluster,
    serving: &Serving,
    hold: &Hold,
    sizes: &Sizes,
) -> Result<Probes> {
    let t = Instant::now();
    let names = (0..sizes.churn_nodes).map(|i| cloud_node_name(i * 97 % sizes.nodes));
    cluster.change_unrelated_labels(names.collect()).await?;
    tokio::time::sleep(sizes.settle).await;
    let churn_end_wall = Timestamp::now();
    let churned = cluster.checkpoint("churn probe settled").await?;
    let nh3 = NodeHolderMetrics::scrape(&serving.served).await?;
    let churn_secs = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let extender = cluster.create_node("scale-up-1").await?;
    let held = serving
        .observer
        .wait_for(sizes.nodes + 2, Duration::from_secs(15));
    let extend_time = held.await.map(|at| at.duration_since(t));
    tokio::time::sleep(sizes.settle).await;
    let extend_end_wall = Timestamp::now();
    let extended = cluster.checkpoint("extend probe settled").await?;
    let nh4 = NodeHolderMetrics::scrape(&serving.served).await?;
    let passes = &format!("{}_count", crate::measure::node_holder::PASS_SECONDS);
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
pub async fn release(
    cluster: &mut Cluster,
    serving: &Serving,
    probed: bool,
    sizes: &Sizes,
) -> Result<Release> {
    let phase = Instant::now();
    let deadline = cluster.window_deadline().await?;
    let until_deadline = deadline.duration_since(Timestamp::now()).as_secs_f64();
    println!("window deadline {deadline} (in {until_deadline:.1} s); waiting for the release...");
    let before = cluster.checkpoint("before the release").await?;
    let cpu_before = process::cpu(serving.pid)?;
    let limit = Duration::try_from(deadline.duration_since(Timestamp::now())).unwrap_or_default()
        + sizes.release_slack;
    let released = serving.observer.wait_for(0, limit).await;
    let released_wall = Timestamp::now();
    let time = released.map(|_| released_wall.duration_since(deadline).as_secs_f64());
    let target = if probed {
        sizes.nodes + 2
    } else {
        sizes.nodes + 1
    };
    match time {
        Some(secs) => println!(
            "RELEASE: no node carries {MARKER_SELECTOR} {secs:.2} s after the deadline ({target} nodes released)"
        ),
        None => println!(
            "RELEASE: NOT all released within {limit:?} ({} still held)",
            serving.observer.current()
        ),
    }
    tokio::time::sleep(sizes.settle).await;
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
