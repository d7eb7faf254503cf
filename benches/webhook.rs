//! Performance of the admission webhook: `cargo bench --bench webhook`.
//!
//! Starts the real `node-holder serve` binary pinned to one core (core 0) with
//! development certificates, and drives it from a load generator pinned to the
//! other core (core 1): one current-thread tokio runtime with hyper HTTP/1.1
//! client connections over rustls that trust the development CA, every request
//! a ~5 KB Node CREATE AdmissionReview. Measures:
//!
//! 1. keep-alive throughput and latency (1, 8 and 32 connections; the
//!    headline is 8), and once more at the production log level (info, JSON
//!    lines, standard error to /dev/null);
//! 2. the handler's CPU per review in-process (`decide` + `review_body`);
//! 3. new TLS connections per second (full handshakes, ECDSA P-256);
//! 4. the server's resident memory idle after start-up and after the load.
//!
//! Loopback only; bounded in time (about 40 seconds) and in request count.
//! `serve` needs a Kubernetes client configuration but no API server to
//! answer the webhook: the kubeconfig points at 127.0.0.1:1 (nothing listens
//! there; readiness stays false, which the webhook port does not care about).

use std::fmt::Write as _;
use std::io::Read as _;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use base64::Engine as _;
use clap::Parser as _;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, StatusCode, header};
use hyper_util::rt::TokioIo;
use node_holder::cli::{Cli, Command as Subcommand};
use node_holder::core::admission::{AdmissionPolicy, decide, review_body};
use rustls::pki_types::ServerName;
use rustls::pki_types::pem::PemObject as _;
use rustls::{ClientConfig, RootCertStore};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// The server's core and the load generator's.
const SERVER_CORE: usize = 0;
const CLIENT_CORE: usize = 1;

/// Keep-alive runs: connections, each run this long after a warm-up.
const KEEP_ALIVE_CONNECTIONS: [usize; 3] = [1, 8, 32];
const HEADLINE_CONNECTIONS: usize = 8;
const WARM_UP: Duration = Duration::from_millis(500);
const KEEP_ALIVE_RUN: Duration = Duration::from_secs(4);
/// Upper bound of requests of one run, whatever the speed.
const MAX_REQUESTS_PER_RUN: usize = 2_000_000;

/// New-connection run: concurrent connecting tasks, and for how long.
const HANDSHAKE_TASKS: usize = 8;
const HANDSHAKE_RUN: Duration = Duration::from_secs(3);
const MAX_HANDSHAKES: usize = 100_000;

/// In-process handler timing: batches of this many reviews, for this long.
const HANDLER_BATCH: usize = 1_000;
const HANDLER_RUN: Duration = Duration::from_secs(2);

/// Any single request or connection taking longer than this is a failure.
const OP_TIMEOUT: Duration = Duration::from_secs(5);

/// The request path the API server calls (it appends the webhook's timeout).
const MUTATE_PATH: &str = "/mutate?timeout=5s";

/// Targets from the issue.
const TARGET_RPS: f64 = 10_000.0;
const TARGET_P99_MS: f64 = 2.0;
const TARGET_HANDLER_US: f64 = 25.0;
const TARGET_HANDSHAKES: f64 = 2_000.0;
const TARGET_IDLE_RSS_MB: f64 = 20.0;

const REVIEW_UID: &str = "5f0c3c1e-9a1b-4d6e-8f3a-2b7c9d4e6a10";

fn main() -> Result<()> {
    // `cargo bench` passes `--bench`; there are no options to read.
    pin_current_thread(CLIENT_CORE);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run())
}

