//! A real Kubernetes control plane on loopback for node-holder's tests and demo.
//!
//! [`ControlPlane::start`] runs the upstream etcd and kube-apiserver built from
//! the pins in `controlplane/go.mod` on free loopback ports, in a temporary
//! directory, with:
//! - secure serving from a freshly generated CA;
//! - two identities from a token file: an admin (`system:masters`) and
//!   node-holder's restricted identity, which looks to RBAC exactly like the
//!   ServiceAccount `node-holder/node-holder` (no permissions unless bound);
//! - RBAC authorization, an audit log written with `docs/audit-policy.yaml`,
//!   and aggregator routing so that Service-routed webhooks reach endpoints.
//!
//! Every process it starts dies with it: on drop (also while a test panics) and,
//! through `PR_SET_PDEATHSIG`, when the owning process dies without unwinding.

mod binaries;
pub mod certs;
mod karpenter;
mod kubelet;
pub mod metrics;
pub mod netns;
mod ports;
mod process;
mod registry;
mod services;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::config::{KubeConfigOptions, Kubeconfig};
use rcgen::{BasicConstraints, CertificateParams, DnType, KeyPair};
use serde_json::{Value, json};
use tempfile::TempDir;

pub use binaries::{Binaries, ensure_built, kubernetes_version, module_dir};
pub use binaries::{
    CertManagerBinaries, ClusterBinaries, GoTool, InstallTools, OHA_VERSION, cert_manager_crds,
    cert_manager_module_dir, cert_manager_source, ensure_cert_manager_built, ensure_cluster_built,
    ensure_helm_built, ensure_install_tools, ensure_kubectl_built, ensure_oha_installed,
    ensure_promtool_built, ensure_tools_built, helm_module_dir, karpenter_module_dir,
    karpenter_version, kwok_module_dir, module_source, prometheus_operator_crds, required_version,
    tool_module_dir,
};
pub use binaries::{
    KubeComponents, RealNodeBinaries, ensure_kube_components_built, ensure_kubelet_built,
    ensure_real_node_built, kubelet_module_dir,
};
pub use binaries::{ensure_actionlint_built, ensure_crane_built};
pub use karpenter::{
    Autoscaler, ClusterOptions, Disruption, INSTANCE_TYPE, KarpenterCluster, NODE_CLASS, NODE_POOL,
    POD_CPU, filler_cronjob, filler_deployment, filler_job, filler_pod, in_pool,
    install_karpenter_crds, node_claims, node_pool_object, node_pools,
};
pub use kubelet::{REAL_NODE_LABEL, REAL_NODE_TAINT, RealNode, SANDBOX_IMAGE};
pub use ports::free_port;
use ports::free_ports;
pub use process::ManagedChild;
pub use registry::LocalRegistry;
pub use services::tracked_connection;

/// The namespace node-holder's restricted identity belongs to.
pub const NODE_HOLDER_NAMESPACE: &str = "node-holder";
/// The user name the API server sees for node-holder's restricted identity.
pub const NODE_HOLDER_USER: &str = "system:serviceaccount:node-holder:node-holder";
/// The admin's user name.
pub const ADMIN_USER: &str = "testenv-admin";
/// The autoscaler's user name (also `system:masters`: Karpenter is not under
/// test), so the audit log tells its requests from the admin's.
pub const AUTOSCALER_USER: &str = "karpenter";

const AUDIT_POLICY: &str = include_str!("../../docs/audit-policy.yaml");
const NODE_HOLDER_RBAC: &str = include_str!("../../webhook-config/rbac.yaml");
const LOCAL_WEBHOOK: &str = include_str!("../../webhook-config/webhook-local.yaml");
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The kube-apiserver flag (for [`ControlPlane::start_with_args`]) that makes
/// it call a webhook or an aggregated API through its Service's ClusterIP, as
/// in a cluster, rather than straight at an endpoint of its EndpointSlices
/// (what the test control plane does by default, where nothing routes
/// ClusterIPs). With a [`RealNode::join_with_services`] kube-proxy routes
/// them.
pub const CLUSTER_IP_ROUTING: &str = "--enable-aggregator-routing=false";

