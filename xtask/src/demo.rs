//! `cargo xtask demo`: node-holder's whole job on a real control plane, live.
//!
//! It starts etcd and kube-apiserver on loopback, runs `node-holder serve`
//! with development certificates, the url-based webhook registration of
//! `webhook-config/webhook-local.yaml` and the RBAC of
//! `webhook-config/rbac.yaml`, then creates nodes the way a Karpenter
//! scale-up does: a burst, a pause, another burst, and after the release one
//! more node in a quiet cluster. A line is printed whenever the window or the
//! holds change. Every process it started stops with it, Ctrl-C included.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use testenv::{ControlPlane, ManagedChild};

/// How the demo runs.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// node-holder's --hold-duration: how long each new node holds the cluster.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub hold_duration: Duration,

    /// The pause between the two bursts of the scale-up.
    #[arg(long, default_value = "8s", value_parser = humantime::parse_duration)]
    pub pause: Duration,

    /// A short run (4s holds, 2s pause) that exits when done: what the test runs.
    #[arg(long)]
    pub quick: bool,
}

const HELD_LABEL: &str = "node-holder.dev/held";
const RECORD: &str = "node-holder-window";

pub async fn run(args: DemoArgs) -> Result<()> {
    let (hold, pause) = if args.quick {
        (Duration::from_secs(4), Duration::from_secs(2))
    } else {
        (args.hold_duration, args.pause)
    };
    tokio::select! {
        result = demo(hold, pause) => result,
        _ = tokio::signal::ctrl_c() => {
            println!("\ndemo: interrupted; stopping node-holder, kube-apiserver and etcd");
            Ok(())
        }
    }
}

async fn demo(hold: Duration, pause: Duration) -> Result<()> {
    let started = Instant::now();
    say("starting etcd and kube-apiserver on loopback (the first run builds them)…");
    let cp = ControlPlane::start().await?;
    say(&format!(
        "control plane ready in {:.1?} at {}",
        started.elapsed(),
        cp.url()
    ));
    say("building node-holder…");
    let binary = build_node_holder()?;

    let certs = cp.dir().join("certs");
    let status = Command::new(&binary)
        .args(["certs", "--out-dir"])
        .arg(&certs)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .context("running node-holder certs")?;
    if !status.success() {
        bail!("node-holder certs failed: {status}");
    }
    cp.install_node_holder_rbac().await?;
    let webhook_port = free_port()?;
    let admin_port = free_port()?;
    let log = cp.dir().join("node-holder.log");
    let mut serve = Command::new(&binary);
    serve
        .args(["serve", "--log-format=text", "--identity=demo"])
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
        .args([
            "--coalesce-idle=300ms",
            "--coalesce-max=2s",
            "--shutdown-grace=0s",
        ])
        .env("KUBECONFIG", cp.node_holder_kubeconfig());
    let mut serve = ManagedChild::spawn_command("node-holder", serve, &log)?;
    wait_ready(&mut serve, admin_port).await?;
    say(&format!(
        "node-holder serve is running as its own least-privilege identity (hold {}, cluster scope); its log: {}",
        humantime::format_duration(hold),
        log.display()
    ));

    let client = cp.admin_client().await?;
    let ca = std::fs::read(certs.join("ca.crt")).context("reading the development CA")?;
    let configs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    configs
        .create(
            &PostParams::default(),
            &testenv::local_webhook_configuration(webhook_port, &ca)?,
        )
        .await
        .context("registering the webhook")?;
    say(
        "webhook registered from webhook-config/webhook-local.yaml; the API server now calls node-holder on every Node CREATE",
    );
    say(&format!(
        "watch along: kubectl --kubeconfig {} get nodes -L {HELD_LABEL} -w",
        cp.admin_kubeconfig().display()
    ));
    println!();
    println!(
        "{:>8}  {:<58} {:<16} held",
        "time", "what happened", "window"
    );

    let mut monitor = Monitor::new(client.clone());
    let nodes: Api<Node> = Api::all(client);
    let t0 = Instant::now();
    let mut scenario = Scenario { nodes: &nodes, t0 };
    scenario
        .burst(
            "burst 1: Karpenter scales up",
            &["wave-1-a", "wave-1-b", "wave-1-c"],
        )
        .await?;
    monitor.follow_for(t0, pause).await?;
    scenario
        .burst(
            "burst 2: more pending pods, more nodes",
            &["wave-2-a", "wave-2-b"],
        )
        .await?;
    monitor.follow_until_closed(t0, hold * 3).await?;
    monitor.follow_for(t0, Duration::from_secs(2)).await?;
    scenario
        .burst("one more node joins the quiet cluster", &["late-1"])
        .await?;
    monitor.follow_until_closed(t0, hold * 3).await?;
    println!();
    let held = monitor.state().await?.held;
    if held != 0 {
        bail!(
            "{held} node(s) still held after the window closed; see {}",
            log.display()
        );
    }
    say(&format!(
        "done in {:.0?}: every node was held from the instant it existed, the cluster stayed held while nodes kept coming, and node-holder released every hold it placed",
        started.elapsed()
    ));
    serve.check_running()?;
    Ok(())
}

