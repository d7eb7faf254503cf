//! `cargo xtask demo`: node-holder's whole job with the real Karpenter, live.
//!
//! It starts a small cluster on loopback (etcd, kube-apiserver,
//! kube-scheduler, kube-controller-manager, kwok as every kubelet, and
//! Karpenter's KWOK provider, all built from pinned Go modules), runs `node-holder
//! serve` with development certificates, the url-based webhook registration
//! of `webhook-config/webhook-local.yaml` and the RBAC of
//! `webhook-config/rbac.yaml`, then plays two waves of batch pods: Karpenter
//! launches nodes for the first, node-holder holds them from their creation,
//! the wave ends and Karpenter wants the empty nodes gone but is blocked, the
//! second wave runs on the held nodes, the window closes and Karpenter
//! consolidates. Then node-holder starts again with `--launch-cost` and two
//! CronJobs run (`schedules.rs`): the nodes of the one due again within the
//! launch cost stay through its gaps, the other's go as soon as its run is
//! over, each with node-holder's reason. One line is printed per thing that
//! happens. Every process it started stops with it, Ctrl-C included.

mod schedules;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Node, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use testenv::{Disruption, KarpenterCluster, ManagedChild};

/// How the demo runs.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// node-holder's --hold-duration: how long each new node holds the cluster.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub hold_duration: Duration,

    /// Pods in each wave; each needs a node of its own.
    #[arg(long, default_value_t = 3)]
    pub pods: usize,

    /// A short run (2 pods, 30s holds) that exits when done: what the test runs.
    #[arg(long)]
    pub quick: bool,
}

const HELD_LABEL: &str = "node-holder.dev/held";
const RECORD: &str = "node-holder-window";
/// The NodePool's consolidateAfter: Karpenter would remove an empty node
/// this long after its last pod left.
const CONSOLIDATE_AFTER: &str = "5s";
/// Karpenter polls for disruption every 10 s and validates a decision for
/// 15 s; anything it does comes within a few such rounds.
const KARPENTER_ROUNDS: Duration = Duration::from_secs(120);

pub async fn run(args: DemoArgs) -> Result<()> {
    let (hold, pods) = if args.quick {
        (Duration::from_secs(30), 2)
    } else {
        (args.hold_duration, args.pods.max(1))
    };
    tokio::select! {
        result = demo(hold, pods) => result,
        _ = tokio::signal::ctrl_c() => {
            println!("\ndemo: interrupted; stopping node-holder, Karpenter, kwok and the control plane");
            Ok(())
        }
    }
}

async fn demo(hold: Duration, pods: usize) -> Result<()> {
    let started = Instant::now();
    let mut cluster = start_cluster().await?;
    say(&format!("cluster ready in {:.1?}", started.elapsed()));
    let (serve, log) = start_node_holder(&cluster, hold, &[]).await?;
    let client = cluster.control_plane().admin_client().await?;
    say(&format!(
        "watch along: kubectl --kubeconfig {} get nodes -L {HELD_LABEL} -w",
        cluster.control_plane().admin_kubeconfig().display()
    ));
    println!();
    let mut story = Story::new(client, pods);
    story.play(&mut cluster).await?;
    println!();
    let launched = story.launched.len();
    say(&format!(
        "Karpenter launched {launched} nodes for two waves of {pods} pods, kept them while \
         node-holder's window was open, and consolidated them once it closed"
    ));
    drop(serve);
    let (_serve, scheduled_log) = schedules::restart_node_holder(&cluster, hold).await?;
    println!();
    story.schedules(&mut cluster).await?;
    println!();
    say(&format!(
        "done in {:.0?}; node-holder's logs: {} and {}",
        started.elapsed(),
        log.display(),
        scheduled_log.display()
    ));
    cluster.check_running()?;
    Ok(())
}

async fn start_cluster() -> Result<KarpenterCluster> {
    say(&format!(
        "starting a small cluster on loopback: etcd, kube-apiserver, kube-scheduler, \
         kube-controller-manager, kwok (the kubelets) and Karpenter {} with its KWOK provider \
         (the first run builds them from their Go modules: about 15 minutes on 2 cores)…",
        testenv::karpenter_version()?
    ));
    let disruption = Disruption {
        consolidation_policy: "WhenEmpty".into(),
        consolidate_after: CONSOLIDATE_AFTER.into(),
        budgets: serde_json::json!([{"nodes": "100%"}]),
    };
    let cluster = KarpenterCluster::start(&disruption).await?;
    say(&format!(
        "NodePool \"{}\": {} nodes (one pod each), consolidationPolicy WhenEmpty, consolidateAfter {CONSOLIDATE_AFTER}",
        testenv::NODE_POOL,
        testenv::INSTANCE_TYPE
    ));
    Ok(cluster)
}

