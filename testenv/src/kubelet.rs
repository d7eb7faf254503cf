//! A real node for the test cluster: a kubelet built from the control plane's
//! own `k8s.io/kubernetes` release (`testenv/tools/kubelet`), a private
//! containerd with runc, and the bridge and host-local CNI plugins, all on
//! this machine, joined to a [`ControlPlane`] beside whatever KWOK nodes it
//! has. Pods bound to it run for real: their images are pulled by containerd,
//! the runtime applies their securityContext, the kubelet runs their probes
//! over the pod network.
//!
//! What it takes on this kind of machine (cgroup v1 controllers with a v2
//! `unified` mount, no systemd, a sandbox that refuses a negative
//! `oom_score_adj`, no registry but loopback ones) is in docs/testing.md; in
//! short:
//! - containerd (Debian's, 1.6) with its root, state, socket and runc root
//!   under the node's directory, `restrict_oom_score_adj`, Debian's CNI path
//!   `/usr/lib/cni`, network namespaces mounted under its state directory,
//!   and a `hosts.toml` for each loopback registry the node pulls from over
//!   plain HTTP ([`RealNode::trust_registry`]);
//! - the sandbox ("pause") image built here: a 129-byte static x86-64
//!   program that waits for a signal, in a one-layer OCI image imported with
//!   `ctr images import` as [`SANDBOX_IMAGE`];
//! - the kubelet with cgroup v1 allowed, the cgroupfs driver, no QoS cgroups,
//!   no node-allocatable enforcement, swap tolerated, no iptables chains of its
//!   own, its own ports, and eviction thresholds low enough that a full shared
//!   disk does not evict the test's pods;
//! - a bridge (`nhrn<N>`, `10.214.<N>.1/24`, made before the CNI plugin sees
//!   it) whose host address is the node's InternalIP and where pods reach the
//!   API server through a relay ([`RealNode::pod_kubeconfig`]), the API
//!   server itself listening on loopback only.
//!
//! The kubelet is `system:node:<name>` in `system:nodes` (a client
//! certificate from the control plane's CA, bound to the `system:node`
//! ClusterRole), registers with the label and the `NoSchedule` taint
//! [`REAL_NODE_LABEL`]`=true`, and authenticates the API server by its client
//! certificate (logs, exec).
//!
//! Dropping a [`RealNode`] kills the kubelet, every container of its runc
//! root, their shims and containerd, unmounts everything under its directory,
//! deletes the bridge and the directory. Slot `<N>` (bridge, subnet) is held
//! under a machine-wide file lock; a slot whose owner died without its
//! teardown is cleaned by the next [`RealNode::join`] that takes it.
//!
//! [`RealNode::join_with_services`] also runs kube-proxy, kube-controller-manager
//! and kube-scheduler for the node (see `services.rs`): a ClusterIP Service
//! whose endpoints are the node's pods is then reachable from the host, pods
//! reach the API server at the `kubernetes` Service, and Deployments and Jobs
//! run their pods there.
//!
//! Needs root, and Debian's `containerd`, `runc` and
//! `containernetworking-plugins` (and `iptables` for kube-proxy; `.ci/run`
//! installs them).

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::binaries::ensure_real_node_built;
use crate::netns::Relay;
use crate::services::{ProxyNode, ServiceProxy};
use crate::{ControlPlane, ManagedChild, apply_objects, free_ports};

/// The label every real node carries (value `true`): what tells it from the
/// KWOK nodes.
pub const REAL_NODE_LABEL: &str = "node-holder.dev/test-real-node";
/// The `NoSchedule` taint every real node carries (value `true`): only pods
/// that tolerate it land there.
pub const REAL_NODE_TAINT: &str = REAL_NODE_LABEL;
/// The sandbox image containerd runs for every pod, imported at join.
pub const SANDBOX_IMAGE: &str = "node-holder.dev/testenv/pause:1";

/// How long a kubelet may take to register its Node and turn it Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long containerd may take to answer on its socket.
const CONTAINERD_TIMEOUT: Duration = Duration::from_secs(30);
/// Debian's CNI plugins (not /opt/cni/bin).
const CNI_BIN_DIR: &str = "/usr/lib/cni";
/// Real nodes on this machine at once (slots: bridges and subnets).
const SLOTS: u8 = 64;
/// Each slot's pod subnet is `10.214.<slot>.0/24`.
const SUBNET_PREFIX: [u8; 2] = [10, 214];
/// Each slot's bridge is `nhrn<slot>`.
const BRIDGE_PREFIX: &str = "nhrn";