/// The kube-apiserver flag (for [`ControlPlane::start_with_args`]) that keeps
/// the `ServiceAccount` admission plugin on (the test control plane turns it
/// off by default): every pod gets its ServiceAccount's token, projected by
/// the kubelet through TokenRequest, the namespace's `kube-root-ca.crt` and
/// its namespace, as in a cluster. For a cluster where a controller-manager
/// makes `default` ServiceAccounts and publishes `kube-root-ca.crt`, as
/// [`RealNode::join_with_services`] runs it; pods in a namespace without
/// them are refused.
pub const SERVICE_ACCOUNTS: &str = "--enable-admission-plugins=ServiceAccount";

/// The `kubernetes` Service's ClusterIP (the first of the control plane's
/// Service range, `10.0.0.0/24`): the API server's serving certificate
/// names it, as a cluster's does, for pods that reach the API server there.
pub const KUBERNETES_SERVICE_IP: &str = "10.0.0.1";

/// A running etcd + kube-apiserver pair. Dropping it stops both and removes
/// their files.
pub struct ControlPlane {
    // Field order is drop order: the API server stops before etcd, and the
    // directory goes last.
    apiserver: ManagedChild,
    etcd: ManagedChild,
    url: String,
    admin_kubeconfig: PathBuf,
    node_holder_kubeconfig: PathBuf,
    autoscaler_kubeconfig: PathBuf,
    audit_log: PathBuf,
    /// How the API server was started, to start it again.
    apiserver_command: (PathBuf, Vec<String>),
    restarts: u32,
    dir: TempDir,
}

impl ControlPlane {
    /// Builds the binaries if needed, starts etcd and kube-apiserver, and waits
    /// until the API server reports `/readyz`.
    pub async fn start() -> Result<Self> {
        Self::start_with_args(&[]).await
    }

    /// [`start`](Self::start) with `extra` kube-apiserver flags (an admission
    /// configuration file, an etcd compaction interval, ...).
    pub async fn start_with_args(extra: &[String]) -> Result<Self> {
        let binaries = tokio::task::spawn_blocking(ensure_built)
            .await
            .context("control-plane build task")??;
        // A free port can be taken by someone else between our probe and the
        // child's bind; a second try with new ports covers that race.
        match Self::start_with(&binaries, extra).await {
            Ok(cp) => Ok(cp),
            Err(first) if format!("{first:#}").contains("address already in use") => {
                Self::start_with(&binaries, extra).await
            }
            Err(first) => Err(first),
        }
    }

    async fn start_with(binaries: &Binaries, extra: &[String]) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("node-holder-controlplane-")
            .tempdir()
            .context("creating the control plane's directory")?;
        let root = dir.path();
        let files = write_files(root)?;

