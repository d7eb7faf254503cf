//! Install fixtures shared by the chart tests (`tests/install*.rs`): the
//! pinned helm and the rendered chart, cert-manager's CRDs, and node-holder
//! run the way the chart's pod runs it: with the rendered arguments and
//! environment, inside a network namespace at a pod-like address that the API
//! server reaches through the chart's Service and an EndpointSlice.
#![allow(dead_code)] // each test binary uses a different part

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tempfile::TempDir;
use testenv::netns::{NetNs, Relay};
use testenv::{ControlPlane, ManagedChild};

use crate::node;

/// Release name and namespace: the ServiceAccount is then `node-holder` in
/// `node-holder`, the identity the test control plane gives node-holder.
pub const RELEASE: &str = "node-holder";
pub const NAMESPACE: &str = "node-holder";
/// The Service's DNS names, which the API server verifies the webhook's
/// certificate for.
pub const SERVICE_DNS_NAMES: [&str; 2] = [
    "node-holder.node-holder.svc",
    "node-holder.node-holder.svc.cluster.local",
];

/// The repository: the workspace root, above this crate.
pub fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The Dockerfile's instructions: its lines trimmed, without blank lines and
/// comments.
pub fn dockerfile_instructions() -> Vec<String> {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

pub fn chart() -> PathBuf {
    repo().join("chart")
}

/// The pinned helm, built once per pin (shared with every other test process
/// through testenv's lock), with its own empty home directories.
pub fn helm() -> Command {
    static HELM: OnceLock<(PathBuf, tempfile::TempDir)> = OnceLock::new();
    let (path, home) = HELM.get_or_init(|| {
        // What `cargo xtask test` prepares: helm and cert-manager's source.
        let tools = testenv::ensure_install_tools()
            .expect("helm builds from testenv/tools/helm, cert-manager's module downloads");
        (tools.helm, tempfile::tempdir().unwrap())
    });
    let mut cmd = Command::new(path);
    cmd.env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        // `helm template` needs no cluster: make sure it never finds one.
        .env("KUBECONFIG", home.path().join("no-kubeconfig"));
    cmd
}

/// Runs `.github/scripts/publish-chart.sh` (the release workflow's chart
/// step: `helm package` at `version`, `helm push` to `repository`,
/// `oci://HOST/PATH`) with the pinned helm and its homes, `push_flags` going
/// to `helm push`: its output, whose standard output names the pushed chart
/// by digest, `oci://HOST/PATH/node-holder@sha256:...`.
pub fn publish_chart(version: &str, repository: &str, push_flags: &[&str]) -> std::process::Output {
    let helm = helm();
    let mut command = Command::new(repo().join(".github/scripts/publish-chart.sh"));
    for (key, value) in helm.get_envs() {
        if let Some(value) = value {
            command.env(key, value);
        }
    }
    command
        .env("HELM", helm.get_program())
        .arg(version)
        .arg(repository)
        .args(push_flags)
        .output()
        .expect("publish-chart.sh runs")
}

/// The image the tests' releases name (the chart requires one): `args`
/// that set `image.repository` themselves win, as they come after it.
pub const IMAGE: &str = "--set=image.repository=node-holder";

/// `helm template RELEASE chart --namespace NAMESPACE` with `args`, as the
/// rendered objects, or helm's error.
pub fn try_template(args: &[&str]) -> Result<Vec<Value>, String> {
    let kube_version = testenv::kubernetes_version(&testenv::module_dir()).unwrap();
    let out = helm()
        .args(["template", RELEASE])
        .arg(chart())
        .args([
            "--namespace",
            NAMESPACE,
            "--kube-version",
            &kube_version,
            IMAGE,
        ])
        .args(args)
        .output()
        .expect("helm runs");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8(out.stdout).unwrap();
    Ok(testenv::parse_manifests(&text).unwrap())
}

pub fn template(args: &[&str]) -> Vec<Value> {
    try_template(args).unwrap_or_else(|err| panic!("helm template {args:?} failed:\n{err}"))
}

/// The objects Helm installs with the release (not its hooks: `helm test`'s
/// and the pre-delete cleanup's, which exist only while they run).
pub fn release_objects(objects: &[Value]) -> Vec<Value> {
    objects
        .iter()
        .filter(|o| o["metadata"]["annotations"]["helm.sh/hook"].is_null())
        .cloned()
        .collect()
}

/// Creates namespace `name` enforcing the Pod Security `level`
/// (`restricted`, `privileged`).
pub async fn create_namespace(client: &kube::Client, name: &str, level: &str) {
    let namespace = json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": level}},
    });
    testenv::apply_objects(client, &[namespace]).await.unwrap();
}

