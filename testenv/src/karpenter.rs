//! A small cluster in which the real Karpenter decides: the control plane, plus
//! kube-scheduler, kube-controller-manager, kwok (every kubelet) and
//! Karpenter's KWOK cloud provider, all built from pinned Go modules.
//!
//! Karpenter "launches" an instance by creating the Node through the API, as a
//! kubelet registers, so the Node CREATE goes through whatever mutating
//! webhook the test registered. kwok turns those nodes Ready, runs the pods the
//! scheduler binds to them (a Job's pods finish after the delay their
//! annotations ask for) and completes evictions; kube-controller-manager lifts
//! the `not-ready` taint and runs the Job and ReplicaSet controllers. Karpenter
//! runs as its own identity ([`AUTOSCALER_USER`](crate::AUTOSCALER_USER)),
//! with the NodePool the test chooses.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::binaries::{ClusterBinaries, ensure_cluster_built};
use crate::{ControlPlane, ManagedChild, apply_objects, free_ports, parse_manifests};

/// The NodePool every cluster gets.
pub const NODE_POOL: &str = "default";
/// Its KWOKNodeClass.
pub const NODE_CLASS: &str = "default";
/// The one instance type the pool may launch: one vCPU (about 900m
/// allocatable after kube-reserved), so a pod of [`POD_CPU`] fills a node and
/// N such pods need N nodes. Pinning the type, the capacity type and the zone
/// leaves Karpenter no random tie-break.
pub const INSTANCE_TYPE: &str = "c-1x-amd64-linux";
/// The CPU request of a pod that fills one node of [`INSTANCE_TYPE`].
pub const POD_CPU: &str = "600m";
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The disruption settings of the NodePool, as the test chooses them.
#[derive(Debug, Clone)]
pub struct Disruption {
    /// `WhenEmpty`, `WhenEmptyOrUnderutilized` or `Balanced`.
    pub consolidation_policy: String,
    /// How long a node must be without pod changes before it may go (`5s`).
    pub consolidate_after: String,
    /// `spec.disruption.budgets`, as Karpenter reads it.
    pub budgets: Value,
}

/// How the cluster's parts behave, beyond the NodePool: what a benchmark
/// that plays a realistic day changes.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The KWOKNodeClass's `nodeRegistrationDelay`: how long after Karpenter
    /// launches an instance its Node appears (a cloud's boot), or none.
    pub registration_delay: Option<Duration>,
    /// Karpenter's `LOG_LEVEL`. Tests read its decisions at `debug`; a
    /// benchmark that runs many pools side by side lowers it to spare CPU.
    pub log_level: &'static str,
    /// Karpenter's `FEATURE_GATES` (`CapacityBuffer=true`), or its defaults.
    pub feature_gates: Option<&'static str>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            registration_delay: None,
            log_level: "debug",
            feature_gates: None,
        }
    }
}

impl Default for Disruption {
    /// Empty nodes go 5 s after their last pod, all at once: short enough for
    /// a test to watch Karpenter churn.
    fn default() -> Self {
        Disruption {
            consolidation_policy: "WhenEmpty".into(),
            consolidate_after: "5s".into(),
            budgets: json!([{"nodes": "100%"}]),
        }
    }
}

/// A running cluster with Karpenter. Dropping it stops every process, the
/// autoscaler first.
pub struct KarpenterCluster {
    // Field order is drop order: the deciders stop before the API server.
    karpenter: ManagedChild,
    kwok: ManagedChild,
    controller_manager: ManagedChild,
    scheduler: ManagedChild,
    karpenter_metrics_port: u16,
    karpenter_log: PathBuf,
    cp: ControlPlane,
}

impl KarpenterCluster {
    /// Builds what is missing, starts the control plane and every component
    /// beside it, creates the KWOKNodeClass and a NodePool with `disruption`,
    /// and waits until Karpenter is ready.
    pub async fn start(disruption: &Disruption) -> Result<Self> {
        Self::start_with(&ClusterOptions::default(), disruption).await
    }