/// Builds node-holder, starts `serve` as its least-privilege identity with
/// `extra` flags and registers the webhook; returns the process and its
/// log's path.
async fn start_node_holder(
    cluster: &KarpenterCluster,
    hold: Duration,
    extra: &[&str],
) -> Result<(ManagedChild, PathBuf)> {
    let cp = cluster.control_plane();
    say("building node-holder…");
    let binary = build_node_holder()?;
    let certs = cp.dir().join("certs");
    make_certs(&certs)?;
    cp.install_node_holder_rbac().await?;
    let (webhook_port, admin_port) = (testenv::free_port()?, testenv::free_port()?);
    let log = cp.dir().join(format!(
        "node-holder{}.log",
        if extra.is_empty() { "" } else { "-2" }
    ));
    let mut serve = Command::new(&binary);
    serve
        .args(["serve", "--log-format=text"])
        .arg(format!("--webhook-addr=127.0.0.1:{webhook_port}"))
        .arg(format!("--admin-addr=127.0.0.1:{admin_port}"))
        .arg(format!(
            "--tls-cert-file={}",
            certs.join("tls.crt").display()
        ))
        .arg(format!(
            "--tls-key-file={}",
            certs.join("tls.key").display()
        ))
        .arg(format!(
            "--hold-duration={}",
            humantime::format_duration(hold)
        ))
        .arg("--shutdown-grace=0s")
        .args(extra)
        .env("KUBECONFIG", cp.node_holder_kubeconfig());
    let mut serve = ManagedChild::spawn_command("node-holder", serve, &log)?;
    wait_ready(&mut serve, admin_port).await?;
    let ca = std::fs::read(certs.join("ca.crt")).context("reading the development CA")?;
    let configs: Api<MutatingWebhookConfiguration> = Api::all(cp.admin_client().await?);
    configs
        .create(
            &PostParams::default(),
            &testenv::local_webhook_configuration(webhook_port, &ca)?,
        )
        .await
        .context("registering the webhook")?;
    say(&format!(
        "node-holder serve runs as its own least-privilege identity (hold {}{}), \
         registered from webhook-config/webhook-local.yaml; its log: {}",
        humantime::format_duration(hold),
        extra.iter().map(|f| format!(", {f}")).collect::<String>(),
        log.display()
    ));
    Ok((serve, log))
}

/// Throw-away certificates in `certs`, unless a first start (the first
/// act) made them already.
fn make_certs(certs: &Path) -> Result<()> {
    if !certs.join("tls.crt").exists() {
        testenv::certs::make(certs, &[])?;
    }
    Ok(())
}

/// The two waves, told as they happen.
struct Story {
    pods: Api<Pod>,
    nodes: Api<Node>,
    events: Api<Event>,
    claims: Api<DynamicObject>,
    record: Api<ConfigMap>,
    per_wave: usize,
    t0: Instant,
    /// Nodes seen so far, and the ones seen gone.
    launched: BTreeSet<String>,
    gone: BTreeSet<String>,
    /// Events already told, by name.
    told: BTreeSet<String>,
    /// Waves whose pods all run.
    running: BTreeSet<String>,
    /// NodeClaims whose consolidateAfter has run out.
    consolidatable: usize,
    deadline: Option<String>,
    released: bool,
    /// The second act: each CronJob's finished runs (by Job).
    runs: BTreeMap<String, BTreeSet<String>>,
    /// node-holder's `ScheduledHoldEnded` Events told.
    ended: usize,
}

impl Story {
    fn new(client: kube::Client, per_wave: usize) -> Self {
        Story {
            pods: Api::namespaced(client.clone(), "default"),
            nodes: Api::all(client.clone()),
            events: Api::namespaced(client.clone(), "default"),
            claims: testenv::node_claims(&client),
            record: Api::namespaced(client, testenv::NODE_HOLDER_NAMESPACE),
            per_wave,
            t0: Instant::now(),
            launched: BTreeSet::new(),
            gone: BTreeSet::new(),
            told: BTreeSet::new(),
            running: BTreeSet::new(),
            consolidatable: 0,
            deadline: None,
            released: false,
            runs: BTreeMap::new(),
            ended: 0,
        }
    }