async fn run() -> Result<()> {
    let machine = Machine::read();
    println!("node-holder webhook benchmark");
    println!(
        "machine: {} cores ({}), load average at start {}",
        machine.cores, machine.cpu_model, machine.loadavg
    );
    ensure!(
        machine.cores >= 2,
        "this benchmark needs 2 cores: one for the server, one for the load generator"
    );

    let body = Bytes::from(serde_json::to_vec(&node_create_review())?);
    println!(
        "request: POST {MUTATE_PATH}, a Node CREATE AdmissionReview of {} bytes",
        body.len()
    );

    let dir = tempfile::tempdir()?;
    write_certs(dir.path())?;
    let kubeconfig = write_kubeconfig(dir.path())?;
    let tls = TlsConnector::from(client_config(
        &std::fs::read(dir.path().join("ca.crt"))?,
        true,
    )?);
    let tls_fresh = TlsConnector::from(client_config(
        &std::fs::read(dir.path().join("ca.crt"))?,
        false,
    )?);

    // 2. Handler CPU, in-process on the load generator's core, before any server runs.
    println!("\n== handler CPU per review (in-process, core {CLIENT_CORE}) ==");
    let handler = handler_cpu(&body)?;
    println!(
        "decide + review_body: mean {:.1} µs/review over {} reviews (best batch of {HANDLER_BATCH}: {:.1} µs); \
         decide alone: mean {:.1} µs; response {} bytes",
        handler.mean_us,
        handler.reviews,
        handler.best_batch_us,
        handler.decide_us,
        handler.response_bytes
    );

    // 1, 3, 4. The server at warn level: no per-request log line.
    println!("\n== `node-holder serve --log-level warn` on core {SERVER_CORE} ==");
    let server = Server::start(dir.path(), &kubeconfig, &["--log-level", "warn"], true).await?;
    println!("{}", server.describe());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = server.memory()?;
    println!("idle after start-up: {idle}");
    check_once(&tls, server.webhook, &body).await?;
    println!(
        "first response checked in full: 200, allowed, JSONPatch adding karpenter.sh/do-not-disrupt"
    );

    let mut keep_alive = Vec::new();
    for connections in KEEP_ALIVE_CONNECTIONS {
        let result = keep_alive_load(&server, &tls, &body, connections).await?;
        println!("{}", result.describe());
        keep_alive.push(result);
    }

    println!("\n== new TLS connections (full handshake + one request + close) ==");
    let handshakes = handshake_load(&server, &tls_fresh, &body).await?;
    println!("{}", handshakes.describe());

    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = server.memory()?;
    println!("\nidle after the load: {after}");
    let warn_log_lines = server.log_lines();
    println!("server log lines at warn level: {warn_log_lines}");
    drop(server);

    // The production configuration: info level, JSON lines, one audit line per review.
    println!(
        "\n== `node-holder serve --log-format json` (info level, standard error to /dev/null) on core {SERVER_CORE} =="
    );
    let server = Server::start(dir.path(), &kubeconfig, &["--log-format", "json"], false).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_info = server.memory()?;
    println!("idle after start-up: {idle_info}");
    check_once(&tls, server.webhook, &body).await?;
    let info = keep_alive_load(&server, &tls, &body, HEADLINE_CONNECTIONS).await?;
    println!("{}", info.describe());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after_info = server.memory()?;
    println!("idle after the load: {after_info}");
    drop(server);

    let headline = keep_alive
        .iter()
        .find(|r| r.connections == HEADLINE_CONNECTIONS)
        .context("headline run")?;
    let summary = Summary {
        machine,
        body_bytes: body.len(),
        headline,
        info: &info,
        handler: &handler,
        handshakes: &handshakes,
        idle,
        after,
        idle_info,
        after_info,
    };
    println!("\n{}", summary.render());
    println!("load average at the end: {}", Machine::read().loadavg);

    let failures =
        keep_alive.iter().map(|r| r.failures).sum::<usize>() + info.failures + handshakes.failures;
    ensure!(
        failures == 0,
        "{failures} requests failed (not 200 or no patch); see above"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// The request.

/// A Node CREATE as the API server sends it when a kubelet registers a
/// Karpenter-launched EC2 node: labels, annotations, the startup taint,
/// managedFields, and the status the kubelet registers with.
fn node_create_review() -> Value {
    let name = "ip-10-24-139-214.eu-west-1.compute.internal";
    let now = "2026-05-04T09:41:27Z";
    let user = format!("system:node:{name}");
    let condition = |kind: &str, status: &str, reason: &str, message: &str| {
        json!({
            "type": kind, "status": status,
            "lastHeartbeatTime": now, "lastTransitionTime": now,
            "reason": reason, "message": message,
        })
    };
    let node = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": "0b6e3f2c-7d41-4a8e-9c55-3e1f2a9b8c70",
            "creationTimestamp": now,
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/instance-type": "m6i.2xlarge",
                "beta.kubernetes.io/os": "linux",
                "failure-domain.beta.kubernetes.io/region": "eu-west-1",
                "failure-domain.beta.kubernetes.io/zone": "eu-west-1b",
                "k8s.io/cloud-provider-aws": "8a3f6c1d2e4b5a69788796a5b4c3d2e1",
                "karpenter.k8s.aws/ec2nodeclass": "default",
                "karpenter.k8s.aws/instance-category": "m",
                "karpenter.k8s.aws/instance-cpu": "8",
                "karpenter.k8s.aws/instance-cpu-manufacturer": "intel",
                "karpenter.k8s.aws/instance-family": "m6i",
                "karpenter.k8s.aws/instance-generation": "6",
                "karpenter.k8s.aws/instance-hypervisor": "nitro",
                "karpenter.k8s.aws/instance-memory": "32768",
                "karpenter.k8s.aws/instance-network-bandwidth": "3125",
                "karpenter.k8s.aws/instance-size": "2xlarge",
                "karpenter.sh/capacity-type": "spot",
                "karpenter.sh/nodepool": "batch",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": "m6i.2xlarge",
                "topology.k8s.aws/zone-id": "euw1-az1",
                "topology.kubernetes.io/region": "eu-west-1",
                "topology.kubernetes.io/zone": "eu-west-1b",
                "workload.example.com/pool": "batch-waves",
            },
            "annotations": {
                "alpha.kubernetes.io/provided-node-ip": "10.24.139.214",
                "karpenter.k8s.aws/ec2nodeclass-hash": "15616957348189460630",
                "karpenter.k8s.aws/ec2nodeclass-hash-version": "v4",
                "karpenter.sh/nodepool-hash": "6821555240594823858",
                "karpenter.sh/nodepool-hash-version": "v3",
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
            "managedFields": [{
                "manager": "kubelet",
                "operation": "Update",
                "apiVersion": "v1",
                "time": now,
                "fieldsType": "FieldsV1",
                "fieldsV1": {
                    "f:metadata": {
                        "f:annotations": {
                            ".": {},
                            "f:alpha.kubernetes.io/provided-node-ip": {},
                            "f:node.alpha.kubernetes.io/ttl": {},
                            "f:volumes.kubernetes.io/controller-managed-attach-detach": {},
                        },
                        "f:labels": {
                            ".": {},
                            "f:beta.kubernetes.io/arch": {},
                            "f:beta.kubernetes.io/os": {},
                            "f:karpenter.sh/capacity-type": {},
                            "f:karpenter.sh/nodepool": {},
                            "f:kubernetes.io/arch": {},
                            "f:kubernetes.io/hostname": {},
                            "f:kubernetes.io/os": {},
                        },
                    },
                    "f:spec": {"f:providerID": {}, "f:taints": {}},
                    "f:status": {
                        "f:addresses": {},
                        "f:allocatable": {},
                        "f:capacity": {},
                        "f:conditions": {},
                        "f:daemonEndpoints": {"f:kubeletEndpoint": {"f:Port": {}}},
                        "f:nodeInfo": {},
                    },
                },
            }],
        },
        "spec": {
            "providerID": "aws:///eu-west-1b/i-0a1b2c3d4e5f60718",
            "taints": [
                {"key": "karpenter.sh/unregistered", "effect": "NoExecute"},
                {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
            ],
        },
        "status": {
            "capacity": {
                "cpu": "8", "ephemeral-storage": "104779756Ki", "hugepages-1Gi": "0",
                "hugepages-2Mi": "0", "memory": "32386520Ki", "pods": "58",
            },
            "allocatable": {
                "cpu": "7910m", "ephemeral-storage": "95491281146", "hugepages-1Gi": "0",
                "hugepages-2Mi": "0", "memory": "31369688Ki", "pods": "58",
            },
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                condition("Ready", "False", "KubeletNotReady", "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": "10.24.139.214"},
                {"type": "InternalDNS", "address": name},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": "ec2b1f3e8d2a4c6b9e0f1a2b3c4d5e6f",
                "systemUUID": "ec2b1f3e-8d2a-4c6b-9e0f-1a2b3c4d5e6f",
                "bootID": "3c9d2e1f-4a5b-6c7d-8e9f-0a1b2c3d4e5f",
                "kernelVersion": "6.12.21-28.71.amzn2023.x86_64",
                "osImage": "Amazon Linux 2023.7.20260428",
                "containerRuntimeVersion": "containerd://2.1.1",
                "kubeletVersion": "v1.37.1-eks-3025e55",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": [
                {"names": ["602401143452.dkr.ecr.eu-west-1.amazonaws.com/amazon-k8s-cni@sha256:8b0f1d3c2a4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d2e3f4a5b6c7d8e9f0a1", "602401143452.dkr.ecr.eu-west-1.amazonaws.com/amazon-k8s-cni:v1.19.5-eksbuild.3"], "sizeBytes": 47_683_210},
                {"names": ["602401143452.dkr.ecr.eu-west-1.amazonaws.com/eks/kube-proxy@sha256:1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3", "602401143452.dkr.ecr.eu-west-1.amazonaws.com/eks/kube-proxy:v1.37.1-minimal-eksbuild.2"], "sizeBytes": 30_412_806},
                {"names": ["602401143452.dkr.ecr.eu-west-1.amazonaws.com/eks/pause@sha256:529cf6b1b6e5b76e901abc43aee825badbd93f9c5ee5f1e316d46a83abbce5a2", "602401143452.dkr.ecr.eu-west-1.amazonaws.com/eks/pause:3.10"], "sizeBytes": 299_513},
            ],
        },
    });
    let group_version_kind = json!({"group": "", "version": "v1", "kind": "Node"});
    let group_version_resource = json!({"group": "", "version": "v1", "resource": "nodes"});
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": REVIEW_UID,
            "kind": group_version_kind,
            "resource": group_version_resource,
            "requestKind": group_version_kind,
            "requestResource": group_version_resource,
            "name": name,
            "operation": "CREATE",
            "userInfo": {
                "username": user,
                "uid": "aws-iam-authenticator:111122223333:AROAEXAMPLEKARPENTERNODE",
                "groups": ["system:nodes", "system:authenticated"],
                "extra": {
                    "accessKeyId": ["ASIAEXAMPLEKEYID0001"],
                    "arn": ["arn:aws:sts::111122223333:assumed-role/KarpenterNodeRole-prod/i-0a1b2c3d4e5f60718"],
                    "canonicalArn": ["arn:aws:iam::111122223333:role/KarpenterNodeRole-prod"],
                    "principalId": ["AROAEXAMPLEKARPENTERNODE"],
                    "sessionName": ["i-0a1b2c3d4e5f60718"],
                },
            },
            "object": node,
            "oldObject": null,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "kubelet"},
        },
    })
}

