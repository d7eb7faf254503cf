//! Services and workloads on the real node: kube-controller-manager,
//! kube-scheduler and kube-proxy, all from the control plane's own
//! `k8s.io/kubernetes` release, so that a ClusterIP Service whose endpoints
//! are pods of the real node is reachable from the host, where the API server
//! runs (a connection from the host goes through the nat table's OUTPUT chain,
//! where kube-proxy's rules DNAT the ClusterIP to a ready pod's address on the
//! node's bridge), pods reach the API server at the `kubernetes` Service, and
//! Deployments and Jobs run their pods there.
//!
//! - kube-controller-manager (as the admin, no leader election, no serving
//!   port) runs the controllers in [`CONTROLLERS`]: EndpointSlices from each
//!   Service's selector and its pods' readiness; Deployments, ReplicaSets and
//!   Jobs making pods, and the garbage collector deleting what their owners
//!   leave; the node lifecycle controller lifting the `not-ready` taint from
//!   the Ready node; the namespaces' `default` ServiceAccounts and their
//!   `kube-root-ca.crt` ConfigMap (the control plane's CA), which pods'
//!   projected ServiceAccount volumes mount (with a control plane started
//!   with [`SERVICE_ACCOUNTS`](crate::SERVICE_ACCOUNTS)); the disruption
//!   controller counting what each PodDisruptionBudget allows, which the
//!   Eviction API reads.
//! - kube-scheduler (as the admin) places pods that have no `nodeName`; pods
//!   that tolerate the real node's taint can land there.
//! - The `kubernetes` Service's EndpointSlice names the relay on the node's
//!   bridge address to the API server (the API server listens on loopback
//!   only, and publishes no endpoint of its own: `--endpoint-reconciler-type
//!   =none`): a pod dialling `KUBERNETES_SERVICE_HOST` (`10.0.0.1:443`)
//!   reaches the API server through kube-proxy's rules in the nat PREROUTING
//!   chain, as in-cluster clients do.
//! - kube-proxy in iptables mode (Debian's `iptables`, the nf_tables backend),
//!   as `system:kube-proxy` (a client certificate; the API server's bootstrap
//!   RBAC binds that user to `system:node-proxier`), for the node's name and
//!   address, with the node's pod subnet as the cluster's pod range. It
//!   leaves the host's sysctls as they are (no conntrack sizes or timeouts, no
//!   `route_localnet`), and serves NodePorts on the node's address only.
//!
//! kube-proxy's chains are the host's (`KUBE-SERVICES` and the rest, in the
//! host's nat and filter tables), and every test control plane hands out
//! ClusterIPs from the same range: one kube-proxy runs on the machine at a
//! time, under a machine-wide file lock. Its rules are removed
//! (`kube-proxy --cleanup`) when it stops, and before it starts (what a
//! process killed without its teardown left).

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::binaries::ensure_kube_components_built;
use crate::karpenter::start_kube_component;
use crate::{ControlPlane, ManagedChild, apply_objects, free_ports};

/// The controllers the real node's kube-controller-manager runs: see the
/// module's documentation.
const CONTROLLERS: &str = "endpointslice-controller,deployment-controller,\
replicaset-controller,job-controller,garbage-collector-controller,\
node-lifecycle-controller,serviceaccount-controller,\
root-ca-certificate-publisher-controller,disruption-controller";

/// How long kube-proxy may take for its first sync of the host's rules.
const SYNC_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a node may wait for another node's kube-proxy to stop.
const LOCK_TIMEOUT: Duration = Duration::from_secs(900);

/// kube-proxy, kube-controller-manager and kube-scheduler for one real node.
/// Dropping it stops them and removes kube-proxy's rules from the host.
pub(crate) struct ServiceProxy {
    kube_proxy: Option<ManagedChild>,
    controller_manager: Option<ManagedChild>,
    scheduler: Option<ManagedChild>,
    binary: PathBuf,
    dir: PathBuf,
    lock: File,
}

/// Where the real node's kube-proxy runs: its node's name, address and pod
/// subnet, where its pods reach the API server, and the directory for its
/// files.
pub(crate) struct ProxyNode<'a> {
    pub name: &'a str,
    pub address: Ipv4Addr,
    pub pod_subnet: &'a str,
    pub api_server_for_pods: SocketAddr,
    pub dir: &'a Path,
}