    async fn play(&mut self, cluster: &mut KarpenterCluster) -> Result<()> {
        println!("{:>8}  what happened", "time");
        self.wave(cluster, "wave-1").await?;
        let first = self.launched.clone();
        self.end_wave(cluster, "wave-1").await?;
        self.tell(&format!(
            "Karpenter would remove the {} empty nodes now (their consolidateAfter has run out)",
            first.len()
        ));
        self.karpenter_looks(cluster).await?;
        self.wave(cluster, "wave-2").await?;
        let reused = self.launched == first;
        self.tell(&if reused {
            "wave-2 runs on the held nodes: Karpenter launched no node for it".to_string()
        } else {
            format!(
                "wave-2 needed new nodes: {:?}",
                self.launched.difference(&first)
            )
        });
        self.end_wave(cluster, "wave-2").await?;
        self.follow(cluster, "Karpenter consolidates after the window", |s| {
            s.released && s.gone.is_superset(&s.launched)
        })
        .await
    }

    /// Creates the wave's pods and follows until every one runs.
    async fn wave(&mut self, cluster: &mut KarpenterCluster, wave: &str) -> Result<()> {
        for n in 0..self.per_wave {
            self.pods
                .create(
                    &PostParams::default(),
                    &testenv::filler_pod(&format!("{wave}-{n}")),
                )
                .await?;
        }
        self.tell(&format!(
            "{wave}: {} pods arrive; each needs a node of its own",
            self.per_wave
        ));
        self.follow(cluster, "the wave's pods running", |s| {
            s.running.contains(wave)
        })
        .await
    }

    /// Deletes the wave's pods (the batch is done) and follows until its
    /// nodes are empty and Karpenter would remove them, were they not held.
    async fn end_wave(&mut self, cluster: &mut KarpenterCluster, wave: &str) -> Result<()> {
        for n in 0..self.per_wave {
            let name = format!("{wave}-{n}");
            self.pods.delete(&name, &DeleteParams::default()).await?;
        }
        self.tell(&format!(
            "{wave} is done: its pods are gone, the nodes are empty"
        ));
        self.running.remove(wave);
        self.follow(cluster, "Karpenter's consolidateAfter run out", |s| {
            s.released || s.consolidatable >= s.launched.len().saturating_sub(s.gone.len())
        })
        .await
    }