    /// [`KarpenterCluster::start`] with `options`.
    pub async fn start_with(options: &ClusterOptions, disruption: &Disruption) -> Result<Self> {
        let binaries = tokio::task::spawn_blocking(ensure_cluster_built)
            .await
            .context("cluster build task")??;
        let cp = ControlPlane::start().await?;
        let admin = cp.admin_client().await?;
        apply_objects(&admin, &karpenter_crds(&binaries.karpenter_source)?).await?;
        let pool = node_pool(NODE_POOL, disruption, json!([]));
        apply_objects(&admin, &[node_class(options.registration_delay), pool]).await?;

        let scheduler = start_scheduler(&cp, &binaries)?;
        let controller_manager = start_controller_manager(&cp, &binaries)?;
        let kwok = start_kwok(&cp, &binaries)?;
        let (karpenter, karpenter_metrics_port) =
            start_ready_karpenter(&cp, &binaries, options).await?;
        Ok(KarpenterCluster {
            karpenter,
            kwok,
            controller_manager,
            scheduler,
            karpenter_metrics_port,
            karpenter_log: cp.dir().join("karpenter.log"),
            cp,
        })
    }

    /// Adds a second NodePool `name`, like the first but with `disruption`
    /// and a taint only the pods [`in_pool`] pins tolerate: a pool of
    /// its own (GPU nodes, say) that other pods never land on.
    pub async fn add_node_pool(&self, name: &str, disruption: &Disruption) -> Result<()> {
        let taint = json!([{"key": POOL_TAINT, "value": name, "effect": "NoSchedule"}]);
        let admin = self.cp.admin_client().await?;
        apply_objects(&admin, &[node_pool(name, disruption, taint)]).await
    }

    /// The control plane under it all.
    pub fn control_plane(&self) -> &ControlPlane {
        &self.cp
    }

    /// The control plane, to restart its API server.
    pub fn control_plane_mut(&mut self) -> &mut ControlPlane {
        &mut self.cp
    }

    /// Karpenter's Prometheus metrics, as text.
    pub async fn karpenter_metrics(&self) -> Result<String> {
        http_get_loopback(self.karpenter_metrics_port, "/metrics").await
    }

    /// How many times Karpenter's disruption loop has evaluated `reason`
    /// (`empty`, `underutilized`, `drifted`): its own
    /// `decision_evaluation_duration_seconds` count.
    pub async fn disruption_passes(&self, reason: &str) -> Result<f64> {
        let metrics = self.karpenter_metrics().await?;
        Ok(samples(
            &metrics,
            "karpenter_voluntary_disruption_decision_evaluation_duration_seconds_count",
            reason,
        )
        .sum())
    }

    /// How many nodes Karpenter last found it may disrupt for `reason`
    /// (its `eligible_nodes` gauge; 0 before its first pass).
    pub async fn eligible_nodes(&self, reason: &str) -> Result<f64> {
        let metrics = self.karpenter_metrics().await?;
        Ok(samples(
            &metrics,
            "karpenter_voluntary_disruption_eligible_nodes",
            reason,
        )
        .next()
        .unwrap_or(0.0))
    }

    /// The Nodes Karpenter's identity `verb`ed (`create`, `delete`)
    /// successfully, with when the API server received each request, from
    /// its audit log, in log order. A node that is gone still counts.
    pub fn karpenter_node_requests(&self, verb: &str) -> Result<Vec<(String, Timestamp)>> {
        Ok(self
            .cp
            .audit_events()?
            .into_iter()
            .filter(|e| {
                e["verb"] == verb
                    && e["objectRef"]["resource"] == "nodes"
                    && e["user"]["username"] == crate::AUTOSCALER_USER
                    && e["stage"] == "ResponseComplete"
                    && e["responseStatus"]["code"]
                        .as_u64()
                        .is_some_and(|c| (200..300).contains(&c))
            })
            .filter_map(|e| {
                let name = e["objectRef"]["name"].as_str()?.to_string();
                let at = e["requestReceivedTimestamp"].as_str()?.parse().ok()?;
                Some((name, at))
            })
            .collect())
    }

    /// Fails with the end of a component's log if one of them has exited.
    pub fn check_running(&mut self) -> Result<()> {
        self.scheduler.check_running()?;
        self.controller_manager.check_running()?;
        self.kwok.check_running()?;
        self.karpenter.check_running()
    }
}

/// Karpenter (its KWOK provider) and kwok beside a control plane whose
/// scheduler and controller manager run already: a real node's
/// ([`crate::RealNode::join_with_services`]). Dropping it stops both.
pub struct Autoscaler {
    karpenter: ManagedChild,
    _kwok: ManagedChild,
}

