//! Node CREATE through the real API server with each way of holding it:
//! `cargo bench -p node-holder-lab --bench admission`.
//!
//! One control plane, three arms at once, told apart by a label on each
//! node: `none` (no admission but the API server's own), `webhook`
//! (node-holder's webhook over TLS on loopback, registered for `arm=webhook`)
//! and `policy` (the chart's MutatingAdmissionPolicy, bound to `arm=policy`).
//! The creates take turns, one arm after the other, one at a time, so every
//! arm sees the same machine load; each latency is one create's round trip as
//! the client sees it (audit logging on, as in every test cluster).
//! node-holder runs with an hour's hold and `--api-qps=1`: every node the
//! webhook holds is already held as the window wants it, and its window task
//! writes the nodes' `held-until` stamps one a second at most while the
//! bench runs.
//!
//! Then node-holder is stopped (SIGKILL; the webhook stays registered, as
//! after a crash or with no ready replica) and the same number of creates
//! per arm say how many new nodes carry the hold at their CREATE in each
//! mode.
//!
//! `NODE_HOLDER_BENCH_CREATES=N`: N creates per arm and phase (default
//! 1,000). About two minutes.

use testsupport as common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, PostParams};
use testenv::ControlPlane;

use common::window::held;
use common::{node, policy, serve};
use node_holder_lab::measure::stats::nearest_rank_ms as percentile;

const ARMS: [&str; 3] = ["none", "webhook", "policy"];
const ARM_LABEL: &str = "arm";
const HOLD: &str = "karpenter.sh/do-not-disrupt";

fn main() -> Result<()> {
    node_holder_lab::build_node_holder()?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?
        .block_on(run())
}

/// What one arm's creates of one phase saw.
#[derive(Default)]
struct Arm {
    latencies: Vec<Duration>,
    held: usize,
}

async fn run() -> Result<()> {
    let creates = std::env::var("NODE_HOLDER_BENCH_CREATES")
        .ok()
        .map(|n| n.parse::<usize>().context("NODE_HOLDER_BENCH_CREATES"))
        .transpose()?
        .unwrap_or(1_000);
    let cp = ControlPlane::start().await?;
    let nodes: Api<Node> = Api::all(cp.admin_client().await?);
    println!("node CREATE through the API server, {creates} per arm and phase");

    let mut served = serve(
        &cp,
        &[
            "--hold-duration=1h",
            "--api-qps=1",
            "--node-selector=arm=webhook",
        ],
    )
    .await;
    register_webhook_for(&cp, &served, &nodes).await?;
    let objects = policy::objects(&[
        "--set-json",
        r#"webhook.objectSelector={"matchLabels":{"arm":"policy"}}"#,
    ]);
    policy::apply(&cp, &objects, &labelled("policy-probe", "policy"), HOLD).await;

    // Warm every path up (connections, the policy's compiled CEL).
    take_turns(&nodes, "warm", 50).await?;
    let running = take_turns(&nodes, "up", creates).await?;
    let _ = served.child.kill();
    let _ = served.child.wait();
    let stopped = take_turns(&nodes, "down", creates).await?;

    println!("\n{}", table(&running, &stopped));
    for (arm, expected) in [("none", 0), ("policy", creates)] {
        ensure!(
            running[arm].held == expected && stopped[arm].held == expected,
            "{arm}: {} and {} held, {expected} expected",
            running[arm].held,
            stopped[arm].held
        );
    }
    ensure!(
        running["webhook"].held == creates,
        "the running webhook held {} of {creates}",
        running["webhook"].held
    );
    Ok(())
}

/// A node named `name` in `arm`.
fn labelled(name: &str, arm: &str) -> Node {
    let mut n = node(name);
    n.metadata.labels = Some(BTreeMap::from([(ARM_LABEL.into(), arm.into())]));
    n
}

/// The webhook of `served`, for `arm=webhook` nodes only; returns once the
/// API server calls it.
async fn register_webhook_for(
    cp: &ControlPlane,
    served: &common::Served,
    nodes: &Api<Node>,
) -> Result<()> {
    let mut config = common::webhook_configuration(served.webhook_port, served.ca_pem());
    for webhook in config.webhooks.iter_mut().flatten() {
        webhook.object_selector = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(ARM_LABEL.into(), "webhook".into())])),
            ..LabelSelector::default()
        });
    }
    let configs: Api<MutatingWebhookConfiguration> = Api::all(cp.admin_client().await?);
    configs.create(&PostParams::default(), &config).await?;
    let probe = labelled("webhook-probe", "webhook");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !held(&policy::admitted(nodes, &probe).await) {
        ensure!(
            Instant::now() < deadline,
            "the API server never called the webhook"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// `creates` Node CREATEs per arm, the arms taking turns; each arm's
/// latencies and how many of its nodes came back held.
async fn take_turns(
    nodes: &Api<Node>,
    phase: &str,
    creates: usize,
) -> Result<BTreeMap<&'static str, Arm>> {
    let mut arms: BTreeMap<&str, Arm> = ARMS.iter().map(|a| (*a, Arm::default())).collect();
    for i in 0..creates {
        for arm in ARMS {
            let node = labelled(&format!("{phase}-{arm}-{i}"), arm);
            let started = Instant::now();
            let created = nodes.create(&PostParams::default(), &node).await?;
            let seen = arms.get_mut(arm).context("an arm")?;
            seen.latencies.push(started.elapsed());
            seen.held += usize::from(held(&created));
        }
    }
    Ok(arms)
}

fn table(running: &BTreeMap<&str, Arm>, stopped: &BTreeMap<&str, Arm>) -> String {
    let mut out = String::from(
        "| arm | node-holder | p50 ms | p99 ms | max ms | held at CREATE |\n|---|---|---|---|---|---|\n",
    );
    for arm in ARMS {
        for (state, arms) in [("running", running), ("stopped", stopped)] {
            let seen = &arms[arm];
            let mut sorted = seen.latencies.clone();
            sorted.sort();
            out.push_str(&format!(
                "| {arm} | {state} | {:.2} | {:.2} | {:.2} | {} of {} |\n",
                percentile(&sorted, 50.0),
                percentile(&sorted, 99.0),
                percentile(&sorted, 100.0),
                seen.held,
                sorted.len()
            ));
        }
    }
    out
}