/// A kubelet with its containerd, registered and Ready. Dropping it stops
/// both and removes every container, mount and link it made.
pub struct RealNode {
    name: String,
    dir: PathBuf,
    socket: PathBuf,
    bridge: String,
    gateway: Ipv4Addr,
    relay: Option<Relay>,
    services: Option<ServiceProxy>,
    kubelet: Option<ManagedChild>,
    containerd: Option<ManagedChild>,
    slot: Slot,
}

impl RealNode {
    /// Joins a real node named `real-node-0` to `cp`: see [`join_as`](Self::join_as).
    pub async fn join(cp: &ControlPlane) -> Result<Self> {
        Self::join_as(cp, "real-node-0").await
    }

    /// Builds the kubelet if needed, starts containerd and the kubelet under
    /// `cp`'s directory, and waits until Node `name` is Ready.
    pub async fn join_as(cp: &ControlPlane, name: &str) -> Result<Self> {
        Self::join_with(cp, name, false).await
    }

    /// [`join`](Self::join), and Services and workloads work: kube-proxy
    /// (iptables mode), kube-controller-manager (EndpointSlices, Deployments,
    /// ReplicaSets, Jobs, garbage collection, node lifecycle, ServiceAccounts
    /// and `kube-root-ca.crt`) and kube-scheduler run for the node, so that a
    /// ClusterIP Service whose endpoints are the node's pods is reachable from
    /// the host, where the API server runs, and pods reach the API server at
    /// the `kubernetes` Service (`10.0.0.1:443`), which names the node's relay.
    /// For pods to get ServiceAccount tokens, start `cp` with
    /// [`SERVICE_ACCOUNTS`](crate::SERVICE_ACCOUNTS). For the API server to call a webhook through
    /// its Service's ClusterIP (not straight at an endpoint), start `cp` with
    /// [`CLUSTER_IP_ROUTING`](crate::CLUSTER_IP_ROUTING). kube-proxy's rules
    /// are the host's: one such node runs on the machine at a time (a second
    /// waits for the first to go).
    pub async fn join_with_services(cp: &ControlPlane) -> Result<Self> {
        Self::join_with(cp, "real-node-0", true).await
    }

    async fn join_with(cp: &ControlPlane, name: &str, services: bool) -> Result<Self> {
        check_prerequisites()?;
        let binaries = tokio::task::spawn_blocking(ensure_real_node_built)
            .await
            .context("kubelet and kube-proxy build task")??;

        let dir = cp.dir().join(name);
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let slot = tokio::task::spawn_blocking(Slot::acquire)
            .await
            .context("slot task")??;
        slot.record(&dir)?;
        let index = slot.index;
        let gateway = Ipv4Addr::new(SUBNET_PREFIX[0], SUBNET_PREFIX[1], index, 1);
        // From here on Drop undoes whatever was made, also when a step fails.
        let mut node = RealNode {
            name: name.to_string(),
            socket: dir.join("containerd.sock"),
            dir,
            bridge: format!("{BRIDGE_PREFIX}{index}"),
            gateway,
            relay: None,
            services: None,
            kubelet: None,
            containerd: None,
            slot,
        };
        node.make_bridge()?;
        node.start_containerd().await?;
        node.import_sandbox_image()?;

        let kubeconfig = node.dir.join("kubelet.kubeconfig");
        cp.client_certificate_kubeconfig(
            &kubeconfig,
            &format!("system:node:{name}"),
            "system:nodes",
        )?;
        let admin = cp.admin_client().await?;
        apply_objects(&admin, &[node_binding()]).await?;
        node.start_kubelet(&binaries.kubelet, &kubeconfig, cp)?;

        let api_port = url_port(cp.url())?;
        node.relay = Some(
            Relay::start(
                SocketAddr::from((gateway, 0)),
                SocketAddr::from(([127, 0, 0, 1], api_port)),
            )
            .await?,
        );
        node.wait_ready(&admin).await?;
        if services {
            let subnet = node.pod_subnet();
            node.services = Some(
                ServiceProxy::start(
                    cp,
                    ProxyNode {
                        name,
                        address: gateway,
                        pod_subnet: &subnet,
                        api_server_for_pods: node
                            .api_server_for_pods()
                            .context("the node has no relay to the API server")?,
                        dir: &node.dir,
                    },
                    &binaries.kube_proxy,
                )
                .await?,
            );
        }
        Ok(node)
    }