impl Autoscaler {
    /// Builds what is missing, creates Karpenter's CRDs, the KWOKNodeClass
    /// and the NodePool with `disruption`, starts kwok and Karpenter and
    /// waits until Karpenter is ready. kwok manages only the nodes Karpenter
    /// launches, never a real kubelet's.
    pub async fn attach(cp: &ControlPlane, disruption: &Disruption) -> Result<Self> {
        let binaries = tokio::task::spawn_blocking(ensure_cluster_built)
            .await
            .context("cluster build task")??;
        let admin = cp.admin_client().await?;
        apply_objects(&admin, &karpenter_crds(&binaries.karpenter_source)?).await?;
        let pool = node_pool(NODE_POOL, disruption, json!([]));
        apply_objects(&admin, &[node_class(None), pool]).await?;
        let kwok = start_kwok(cp, &binaries)?;
        let options = ClusterOptions::default();
        let (karpenter, _) = start_ready_karpenter(cp, &binaries, &options).await?;
        Ok(Autoscaler {
            karpenter,
            _kwok: kwok,
        })
    }

    /// The end of Karpenter's log, for a failure's message.
    pub fn log_tail(&self) -> String {
        self.karpenter.log_tail()
    }
}

/// Starts Karpenter and waits until it is ready; it and its metrics port.
/// A free port can be taken by someone else between the probe and
/// Karpenter's bind: one more start on new ports covers it.
async fn start_ready_karpenter(
    cp: &ControlPlane,
    binaries: &ClusterBinaries,
    options: &ClusterOptions,
) -> Result<(ManagedChild, u16)> {
    let mut tries = 0;
    loop {
        let [metrics_port, health_port] = free_ports()?;
        let mut karpenter = start_karpenter(cp, binaries, options, [metrics_port, health_port])?;
        match wait_ready(&mut karpenter, health_port).await {
            Err(err) if tries == 0 && format!("{err:#}").contains("address already in use") => {
                tries += 1;
            }
            result => return result.map(|()| (karpenter, metrics_port)),
        }
    }
}

async fn wait_ready(karpenter: &mut ManagedChild, health_port: u16) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        karpenter.check_running()?;
        match http_get_loopback(health_port, "/readyz").await {
            Ok(_) => return Ok(()),
            Err(err) if Instant::now() > deadline => {
                bail!(
                    "Karpenter not ready after {READY_TIMEOUT:?}: {err:#}\n{}",
                    karpenter.log_tail()
                );
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

impl Drop for KarpenterCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "testenv: test failed; last lines of Karpenter's log ({}):\n{}",
                self.karpenter_log.display(),
                self.karpenter.log_tail()
            );
        }
    }
}

/// Karpenter's CRDs as its KWOK build ships them (NodePool, NodeClaim,
/// NodeOverlay, CapacityBuffer) and the KWOKNodeClass CRD.
fn karpenter_crds(source: &Path) -> Result<Vec<Value>> {
    let mut objects = Vec::new();
    for dir in ["kwok/charts/crds", "kwok/apis/crds"] {
        let dir = source.join(dir);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .map(|entry| entry.map(|e| e.path()))
            .collect::<std::io::Result<_>>()?;
        files.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
        files.sort();
        for file in files {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            objects.extend(parse_manifests(&text)?);
        }
    }
    if objects.is_empty() {
        bail!("no CRDs in {}", source.display());
    }
    Ok(objects)
}

/// The KWOKNodeClass every pool launches from; its Nodes appear
/// `registration_delay` after the launch (whole seconds).
fn node_class(registration_delay: Option<Duration>) -> Value {
    let spec = match registration_delay {
        Some(delay) => json!({"nodeRegistrationDelay": format!("{}s", delay.as_secs())}),
        None => json!({}),
    };
    json!({
        "apiVersion": "karpenter.kwok.sh/v1alpha1",
        "kind": "KWOKNodeClass",
        "metadata": {"name": NODE_CLASS},
        "spec": spec
    })
}

/// Karpenter's CRDs (from the pinned module, built with the cluster's
/// binaries) in `cp`, without Karpenter: for tests of what node-holder
/// writes to NodePools.
pub async fn install_karpenter_crds(cp: &ControlPlane) -> Result<()> {
    let binaries = tokio::task::spawn_blocking(ensure_cluster_built)
        .await
        .context("cluster build task")??;
    let admin = cp.admin_client().await?;
    apply_objects(&admin, &karpenter_crds(&binaries.karpenter_source)?).await
}

/// A NodePool `name` as every cluster's, with `disruption`: what a test
/// creates itself.
pub fn node_pool_object(name: &str, disruption: &Disruption) -> Value {
    node_pool(name, disruption, json!([]))
}