// ---------------------------------------------------------------------------
// 2. Handler CPU in-process.

struct HandlerCpu {
    reviews: usize,
    mean_us: f64,
    best_batch_us: f64,
    decide_us: f64,
    response_bytes: usize,
}

/// The policy `serve` builds from its default flags.
fn default_policy() -> Result<AdmissionPolicy> {
    match Cli::try_parse_from(["node-holder", "serve"])?.command {
        Subcommand::Serve(args) => node_holder::serve::policy(&args.policy),
        _ => bail!("`node-holder serve` did not parse as serve"),
    }
}

fn handler_cpu(body: &[u8]) -> Result<HandlerCpu> {
    let policy = default_policy()?;
    let review = |body: &[u8]| -> Result<Vec<u8>> {
        let decision = decide(body, &policy).map_err(|e| anyhow!("{e}"))?;
        Ok(review_body(decision.response)?)
    };
    let response = review(body)?;
    check_response(&response)?;
    for _ in 0..HANDLER_BATCH {
        std::hint::black_box(review(std::hint::black_box(body))?);
    }

    let (mut reviews, mut best) = (0usize, Duration::MAX);
    let started = Instant::now();
    while started.elapsed() < HANDLER_RUN {
        let batch = Instant::now();
        for _ in 0..HANDLER_BATCH {
            std::hint::black_box(review(std::hint::black_box(body))?);
        }
        best = best.min(batch.elapsed());
        reviews += HANDLER_BATCH;
    }
    let total = started.elapsed();

    let (mut decided, decide_started) = (0usize, Instant::now());
    while decide_started.elapsed() < HANDLER_RUN / 2 {
        for _ in 0..HANDLER_BATCH {
            let decision =
                decide(std::hint::black_box(body), &policy).map_err(|e| anyhow!("{e}"))?;
            std::hint::black_box(decision);
        }
        decided += HANDLER_BATCH;
    }
    let decide_total = decide_started.elapsed();

    Ok(HandlerCpu {
        reviews,
        mean_us: micros(total) / reviews as f64,
        best_batch_us: micros(best) / HANDLER_BATCH as f64,
        decide_us: micros(decide_total) / decided as f64,
        response_bytes: response.len(),
    })
}