    /// The Node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's InternalIP: the host's address on the pod bridge, where
    /// pods reach the host.
    pub fn internal_ip(&self) -> Ipv4Addr {
        self.gateway
    }

    /// The pods' subnet (`10.214.<N>.0/24`).
    pub fn pod_subnet(&self) -> String {
        let [a, b] = SUBNET_PREFIX;
        format!("{a}.{b}.{}.0/24", self.slot.index)
    }

    /// Where pods on this node reach the API server: a relay on the host's
    /// bridge address to the API server's loopback port.
    pub fn api_server_for_pods(&self) -> Option<SocketAddr> {
        self.relay.as_ref().map(Relay::addr)
    }

    /// The kubeconfig at `kubeconfig` (one of the control plane's) as a pod
    /// on this node uses it: the API server at the relay
    /// ([`api_server_for_pods`](Self::api_server_for_pods)), its certificate
    /// checked against the name `kubernetes.default.svc`, the CA inline.
    pub fn pod_kubeconfig(&self, kubeconfig: &Path) -> Result<String> {
        let relay = self
            .api_server_for_pods()
            .context("the node has no relay to the API server")?;
        let mut config: Value = serde_json::from_slice(
            &fs::read(kubeconfig).with_context(|| format!("reading {}", kubeconfig.display()))?,
        )
        .with_context(|| format!("parsing {}", kubeconfig.display()))?;
        for cluster in config["clusters"]
            .as_array_mut()
            .context("a kubeconfig without clusters")?
        {
            let cluster = &mut cluster["cluster"];
            let ca_path = cluster["certificate-authority"]
                .as_str()
                .context("a cluster without certificate-authority")?
                .to_string();
            let ca = fs::read(&ca_path).with_context(|| format!("reading {ca_path}"))?;
            *cluster = json!({
                "server": format!("https://{relay}"),
                "tls-server-name": "kubernetes.default.svc",
                // base64, as ByteString serializes.
                "certificate-authority-data": k8s_openapi::ByteString(ca),
            });
        }
        Ok(serde_json::to_string_pretty(&config)?)
    }

    /// Lets the node pull from `host` (`127.0.0.1:PORT`, a
    /// [`LocalRegistry`](crate::LocalRegistry)) over plain HTTP: a
    /// `hosts.toml` containerd reads at every pull.
    pub fn trust_registry(&self, host: &str) -> Result<()> {
        let dir = self.dir.join("certs.d").join(host);
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        fs::write(
            dir.join("hosts.toml"),
            format!(
                "server = \"http://{host}\"\n\n[host.\"http://{host}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
            ),
        )
        .with_context(|| format!("writing {}/hosts.toml", dir.display()))
    }

    /// The host PID of the init process of container `container_id` (a
    /// container status's `containerID`, with or without `containerd://`):
    /// what the runtime really started, to read from `/proc`.
    pub fn container_pid(&self, container_id: &str) -> Result<u32> {
        let id = container_id
            .strip_prefix("containerd://")
            .unwrap_or(container_id);
        let path = self.runc_root().join(id).join("state.json");
        let state: Value = serde_json::from_slice(
            &fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
        )?;
        state["init_process_pid"]
            .as_u64()
            .and_then(|pid| u32::try_from(pid).ok())
            .with_context(|| format!("no init_process_pid in {}", path.display()))
    }

    /// The node's directory (containerd's and the kubelet's files and logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last lines of the kubelet's and containerd's logs.
    pub fn log_tails(&self) -> String {
        let tail = |child: &Option<ManagedChild>| {
            child
                .as_ref()
                .map(ManagedChild::log_tail)
                .unwrap_or_default()
        };
        let services = self
            .services
            .as_ref()
            .map(ServiceProxy::log_tails)
            .unwrap_or_default();
        format!(
            "kubelet:\n{}\ncontainerd:\n{}\n{services}",
            tail(&self.kubelet),
            tail(&self.containerd)
        )
    }

    fn runc_root(&self) -> PathBuf {
        runc_root(&self.dir)
    }

    fn make_bridge(&self) -> Result<()> {
        let address = format!("{}/24", self.gateway);
        ip(&["link", "add", &self.bridge, "type", "bridge"])?;
        ip(&["addr", "add", &address, "dev", &self.bridge])?;
        ip(&["link", "set", &self.bridge, "up"])
    }