/// A NodePool: one small on-demand instance type in one zone, with the
/// test's disruption settings and `taints` on its nodes.
fn node_pool(name: &str, disruption: &Disruption, taints: Value) -> Value {
    let requirement =
        |key: &str, value: &str| json!({"key": key, "operator": "In", "values": [value]});
    json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "spec": {
                    "taints": taints,
                    "nodeClassRef": {
                        "group": "karpenter.kwok.sh",
                        "kind": "KWOKNodeClass",
                        "name": NODE_CLASS
                    },
                    "requirements": [
                        requirement("node.kubernetes.io/instance-type", INSTANCE_TYPE),
                        requirement("karpenter.sh/capacity-type", "on-demand"),
                        requirement("topology.kubernetes.io/zone", "test-zone-a"),
                    ],
                    "expireAfter": "Never"
                }
            },
            "disruption": {
                "consolidationPolicy": disruption.consolidation_policy,
                "consolidateAfter": disruption.consolidate_after,
                "budgets": disruption.budgets
            },
            "limits": {"cpu": "1000"}
        }
    })
}

/// Starts one of Kubernetes' own components as the admin, outside a
/// cluster: no leader election and no serving port (nothing here scrapes
/// it), with `extra` flags, in UTC as its image runs it (the CronJob
/// controller reads a schedule without `timeZone` in its own zone).
pub(crate) fn start_kube_component(
    cp: &ControlPlane,
    name: &'static str,
    binary: &Path,
    extra: &[String],
) -> Result<ManagedChild> {
    let mut args = vec![
        format!("--kubeconfig={}", cp.admin_kubeconfig().display()),
        "--leader-elect=false".into(),
        "--secure-port=0".into(),
        "--v=1".into(),
    ];
    args.extend_from_slice(extra);
    let mut command = std::process::Command::new(binary);
    command.args(&args).env("TZ", "UTC");
    ManagedChild::spawn_command(name, command, &cp.dir().join(format!("{name}.log")))
}

fn start_scheduler(cp: &ControlPlane, binaries: &ClusterBinaries) -> Result<ManagedChild> {
    start_kube_component(cp, "kube-scheduler", &binaries.kube_scheduler, &[])
}

/// The controllers a Karpenter cluster needs: node lifecycle (lifts the
/// `not-ready` taint the API server puts on every new Node), Jobs and the
/// CronJobs that start them, ReplicaSets and Deployments, and garbage
/// collection of their pods.
const CONTROLLERS: &str = "node-lifecycle-controller,job-controller,cronjob-controller,\
replicaset-controller,deployment-controller,garbage-collector-controller,\
pod-garbage-collector-controller,ttl-after-finished-controller";

fn start_controller_manager(cp: &ControlPlane, binaries: &ClusterBinaries) -> Result<ManagedChild> {
    start_kube_component(
        cp,
        "kube-controller-manager",
        &binaries.kube_controller_manager,
        &[
            format!("--controllers={CONTROLLERS}"),
            // kwok renews node Leases every few seconds; a loaded 2-core
            // machine must not turn a node NotReady because one renewal
            // came late.
            "--node-monitor-grace-period=2m".into(),
        ],
    )
}

/// kwok manages exactly Karpenter's KWOK nodes (the annotation its cloud
/// provider sets) and the pods bound to them, with its upstream stages:
/// nodes Ready at once with Lease heartbeats; pods Ready at once; a Job's pod
/// that says how long it runs finishes after
/// `pod-complete.stage.kwok.x-k8s.io/delay` (set `.../jitter-delay` to the
/// same value for an exact time); deleted pods go.
///
/// Upstream's pod-complete stage finishes every Job pod within seconds,
/// delay or not; a real container runs until its process exits, and a pause
/// container (node-holder's placeholders) never does. So the stage here
/// finishes only the pods that carry the delay: the others run until they
/// are deleted or their Job's deadline ends them.
///
/// Upstream's pod-delete stage deletes a deleted pod at once, which does
/// nothing while a finalizer holds it (a Job's pods carry
/// `batch.kubernetes.io/job-tracking`); a kubelet kills the containers of a
/// deleted pod and reports it `Failed`, and the Job controller then lifts
/// its finalizer. So here a deleted pod that has not finished is first
/// reported `Failed` ([`POD_TERMINATE`]), and deleted once no finalizer is
/// left.
fn start_kwok(cp: &ControlPlane, binaries: &ClusterBinaries) -> Result<ManagedChild> {
    let stages = binaries.kwok_source.join("kustomize/stage");
    let mut args = vec![
        format!("--kubeconfig={}", cp.admin_kubeconfig().display()),
        "--manage-all-nodes=false".into(),
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake".into(),
        "--node-lease-duration-seconds=40".into(),
    ];
    for stage in [
        "node/fast/node-initialize.yaml",
        "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
        "pod/fast/pod-ready.yaml",
        "pod/general/pod-complete.yaml",
        "pod/fast/pod-delete.yaml",
    ] {
        let mut path = stages.join(stage);
        if !path.exists() {
            bail!("kwok stage {} is missing", path.display());
        }
        let narrowing = match stage {
            "pod/general/pod-complete.yaml" => Some(("pod-complete.yaml", DELAY_SET)),
            "pod/fast/pod-delete.yaml" => Some(("pod-delete.yaml", NO_FINALIZER)),
            _ => None,
        };
        if let Some((name, requirement)) = narrowing {
            path = narrowed(&path, &cp.dir().join(name), requirement)?;
        }
        args.push(format!("--config={}", path.display()));
    }
    let terminate = cp.dir().join("pod-terminate.yaml");
    std::fs::write(&terminate, POD_TERMINATE)
        .with_context(|| format!("{}", terminate.display()))?;
    args.push(format!("--config={}", terminate.display()));
    ManagedChild::spawn("kwok", &binaries.kwok, &args, &cp.dir().join("kwok.log"))
}