    /// Follows until Karpenter's disruption loop has looked at the empty
    /// nodes once more, and tells how many it found it may remove.
    async fn karpenter_looks(&mut self, cluster: &mut KarpenterCluster) -> Result<()> {
        let before = cluster.disruption_passes("empty").await?;
        let deadline = Instant::now() + KARPENTER_ROUNDS;
        while cluster.disruption_passes("empty").await? <= before {
            self.look().await?;
            cluster.check_running()?;
            if Instant::now() > deadline {
                bail!("Karpenter's disruption loop did not run within {KARPENTER_ROUNDS:?}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let eligible = cluster.eligible_nodes("empty").await?;
        let empty = self.launched.len().saturating_sub(self.gone.len());
        self.tell(&format!(
            "Karpenter looked: {eligible} of {empty} empty nodes may go; \
             the others carry karpenter.sh/do-not-disrupt"
        ));
        Ok(())
    }

    /// Looks every 250 ms, telling what changed, until `done`.
    async fn follow(
        &mut self,
        cluster: &mut KarpenterCluster,
        what: &str,
        done: impl Fn(&Story) -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + KARPENTER_ROUNDS * 2;
        loop {
            self.look().await?;
            if done(self) {
                return Ok(());
            }
            cluster.check_running()?;
            if Instant::now() > deadline {
                bail!("{what}: not within {:?}", KARPENTER_ROUNDS * 2);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// One look at the cluster: new and gone nodes, the window, and what
    /// Karpenter said about the nodes.
    async fn look(&mut self) -> Result<()> {
        self.look_at_pods().await?;
        self.look_at_nodes().await?;
        self.look_at_claims().await?;
        self.look_at_window().await?;
        self.look_at_runs().await?;
        self.look_at_events().await
    }

    /// Tells when every pod of a wave runs.
    async fn look_at_pods(&mut self) -> Result<()> {
        let mut running: BTreeMap<String, usize> = BTreeMap::new();
        for pod in self.pods.list(&ListParams::default()).await?.items {
            let phase = pod.status.and_then(|s| s.phase);
            if let (Some(name), Some("Running")) = (pod.metadata.name, phase.as_deref())
                && let Some((wave, _)) = name.rsplit_once('-')
            {
                *running.entry(wave.to_string()).or_default() += 1;
            }
        }
        for (wave, count) in running {
            if count >= self.per_wave && self.running.insert(wave.clone()) {
                self.tell(&format!("{wave}: {count}/{} pods running", self.per_wave));
            }
        }
        Ok(())
    }

    /// Counts the NodeClaims Karpenter calls `Consolidatable`.
    async fn look_at_claims(&mut self) -> Result<()> {
        self.consolidatable = self
            .claims
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|c| {
                c.data["status"]["conditions"].as_array().is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "Consolidatable" && c["status"] == "True")
                })
            })
            .count();
        Ok(())
    }

    async fn look_at_nodes(&mut self) -> Result<()> {
        let nodes = self
            .nodes
            .list_metadata(&ListParams::default().labels("karpenter.sh/nodepool"))
            .await?;
        let mut now = BTreeSet::new();
        for node in nodes.items {
            let Some(name) = node.metadata.name else {
                continue;
            };
            if self.launched.insert(name.clone()) {
                let held = node
                    .metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key(HELD_LABEL));
                self.tell(&format!(
                    "Karpenter launched node {name}{}",
                    if held {
                        ", held by node-holder from its creation"
                    } else {
                        ""
                    }
                ));
            }
            now.insert(name);
        }
        let gone: Vec<String> = self.launched.difference(&now).cloned().collect();
        for name in gone {
            if self.gone.insert(name.clone()) {
                self.tell(&format!("node {name} is gone"));
            }
        }
        Ok(())
    }

    async fn look_at_window(&mut self) -> Result<()> {
        let deadline = match self.record.get_opt(RECORD).await? {
            Some(config_map) => {
                let window: serde_json::Value = config_map
                    .data
                    .and_then(|d| d.get("window.json").cloned())
                    .map(|text| serde_json::from_str(&text))
                    .transpose()?
                    .unwrap_or_default();
                window["open"]["deadline"].as_str().map(str::to_string)
            }
            None => None,
        };
        if deadline == self.deadline {
            return Ok(());
        }
        match (&self.deadline, &deadline) {
            (None, Some(d)) => self.tell(&format!(
                "node-holder's hold window opened: every node is held until {}",
                self.clock(d)
            )),
            (Some(_), Some(d)) => self.tell(&format!("window extended to {}", self.clock(d))),
            (Some(_), None) => {
                self.released = true;
                self.tell("window closed: node-holder strips its holds");
            }
            (None, None) => {}
        }
        self.deadline = deadline;
        Ok(())
    }

    /// Karpenter's DisruptionBlocked and DisruptionTerminating Events on
    /// nodes, and node-holder's of the schedule hold, each told once.
    async fn look_at_events(&mut self) -> Result<()> {
        let mut events = self.events.list(&ListParams::default()).await?.items;
        events.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
        let mut said = BTreeMap::new();
        for event in events {
            let (Some(name), Some(reason)) = (event.metadata.name.clone(), event.reason.clone())
            else {
                continue;
            };
            if event.involved_object.kind.as_deref() != Some("Node") || self.told.contains(&name) {
                continue;
            }
            let who = match reason.as_str() {
                "DisruptionBlocked" | "DisruptionTerminating" => "Karpenter",
                "HeldForScheduledRun" => "node-holder",
                "ScheduledHoldEnded" => {
                    self.ended += 1;
                    "node-holder"
                }
                _ => continue,
            };
            let node = event.involved_object.name.unwrap_or_default();
            said.insert(
                name,
                format!("{who} on {node}: {}", event.message.unwrap_or_default()),
            );
        }
        for (name, line) in said {
            self.told.insert(name);
            self.tell(&line);
        }
        Ok(())
    }

    fn tell(&self, what: &str) {
        println!(
            "{:>8}  {what}",
            format!("+{:.1}s", self.t0.elapsed().as_secs_f64())
        );
    }

    /// An RFC 3339 time as seconds since the story began (`+62.0s`).
    fn clock(&self, rfc3339: &str) -> String {
        use k8s_openapi::jiff::Timestamp;
        match rfc3339.parse::<Timestamp>() {
            Ok(at) => {
                let ahead = at.duration_since(Timestamp::now()).as_secs_f64();
                format!("+{:.1}s", self.t0.elapsed().as_secs_f64() + ahead)
            }
            Err(_) => rfc3339.to_string(),
        }
    }
}

fn say(text: &str) {
    println!("demo: {text}");
}

fn build_node_holder() -> Result<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the workspace root")?
        .to_path_buf();
    // Without the variables Cargo set for this process: under `cargo test` (the demo's own
    // test) they made ring's build script rerun, and every crate after it rebuild, twice a
    // suite run (here, then at the doc tests).
    let status = xtask::cargo()
        .args([
            "build",
            "--quiet",
            "--locked",
            "-p",
            "node-holder",
            "--bin",
            "node-holder",
        ])
        .current_dir(&root)
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("building node-holder failed: {status}");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    Ok(target.join("debug").join("node-holder"))
}

async fn wait_ready(serve: &mut ManagedChild, admin_port: u16) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        serve.check_running()?;
        if let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", admin_port)).await {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            stream.write_all(b"GET /readyz HTTP/1.0\r\n\r\n").await.ok();
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await.ok();
            if answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200") {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("node-holder never turned ready:\n{}", serve.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
