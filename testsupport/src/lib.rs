//! What node-holder's tests and benches share: node-holder running against a
//! real control plane (testenv), called by the API server through a real
//! MutatingWebhookConfiguration over TLS; the install (helm, manifests, a pod
//! network of its own) and the real Karpenter beside it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use tempfile::TempDir;
use testenv::ControlPlane;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub mod audit;
pub mod install;
pub mod karpenter;
pub mod policy;
pub mod window;
pub const WEBHOOK_NAME: &str = "hold.node-holder.dev";

/// The `node-holder` binary Cargo built beside the running test or bench:
/// `target/<profile>/node-holder`, while the test's own executable is in
/// `target/<profile>/deps/` (Cargo builds a package's binaries for its
/// integration tests and benches).
pub fn node_holder_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own executable");
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test executable is in target/<profile>/deps");
    let binary = profile.join("node-holder");
    assert!(
        binary.exists(),
        "{} is missing: run the tests through cargo",
        binary.display()
    );
    binary
}

/// `node-holder args` run as an operator runs it: the admin's kubeconfig.
pub fn operator(cp: &ControlPlane, args: &[&str]) -> std::process::Output {
    Command::new(node_holder_binary())
        .args(args)
        .env("KUBECONFIG", cp.admin_kubeconfig())
        .output()
        .expect("node-holder runs")
}

/// The standard output of a command that must have succeeded; else the test
/// fails, showing both streams.
pub fn succeeded(out: &std::process::Output) -> String {
    assert!(out.status.success(), "{}", output_report(out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn free_port() -> u16 {
    testenv::free_port().expect("a free loopback port")
}

/// A `node-holder serve` process; killed on drop. Its JSON log goes to a file
/// in its directory, printed when a test fails.
pub struct Served {
    pub child: Child,
    pub webhook_port: u16,
    pub admin_port: u16,
    pub certs: TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("node-holder serve's log:\n{}", self.log());
        }
    }
}

impl Served {
    pub fn cert_dir(&self) -> PathBuf {
        self.certs.path().to_path_buf()
    }

    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.certs.path().join("ca.crt")).unwrap()
    }

    /// Everything the process has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.certs.path().join("serve.log")).unwrap_or_default()
    }

    /// The JSON log lines so far, parsed.
    pub fn log_lines(&self) -> Vec<serde_json::Value> {
        self.log()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// Sends SIGTERM, as the kubelet does to a terminating pod.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

/// Writes throw-away certificates into `dir` ([`testenv::certs`]), the
/// serving one valid for localhost, 127.0.0.1 and the chart's Service in
/// node-holder's namespace.
pub fn make_certs(dir: &std::path::Path) {
    make_certs_for(dir, &["node-holder.node-holder.svc"]);
}

/// [`make_certs`], the serving certificate valid for `dns_names` besides
/// localhost and 127.0.0.1.
pub fn make_certs_for(dir: &std::path::Path, dns_names: &[&str]) {
    testenv::certs::make(dir, dns_names).unwrap();
}

/// Starts `node-holder serve` as node-holder's restricted identity, with the
/// RBAC of `webhook-config/rbac.yaml`.
pub async fn serve(cp: &ControlPlane, extra: &[&str]) -> Served {
    install_node_holder_rbac(cp).await;
    launch(cp, |command, at| serve_args(command, at, extra)).await
}

/// Starts `node-holder serve` with no API server behind it: its kubeconfig
/// points at a loopback port nobody listens on. For what happens on the
/// webhook port alone: the real binary, without the cost of etcd and a
/// kube-apiserver. It never turns ready (`/readyz` follows the API server),
/// so this waits for `/healthz`; its window task keeps retrying the Lease.
pub async fn serve_offline(extra: &[&str]) -> Served {
    serve_offline_with(extra, |_| {}).await
}

/// [`serve_offline`], with `configure` adding to the command (its
/// environment, say) after the arguments.
pub async fn serve_offline_with(extra: &[&str], configure: impl FnOnce(&mut Command)) -> Served {
    let dead_port = free_port();
    launch_with(
        |dir| {
            let kubeconfig = dir.join("offline.kubeconfig");
            std::fs::write(&kubeconfig, offline_kubeconfig(dead_port)).unwrap();
            kubeconfig
        },
        "/healthz",
        |command, at| {
            serve_args(command, at, extra);
            configure(command);
        },
    )
    .await
}

/// A kubeconfig for an API server at `port` on loopback that is not there.
fn offline_kubeconfig(port: u16) -> String {
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: offline\n\
         clusters: [{{name: offline, cluster: {{server: 'https://127.0.0.1:{port}', insecure-skip-tls-verify: true}}}}]\n\
         users: [{{name: offline, user: {{token: offline}}}}]\n\
         contexts: [{{name: offline, context: {{cluster: offline, user: offline}}}}]\n"
    )
}