/// Only the pods that say how long they run finish (see [`start_kwok`]).
const DELAY_SET: &str = "    - key: '.metadata.annotations[\"pod-complete.stage.kwok.x-k8s.io/delay\"]'\n      operator: 'Exists'\n";
/// Only the pods no finalizer holds are deleted.
const NO_FINALIZER: &str = "    - key: '.metadata.finalizers'\n      operator: 'DoesNotExist'\n";

/// What a kubelet does with a deleted pod that has not finished: its
/// containers are killed and the pod is `Failed`.
const POD_TERMINATE: &str = r#"apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-terminate
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
    - key: '.metadata.finalizers'
      operator: 'Exists'
    - key: '.status.phase'
      operator: 'NotIn'
      values: ['Succeeded', 'Failed']
  next:
    statusTemplate: |
      {{ $now := Now }}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 137
            finishedAt: {{ $now | Quote }}
            reason: Error
            startedAt: {{ $now | Quote }}
      {{ end }}
      phase: Failed
"#;

/// A kwok stage with one more selector requirement, written to `path`.
fn narrowed(stage: &Path, path: &Path, requirement: &str) -> Result<PathBuf> {
    const SELECTOR: &str = "  selector:\n    matchExpressions:\n";
    let text = std::fs::read_to_string(stage).with_context(|| format!("{}", stage.display()))?;
    if !text.contains(SELECTOR) {
        bail!("kwok stage {} has no selector to narrow", stage.display());
    }
    let narrowed = text.replacen(SELECTOR, &format!("{SELECTOR}{requirement}"), 1);
    std::fs::write(path, narrowed).with_context(|| format!("{}", path.display()))?;
    Ok(path.to_path_buf())
}

fn start_karpenter(
    cp: &ControlPlane,
    binaries: &ClusterBinaries,
    options: &ClusterOptions,
    [metrics_port, health_port]: [u16; 2],
) -> Result<ManagedChild> {
    use std::os::unix::process::CommandExt as _;
    let mut command = std::process::Command::new(&binaries.karpenter);
    // Karpenter reads its options from the environment; `--kubeconfig` is not
    // one of its flags (controller-runtime reads KUBECONFIG). Its argv[0]
    // names the cluster's directory, as the other components' flags do, so
    // `ps` tells which cluster a Karpenter belongs to.
    command
        .arg0(cp.dir().join("karpenter"))
        .env("KUBECONFIG", cp.autoscaler_kubeconfig())
        .env("DISABLE_LEADER_ELECTION", "true")
        .env("METRICS_PORT", metrics_port.to_string())
        .env("HEALTH_PROBE_PORT", health_port.to_string())
        .env("LOG_LEVEL", options.log_level);
    if let Some(gates) = options.feature_gates {
        command.env("FEATURE_GATES", gates);
    }
    ManagedChild::spawn_command("karpenter", command, &cp.dir().join("karpenter.log"))
}

/// The values of metric `name`'s series labelled `reason="{reason}"` in
/// Prometheus text.
fn samples<'a>(metrics: &'a str, name: &'a str, reason: &'a str) -> impl Iterator<Item = f64> + 'a {
    crate::metrics::named(metrics, name)
        .filter(move |s| s.label("reason") == reason)
        .map(|s| s.value)
}