        let [etcd_client, etcd_peer, apiserver_port] = free_ports()?;
        let etcd_url = format!("http://127.0.0.1:{etcd_client}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        let etcd = ManagedChild::spawn(
            "etcd",
            &binaries.etcd,
            &[
                "--name=testenv".into(),
                format!("--data-dir={}", root.join("etcd").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=testenv={peer_url}"),
                // Durability is worthless for a throw-away store; speed is not.
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
            ],
            &root.join("etcd.log"),
        )?;

        let audit_log = root.join("audit.log");
        let p = |name: &str| root.join(name).display().to_string();
        let mut apiserver_args: Vec<String> = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={apiserver_port}"),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            format!("--token-auth-file={}", p("tokens.csv")),
            "--authorization-mode=RBAC".into(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            // Loopback endpoints for `kubernetes` are invalid.
            "--endpoint-reconciler-type=none".into(),
            format!("--audit-policy-file={}", p("audit-policy.yaml")),
            format!("--audit-log-path={}", audit_log.display()),
            // One file however long the run: the log rotates at 100 MB by
            // default, and `audit_events` reads this file only (a 50,000-node
            // bench writes more).
            "--audit-log-maxsize=100000".into(),
            "--enable-aggregator-routing=true".into(),
            "--profiling=false".into(),
            // How it reaches a real kubelet (logs, exec, port-forward): with a
            // client certificate of its own, at the node's InternalIP (a real
            // node's host name resolves nowhere).
            format!(
                "--kubelet-client-certificate={}",
                p("apiserver-kubelet-client.crt")
            ),
            format!("--kubelet-client-key={}", p("apiserver-kubelet-client.key")),
            "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
        ];
        // No controller-manager runs: nothing would publish `kube-root-ca.crt`
        // or make the namespaces' `default` ServiceAccounts, and pods would
        // be refused. On only when asked for ([`SERVICE_ACCOUNTS`]).
        if !extra.iter().any(|arg| arg == SERVICE_ACCOUNTS) {
            apiserver_args.push("--disable-admission-plugins=ServiceAccount".into());
        }
        apiserver_args.extend_from_slice(extra);
        let apiserver = ManagedChild::spawn(
            "kube-apiserver",
            &binaries.kube_apiserver,
            &apiserver_args,
            &apiserver_log(root, 0),
        )?;

        let url = format!("https://127.0.0.1:{apiserver_port}");
        let admin_kubeconfig = root.join("admin.kubeconfig");
        let node_holder_kubeconfig = root.join("node-holder.kubeconfig");
        let autoscaler_kubeconfig = root.join("autoscaler.kubeconfig");
        write_kubeconfig(
            &admin_kubeconfig,
            &url,
            &files.ca,
            "admin",
            &files.admin_token,
        )?;
        write_kubeconfig(
            &node_holder_kubeconfig,
            &url,
            &files.ca,
            "node-holder",
            &files.node_holder_token,
        )?;
        write_kubeconfig(
            &autoscaler_kubeconfig,
            &url,
            &files.ca,
            AUTOSCALER_USER,
            &files.autoscaler_token,
        )?;

        let mut cp = ControlPlane {
            apiserver,
            etcd,
            url,
            admin_kubeconfig,
            node_holder_kubeconfig,
            autoscaler_kubeconfig,
            audit_log,
            apiserver_command: (binaries.kube_apiserver.clone(), apiserver_args),
            restarts: 0,
            dir,
        };
        cp.wait_ready().await?;
        Ok(cp)
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let client = self.admin_client().await?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.etcd.check_running()?;
            self.apiserver.check_running()?;
            let request = http_get("/readyz")?;
            let last_error = match client.request_text(request).await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                Ok(body) => body,
                Err(err) => err.to_string(),
            };
            if Instant::now() > deadline {
                bail!(
                    "kube-apiserver not ready after {READY_TIMEOUT:?}: {last_error}\n{}",
                    self.apiserver.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills the API server (SIGKILL, as a crash), keeps it down for
    /// `down_for`, then starts it again on the same port with the same flags
    /// and etcd data, and waits until it is ready.
    pub async fn restart_apiserver(&mut self, down_for: Duration) -> Result<()> {
        self.apiserver.kill();
        tokio::time::sleep(down_for).await;
        self.restarts += 1;
        let log = apiserver_log(self.dir.path(), self.restarts);
        let (program, args) = &self.apiserver_command;
        self.apiserver = ManagedChild::spawn("kube-apiserver", program, args, &log)?;
        self.wait_ready().await
    }

    /// The API server's base URL (`https://127.0.0.1:PORT`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Kubeconfig of the admin identity (`system:masters`).
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// Kubeconfig of node-holder's restricted identity ([`NODE_HOLDER_USER`]).
    pub fn node_holder_kubeconfig(&self) -> &Path {
        &self.node_holder_kubeconfig
    }

    /// Kubeconfig of the autoscaler's identity ([`AUTOSCALER_USER`], in
    /// `system:masters`).
    pub fn autoscaler_kubeconfig(&self) -> &Path {
        &self.autoscaler_kubeconfig
    }

    /// Process ids of etcd and kube-apiserver.
    pub fn pids(&self) -> [u32; 2] {
        [self.etcd.id(), self.apiserver.id()]
    }

    /// The directory holding the control plane's files and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A client acting as the admin.
    pub async fn admin_client(&self) -> Result<kube::Client> {
        client_from_kubeconfig(&self.admin_kubeconfig).await
    }

    /// A client acting as node-holder's restricted identity.
    pub async fn node_holder_client(&self) -> Result<kube::Client> {
        client_from_kubeconfig(&self.node_holder_kubeconfig).await
    }

    /// The audit log file (JSON lines, `audit.k8s.io/v1` events).
    pub fn audit_log(&self) -> &Path {
        &self.audit_log
    }

    /// Every audit event written so far. A last line without its newline is
    /// one the API server is still writing: it is left for the next read.
    pub fn audit_events(&self) -> Result<Vec<Value>> {
        let bytes = match fs::read(&self.audit_log) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(err) => return Err(err).context("reading the audit log"),
        };
        let complete = bytes.iter().rposition(|&b| b == b'\n').unwrap_or(0);
        std::str::from_utf8(&bytes[..complete])
            .context("the audit log is not UTF-8")?
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| serde_json::from_str(line).context("parsing an audit event"))
            .collect()
    }