/// `serve`'s arguments: JSON logs, loopback ports, the launch's certificates;
/// and a host name of its own, its name in the Lease (as each pod's is).
fn serve_args(command: &mut Command, at: &Listen, extra: &[&str]) {
    command
        .args(["serve", "--log-format", "json"])
        .env("HOSTNAME", format!("serve-{}", at.webhook_port))
        .arg(format!("--webhook-addr=127.0.0.1:{}", at.webhook_port))
        .arg(format!("--admin-addr=127.0.0.1:{}", at.admin_port))
        .arg(format!(
            "--tls-cert-file={}",
            at.cert_dir.join("tls.crt").display()
        ))
        .arg(format!(
            "--tls-key-file={}",
            at.cert_dir.join("tls.key").display()
        ))
        .args(extra);
}

/// Where a [`launch`]ed `node-holder serve` is to listen (loopback) and find
/// its certificates (`tls.crt`, `tls.key`, `ca.crt`).
pub struct Listen<'a> {
    pub webhook_port: u16,
    pub admin_port: u16,
    pub cert_dir: &'a Path,
}

/// Starts the node-holder binary as node-holder's restricted identity, with
/// fresh development certificates and two free ports, and waits until its
/// `/readyz` answers 200. `configure` gives it its arguments and environment
/// (the subcommand included); grants nothing.
pub async fn launch(cp: &ControlPlane, configure: impl FnOnce(&mut Command, &Listen)) -> Served {
    let kubeconfig = cp.node_holder_kubeconfig();
    launch_with(|_| kubeconfig.to_path_buf(), "/readyz", configure).await
}