impl ServiceProxy {
    /// Takes the machine's kube-proxy lock, removes leftover rules, publishes
    /// the `kubernetes` Service's endpoint, starts kube-controller-manager,
    /// kube-scheduler and kube-proxy, and waits for kube-proxy's first sync.
    pub(crate) async fn start(
        cp: &ControlPlane,
        node: ProxyNode<'_>,
        kube_proxy: &Path,
    ) -> Result<Self> {
        check_prerequisites()?;
        let components = tokio::task::spawn_blocking(ensure_kube_components_built)
            .await
            .context("kube-controller-manager build task")??;
        let lock = tokio::task::spawn_blocking(machine_lock)
            .await
            .context("kube-proxy lock task")??;
        let mut proxy = ServiceProxy {
            kube_proxy: None,
            controller_manager: None,
            scheduler: None,
            binary: kube_proxy.to_path_buf(),
            dir: node.dir.to_path_buf(),
            lock,
        };
        proxy.cleanup()?;

        let admin = cp.admin_client().await?;
        apply_objects(&admin, &[kubernetes_endpoints(node.api_server_for_pods)]).await?;
        proxy.controller_manager = Some(start_kube_component(
            cp,
            "kube-controller-manager",
            &components.kube_controller_manager,
            &[
                format!("--controllers={CONTROLLERS}"),
                format!("--root-ca-file={}", cp.dir().join("ca.crt").display()),
                // A loaded 2-core machine must not turn the node NotReady
                // (and taint it) because one Lease renewal came late.
                "--node-monitor-grace-period=2m".into(),
            ],
        )?);
        proxy.scheduler = Some(start_kube_component(
            cp,
            "kube-scheduler",
            &components.kube_scheduler,
            &[],
        )?);

        let kubeconfig = node.dir.join("kube-proxy.kubeconfig");
        cp.client_certificate_kubeconfig(&kubeconfig, "system:kube-proxy", "system:kube-proxy")?;
        let [healthz_port, metrics_port] = free_ports()?;
        let config = json!({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": kubeconfig},
            "hostnameOverride": node.name,
            "bindAddress": node.address.to_string(),
            "healthzBindAddress": format!("127.0.0.1:{healthz_port}"),
            "metricsBindAddress": format!("127.0.0.1:{metrics_port}"),
            "mode": "iptables",
            // The cluster's pods: the one real node's.
            "clusterCIDR": node.pod_subnet,
            "detectLocalMode": "ClusterCIDR",
            // NodePorts on the node's address only, never on loopback (that
            // would turn on route_localnet for the whole host).
            "nodePortAddresses": ["primary"],
            "iptables": {"localhostNodePorts": false},
            // The host's conntrack table and timeouts are not kube-proxy's
            // to size here (0: leave as is).
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            // The sandbox refuses a negative oom_score_adj (kube-proxy's
            // default is -999).
            "oomScoreAdj": 0,
        });
        let config_path = node.dir.join("kube-proxy.json");
        fs::write(&config_path, serde_json::to_vec_pretty(&config)?)
            .with_context(|| format!("writing {}", config_path.display()))?;
        proxy.kube_proxy = Some(ManagedChild::spawn(
            "kube-proxy",
            kube_proxy,
            &[
                format!("--config={}", config_path.display()),
                "--v=2".into(),
            ],
            &node.dir.join("kube-proxy.log"),
        )?);
        proxy.wait_synced(metrics_port).await?;
        Ok(proxy)
    }

    /// The last lines of kube-proxy's, kube-controller-manager's and
    /// kube-scheduler's logs.
    pub(crate) fn log_tails(&self) -> String {
        let tail = |child: &Option<ManagedChild>| {
            child
                .as_ref()
                .map(ManagedChild::log_tail)
                .unwrap_or_default()
        };
        format!(
            "kube-proxy:\n{}\nkube-controller-manager:\n{}\nkube-scheduler:\n{}",
            tail(&self.kube_proxy),
            tail(&self.controller_manager),
            tail(&self.scheduler)
        )
    }

    /// Waits until kube-proxy has written the host's IPv4 rules once: its
    /// `kubeproxy_sync_proxy_rules_last_timestamp_seconds` is set.
    async fn wait_synced(&mut self, metrics_port: u16) -> Result<()> {
        let deadline = Instant::now() + SYNC_TIMEOUT;
        loop {
            for child in [
                &mut self.kube_proxy,
                &mut self.controller_manager,
                &mut self.scheduler,
            ]
            .into_iter()
            .flatten()
            {
                child.check_running()?;
            }
            let synced = tokio::task::spawn_blocking(move || last_sync(metrics_port))
                .await
                .context("kube-proxy metrics task")?;
            if synced.is_some_and(|seconds| seconds > 0.0) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "kube-proxy did not sync the host's rules within {SYNC_TIMEOUT:?}:\n{}",
                    self.log_tails()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `kube-proxy --cleanup`: removes kube-proxy's chains and rules (iptables,
    /// IPVS, nftables) from the host; its output goes to
    /// `kube-proxy-cleanup.log`.
    fn cleanup(&self) -> Result<()> {
        let log_path = self.dir.join("kube-proxy-cleanup.log");
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let status = Command::new(&self.binary)
            .arg("--cleanup")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log.try_clone()?)
            .status()
            .context("running kube-proxy --cleanup")?;
        let _ = writeln!(log, "kube-proxy --cleanup: {status}");
        if !status.success() {
            bail!(
                "`kube-proxy --cleanup` failed with {status}: {}",
                fs::read_to_string(&log_path).unwrap_or_default().trim()
            );
        }
        for iptables in ["iptables", "ip6tables"] {
            remove_empty_firewall_chain(iptables);
        }
        Ok(())
    }
}

impl Drop for ServiceProxy {
    fn drop(&mut self) {
        self.kube_proxy = None;
        self.scheduler = None;
        self.controller_manager = None;
        if let Err(err) = self.cleanup() {
            eprintln!("testenv: {err:#}");
        }
        let _ = self.lock.unlock();
    }
}

/// The `kubernetes` Service's EndpointSlice (in `default`), naming `relay`
/// (the API server's relay on the node's bridge): what a cluster's API server
/// publishes of itself, so that pods reach it at the Service's ClusterIP.
fn kubernetes_endpoints(relay: SocketAddr) -> serde_json::Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kubernetes",
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": "kubernetes"},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [relay.ip().to_string()], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "port": relay.port(), "protocol": "TCP"}],
    })
}