    async fn start_containerd(&mut self) -> Result<()> {
        let dir = &self.dir;
        for sub in ["root", "state", "certs.d", "net.d", "cni", "runc", "opt"] {
            fs::create_dir_all(dir.join(sub))?;
        }
        let subnet = self.pod_subnet();
        let conflist = json!({
            "cniVersion": "1.0.0",
            "name": "real-node",
            "plugins": [{
                "type": "bridge",
                "bridge": self.bridge,
                // The bridge has its address already; no IP forwarding is
                // turned on for the whole host: pods reach the host's
                // address on their own link.
                "isGateway": false,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "dataDir": dir.join("cni"),
                    "ranges": [[{"subnet": subnet, "gateway": self.gateway.to_string()}]],
                    "routes": [{"dst": "0.0.0.0/0", "gw": self.gateway.to_string()}],
                },
            }],
        });
        fs::write(
            dir.join("net.d/10-real-node.conflist"),
            serde_json::to_vec_pretty(&conflist)?,
        )?;
        let config = containerd_config(dir, &self.socket);
        let config_path = dir.join("containerd.toml");
        fs::write(&config_path, config)?;
        let mut containerd = ManagedChild::spawn(
            "containerd",
            Path::new("containerd"),
            &["--config".into(), config_path.display().to_string()],
            &dir.join("containerd.log"),
        )?;
        let deadline = Instant::now() + CONTAINERD_TIMEOUT;
        loop {
            containerd.check_running()?;
            if self.socket.exists() && self.ctr(&["version"]).is_ok() {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "containerd did not answer on {} within {CONTAINERD_TIMEOUT:?}:\n{}",
                    self.socket.display(),
                    containerd.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.containerd = Some(containerd);
        Ok(())
    }

    /// `ctr` against this node's containerd, in the CRI's namespace.
    fn ctr(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", "k8s.io"])
            .args(args)
            .output()
            .context("running ctr")?;
        if !out.status.success() {
            bail!(
                "ctr {} failed with {}: {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn import_sandbox_image(&self) -> Result<()> {
        let archive = self.dir.join("sandbox-image.tar");
        fs::write(&archive, sandbox_image_archive()?)?;
        self.ctr(&["images", "import", &archive.display().to_string()])?;
        Ok(())
    }

    fn start_kubelet(&mut self, binary: &Path, kubeconfig: &Path, cp: &ControlPlane) -> Result<()> {
        let dir = &self.dir;
        let [port, healthz_port] = free_ports()?;
        let config = json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.gateway.to_string(),
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz_port,
            "containerRuntimeEndpoint": format!("unix://{}", self.socket.display()),
            "imageServiceEndpoint": format!("unix://{}", self.socket.display()),
            // The host has cgroup v1 controllers (v2 only at
            // /sys/fs/cgroup/unified) and no systemd.
            "failCgroupV1": false,
            "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": false,
            "enforceNodeAllocatable": [],
            "failSwapOn": false,
            // The host's firewall is not the kubelet's.
            "makeIPTablesUtilChains": false,
            "podLogsDir": dir.join("pod-logs"),
            "volumePluginDir": dir.join("volume-plugins"),
            // Pods get no DNS: none runs here.
            "resolvConf": "",
            "registerWithTaints": [{"key": REAL_NODE_TAINT, "value": "true", "effect": "NoSchedule"}],
            // The API server is known by its client certificate; anyone else
            // is asked about with a SubjectAccessReview.
            "authentication": {
                "anonymous": {"enabled": false},
                "webhook": {"enabled": true},
                "x509": {"clientCAFile": cp.dir().join("ca.crt")},
            },
            "authorization": {"mode": "Webhook"},
            // The disk is shared with every other test and build: the
            // default thresholds (imagefs below 15 %) would evict pods
            // for what others write.
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": false,
            "syncFrequency": "10s",
            "nodeStatusUpdateFrequency": "5s",
        });
        let config_path = dir.join("kubelet.json");
        fs::write(&config_path, serde_json::to_vec_pretty(&config)?)?;
        let args = vec![
            format!("--config={}", config_path.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--root-dir={}", dir.join("kubelet").display()),
            format!("--hostname-override={}", self.name),
            format!("--node-ip={}", self.gateway),
            format!("--node-labels={REAL_NODE_LABEL}=true"),
            "--v=1".into(),
        ];
        self.kubelet = Some(ManagedChild::spawn(
            "kubelet",
            binary,
            &args,
            &dir.join("kubelet.log"),
        )?);
        Ok(())
    }

    async fn wait_ready(&mut self, admin: &kube::Client) -> Result<()> {
        let nodes: kube::Api<Node> = kube::Api::all(admin.clone());
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            for child in [&mut self.kubelet, &mut self.containerd]
                .into_iter()
                .flatten()
            {
                child.check_running()?;
            }
            let ready = nodes.get_opt(&self.name).await?.is_some_and(|node| {
                node.status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            });
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "Node {} not Ready within {READY_TIMEOUT:?}:\n{}",
                    self.name,
                    self.log_tails()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "testenv: test failed; the real node's logs are in {}; last lines:\n{}",
                self.dir.display(),
                self.log_tails()
            );
        }
        self.relay = None;
        // kube-proxy's rules leave the host before the pods they point at.
        self.services = None;
        // No kubelet restarts what is killed next.
        self.kubelet = None;
        // Containers first (their shims report to a live containerd), then
        // the shims, then containerd.
        stop_containers(&self.dir, &self.socket);
        self.containerd = None;
        teardown(&self.dir, &self.bridge, &self.socket);
        self.slot.release();
    }
}