/// A Pod from the rendered Deployment's template in `namespace`, as the
/// ReplicaSet controller would create it.
pub fn pod_of(objects: &[Value], namespace: &str) -> Value {
    let template = &one(objects, "Deployment")["spec"]["template"];
    let mut metadata = template["metadata"].clone();
    metadata["name"] = json!("node-holder-pod");
    metadata["namespace"] = json!(namespace);
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]})
}

pub fn kind(object: &Value) -> &str {
    object["kind"].as_str().unwrap_or_default()
}

pub fn name(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

pub fn all_of<'a>(objects: &'a [Value], k: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| kind(o) == k).collect()
}

pub fn one<'a>(objects: &'a [Value], k: &str) -> &'a Value {
    let found = all_of(objects, k);
    assert_eq!(found.len(), 1, "exactly one {k} expected");
    found[0]
}

pub fn container(objects: &[Value]) -> &Value {
    let deployment = one(objects, "Deployment");
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(containers.len(), 1);
    &containers[0]
}

/// The Deployment's environment: literal values, and `fieldRef:<path>` for
/// values taken from the pod.
pub fn env_of(objects: &[Value]) -> BTreeMap<String, String> {
    container(objects)["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some(path) => format!("fieldRef:{path}"),
                None => e["value"].as_str().unwrap().to_string(),
            };
            (e["name"].as_str().unwrap().to_string(), value)
        })
        .collect()
}

/// The pod name the tests give the chart's pod (its host name, so its Lease
/// identity).
pub const POD_NAME: &str = "node-holder-5d8f7-abcde";

/// The container's arguments and environment as the kubelet would start it:
/// the pod's own fields (namespace, name) filled in, and `HOSTNAME`, which
/// the container runtime sets to the pod's name.
pub fn pod_command(objects: &[Value]) -> (Vec<String>, BTreeMap<String, String>) {
    let mut env = env_of(objects);
    for (var, value) in env.iter_mut() {
        match value.as_str() {
            "fieldRef:metadata.namespace" => *value = NAMESPACE.into(),
            "fieldRef:metadata.name" => *value = POD_NAME.into(),
            other => assert!(!other.starts_with("fieldRef:"), "{var}: {other}"),
        }
    }
    env.insert("HOSTNAME".into(), POD_NAME.into());
    let args = serde_json::from_value(container(objects)["args"].clone()).unwrap();
    (args, env)
}

/// Points the environment's certificate files, which the chart mounts from
/// the TLS Secret at `/etc/node-holder/tls/`, at `tls.crt` and `tls.key` in
/// `dir`.
pub fn use_cert_files(env: &mut BTreeMap<String, String>, dir: &Path) {
    for (var, file) in [
        ("NODE_HOLDER_TLS_CERT_FILE", "tls.crt"),
        ("NODE_HOLDER_TLS_KEY_FILE", "tls.key"),
    ] {
        assert_eq!(env[var], format!("/etc/node-holder/tls/{file}"));
        env.insert(var.into(), dir.join(file).display().to_string());
    }
}

/// Installs cert-manager's CRDs (from the pinned module's `deploy/crds`) and
/// waits until the API server serves them.
pub async fn install_cert_manager_crds(cp: &ControlPlane) {
    let names = install_crds(cp, testenv::cert_manager_crds).await;
    assert!(names.contains(&"certificates.cert-manager.io".to_string()));
    assert!(names.contains(&"issuers.cert-manager.io".to_string()));
}