/// A plain HTTP GET on a loopback port; the body of a 200 answer.
async fn http_get_loopback(port: u16, path: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .with_context(|| format!("connecting to 127.0.0.1:{port}"))?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("an HTTP answer without a header end")?;
    let status = head.split_whitespace().nth(1).unwrap_or_default();
    if status != "200" {
        bail!("GET {path} answered {status}: {body}");
    }
    Ok(body.to_string())
}

/// The spec of a pod that asks for [`POD_CPU`]: one fills one node.
/// ServiceAccount admission is off in the test control plane, so the pod
/// needs no token; kwok "runs" it once it is bound.
fn filler_spec() -> Value {
    json!({
        "containers": [{
            "name": "work",
            "image": "registry.invalid/work:1",
            "resources": {"requests": {"cpu": POD_CPU}}
        }],
        "terminationGracePeriodSeconds": 0
    })
}

/// The taint of the NodePools [`KarpenterCluster::add_node_pool`] adds.
const POOL_TAINT: &str = "example.com/pool";

/// Pins the pod spec `spec` (JSON) to the NodePool `pool` that
/// [`KarpenterCluster::add_node_pool`] added: its node selector and the
/// toleration of the pool's taint.
pub fn in_pool(spec: &mut Value, pool: &str) {
    spec["nodeSelector"] = json!({"karpenter.sh/nodepool": pool});
    spec["tolerations"] =
        json!([{"key": POOL_TAINT, "operator": "Equal", "value": pool, "effect": "NoSchedule"}]);
}

/// A bare pod named `name` in `default` that fills one node.
pub fn filler_pod(name: &str) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": filler_spec()
    }))
    .expect("a valid Pod")
}

/// A Job `name` in `default` of `pods` pods at once, each filling one node
/// and running for `run_for` (kwok's pod-complete stage finishes it then:
/// delay and jitter both set, so the time is exact).
pub fn filler_job(name: &str, pods: i32, run_for: Duration) -> k8s_openapi::api::batch::v1::Job {
    let run_for = format!("{}ms", run_for.as_millis());
    let mut spec = filler_spec();
    spec["restartPolicy"] = json!("Never");
    serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "template": {
                "metadata": {
                    "labels": {"app": name},
                    "annotations": {
                        "pod-complete.stage.kwok.x-k8s.io/delay": run_for,
                        "pod-complete.stage.kwok.x-k8s.io/jitter-delay": run_for
                    }
                },
                "spec": spec
            }
        }
    }))
    .expect("a valid Job")
}

/// A CronJob `name` in `default` on `schedule`: each run one pod that fills
/// a node for `run_for` (as [`filler_job`]), labelled `cronjob: name`; a run
/// is not started while the last one runs (`Forbid`).
pub fn filler_cronjob(
    name: &str,
    schedule: &str,
    run_for: Duration,
) -> k8s_openapi::api::batch::v1::CronJob {
    let job = filler_job(name, 1, run_for);
    let mut template = serde_json::to_value(job.spec).expect("a Job's spec");
    template["template"]["metadata"]["labels"] = json!({"cronjob": name});
    serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "schedule": schedule,
            "concurrencyPolicy": "Forbid",
            "jobTemplate": {"spec": template}
        }
    }))
    .expect("a valid CronJob")
}

/// A Deployment `name` in `default` of `replicas` pods that each fill one
/// node: pods that come back elsewhere when their node goes.
pub fn filler_deployment(name: &str, replicas: i32) -> k8s_openapi::api::apps::v1::Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": filler_spec()}
        }
    }))
    .expect("a valid Deployment")
}

/// Karpenter's NodeClaims (`karpenter.sh/v1`, cluster-scoped).
pub fn node_claims(client: &kube::Client) -> kube::Api<kube::api::DynamicObject> {
    karpenter_api(client, "NodeClaim", "nodeclaims")
}

/// Karpenter's NodePools (`karpenter.sh/v1`, cluster-scoped).
pub fn node_pools(client: &kube::Client) -> kube::Api<kube::api::DynamicObject> {
    karpenter_api(client, "NodePool", "nodepools")
}

fn karpenter_api(
    client: &kube::Client,
    kind: &str,
    plural: &str,
) -> kube::Api<kube::api::DynamicObject> {
    let resource = kube::api::ApiResource {
        group: "karpenter.sh".into(),
        version: "v1".into(),
        api_version: "karpenter.sh/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    kube::Api::all_with(client.clone(), &resource)
}