    /// The lines of the API server's logs (every start's) that `keep`
    /// keeps: its own word for what happened, such as why it failed a
    /// webhook call open (`Failed calling webhook, failing open ...`).
    pub fn apiserver_log_lines(&self, keep: impl Fn(&str) -> bool) -> Vec<String> {
        let mut lines = Vec::new();
        for restart in 0..=self.restarts {
            let log = apiserver_log(self.dir.path(), restart);
            let text = fs::read_to_string(log).unwrap_or_default();
            lines.extend(text.lines().filter(|l| keep(l)).map(str::to_owned));
        }
        lines
    }

    /// Waits (up to 10 s) for the audit events that match `predicate`. The API
    /// server writes the `ResponseComplete` event after it answers, so an event
    /// can trail the response it describes.
    pub async fn wait_for_audit_events(
        &self,
        predicate: impl Fn(&Value) -> bool,
    ) -> Result<Vec<Value>> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let matching: Vec<Value> = self
                .audit_events()?
                .into_iter()
                .filter(|e| predicate(e))
                .collect();
            if !matching.is_empty() {
                return Ok(matching);
            }
            if Instant::now() > deadline {
                bail!("no matching audit event in {}", self.audit_log.display());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// node-holder's namespace and exactly the RBAC of
    /// `webhook-config/rbac.yaml`, which binds node-holder's restricted
    /// identity ([`NODE_HOLDER_USER`]). Safe to call again.
    pub async fn install_node_holder_rbac(&self) -> Result<()> {
        let client = self.admin_client().await?;
        apply_manifests(
            &client,
            &format!(
                "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NODE_HOLDER_NAMESPACE}\n"
            ),
        )
        .await?;
        apply_manifests(&client, NODE_HOLDER_RBAC).await
    }

    /// Writes a kubeconfig at `path` for `user` in `group`, who presents a
    /// client certificate signed by the control plane's CA (written beside
    /// the kubeconfig as `<path>.crt` and `<path>.key`): an identity the token
    /// file does not know, such as a kubelet's `system:node:<name>`.
    pub fn client_certificate_kubeconfig(
        &self,
        path: &Path,
        user: &str,
        group: &str,
    ) -> Result<()> {
        let root = self.dir.path();
        let ca_pem = fs::read_to_string(root.join("ca.crt")).context("reading ca.crt")?;
        let ca_key =
            KeyPair::from_pem(&fs::read_to_string(root.join("ca.key")).context("reading ca.key")?)?;
        let ca = rcgen::Issuer::from_ca_cert_pem(&ca_pem, ca_key)?;
        let (cert, key) = client_certificate(&ca, user, group)?;
        let cert_path = path.with_extension("crt");
        let key_path = path.with_extension("key");
        fs::write(&cert_path, cert).with_context(|| format!("writing {}", cert_path.display()))?;
        fs::write(&key_path, key).with_context(|| format!("writing {}", key_path.display()))?;
        let config = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "testenv", "cluster": {"server": self.url, "certificate-authority": root.join("ca.crt")}}],
            "users": [{"name": user, "user": {"client-certificate": cert_path, "client-key": key_path}}],
            "contexts": [{"name": user, "context": {"cluster": "testenv", "user": user}}],
            "current-context": user,
        });
        fs::write(path, serde_json::to_vec_pretty(&config)?)
            .with_context(|| format!("writing {}", path.display()))
    }

    /// Waits for the completed create of Node `name` in the audit log.
    pub async fn wait_for_node_create_event(&self, name: &str) -> Result<Value> {
        let mut events = self
            .wait_for_audit_events(|e| {
                e["verb"] == "create"
                    && e["objectRef"]["resource"] == "nodes"
                    && e["objectRef"]["name"] == name
                    && e["stage"] == "ResponseComplete"
            })
            .await?;
        Ok(events.swap_remove(0))
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "testenv: test failed; last lines of kube-apiserver's log:\n{}",
                self.apiserver.log_tail()
            );
        }
    }
}