/// Removes the `KUBE-FIREWALL` chain of the filter table and its jumps from
/// INPUT and OUTPUT when the chain is empty: kube-proxy makes it (a copy of
/// the kubelet's, which the real node's kubelet does not make), fills it only
/// for NodePorts on loopback (off here), and `--cleanup` keeps it.
fn remove_empty_firewall_chain(iptables: &str) {
    let run = |args: &[&str]| {
        Command::new(iptables)
            .args(["-w", "5"])
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let Some(rules) = run(&["-t", "filter", "-S", "KUBE-FIREWALL"]) else {
        return;
    };
    if rules.lines().any(|line| line.starts_with("-A ")) {
        return;
    }
    for chain in ["INPUT", "OUTPUT"] {
        while run(&["-t", "filter", "-D", chain, "-j", "KUBE-FIREWALL"]).is_some() {}
    }
    run(&["-t", "filter", "-X", "KUBE-FIREWALL"]);
}

/// The machine-wide kube-proxy lock, waited for up to [`LOCK_TIMEOUT`].
fn machine_lock() -> Result<File> {
    let path = std::env::temp_dir().join("testenv-kube-proxy.lock");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let deadline = Instant::now() + LOCK_TIMEOUT;
    loop {
        match lock.try_lock() {
            Ok(()) => return Ok(lock),
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                bail!(
                    "another real node's kube-proxy held {} for {LOCK_TIMEOUT:?}",
                    path.display()
                )
            }
            Err(std::fs::TryLockError::Error(err)) => {
                return Err(err).with_context(|| format!("locking {}", path.display()));
            }
        }
    }
}

/// kube-proxy's `kubeproxy_sync_proxy_rules_last_timestamp_seconds`, read
/// from its metrics on loopback `port`; `None` while it does not answer.
fn last_sync(port: u16) -> Option<f64> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).ok()?;
    metric_value(
        &body,
        r#"kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}"#,
    )
}

/// The value of sample `name` (with its labels, as written) in Prometheus
/// text `body`.
fn metric_value(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (metric, value) = line.split_once(' ')?;
            (metric == name).then(|| value.trim().parse().ok())?
        })
}

/// Fails, saying what to install, when kube-proxy's tools are missing.
fn check_prerequisites() -> Result<()> {
    for program in ["iptables", "iptables-save", "iptables-restore"] {
        let found = std::env::var_os("PATH").is_some_and(|path| {
            std::env::split_paths(&path).any(|dir| dir.join(program).is_file())
        });
        if !found {
            bail!("kube-proxy needs `{program}` on PATH: apt-get install iptables");
        }
    }
    Ok(())
}

/// A line of /proc/net/nf_conntrack as (original destination and port, reply
/// source and port); empty strings when the line has no ports. What the
/// tests read to tell that a connection went through kube-proxy.
pub fn tracked_connection<'a>(line: &'a str) -> ([&'a str; 2], [&'a str; 2]) {
    let values = |key: &str| -> Vec<&'a str> {
        line.split_whitespace()
            .filter_map(|word| word.strip_prefix(key))
            .collect()
    };
    let (dst, dport, src, sport) = (
        values("dst="),
        values("dport="),
        values("src="),
        values("sport="),
    );
    let at = |list: &Vec<&'a str>, i: usize| list.get(i).copied().unwrap_or_default();
    ([at(&dst, 0), at(&dport, 0)], [at(&src, 1), at(&sport, 1)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_sync_is_read_from_the_metrics_text() {
        let body = "# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds ...\n\
                    # TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge\n\
                    kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv6\"} 3\n\
                    kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} 1.7642e+09\n";
        assert_eq!(
            metric_value(
                body,
                r#"kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}"#
            ),
            Some(1.7642e9)
        );
        assert_eq!(metric_value("", "x"), None);
    }
}