/// Fails, saying what to install, when something the node needs is missing.
fn check_prerequisites() -> Result<()> {
    // SAFETY: geteuid has no preconditions and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        bail!("a real node needs root (containerd, runc, mounts, a bridge)");
    }
    if std::env::consts::ARCH != "x86_64" {
        bail!("a real node runs on x86-64 only (its sandbox program and node-holder's image are)");
    }
    for program in ["containerd", "ctr", "runc", "ip"] {
        let found = std::env::var_os("PATH").is_some_and(|path| {
            std::env::split_paths(&path).any(|dir| dir.join(program).is_file())
        });
        if !found {
            bail!(
                "a real node needs `{program}` on PATH: apt-get install containerd runc containernetworking-plugins iproute2"
            );
        }
    }
    for plugin in ["bridge", "host-local", "loopback"] {
        let path = Path::new(CNI_BIN_DIR).join(plugin);
        if !path.is_file() {
            bail!(
                "a real node needs the CNI plugin {}: apt-get install containernetworking-plugins",
                path.display()
            );
        }
    }
    Ok(())
}

/// The ClusterRoleBinding that gives every kubelet (`system:nodes`) the
/// `system:node` ClusterRole, which the API server has but binds to no one.
fn node_binding() -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "testenv:real-nodes"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}],
    })
}

fn url_port(url: &str) -> Result<u16> {
    url.rsplit(':')
        .next()
        .and_then(|port| port.trim_end_matches('/').parse().ok())
        .with_context(|| format!("no port in {url}"))
}

fn runc_root(dir: &Path) -> PathBuf {
    // The runc shim keeps each containerd namespace's containers under
    // `<Root>/<namespace>`.
    dir.join("runc").join("k8s.io")
}

/// containerd's configuration: everything of its own under `dir`.
fn containerd_config(dir: &Path, socket: &Path) -> String {
    let d = |sub: &str| dir.join(sub).display().to_string();
    let socket = socket.display();
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{SANDBOX_IMAGE}"
  # This machine refuses a negative oom_score_adj (the sandbox's -998): runc
  # would fail with "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  disable_apparmor = true
  # Not /var/run/netns: everything the node mounts is under its directory.
  netns_mounts_under_state_dir = true

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc}"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{net_d}"

  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{certs_d}"
"#,
        root = d("root"),
        state = d("state"),
        opt = d("opt"),
        runc = d("runc"),
        net_d = d("net.d"),
        certs_d = d("certs.d"),
    )
}