/// [`launch`] with the kubeconfig `kubeconfig` makes (given the launch's
/// directory), waiting until `ready_path` on the admin port answers 200.
async fn launch_with(
    kubeconfig: impl FnOnce(&Path) -> std::path::PathBuf,
    ready_path: &str,
    configure: impl FnOnce(&mut Command, &Listen),
) -> Served {
    let certs = tempfile::tempdir().unwrap();
    let kubeconfig = kubeconfig(certs.path());
    make_certs(certs.path());
    let (webhook_port, admin_port) = (free_port(), free_port());
    let mut command = Command::new(node_holder_binary());
    configure(
        &mut command,
        &Listen {
            webhook_port,
            admin_port,
            cert_dir: certs.path(),
        },
    );
    let child = command
        .env("KUBECONFIG", kubeconfig)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(certs.path().join("serve.log")).unwrap())
        .spawn()
        .expect("node-holder serve starts");
    let mut served = Served {
        child,
        webhook_port,
        admin_port,
        certs,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok((200, _)) = http_get(admin_port, ready_path).await {
            return served;
        }
        if let Some(status) = served.child.try_wait().unwrap() {
            panic!("node-holder serve exited: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "node-holder serve never turned ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A plain HTTP/1.0 GET on loopback: (status, body).
pub async fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// `webhook-config/webhook-local.yaml` for the webhook on `port`.
pub fn webhook_configuration(port: u16, ca_pem: Vec<u8>) -> MutatingWebhookConfiguration {
    testenv::local_webhook_configuration(port, &ca_pem).unwrap()
}

/// Node `name` with `labels` and `annotations` (absent when empty).
pub fn node_with(name: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Node {
    let map = |pairs: &[(&str, &str)]| {
        (!pairs.is_empty()).then(|| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<std::collections::BTreeMap<_, _>>()
        })
    };
    let mut n = node(name);
    n.metadata.labels = map(labels);
    n.metadata.annotations = map(annotations);
    n
}

pub fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

/// Registers the webhook and waits until the API server calls it: a dry-run
/// create comes back held.
pub async fn register_webhook(cp: &ControlPlane, served: &Served) {
    register_webhook_probing(cp, served, node("webhook-probe")).await;
}

/// Creates the webhook configuration for `port` trusting `ca_pem`; returns
/// the admin's Node API and the parameters of a dry-run create, to probe with.
pub async fn create_webhook_configuration(
    cp: &ControlPlane,
    port: u16,
    ca_pem: Vec<u8>,
) -> (Api<Node>, PostParams) {
    let client = cp.admin_client().await.unwrap();
    let configs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    configs
        .create(&PostParams::default(), &webhook_configuration(port, ca_pem))
        .await
        .unwrap();
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    (Api::all(client), dry_run)
}

/// As [`register_webhook`], probing with `probe`, a node in scope.
pub async fn register_webhook_probing(cp: &ControlPlane, served: &Served, probe: Node) {
    let (nodes, dry_run) =
        create_webhook_configuration(cp, served.webhook_port, served.ca_pem()).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let returned = nodes.create(&dry_run, &probe).await.unwrap();
        if returned
            .metadata
            .annotations
            .is_some_and(|a| a.contains_key("karpenter.sh/do-not-disrupt"))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the API server never called the webhook"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A TLS client configuration that trusts `ca_pem` only and offers `alpn`.
pub fn tls_connector(ca_pem: &[u8], alpn: &[&str]) -> tokio_rustls::TlsConnector {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
}

/// A TLS connection to the webhook port, verified for `localhost`.
pub async fn tls_connect(
    served: &Served,
    alpn: &[&str],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", served.webhook_port))
        .await
        .unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    tls_connector(&served.ca_pem(), alpn)
        .connect(name, tcp)
        .await
        .expect("TLS handshake with the webhook")
}

/// A request to send to the webhook port.
pub fn request(
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> hyper::Request<http_body_util::Full<hyper::body::Bytes>> {
    let mut builder = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost");
    if let Some(content_type) = content_type {
        builder = builder.header("content-type", content_type);
    }
    builder
        .body(http_body_util::Full::new(hyper::body::Bytes::from(body)))
        .unwrap()
}

/// A response's status, headers and whole body.
pub struct Reply {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    async fn read(response: hyper::Response<hyper::body::Incoming>) -> Reply {
        use http_body_util::BodyExt;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        Reply {
            status,
            headers,
            body: body.to_vec(),
        }
    }
}

/// A keep-alive HTTP/1.1 connection to the webhook over TLS.
pub struct Http1 {
    sender: hyper::client::conn::http1::SendRequest<http_body_util::Full<hyper::body::Bytes>>,
    pub connection: tokio::task::JoinHandle<hyper::Result<()>>,
}

impl Http1 {
    pub async fn connect(served: &Served) -> Http1 {
        let tls = tls_connect(served, &["http/1.1"]).await;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .unwrap();
        Http1 {
            sender,
            connection: tokio::spawn(connection),
        }
    }

    /// Sends `request` on this connection.
    pub async fn send(
        &mut self,
        request: hyper::Request<http_body_util::Full<hyper::body::Bytes>>,
    ) -> hyper::Result<Reply> {
        self.sender.ready().await?;
        let response = self.sender.send_request(request).await?;
        Ok(Reply::read(response).await)
    }
}

/// One request on a fresh HTTP/1.1 TLS connection.
pub async fn https(
    served: &Served,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> Reply {
    Http1::connect(served)
        .await
        .send(request(method, path, content_type, body))
        .await
        .unwrap()
}

/// One request over h2 (ALPN-negotiated).
pub async fn https_h2(served: &Served, body: Vec<u8>) -> Reply {
    let tls = tls_connect(served, &["h2"]).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let mut request = request("POST", "/mutate", Some("application/json"), body);
    *request.uri_mut() = "https://localhost/mutate".parse().unwrap();
    let response = sender.send_request(request).await.unwrap();
    Reply::read(response).await
}

/// The 5.6 KB Node CREATE AdmissionReview of
/// `benches/fixtures/node-create-review.json` (a Karpenter-launched EC2 node)
/// as the API server sends it: compact JSON.
pub fn node_create_fixture() -> serde_json::Result<Vec<u8>> {
    let pretty = include_str!("../../benches/fixtures/node-create-review.json");
    let review: serde_json::Value = serde_json::from_str(pretty)?;
    serde_json::to_vec(&review)
}

/// A Node with only a name, as a review carries a new one.
pub fn node_object(name: &str) -> serde_json::Value {
    serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
}

/// The body of a Node CREATE review for `name`.
pub fn node_create(name: &str) -> Vec<u8> {
    serde_json::to_vec(&review("Node", "CREATE", node_object(name))).unwrap()
}

/// An AdmissionReview of `kind` (`operation`) as the API server sends it.
pub fn review(kind: &str, operation: &str, object: serde_json::Value) -> serde_json::Value {
    let (group, version, resource) = match kind {
        "Node" => ("", "v1", "nodes"),
        "Pod" => ("", "v1", "pods"),
        other => panic!("no review fixture for {other}"),
    };
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "requestKind": {"group": group, "version": version, "kind": kind},
            "requestResource": {"group": group, "version": version, "resource": resource},
            "name": object["metadata"]["name"],
            "operation": operation,
            "userInfo": {"username": "system:node:probe", "groups": ["system:nodes"]},
            "object": object,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
}

/// Whether the Events in `events` include, for each `(node, reason)` of
/// `wanted`, one of that reason regarding that node (what `kubectl describe
/// node` shows).
pub async fn has_node_events(events: &Api<Event>, wanted: &[(&str, &str)]) -> bool {
    let reasons: Vec<(String, String)> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| Some((e.regarding?.name?, e.reason?)))
        .collect();
    wanted
        .iter()
        .all(|(node, reason)| reasons.iter().any(|(n, r)| n == node && r == reason))
}

/// node-holder's namespace and exactly the RBAC of `webhook-config/rbac.yaml`,
/// bound to node-holder's restricted identity.
pub async fn install_node_holder_rbac(cp: &ControlPlane) {
    cp.install_node_holder_rbac().await.unwrap();
}

/// `webhook-config/rbac-{what}.yaml` (`schedules` for `--launch-cost`,
/// `warm` for `--warm-before-runs`):
/// what a mode needs beside `rbac.yaml`, bound to node-holder's restricted
/// identity.
pub async fn install_rbac_for(cp: &ControlPlane, what: &str) {
    let path = install::repo().join(format!("webhook-config/rbac-{what}.yaml"));
    let manifests = std::fs::read_to_string(&path).unwrap();
    let admin = cp.admin_client().await.unwrap();
    testenv::apply_manifests(&admin, &manifests).await.unwrap();
}

/// `node-holder serve` with certificate `cert`, key `key` and `extra` flags,
/// which must refuse to start (exit 1) before it needs a cluster. Its stderr.
pub fn refused_start(cert: &std::path::Path, key: &std::path::Path, extra: &[String]) -> String {
    let out = std::process::Command::new(node_holder_binary())
        .args([
            "serve",
            "--webhook-addr=127.0.0.1:0",
            "--admin-addr=127.0.0.1:0",
        ])
        .arg(format!("--tls-cert-file={}", cert.display()))
        .arg(format!("--tls-key-file={}", key.display()))
        .args(extra)
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    String::from_utf8(out.stderr).unwrap()
}

/// Cases of a fuzzing property test: `NODE_HOLDER_FUZZ_CASES` when set (the
/// documented million-case run), else `default` (the suite's).
pub fn fuzz_cases(default: u32) -> u32 {
    std::env::var("NODE_HOLDER_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// A command's standard output and error, one after the other.
pub fn output_text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A command's exit status, standard output and error, for a failure
/// message.
pub fn output_report(out: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
