//! A drift rollout under a default install:
//! `cargo bench -p node-holder-lab --bench drift` (`NODE_HOLDER_BENCH_NODES`,
//! default 10; `NODE_HOLDER_BENCH_ROUNDS`, default 3).
//!
//! Each round starts two clusters side by side, each with the real
//! Karpenter at its own defaults (`WhenEmptyOrUnderutilized`,
//! `consolidateAfter: 0s`, a `nodes: 10%` budget) and a 45 s boot per node:
//!
//! - `karpenter`: Karpenter alone;
//! - `node-holder`: `node-holder serve` with its defaults (the hold
//!   annotation, cluster scope, a 20-minute window) as the cluster's webhook,
//!   installed before the nodes, so that the window holds every node when
//!   the rollout starts: the hardest case for a rollout.
//!
//! In each, a Deployment of N pods that each fill a node runs on N nodes;
//! then the NodePool's template changes (every node drifts) and the round
//! measures the time until every old node is deleted and every pod runs on
//! a new one. The paired ratio node-holder / karpenter over the rounds is
//! the figure (issue 39: at most 1.5x). It also reports how many of the new
//! nodes node-holder holds at the end: consolidation after the scale-up is
//! still held.

use testsupport as common;
use testsupport::karpenter::Autoscaled;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::{ClusterOptions, Disruption};

use node_holder_lab::frontier::mean_ci95;
use node_holder_lab::measure::machine::Machine;

const BOOT: Duration = Duration::from_secs(45);
const DEPLOYMENT: &str = "service";
const HOLD_KEY: &str = "karpenter.sh/do-not-disrupt";

fn main() -> Result<()> {
    node_holder_lab::run_bench(run)
}

/// What one arm of one round saw.
#[derive(Debug)]
struct Rollout {
    /// From the NodePool's change until every old node is gone and every
    /// pod runs on a new one.
    took: Duration,
    /// New nodes carrying the hold at the end.
    held: usize,
    replaced: usize,
}

async fn run() -> Result<()> {
    let (nodes, rounds) = (
        node_holder_lab::env_count("NODE_HOLDER_BENCH_NODES", 10),
        node_holder_lab::env_count("NODE_HOLDER_BENCH_ROUNDS", 3),
    );
    println!("node-holder drift benchmark: {nodes} nodes, {rounds} rounds");
    let mut ratios = Vec::new();
    for round in 1..=rounds {
        let (alone, held) = tokio::join!(rollout(nodes, false), rollout(nodes, true));
        let (alone, held) = (alone?, held?);
        let ratio = held.took.as_secs_f64() / alone.took.as_secs_f64();
        println!(
            "round {round}: karpenter {:.0} s, node-holder {:.0} s ({ratio:.2}x); \
             node-holder held {} of {} new nodes at the end, karpenter {}",
            alone.took.as_secs_f64(),
            held.took.as_secs_f64(),
            held.held,
            held.replaced,
            alone.held
        );
        ratios.push(ratio);
    }
    let (mean, half) = mean_ci95(&ratios);
    let machine = Machine::read();
    println!(
        "node-holder / karpenter: {mean:.2}x ± {half:.2} (95%, {rounds} rounds; target ≤ 1.5x: {}); \
         {} cores, load average {}",
        if mean <= 1.5 { "met" } else { "NOT met" },
        machine.cores,
        machine.loadavg
    );
    Ok(())
}

/// One arm of one round: the cluster, the Deployment, the rollout.
async fn rollout(nodes: usize, with_node_holder: bool) -> Result<Rollout> {
    let options = ClusterOptions {
        registration_delay: Some(BOOT),
        log_level: "info",
        ..ClusterOptions::default()
    };
    let mut a = Autoscaled::start_with(&options, &karpenters_defaults()).await;
    let served = match with_node_holder {
        true => {
            let served = common::serve(a.cp(), &["--lease-duration=5s"]).await;
            common::register_webhook(a.cp(), &served).await;
            Some(served)
        }
        false => None,
    };
    let old = scale_up(&mut a, nodes).await?;
    let started = Instant::now();
    drift_the_pool(&a).await?;
    let limit = BOOT * 4 * u32::try_from(nodes)?;
    a.until("every old node replaced", limit, async |a| {
        let deleted = a.nodes_deleted();
        let running = a.running_nodes(DEPLOYMENT).await;
        old.iter().all(|n| deleted.contains_key(n))
            && running.len() == nodes
            && running.is_disjoint(&old)
    })
    .await;
    let took = started.elapsed();
    let new = a.running_nodes(DEPLOYMENT).await;
    let mut held = 0;
    for node in &new {
        let annotations = a.nodes.get(node).await?.metadata.annotations;
        held += usize::from(annotations.is_some_and(|an| an.contains_key(HOLD_KEY)));
    }
    drop(served);
    Ok(Rollout {
        took,
        held,
        replaced: new.len(),
    })
}

/// A NodePool as Karpenter creates it by default.
fn karpenters_defaults() -> Disruption {
    Disruption {
        consolidation_policy: "WhenEmptyOrUnderutilized".into(),
        consolidate_after: "0s".into(),
        budgets: json!([{"nodes": "10%"}]),
    }
}

/// The Deployment of `nodes` pods, one a node; the nodes it runs on.
async fn scale_up(a: &mut Autoscaled, nodes: usize) -> Result<BTreeSet<String>> {
    let deployments: Api<Deployment> = Api::namespaced(a.client.clone(), "default");
    let replicas = i32::try_from(nodes)?;
    deployments
        .create(
            &PostParams::default(),
            &testenv::filler_deployment(DEPLOYMENT, replicas),
        )
        .await?;
    let limit = BOOT * 4;
    a.until("every pod runs", limit, async |a| {
        a.running_nodes(DEPLOYMENT).await.len() == nodes
    })
    .await;
    let old = a.running_nodes(DEPLOYMENT).await;
    ensure!(old.len() == nodes, "one node a pod: {old:?}");
    Ok(old)
}

/// Changes the NodePool's template: every node of the pool drifts.
async fn drift_the_pool(a: &Autoscaled) -> Result<()> {
    let change = json!({"spec": {"template": {"metadata": {"labels": {
        "rollout": Timestamp::now().as_second().to_string()
    }}}}});
    testenv::node_pools(&a.client)
        .patch(
            testenv::NODE_POOL,
            &PatchParams::default(),
            &Patch::Merge(change),
        )
        .await
        .context("changing the NodePool")?;
    Ok(())
}
