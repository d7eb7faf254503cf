//! Shared fixtures: node-holder running against a real control plane, called
//! by the API server through a real MutatingWebhookConfiguration over TLS.
#![allow(dead_code)] // each test binary uses a different part

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ObjectMeta, PostParams};
use tempfile::TempDir;
use testenv::ControlPlane;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const WEBHOOK_NAME: &str = "hold.node-holder.dev";

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `node-holder serve` process; killed on drop.
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
    }
}

impl Served {
    pub fn cert_dir(&self) -> PathBuf {
        self.certs.path().to_path_buf()
    }

    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.certs.path().join("ca.crt")).unwrap()
    }
}

/// Writes development certificates with the real `node-holder certs`.
pub fn make_certs(dir: &std::path::Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_node-holder"))
        .args(["certs", "--out-dir", dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts `node-holder serve` as node-holder's restricted identity.
pub async fn serve(cp: &ControlPlane, extra: &[&str]) -> Served {
    let certs = tempfile::tempdir().unwrap();
    make_certs(certs.path());
    let (webhook_port, admin_port) = (free_port(), free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_node-holder"))
        .args(["serve", "--log-format", "json"])
        .arg(format!("--webhook-addr=127.0.0.1:{webhook_port}"))
        .arg(format!("--admin-addr=127.0.0.1:{admin_port}"))
        .arg(format!(
            "--tls-cert-file={}",
            certs.path().join("tls.crt").display()
        ))
        .arg(format!(
            "--tls-key-file={}",
            certs.path().join("tls.key").display()
        ))
        .args(extra)
        .env("KUBECONFIG", cp.node_holder_kubeconfig())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("node-holder serve starts");
    let served = Served {
        child,
        webhook_port,
        admin_port,
        certs,
    };
    let mut served = served;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok((200, _)) = http_get(admin_port, "/readyz").await {
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

/// The url-based webhook configuration for Node CREATEs, as local development uses.
pub fn webhook_configuration(port: u16, ca_pem: Vec<u8>) -> MutatingWebhookConfiguration {
    MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some("node-holder".into()),
            ..ObjectMeta::default()
        },
        webhooks: Some(vec![MutatingWebhook {
            name: WEBHOOK_NAME.into(),
            admission_review_versions: vec!["v1".into()],
            client_config: WebhookClientConfig {
                url: Some(format!("https://127.0.0.1:{port}/mutate")),
                ca_bundle: Some(ByteString(ca_pem)),
                service: None,
            },
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec!["".into()]),
                api_versions: Some(vec!["v1".into()]),
                operations: Some(vec!["CREATE".into()]),
                resources: Some(vec!["nodes".into()]),
                scope: Some("Cluster".into()),
            }]),
            failure_policy: Some("Ignore".into()),
            side_effects: "None".into(),
            timeout_seconds: Some(5),
            reinvocation_policy: Some("IfNeeded".into()),
            ..MutatingWebhook::default()
        }]),
    }
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

/// As [`register_webhook`], probing with `probe`, a node in scope.
pub async fn register_webhook_probing(cp: &ControlPlane, served: &Served, probe: Node) {
    let client = cp.admin_client().await.unwrap();
    let configs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    configs
        .create(
            &PostParams::default(),
            &webhook_configuration(served.webhook_port, served.ca_pem()),
        )
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(client);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
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