// ---------------------------------------------------------------------------
// The server process.

/// A `node-holder serve` process pinned to [`SERVER_CORE`]; killed on drop,
/// and by the kernel if this process dies first.
struct Server {
    child: Child,
    webhook: SocketAddr,
    args: Vec<String>,
    log: Option<PathBuf>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    async fn start(
        dir: &Path,
        kubeconfig: &Path,
        extra: &[&str],
        log_to_file: bool,
    ) -> Result<Server> {
        let webhook: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let mut args = vec![
            "serve".to_string(),
            format!("--webhook-addr={webhook}"),
            format!("--admin-addr={admin}"),
            format!("--tls-cert-file={}", dir.join("tls.crt").display()),
            format!("--tls-key-file={}", dir.join("tls.key").display()),
        ];
        args.extend(extra.iter().map(ToString::to_string));
        let (log, stderr) = if log_to_file {
            let path = dir.join(format!("serve-{}.log", webhook.port()));
            let file = std::fs::File::create(&path)?;
            (Some(path), Stdio::from(file))
        } else {
            (None, Stdio::null())
        };
        let mut command = Command::new(node_holder_binary());
        command
            .args(&args)
            .env("KUBECONFIG", kubeconfig)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let cpus = cpu_set(SERVER_CORE);
        // SAFETY: between fork and exec only two raw system calls run, both
        // async-signal-safe; `cpus` was built before the fork.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0
                    || libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &cpus)
                        != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().context("starting node-holder serve")?;
        let mut server = Server {
            child,
            webhook,
            args,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if TcpStream::connect(webhook).await.is_ok() {
                return Ok(server);
            }
            if let Some(status) = server.child.try_wait()? {
                bail!("node-holder serve exited: {status}; {}", server.log_tail());
            }
            ensure!(
                Instant::now() < deadline,
                "node-holder serve never listened on {webhook}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn describe(&self) -> String {
        let status = proc_status(self.pid()).unwrap_or_default();
        format!(
            "pid {}, cores allowed {}, threads {}: {} {}",
            self.pid(),
            status_field(&status, "Cpus_allowed_list").unwrap_or("?"),
            status_field(&status, "Threads").unwrap_or("?"),
            node_holder_binary().display(),
            self.args.join(" ")
        )
    }

    fn memory(&self) -> Result<Memory> {
        let status = proc_status(self.pid())?;
        let kb = |field| -> Result<u64> {
            status_field(&status, field)
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("{field} in /proc/{}/status", self.pid()))
        };
        Ok(Memory {
            rss_kb: kb("VmRSS")?,
            hwm_kb: kb("VmHWM")?,
        })
    }

    fn cpu(&self) -> Duration {
        process_cpu(&format!("/proc/{}/stat", self.pid())).unwrap_or_default()
    }

    fn log_lines(&self) -> String {
        match &self.log {
            Some(path) => std::fs::read_to_string(path)
                .map(|t| t.lines().count().to_string())
                .unwrap_or_else(|e| format!("unreadable: {e}")),
            None => "(standard error to /dev/null)".to_string(),
        }
    }

    fn log_tail(&self) -> String {
        self.log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .map(|t| t.lines().rev().take(20).collect::<Vec<_>>().join("\n"))
            .unwrap_or_default()
    }
}