/// A static x86-64 Linux program that calls pause(2) forever: the sandbox's
/// only process, which holds the pod's namespaces until it is killed. An ELF
/// header, one loadable segment, and 9 bytes of code.
fn pause_program() -> Vec<u8> {
    const BASE: u64 = 0x40_0000;
    const HEADER: u16 = 64;
    const SEGMENT_HEADER: u16 = 56;
    // loop: mov eax, 34 (pause); syscall; jmp loop
    const CODE: [u8; 9] = [0xb8, 0x22, 0, 0, 0, 0x0f, 0x05, 0xeb, 0xf7];
    let size = u64::from(HEADER + SEGMENT_HEADER) + CODE.len() as u64;
    let mut elf = Vec::with_capacity(size as usize);
    // e_ident: magic, 64-bit, little-endian, version 1, System V ABI.
    elf.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
    elf.extend_from_slice(&[0; 8]);
    elf.extend_from_slice(&2u16.to_le_bytes()); // e_type: executable
    elf.extend_from_slice(&0x3eu16.to_le_bytes()); // e_machine: x86-64
    elf.extend_from_slice(&1u32.to_le_bytes()); // e_version
    elf.extend_from_slice(&(BASE + u64::from(HEADER + SEGMENT_HEADER)).to_le_bytes()); // e_entry
    elf.extend_from_slice(&u64::from(HEADER).to_le_bytes()); // e_phoff
    elf.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
    elf.extend_from_slice(&0u32.to_le_bytes()); // e_flags
    elf.extend_from_slice(&HEADER.to_le_bytes()); // e_ehsize
    elf.extend_from_slice(&SEGMENT_HEADER.to_le_bytes()); // e_phentsize
    elf.extend_from_slice(&1u16.to_le_bytes()); // e_phnum
    elf.extend_from_slice(&[0; 6]); // e_shentsize, e_shnum, e_shstrndx
    // The one segment: the whole file, loaded read + execute at BASE.
    elf.extend_from_slice(&1u32.to_le_bytes()); // p_type: PT_LOAD
    elf.extend_from_slice(&5u32.to_le_bytes()); // p_flags: R + X
    elf.extend_from_slice(&0u64.to_le_bytes()); // p_offset
    elf.extend_from_slice(&BASE.to_le_bytes()); // p_vaddr
    elf.extend_from_slice(&BASE.to_le_bytes()); // p_paddr
    elf.extend_from_slice(&size.to_le_bytes()); // p_filesz
    elf.extend_from_slice(&size.to_le_bytes()); // p_memsz
    elf.extend_from_slice(&0x1000u64.to_le_bytes()); // p_align
    elf.extend_from_slice(&CODE);
    elf
}

/// [`SANDBOX_IMAGE`] as an OCI image layout in a tar archive, as `ctr
/// images import` takes it: one uncompressed layer holding `/pause`, run as
/// 65535 like the upstream pause image.
fn sandbox_image_archive() -> Result<Vec<u8>> {
    let digest = |data: &[u8]| format!("sha256:{:x}", Sha256::digest(data));
    let layer = tar_archive(&[("pause", &pause_program(), 0o755)])?;
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [digest(&layer)]},
    }))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(&config), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest(&layer), "size": layer.len()}],
    }))?;
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest(&manifest),
            "size": manifest.len(),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": SANDBOX_IMAGE},
        }],
    }))?;
    let blob = |data: &[u8]| format!("blobs/sha256/{:x}", Sha256::digest(data));
    let (layer_path, config_path, manifest_path) = (blob(&layer), blob(&config), blob(&manifest));
    tar_archive(&[
        ("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#, 0o644),
        ("index.json", &index, 0o644),
        (&layer_path, &layer, 0o644),
        (&config_path, &config, 0o644),
        (&manifest_path, &manifest, 0o644),
    ])
}

/// A tar archive of regular files (path, contents, mode), every time the epoch.
fn tar_archive(files: &[(&str, &[u8], u32)]) -> Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    for (path, data, mode) in files {
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(*mode);
        header.set_mtime(0);
        header.set_size(data.len() as u64);
        tar.append_data(&mut header, path, *data)
            .with_context(|| format!("adding {path} to an archive"))?;
    }
    Ok(tar.into_inner()?)
}