fn say(text: &str) {
    println!("demo: {text}");
}

fn stamp(t0: Instant) -> String {
    format!("+{:.1}s", t0.elapsed().as_secs_f64())
}

/// The target directory's node-holder, built now.
fn build_node_holder() -> Result<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the workspace root")?
        .to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
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
        .with_context(|| format!("running {cargo} build"))?;
    if !status.success() {
        bail!("building node-holder failed: {status}");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    Ok(target.join("debug").join("node-holder"))
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
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

struct Scenario<'a> {
    nodes: &'a Api<Node>,
    t0: Instant,
}

impl Scenario<'_> {
    async fn burst(&mut self, what: &str, names: &[&str]) -> Result<()> {
        let mut labels = BTreeMap::new();
        labels.insert("karpenter.sh/nodepool".to_string(), "default".to_string());
        for name in names {
            let node = Node {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    labels: Some(labels.clone()),
                    ..ObjectMeta::default()
                },
                ..Node::default()
            };
            let created = self
                .nodes
                .create(&PostParams::default(), &node)
                .await
                .with_context(|| format!("creating node {name}"))?;
            let held_at_birth = created
                .metadata
                .labels
                .is_some_and(|l| l.contains_key(HELD_LABEL));
            if !held_at_birth {
                bail!("node {name} was created without the hold: the webhook was not called");
            }
        }
        println!(
            "{:>8}  {:<58}",
            stamp(self.t0),
            format!("{what}: {} (held at creation)", names.join(", "))
        );
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq)]
struct State {
    deadline: Option<String>,
    held: usize,
    total: usize,
}

/// Prints a line whenever the window or the held count changes.
struct Monitor {
    nodes: Api<Node>,
    record: Api<ConfigMap>,
    last: Option<State>,
}

impl Monitor {
    fn new(client: kube::Client) -> Self {
        Monitor {
            nodes: Api::all(client.clone()),
            record: Api::namespaced(client, testenv::NODE_HOLDER_NAMESPACE),
            last: None,
        }
    }

    async fn state(&self) -> Result<State> {
        let nodes = self.nodes.list_metadata(&ListParams::default()).await?;
        let held = nodes
            .items
            .iter()
            .filter(|n| {
                n.metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key(HELD_LABEL))
            })
            .count();
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
        Ok(State {
            deadline,
            held,
            total: nodes.items.len(),
        })
    }

    /// Prints what changed since the last look.
    async fn look(&mut self, t0: Instant) -> Result<State> {
        let state = self.state().await?;
        if self.last.as_ref() != Some(&state) {
            let (last_deadline, last_held) = self
                .last
                .as_ref()
                .map_or((None, 0), |l| (l.deadline.as_deref(), l.held));
            let what = match (last_deadline, state.deadline.as_deref()) {
                (None, Some(_)) => "hold window opened: every node in scope is held",
                (Some(a), Some(b)) if a != b => "window extended to the newest node + hold",
                (Some(_), None) => "window closed: node-holder strips its holds",
                (_, Some(_)) => "holding",
                (_, None) if state.held == 0 => "every hold node-holder placed is gone",
                (_, None) if state.held > last_held => "the webhook held the new nodes",
                (_, None) => "releasing",
            };
            let window = match &state.deadline {
                Some(deadline) => format!("until {}", until(t0, deadline)),
                None => "closed".to_string(),
            };
            println!(
                "{:>8}  {:<58} {:<16} {}/{}",
                stamp(t0),
                what,
                window,
                state.held,
                state.total
            );
            self.last = Some(state.clone());
        }
        Ok(state)
    }

    async fn follow_for(&mut self, t0: Instant, span: Duration) -> Result<()> {
        let end = Instant::now() + span;
        while Instant::now() < end {
            self.look(t0).await?;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Ok(())
    }

    /// Follows until the window has opened and closed again with nothing held.
    async fn follow_until_closed(&mut self, t0: Instant, limit: Duration) -> Result<()> {
        let end = Instant::now() + limit;
        let mut seen_open = false;
        loop {
            let state = self.look(t0).await?;
            seen_open |= state.deadline.is_some();
            if seen_open && state.deadline.is_none() && state.held == 0 {
                return Ok(());
            }
            if Instant::now() > end {
                bail!("the window did not close within {limit:?}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// An RFC 3339 time as seconds since the demo's start (`+12.0s`).
fn until(t0: Instant, rfc3339: &str) -> String {
    use k8s_openapi::jiff::Timestamp;
    match rfc3339.parse::<Timestamp>() {
        Ok(at) => {
            let ahead = at.duration_since(Timestamp::now()).as_secs_f64();
            format!("+{:.1}s", t0.elapsed().as_secs_f64() + ahead)
        }
        Err(_) => rfc3339.to_string(),
    }
}