/// Installs the Prometheus Operator's ServiceMonitor and PrometheusRule CRDs
/// (from the pinned module) and waits until the API server serves them.
pub async fn install_prometheus_operator_crds(cp: &ControlPlane) {
    let names = install_crds(cp, testenv::prometheus_operator_crds).await;
    assert!(names.contains(&"servicemonitors.monitoring.coreos.com".to_string()));
    assert!(names.contains(&"prometheusrules.monitoring.coreos.com".to_string()));
}

/// Applies the CRDs `crds` reads and waits until each is established;
/// returns their names.
async fn install_crds(cp: &ControlPlane, crds: fn() -> anyhow::Result<String>) -> Vec<String> {
    let client = cp.admin_client().await.unwrap();
    let crds = tokio::task::spawn_blocking(crds)
        .await
        .unwrap()
        .expect("CRDs from a pinned module");
    testenv::apply_manifests(&client, &crds).await.unwrap();
    let names: Vec<String> = testenv::parse_manifests(&crds)
        .unwrap()
        .iter()
        .map(|c| name(c).to_string())
        .collect();
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let deadline = Instant::now() + Duration::from_secs(30);
    for crd in &names {
        loop {
            let established = api.get(crd).await.unwrap().status.is_some_and(|s| {
                s.conditions
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
            if established {
                break;
            }
            assert!(Instant::now() < deadline, "{crd} never established");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    names
}

/// node-holder running as the chart's pod would: the rendered arguments and
/// environment (its addresses `0.0.0.0:8443` and `0.0.0.0:8080` included),
/// inside its own network namespace, as node-holder's restricted identity.
/// Killed, and the namespace deleted, on drop.
pub struct Pod {
    // Field order is drop order: the process dies before its namespace goes.
    child: ManagedChild,
    relay: Relay,
    netns: NetNs,
    dir: TempDir,
}

impl Pod {
    /// Starts node-holder in a new network namespace with the chart's
    /// `objects`' configuration and the certificate files in `cert_dir`. It
    /// reaches the API server through a relay on the host side of the pair
    /// (the API server listens on loopback only), verifying the API server's
    /// certificate for `localhost` as a pod verifies `kubernetes.default.svc`.
    pub async fn start(cp: &ControlPlane, objects: &[Value], cert_dir: &Path) -> Pod {
        let netns = NetNs::create().expect("a network namespace and veth pair (needs root)");
        let api_port: u16 = cp
            .url()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("the API server's port");
        let relay = Relay::start(
            SocketAddr::from((netns.host_addr(), 0)),
            SocketAddr::from(([127, 0, 0, 1], api_port)),
        )
        .await
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        let mut config: Value =
            serde_json::from_slice(&std::fs::read(cp.node_holder_kubeconfig()).unwrap()).unwrap();
        config["clusters"][0]["cluster"]["server"] = json!(format!("https://{}", relay.addr()));
        config["clusters"][0]["cluster"]["tls-server-name"] = json!("localhost");
        std::fs::write(&kubeconfig, serde_json::to_vec_pretty(&config).unwrap()).unwrap();

        let (args, mut env) = pod_command(objects);
        use_cert_files(&mut env, cert_dir);
        let mut command = netns.command(crate::node_holder_binary());
        for (var, _) in std::env::vars() {
            if var.starts_with("NODE_HOLDER_") {
                command.env_remove(var);
            }
        }
        command
            .args(&args)
            .envs(&env)
            .env("KUBECONFIG", &kubeconfig);
        let child = ManagedChild::spawn_command(
            "node-holder serve",
            command,
            &dir.path().join("serve.log"),
        )
        .unwrap();
        Pod {
            child,
            relay,
            netns,
            dir,
        }
    }

    /// The pod's address, the EndpointSlice's endpoint.
    pub fn ip(&self) -> std::net::Ipv4Addr {
        self.netns.ns_addr()
    }

    /// Everything node-holder has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default()
    }

    /// The JSON log lines so far, parsed.
    pub fn log_lines(&self) -> Vec<Value> {
        self.log()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// Fails with the end of node-holder's log if it has exited.
    pub fn check_running(&mut self) {
        if let Err(err) = self.child.check_running() {
            panic!("{err:#}");
        }
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "node-holder serve's log (in its namespace):\n{}",
                self.log()
            );
        }
    }
}

/// The EndpointSlice the endpoint controller would make for the chart's
/// Service with one ready pod at `ip`: the Service's named ports mapped to the
/// container's ports of the same names.
pub fn endpoint_slice(objects: &[Value], ip: std::net::Ipv4Addr) -> Value {
    let service = one(objects, "Service");
    let container_ports = container(objects)["ports"].as_array().unwrap();
    let ports: Vec<Value> = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|port| {
            let target = port["targetPort"].as_str().expect("a named targetPort");
            let container_port = container_ports
                .iter()
                .find(|p| p["name"] == target)
                .unwrap_or_else(|| panic!("no container port named {target}"));
            json!({
                "name": port["name"],
                "port": container_port["containerPort"],
                "protocol": "TCP",
            })
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": format!("{}-pod", name(service)),
            "namespace": NAMESPACE,
            "labels": {
                "kubernetes.io/service-name": name(service),
                "endpointslice.kubernetes.io/managed-by": "testenv",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{
            "addresses": [ip.to_string()],
            "conditions": {"ready": true, "serving": true, "terminating": false},
            "targetRef": {"kind": "Pod", "namespace": NAMESPACE, "name": POD_NAME},
        }],
        "ports": ports,
    })
}

/// Waits until the API server calls the webhook and it holds: a dry-run
/// create of a probe node comes back held. Fails early if node-holder exits.
pub async fn wait_until_the_webhook_holds(cp: &ControlPlane, pod: &mut Pod, limit: Duration) {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(cp.admin_client().await.unwrap());
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let deadline = Instant::now() + limit;
    loop {
        pod.check_running();
        let returned = nodes
            .create(&dry_run, &node("webhook-probe"))
            .await
            .unwrap();
        if crate::window::held(&returned) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the API server never had the webhook hold a node through the Service"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// cert-manager's controller and CA injector, running as the admin (the
/// tests do not install cert-manager's own RBAC). Killed on drop.
pub struct CertManager {
    controller: ManagedChild,
    cainjector: ManagedChild,
    dir: tempfile::TempDir,
}

impl CertManager {
    pub async fn start(cp: &ControlPlane) -> CertManager {
        let binaries = tokio::task::spawn_blocking(testenv::ensure_cert_manager_built)
            .await
            .unwrap()
            .expect("cert-manager builds from testenv/tools/cert-manager");
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = format!("--kubeconfig={}", cp.admin_kubeconfig().display());
        let spawn = |name: &'static str, program: &Path| {
            let mut command = std::process::Command::new(program);
            command.arg(&kubeconfig).arg("-v=2");
            ManagedChild::spawn_command(name, command, &dir.path().join(format!("{name}.log")))
                .unwrap()
        };
        let controller = spawn("cert-manager-controller", &binaries.controller);
        let cainjector = spawn("cert-manager-cainjector", &binaries.cainjector);
        CertManager {
            controller,
            cainjector,
            dir,
        }
    }

    pub fn check_running(&mut self) {
        for child in [&mut self.controller, &mut self.cainjector] {
            if let Err(err) = child.check_running() {
                panic!("{err:#}");
            }
        }
    }
}

impl Drop for CertManager {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for name in ["cert-manager-controller", "cert-manager-cainjector"] {
                let log = std::fs::read_to_string(self.dir.path().join(format!("{name}.log")))
                    .unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                eprintln!(
                    "{name}'s log (last lines):\n{}",
                    lines[lines.len().saturating_sub(40)..].join("\n")
                );
            }
        }
    }
}