struct Files {
    ca: PathBuf,
    admin_token: String,
    node_holder_token: String,
    autoscaler_token: String,
}

fn write_files(root: &Path) -> Result<Files> {
    // The CA's key stays beside it: a real node's kubelet gets a client
    // certificate signed with it (`client_certificate_kubeconfig`).
    let (ca, ca_key_pem) = certs::new_ca(
        "testenv control-plane CA",
        BasicConstraints::Unconstrained,
        None,
    )?;

    let serving_key = KeyPair::generate()?;
    let mut serving = CertificateParams::new(vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "kubernetes".to_string(),
        "kubernetes.default".to_string(),
        "kubernetes.default.svc".to_string(),
        "kubernetes.default.svc.cluster.local".to_string(),
        // In-cluster clients dial the `kubernetes` Service's ClusterIP
        // (KUBERNETES_SERVICE_HOST) and check this name.
        KUBERNETES_SERVICE_IP.to_string(),
    ])?;
    serving
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    let serving_cert = serving.signed_by(&serving_key, &ca)?;
    // The API server's identity towards kubelets; system:masters, so that a
    // kubelet's webhook authorization lets it read logs and exec.
    let (kubelet_client_cert, kubelet_client_key) =
        client_certificate(&ca, "kube-apiserver-kubelet-client", "system:masters")?;

    let admin_token = random_token()?;
    let node_holder_token = random_token()?;
    let autoscaler_token = random_token()?;
    // token,user,uid,"groups"
    let tokens = format!(
        "{admin_token},{ADMIN_USER},admin,\"system:masters\"\n\
         {node_holder_token},{NODE_HOLDER_USER},node-holder,\"system:serviceaccounts,system:serviceaccounts:{NODE_HOLDER_NAMESPACE}\"\n\
         {autoscaler_token},{AUTOSCALER_USER},autoscaler,\"system:masters\"\n"
    );

    let write = |name: &str, contents: &str| -> Result<()> {
        let path = root.join(name);
        fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))
    };
    write("ca.crt", &ca.pem())?;
    write("ca.key", &ca_key_pem)?;
    write("apiserver.crt", &serving_cert.pem())?;
    write("apiserver.key", &serving_key.serialize_pem())?;
    write("apiserver-kubelet-client.crt", &kubelet_client_cert)?;
    write("apiserver-kubelet-client.key", &kubelet_client_key)?;
    let service_account_key = KeyPair::generate()?;
    write("sa.key", &service_account_key.serialize_pem())?;
    write("sa.pub", &service_account_key.public_key_pem())?;
    write("tokens.csv", &tokens)?;
    write("audit-policy.yaml", AUDIT_POLICY)?;
    Ok(Files {
        ca: root.join("ca.crt"),
        admin_token,
        node_holder_token,
        autoscaler_token,
    })
}