/// Runs `ip` with `args`; fails with its error output.
fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running `ip` (iproute2)")?;
    if !out.status.success() {
        bail!(
            "`ip {}` failed with {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Stops what runs for the node whose directory is `dir` and containerd
/// `socket`, whatever became of the kubelet and containerd: SIGKILLs and
/// deletes every container of its runc root (`runc delete` also removes their
/// cgroups), SIGKILLs the shims and removes the sockets they leave.
fn stop_containers(dir: &Path, socket: &Path) {
    let root = runc_root(dir);
    let ids: Vec<std::ffi::OsString> = fs::read_dir(&root)
        .map(|entries| entries.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    kill_containers(&root, &ids);
    for id in kill_shims(socket) {
        let _ = fs::remove_file(shim_socket(socket, &id));
    }
}

/// SIGKILLs and deletes the containers `ids` of the runc root `root`.
fn kill_containers(root: &Path, ids: &[std::ffi::OsString]) {
    for id in ids {
        let runc = |args: &[&str]| {
            let _ = Command::new("runc")
                .arg("--root")
                .arg(root)
                .args(args)
                .arg(id)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        };
        runc(&["kill"]);
        runc(&["delete", "--force"]);
    }
}

/// SIGKILLs the containerd shims started for the containerd at `socket`
/// (their command line names it: `-address <socket>`), which outlive
/// containerd otherwise; the ids (`-id <id>`) of those killed.
fn kill_shims(socket: &Path) -> Vec<std::ffi::OsString> {
    use std::os::unix::ffi::OsStrExt;
    let socket = socket.as_os_str().as_encoded_bytes();
    let mut killed = Vec::new();
    let Ok(processes) = fs::read_dir("/proc") else {
        return killed;
    };
    for process in processes.flatten() {
        let Some(pid) = process
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = fs::read(process.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let is_shim = args
            .first()
            .is_some_and(|program| program.ends_with(b"containerd-shim-runc-v2"));
        let ours = args
            .windows(2)
            .any(|pair| pair[0] == b"-address" && pair[1] == socket);
        if is_shim && ours {
            // SAFETY: kill has no memory effects; the pid was just read.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            if let Some(pair) = args.windows(2).find(|pair| pair[0] == b"-id") {
                killed.push(std::ffi::OsStr::from_bytes(pair[1]).to_os_string());
            }
        }
    }
    killed
}

/// Where containerd 1.6's runc shim for sandbox (or container) `id` listens:
/// `/run/containerd/s/<sha256 of "<containerd socket>/k8s.io/<id>">`. A shim
/// that was SIGKILLed leaves it behind.
fn shim_socket(socket: &Path, id: &std::ffi::OsStr) -> PathBuf {
    let address = socket.join("k8s.io").join(id);
    let digest = Sha256::digest(address.as_os_str().as_encoded_bytes());
    PathBuf::from(format!("/run/containerd/s/{digest:x}"))
}

/// What is left once the processes are gone: the mounts under `dir`
/// (container root filesystems, /dev/shm, network namespaces, the kubelet's
/// own bind mount and its pods' volumes), the bridge, the directory. Nothing
/// is touched under a directory that is not a node's
/// (`<temp>/node-holder-controlplane-*/<name>`).
fn teardown(dir: &Path, bridge: &str, socket: &Path) {
    if !is_node_dir(dir) {
        return;
    }
    stop_containers(dir, socket);
    unmount_under(dir);
    let _ = Command::new("ip")
        .args(["link", "del", bridge])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    let _ = fs::remove_dir_all(dir);
}

/// Whether `dir` is where a node lives: `<...>/node-holder-controlplane-*/<name>`,
/// absolute, without `..`.
fn is_node_dir(dir: &Path) -> bool {
    use std::path::Component;
    dir.components()
        .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && dir.is_absolute()
        && dir.file_name().is_some()
        && dir
            .parent()
            .and_then(Path::file_name)
            .is_some_and(|parent| {
                parent
                    .to_string_lossy()
                    .starts_with("node-holder-controlplane-")
            })
}

/// Unmounts (lazily) every mount point at or under `dir`, deepest first.
fn unmount_under(dir: &Path) {
    use std::os::unix::ffi::OsStrExt;
    // A mount can hide another at the same place: a few rounds.
    for _ in 0..4 {
        let mut points = mount_points_under(dir);
        if points.is_empty() {
            return;
        }
        points.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
        for point in points {
            let Ok(path) = std::ffi::CString::new(point.as_os_str().as_bytes()) else {
                continue;
            };
            // SAFETY: a NUL-terminated path that lives across the call.
            unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// The mount points at or under `dir`, from /proc/self/mountinfo (its fifth
/// field, with spaces and the like escaped as octal).
fn mount_points_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|point| PathBuf::from(unescape_mount_point(point)))
        .filter(|point| point.starts_with(dir))
        .collect()
}

fn unescape_mount_point(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|digits| bytes[i] == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d)));
        if let Some(digits) = octal {
            out.push(
                digits
                    .iter()
                    .fold(0u8, |n, d| n.wrapping_mul(8).wrapping_add(d - b'0')),
            );
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One of [`SLOTS`] real nodes on this machine: its bridge and subnet, held
/// under a file lock that dies with the process. The lock file names the
/// directory of the node that holds the slot until its teardown is done.
struct Slot {
    index: u8,
    lock: File,
}

impl Slot {
    /// The first slot no process holds and no interface uses; the remains of
    /// a node whose process died without its teardown are cleaned first.
    fn acquire() -> Result<Slot> {
        for index in 0..SLOTS {
            let path = std::env::temp_dir().join(format!("testenv-real-node-{index}.lock"));
            let mut lock = OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .open(&path)
                .with_context(|| format!("opening {}", path.display()))?;
            match lock.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => continue,
                Err(std::fs::TryLockError::Error(err)) => {
                    return Err(err).with_context(|| format!("locking {}", path.display()));
                }
            }
            let mut previous = String::new();
            lock.read_to_string(&mut previous)?;
            let bridge = format!("{BRIDGE_PREFIX}{index}");
            if !previous.trim().is_empty() {
                let dir = PathBuf::from(previous.trim());
                teardown(&dir, &bridge, &dir.join("containerd.sock"));
            }
            let slot = Slot { index, lock };
            slot.clear()?;
            if subnet_in_use(index)? {
                continue;
            }
            return Ok(slot);
        }
        bail!("all {SLOTS} real-node slots are taken (or their subnets 10.214.N.0/24 are in use)")
    }

    /// Notes `dir` as the slot's node, for a later cleanup if this process
    /// dies before its teardown.
    fn record(&self, dir: &Path) -> Result<()> {
        let mut lock = &self.lock;
        lock.set_len(0)?;
        lock.rewind()?;
        lock.write_all(dir.as_os_str().as_encoded_bytes())?;
        Ok(())
    }

    fn clear(&self) -> Result<()> {
        self.lock.set_len(0)?;
        Ok(())
    }

    /// The node's teardown is done: the slot is free.
    fn release(&self) {
        let _ = self.clear();
        let _ = self.lock.unlock();
    }
}

/// Whether an interface of the host has an address in slot `index`'s subnet.
fn subnet_in_use(index: u8) -> Result<bool> {
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .context("running `ip -o -4 addr show`")?;
    let prefix = format!("{}.{}.{index}.", SUBNET_PREFIX[0], SUBNET_PREFIX[1]);
    Ok(String::from_utf8_lossy(&out.stdout).lines().any(|line| {
        let mut words = line.split_whitespace();
        words.any(|w| w == "inet") && words.next().is_some_and(|a| a.starts_with(&prefix))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_program_is_a_whole_elf_file() {
        let elf = pause_program();
        assert_eq!(elf.len(), 129);
        assert_eq!(&elf[..4], b"\x7fELF");
        // e_entry points at the code, right after the two headers.
        assert_eq!(
            u64::from_le_bytes(elf[24..32].try_into().unwrap()),
            0x40_0078
        );
    }

    #[test]
    fn mount_points_unescape_as_the_kernel_escapes_them() {
        assert_eq!(unescape_mount_point(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape_mount_point(r"/tmp/plain"), "/tmp/plain");
        assert_eq!(unescape_mount_point(r"/tmp/end\"), r"/tmp/end\");
    }

    #[test]
    fn a_shim_socket_is_named_as_containerd_names_it() {
        // sha256("/tmp/d/containerd.sock/k8s.io/abc"), as containerd 1.6.20
        // names it (checked against a running node's /run/containerd/s).
        assert_eq!(
            shim_socket(
                Path::new("/tmp/d/containerd.sock"),
                std::ffi::OsStr::new("abc")
            ),
            Path::new(
                "/run/containerd/s/6aca19d8cfe2cc8496cbf620c4ac76932689ca5f9c961d20d301fa2aa00a3b63"
            )
        );
    }

    #[test]
    fn only_a_nodes_directory_is_torn_down() {
        assert!(is_node_dir(Path::new(
            "/tmp/node-holder-controlplane-AbC123/real-node-0"
        )));
        for dir in [
            "/",
            "/tmp",
            "/tmp/node-holder-controlplane-AbC123",
            "node-holder-controlplane-AbC123/real-node-0",
            "/tmp/node-holder-controlplane-AbC123/..",
            "/tmp/other/real-node-0",
        ] {
            assert!(!is_node_dir(Path::new(dir)), "{dir}");
        }
    }

    #[test]
    fn the_api_server_port_is_read_from_its_url() {
        assert_eq!(url_port("https://127.0.0.1:36929").unwrap(), 36929);
        assert!(url_port("https://127.0.0.1").is_err());
    }
}