/// The binary Cargo built for this bench (the bench profile's, i.e. release).
fn node_holder_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_node-holder"))
}

fn write_certs(dir: &Path) -> Result<()> {
    let out = Command::new(node_holder_binary())
        .args(["certs", "--out-dir"])
        .arg(dir)
        .output()?;
    ensure!(
        out.status.success(),
        "node-holder certs failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// A client configuration `kube::Config::infer()` accepts, for an API server
/// that is not there.
fn write_kubeconfig(dir: &Path) -> Result<PathBuf> {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1
kind: Config
clusters:
- name: absent
  cluster:
    server: https://127.0.0.1:1
    insecure-skip-tls-verify: true
users:
- name: bench
  user:
    token: not-a-real-token
contexts:
- name: bench
  context:
    cluster: absent
    user: bench
current-context: bench
",
    )?;
    Ok(path)
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

// ---------------------------------------------------------------------------
// The client.

/// rustls trusting only the development CA, offering HTTP/1.1, with the AES
/// suite order a Go client (the API server) uses on AES-capable CPUs.
/// `resumption: false` forces a full handshake on every connection.
fn client_config(ca_pem: &[u8], resumption: bool) -> Result<Arc<ClientConfig>> {
    let mut roots = RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert?)?;
    }
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites.sort_by_key(|suite| {
        use rustls::CipherSuite::*;
        match suite.suite() {
            TLS13_AES_128_GCM_SHA256 => 0,
            TLS13_AES_256_GCM_SHA384 => 1,
            TLS13_CHACHA20_POLY1305_SHA256 => 2,
            _ => 3,
        }
    });
    let mut config = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    if !resumption {
        config.resumption = rustls::client::Resumption::disabled();
    }
    Ok(Arc::new(config))
}

struct Connection {
    sender: SendRequest<Full<Bytes>>,
    driver: tokio::task::JoinHandle<()>,
    protocol: String,
}

async fn connect(addr: SocketAddr, tls: &TlsConnector) -> Result<Connection> {
    let tcp = TcpStream::connect(addr).await?;
    // Go's net package, the API server's, sets TCP_NODELAY on every connection.
    tcp.set_nodelay(true)?;
    let stream = tls.connect(ServerName::try_from("localhost")?, tcp).await?;
    let session = stream.get_ref().1;
    let protocol = format!(
        "{:?} {:?}",
        session.protocol_version().context("no TLS version")?,
        session
            .negotiated_cipher_suite()
            .context("no cipher suite")?
            .suite()
    );
    let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(Connection {
        sender,
        driver,
        protocol,
    })
}