/// A client certificate for `user` in `group` (its subject's CN and O, as
/// the API server reads them) signed by `ca`, and its key (PEM).
fn client_certificate(
    ca: &rcgen::Issuer<'_, KeyPair>,
    user: &str,
    group: &str,
) -> Result<(String, String)> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, user);
    params
        .distinguished_name
        .push(DnType::OrganizationName, group);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, ca)?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn write_kubeconfig(path: &Path, url: &str, ca: &Path, user: &str, token: &str) -> Result<()> {
    // JSON is YAML: kubectl and kube-rs read this as they read any kubeconfig.
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "testenv", "cluster": {"server": url, "certificate-authority": ca}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": "testenv", "user": user}}],
        "current-context": user,
    });
    fs::write(path, serde_json::to_vec_pretty(&config)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// `webhook-config/webhook-local.yaml`, the url-based registration of local
/// development, pointed at `https://127.0.0.1:{port}/mutate` and trusting
/// `ca_pem`.
pub fn local_webhook_configuration(
    port: u16,
    ca_pem: &[u8],
) -> Result<MutatingWebhookConfiguration> {
    let mut documents = parse_manifests(LOCAL_WEBHOOK)?;
    let mut config: MutatingWebhookConfiguration =
        serde_json::from_value(documents.remove(0)).context("webhook-local.yaml")?;
    for webhook in config.webhooks.iter_mut().flatten() {
        webhook.client_config.url = Some(format!("https://127.0.0.1:{port}/mutate"));
        webhook.client_config.ca_bundle = Some(k8s_openapi::ByteString(ca_pem.to_vec()));
    }
    Ok(config)
}

/// The API server's log of its start number `restart` (0: the first) in
/// the control plane's directory `dir`.
fn apiserver_log(dir: &Path, restart: u32) -> PathBuf {
    match restart {
        0 => dir.join("kube-apiserver.log"),
        n => dir.join(format!("kube-apiserver-{n}.log")),
    }
}

/// The objects of a multi-document YAML manifest.
pub fn parse_manifests(yaml: &str) -> Result<Vec<Value>> {
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(yaml).context("parsing a YAML manifest")?;
    Ok(documents.into_iter().filter(|d| !d.is_null()).collect())
}

/// Creates every object of a multi-document YAML manifest; objects that exist
/// already are left as they are.
pub async fn apply_manifests(client: &kube::Client, yaml: &str) -> Result<()> {
    use kube::api::{Api, DynamicObject, GroupVersionKind, PostParams};
    use kube::discovery::Scope;
    for document in parse_manifests(yaml)? {
        let object: DynamicObject =
            serde_json::from_value(document).context("a manifest object")?;
        let types = object
            .types
            .clone()
            .context("a manifest object without apiVersion and kind")?;
        let gvk = GroupVersionKind::try_from(&types)?;
        let (resource, capabilities) = kube::discovery::pinned_kind(client, &gvk)
            .await
            .with_context(|| format!("discovering {}", types.kind))?;
        let api: Api<DynamicObject> = match (&capabilities.scope, &object.metadata.namespace) {
            (Scope::Namespaced, Some(namespace)) => {
                Api::namespaced_with(client.clone(), namespace, &resource)
            }
            _ => Api::all_with(client.clone(), &resource),
        };
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(err) => {
                return Err(err).with_context(|| {
                    format!("creating {} {:?}", types.kind, object.metadata.name)
                });
            }
        }
    }
    Ok(())
}

/// A client for the kubeconfig at `path`.
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client> {
    let kubeconfig =
        Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .with_context(|| format!("loading {}", path.display()))?;
    // A test sees each answer as the API server gave it: kube's retry layer
    // would turn an eviction's 429 (a PodDisruptionBudget's no) into
    // minutes of silent retries.
    config.default_retry = false;
    kube::Client::try_from(config).context("building a client")
}

fn http_get(path: &str) -> Result<http::Request<Vec<u8>>> {
    http::Request::get(path)
        .body(Vec::new())
        .context("building a request")
}

fn random_token() -> Result<String> {
    let mut bytes = [0u8; 16];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .context("reading /dev/urandom")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The API of `object`'s kind, in its namespace when the kind is namespaced,
/// found by discovery (retried for up to 10 s, so that a freshly created
/// CustomResourceDefinition has time to be served).
async fn dynamic_api(
    client: &kube::Client,
    object: &kube::api::DynamicObject,
) -> Result<kube::Api<kube::api::DynamicObject>> {
    use kube::api::{Api, GroupVersionKind};
    use kube::discovery::Scope;
    let types = object
        .types
        .clone()
        .context("a manifest object without apiVersion and kind")?;
    let gvk = GroupVersionKind::try_from(&types)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let (resource, capabilities) = loop {
        match kube::discovery::pinned_kind(client, &gvk).await {
            Ok(found) => break found,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(err) => {
                return Err(err).with_context(|| format!("discovering {}", types.kind));
            }
        }
    };
    Ok(match (&capabilities.scope, &object.metadata.namespace) {
        (Scope::Namespaced, Some(namespace)) => {
            Api::namespaced_with(client.clone(), namespace, &resource)
        }
        _ => Api::all_with(client.clone(), &resource),
    })
}

/// Deletes every object in `objects` (JSON values of Kubernetes objects), in
/// the reverse order; objects already gone are fine.
pub async fn delete_objects(client: &kube::Client, objects: &[Value]) -> Result<()> {
    use kube::api::{DeleteParams, DynamicObject};
    for document in objects.iter().rev() {
        let object: DynamicObject =
            serde_json::from_value(document.clone()).context("a manifest object")?;
        let api = dynamic_api(client, &object).await?;
        let name = object.metadata.name.clone().unwrap_or_default();
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => return Err(err).with_context(|| format!("deleting {name}")),
        }
    }
    Ok(())
}

/// Creates every object in `objects` (JSON values of Kubernetes objects);
/// objects that exist already are left as they are.
pub async fn apply_objects(client: &kube::Client, objects: &[Value]) -> Result<()> {
    use kube::api::{DynamicObject, PostParams};
    for document in objects {
        let object: DynamicObject =
            serde_json::from_value(document.clone()).context("a manifest object")?;
        let api = dynamic_api(client, &object).await?;
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(err) => {
                return Err(err).with_context(|| {
                    format!("creating {:?} {:?}", object.types, object.metadata.name)
                });
            }
        }
    }
    Ok(())
}

/// Creates every object in `objects` as a server-side dry run (`?dryRun=All`):
/// the API server decodes, defaults, validates and admits each one, and
/// stores nothing. Fails on the first object it rejects.
pub async fn dry_run_objects(client: &kube::Client, objects: &[Value]) -> Result<()> {
    use kube::api::{DynamicObject, PostParams};
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    for document in objects {
        let object: DynamicObject =
            serde_json::from_value(document.clone()).context("a manifest object")?;
        let api = dynamic_api(client, &object).await?;
        api.create(&dry_run, &object).await.with_context(|| {
            format!(
                "the API server rejected {} {:?} (dry run)",
                object.types.as_ref().map_or("?", |t| t.kind.as_str()),
                object.metadata.name
            )
        })?;
    }
    Ok(())
}