/// One review on `connection`: the response body if 200 with a patch.
async fn review(connection: &mut Connection, body: &Bytes) -> Result<Bytes> {
    let request = Request::post(MUTATE_PATH)
        .header(header::HOST, "localhost")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, */*")
        .header(header::USER_AGENT, "kube-apiserver-admission")
        .body(Full::new(body.clone()))?;
    connection.sender.ready().await?;
    let response = connection.sender.send_request(request).await?;
    let status = response.status();
    let bytes = response.into_body().collect().await?.to_bytes();
    ensure!(
        status == StatusCode::OK,
        "status {status}: {}",
        String::from_utf8_lossy(&bytes)
    );
    check_patched(&bytes)?;
    Ok(bytes)
}

/// The cheap check every response gets: allowed, with a JSONPatch, for our uid.
fn check_patched(body: &[u8]) -> Result<()> {
    for needle in [
        &b"\"allowed\":true"[..],
        b"\"patchType\":\"JSONPatch\"",
        b"\"patch\":\"",
        REVIEW_UID.as_bytes(),
    ] {
        ensure!(
            body.windows(needle.len()).any(|w| w == needle),
            "response lacks {}: {}",
            String::from_utf8_lossy(needle),
            String::from_utf8_lossy(body)
        );
    }
    Ok(())
}

/// The full check, once: the patch adds the hold.
fn check_response(body: &[u8]) -> Result<()> {
    check_patched(body)?;
    let review: Value = serde_json::from_slice(body)?;
    let patch = review["response"]["patch"].as_str().context("no patch")?;
    let patch: Value =
        serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(patch)?)?;
    ensure!(
        patch.as_array().is_some_and(|ops| ops.iter().any(|op| {
            op["op"] == "add"
                && op["path"] == "/metadata/annotations/karpenter.sh~1do-not-disrupt"
                && op["value"] == "true"
        })),
        "the patch does not add karpenter.sh/do-not-disrupt: {patch}"
    );
    Ok(())
}

async fn check_once(tls: &TlsConnector, addr: SocketAddr, body: &Bytes) -> Result<()> {
    let mut connection = connect(addr, tls).await?;
    let response = review(&mut connection, body).await?;
    check_response(&response)
}

// ---------------------------------------------------------------------------
// 1. Keep-alive load.

struct KeepAlive {
    connections: usize,
    protocol: String,
    requests: usize,
    failures: usize,
    first_failure: Option<String>,
    elapsed: Duration,
    latencies_ns: Vec<u64>,
    server_cpu: Duration,
    client_cpu: Duration,
}

impl KeepAlive {
    fn rps(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    fn describe(&self) -> String {
        let mut text = format!(
            "keep-alive, {:>2} connection(s): {:>8.0} reviews/s ({} in {:.2} s, {} failed) \
             latency p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms; \
             server CPU {:.0}% of its core = {:.1} µs/review; load generator CPU {:.0}% [{}]",
            self.connections,
            self.rps(),
            self.requests,
            self.elapsed.as_secs_f64(),
            self.failures,
            percentile_ms(&self.latencies_ns, 0.50),
            percentile_ms(&self.latencies_ns, 0.99),
            percentile_ms(&self.latencies_ns, 0.999),
            percentile_ms(&self.latencies_ns, 1.0),
            100.0 * self.server_cpu.as_secs_f64() / self.elapsed.as_secs_f64(),
            micros(self.server_cpu) / self.requests.max(1) as f64,
            100.0 * self.client_cpu.as_secs_f64() / self.elapsed.as_secs_f64(),
            self.protocol,
        );
        if let Some(failure) = &self.first_failure {
            let _ = write!(text, "\n  first failure: {failure}");
        }
        text
    }
}

/// `connections` keep-alive connections, each sending the next review as soon
/// as the previous answer is in (closed loop), for [`KEEP_ALIVE_RUN`] after a
/// [`WARM_UP`]. Only requests sent inside the measured window count.
async fn keep_alive_load(
    server: &Server,
    tls: &TlsConnector,
    body: &Bytes,
    connections: usize,
) -> Result<KeepAlive> {
    let mut opened = Vec::new();
    for _ in 0..connections {
        opened.push(tokio::time::timeout(OP_TIMEOUT, connect(server.webhook, tls)).await??);
    }
    let protocol = opened[0].protocol.clone();
    let start = Instant::now() + WARM_UP;
    let end = start + KEEP_ALIVE_RUN;
    let per_connection = MAX_REQUESTS_PER_RUN / connections;
    let mut tasks = Vec::new();
    for mut connection in opened {
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(per_connection.min(200_000));
            let (mut failures, mut first_failure, mut last) = (0usize, None, start);
            loop {
                let sent = Instant::now();
                if sent >= end || latencies.len() + failures >= per_connection {
                    break;
                }
                let outcome =
                    tokio::time::timeout(OP_TIMEOUT, review(&mut connection, &body)).await;
                let done = Instant::now();
                if sent < start {
                    continue;
                }
                last = last.max(done);
                match outcome {
                    Ok(Ok(_)) => latencies.push((done - sent).as_nanos() as u64),
                    Ok(Err(err)) => {
                        failures += 1;
                        first_failure.get_or_insert(format!("{err:#}"));
                    }
                    Err(_) => {
                        failures += 1;
                        first_failure.get_or_insert("timed out".to_string());
                    }
                }
                if connection.sender.is_closed() {
                    first_failure.get_or_insert("connection closed".to_string());
                    break;
                }
            }
            drop(connection.sender);
            let _ = connection.driver.await;
            (latencies, failures, first_failure, last)
        }));
    }

    tokio::time::sleep_until(start.into()).await;
    let (server_cpu0, client_cpu0) = (server.cpu(), self_cpu());
    let mut result = KeepAlive {
        connections,
        protocol,
        requests: 0,
        failures: 0,
        first_failure: None,
        elapsed: Duration::ZERO,
        latencies_ns: Vec::new(),
        server_cpu: Duration::ZERO,
        client_cpu: Duration::ZERO,
    };
    let mut last = start;
    for task in tasks {
        let (latencies, failures, first_failure, task_last) = task.await?;
        result.latencies_ns.extend(latencies);
        result.failures += failures;
        if result.first_failure.is_none() {
            result.first_failure = first_failure;
        }
        last = last.max(task_last);
    }
    result.server_cpu = server.cpu().saturating_sub(server_cpu0);
    result.client_cpu = self_cpu().saturating_sub(client_cpu0);
    result.elapsed = last - start;
    result.requests = result.latencies_ns.len();
    result.latencies_ns.sort_unstable();
    Ok(result)
}

// ---------------------------------------------------------------------------
// 3. New connections.

struct Handshakes {
    completed: usize,
    failures: usize,
    first_failure: Option<String>,
    elapsed: Duration,
    protocol: String,
    connect_ns: Vec<u64>,
    server_cpu: Duration,
    client_cpu: Duration,
}

impl Handshakes {
    fn per_second(&self) -> f64 {
        self.completed as f64 / self.elapsed.as_secs_f64()
    }

    fn server_cpu_us(&self) -> f64 {
        micros(self.server_cpu) / self.completed.max(1) as f64
    }

    fn describe(&self) -> String {
        let mut text = format!(
            "{HANDSHAKE_TASKS} tasks: {:.0} connections/s ({} in {:.2} s, {} failed), \
             TCP+TLS connect p50 {:.3} ms, p99 {:.3} ms; server CPU {:.0}% of its core = {:.0} µs/connection \
             (server-bound ceiling ≈ {:.0}/s); load generator CPU {:.0}% [{}]",
            self.per_second(),
            self.completed,
            self.elapsed.as_secs_f64(),
            self.failures,
            percentile_ms(&self.connect_ns, 0.50),
            percentile_ms(&self.connect_ns, 0.99),
            100.0 * self.server_cpu.as_secs_f64() / self.elapsed.as_secs_f64(),
            self.server_cpu_us(),
            1e6 / self.server_cpu_us(),
            100.0 * self.client_cpu.as_secs_f64() / self.elapsed.as_secs_f64(),
            self.protocol,
        );
        if let Some(failure) = &self.first_failure {
            let _ = write!(text, "\n  first failure: {failure}");
        }
        text
    }
}

/// [`HANDSHAKE_TASKS`] tasks each: connect, full TLS handshake (no
/// resumption), one review, close; again until [`HANDSHAKE_RUN`] is over.
async fn handshake_load(server: &Server, tls: &TlsConnector, body: &Bytes) -> Result<Handshakes> {
    let start = Instant::now();
    let end = start + HANDSHAKE_RUN;
    let (server_cpu0, client_cpu0) = (server.cpu(), self_cpu());
    let mut tasks = Vec::new();
    for _ in 0..HANDSHAKE_TASKS {
        let (tls, body, addr) = (tls.clone(), body.clone(), server.webhook);
        tasks.push(tokio::spawn(async move {
            let (mut connect_ns, mut failures, mut first_failure, mut protocol) =
                (Vec::new(), 0usize, None, String::new());
            while Instant::now() < end
                && connect_ns.len() + failures < MAX_HANDSHAKES / HANDSHAKE_TASKS
            {
                let begun = Instant::now();
                let attempt = async {
                    let mut connection = connect(addr, &tls).await?;
                    let connected = begun.elapsed();
                    review(&mut connection, &body).await?;
                    let reviewed = begun.elapsed();
                    drop(connection.sender);
                    connection.driver.await?;
                    if std::env::var_os("DBG").is_some() { eprintln!("connect {:?} review {:?} close {:?}", connected, reviewed - connected, begun.elapsed() - reviewed); }
                    anyhow::Ok((connected, connection.protocol))
                };
                match tokio::time::timeout(OP_TIMEOUT, attempt).await {
                    Ok(Ok((connected, negotiated))) => {
                        connect_ns.push(connected.as_nanos() as u64);
                        protocol = negotiated;
                    }
                    Ok(Err(err)) => {
                        failures += 1;
                        first_failure.get_or_insert(format!("{err:#}"));
                    }
                    Err(_) => {
                        failures += 1;
                        first_failure.get_or_insert("timed out".to_string());
                    }
                }
            }
            (connect_ns, failures, first_failure, protocol)
        }));
    }
    let mut result = Handshakes {
        completed: 0,
        failures: 0,
        first_failure: None,
        elapsed: Duration::ZERO,
        protocol: String::new(),
        connect_ns: Vec::new(),
        server_cpu: Duration::ZERO,
        client_cpu: Duration::ZERO,
    };
    for task in tasks {
        let (connect_ns, failures, first_failure, protocol) = task.await?;
        result.connect_ns.extend(connect_ns);
        result.failures += failures;
        if result.first_failure.is_none() {
            result.first_failure = first_failure;
        }
        if !protocol.is_empty() {
            result.protocol = protocol;
        }
    }
    result.elapsed = start.elapsed();
    result.server_cpu = server.cpu().saturating_sub(server_cpu0);
    result.client_cpu = self_cpu().saturating_sub(client_cpu0);
    result.completed = result.connect_ns.len();
    result.connect_ns.sort_unstable();
    Ok(result)
}

// ---------------------------------------------------------------------------
// 4. Memory, CPU time, the machine.

#[derive(Debug, Clone, Copy)]
struct Memory {
    rss_kb: u64,
    hwm_kb: u64,
}

impl Memory {
    fn rss_mb(&self) -> f64 {
        self.rss_kb as f64 / 1024.0
    }
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "VmRSS {:.1} MiB (peak VmHWM {:.1} MiB)",
            self.rss_mb(),
            self.hwm_kb as f64 / 1024.0
        )
    }
}

fn proc_status(pid: u32) -> Result<String> {
    Ok(std::fs::read_to_string(format!("/proc/{pid}/status"))?)
}

fn status_field<'a>(status: &'a str, field: &str) -> Option<&'a str> {
    status.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// User + system CPU time of a process, from `/proc/<pid>/stat`.
fn process_cpu(stat_path: &str) -> Result<Duration> {
    let mut stat = String::new();
    std::fs::File::open(stat_path)?.read_to_string(&mut stat)?;
    // Fields after the parenthesised command name, which may hold spaces.
    let rest = &stat[stat.rfind(')').context("malformed stat")? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    // SAFETY: sysconf reads a constant of the C library.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(Duration::from_secs_f64(ticks as f64 / per_second))
}

fn self_cpu() -> Duration {
    process_cpu("/proc/self/stat").unwrap_or_default()
}

fn cpu_set(core: usize) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is a plain bit array, all zeroes the empty set;
    // CPU_SET bounds-checks `core` against it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        set
    }
}

/// Pins the calling thread (and the threads it starts later) to `core`.
fn pin_current_thread(core: usize) {
    let set = cpu_set(core);
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        eprintln!(
            "warning: could not pin the load generator to core {core}: {}",
            std::io::Error::last_os_error()
        );
    }
}

struct Machine {
    cores: usize,
    cpu_model: String,
    loadavg: String,
}

impl Machine {
    fn read() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        Machine {
            // The machine's cores, not this thread's (already pinned) share.
            cores: cpuinfo
                .lines()
                .filter(|l| l.starts_with("processor"))
                .count(),
            cpu_model: cpuinfo
                .lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
                .unwrap_or_else(|| "unknown CPU".to_string()),
            loadavg: std::fs::read_to_string("/proc/loadavg")
                .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
                .unwrap_or_default(),
        }
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Nearest-rank percentile of sorted samples, in milliseconds.
fn percentile_ms(sorted_ns: &[u64], q: f64) -> f64 {
    if sorted_ns.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted_ns.len() as f64).ceil() as usize).clamp(1, sorted_ns.len());
    sorted_ns[rank - 1] as f64 / 1e6
}

// ---------------------------------------------------------------------------
// The summary.

struct Summary<'a> {
    machine: Machine,
    body_bytes: usize,
    headline: &'a KeepAlive,
    info: &'a KeepAlive,
    handler: &'a HandlerCpu,
    handshakes: &'a Handshakes,
    idle: Memory,
    after: Memory,
    idle_info: Memory,
    after_info: Memory,
}

impl Summary<'_> {
    fn render(&self) -> String {
        let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
        let h = self.headline;
        let i = self.info;
        let rows = [
            (
                format!("keep-alive reviews/s, {} conns, warn logs", h.connections),
                format!("{:.0}", h.rps()),
                format!(">= {TARGET_RPS:.0}"),
                verdict(h.rps() >= TARGET_RPS),
            ),
            (
                format!("keep-alive p99 latency, {} conns, warn logs", h.connections),
                format!(
                    "{:.3} ms (p50 {:.3}, max {:.3})",
                    percentile_ms(&h.latencies_ns, 0.99),
                    percentile_ms(&h.latencies_ns, 0.50),
                    percentile_ms(&h.latencies_ns, 1.0)
                ),
                format!("<= {TARGET_P99_MS} ms"),
                verdict(percentile_ms(&h.latencies_ns, 0.99) <= TARGET_P99_MS),
            ),
            (
                format!(
                    "keep-alive reviews/s, {} conns, info JSON logs",
                    i.connections
                ),
                format!("{:.0}", i.rps()),
                format!(">= {TARGET_RPS:.0}"),
                verdict(i.rps() >= TARGET_RPS),
            ),
            (
                format!(
                    "keep-alive p99 latency, {} conns, info JSON logs",
                    i.connections
                ),
                format!(
                    "{:.3} ms (p50 {:.3}, max {:.3})",
                    percentile_ms(&i.latencies_ns, 0.99),
                    percentile_ms(&i.latencies_ns, 0.50),
                    percentile_ms(&i.latencies_ns, 1.0)
                ),
                format!("<= {TARGET_P99_MS} ms"),
                verdict(percentile_ms(&i.latencies_ns, 0.99) <= TARGET_P99_MS),
            ),
            (
                "handler CPU (decide + review_body)".to_string(),
                format!("{:.1} µs/review", self.handler.mean_us),
                format!("<= {TARGET_HANDLER_US} µs"),
                verdict(self.handler.mean_us <= TARGET_HANDLER_US),
            ),
            (
                "new TLS connections/s (ECDSA P-256)".to_string(),
                format!("{:.0}", self.handshakes.per_second()),
                format!(">= {TARGET_HANDSHAKES:.0}"),
                verdict(self.handshakes.per_second() >= TARGET_HANDSHAKES),
            ),
            (
                "idle RSS after start-up (warn / info)".to_string(),
                format!(
                    "{:.1} / {:.1} MiB",
                    self.idle.rss_mb(),
                    self.idle_info.rss_mb()
                ),
                format!("< {TARGET_IDLE_RSS_MB} MB"),
                verdict(self.idle.rss_mb().max(self.idle_info.rss_mb()) < TARGET_IDLE_RSS_MB),
            ),
            (
                "idle RSS after the load (warn / info)".to_string(),
                format!(
                    "{:.1} / {:.1} MiB",
                    self.after.rss_mb(),
                    self.after_info.rss_mb()
                ),
                "(reported)".to_string(),
                "-",
            ),
        ];
        let width = rows.iter().map(|r| r.0.chars().count()).max().unwrap_or(0);
        let value_width = rows.iter().map(|r| r.1.chars().count()).max().unwrap_or(0);
        let mut text = format!(
            "== summary: {} cores, {}; server pinned to core {SERVER_CORE}, load generator to core {CLIENT_CORE}; body {} bytes ==\n",
            self.machine.cores, self.machine.cpu_model, self.body_bytes
        );
        for (what, value, target, verdict) in rows {
            let _ = writeln!(
                text,
                "{what:<width$}  {value:<value_width$}  target {target:<10}  {verdict}"
            );
        }
        text
    }
}
