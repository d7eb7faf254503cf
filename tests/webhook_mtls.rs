//! Client-certificate authentication of the API server to the webhook
//! (`--client-ca-file`), against the real kube-apiserver: its
//! AdmissionConfiguration gives MutatingAdmissionWebhook a kubeconfig whose
//! user, named for the webhook's `host:port`, carries a client certificate.
//! Direct clients prove what everyone else meets: no certificate, or one from
//! another CA, ends the handshake, and both are counted.

use testsupport as common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::window::{HOLD, eventually, eventually_logging, held};
use common::{Served, create_webhook_configuration, http_get, make_certs, node, serve};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::json;
use testenv::ControlPlane;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;

/// A client CA and one client certificate it signed, as PEM files in a
/// directory: `ca.crt`, `client.crt`, `client.key`.
struct ClientPki {
    dir: PathBuf,
}

impl ClientPki {
    /// A new CA named `name` and a client certificate (`clientAuth` only)
    /// for `common_name`, written into `parent/name`.
    fn new(parent: &Path, name: &str, common_name: &str) -> ClientPki {
        let dir = parent.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let now = time::OffsetDateTime::now_utc();
        let (not_before, not_after) = (
            now - time::Duration::hours(1),
            now + time::Duration::days(1),
        );
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.distinguished_name
            .push(DnType::CommonName, format!("{name} client CA"));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        ca.not_before = not_before;
        ca.not_after = not_after;
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();

        let key = KeyPair::generate().unwrap();
        let mut leaf = CertificateParams::new(Vec::<String>::new()).unwrap();
        leaf.distinguished_name
            .push(DnType::CommonName, common_name);
        leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        leaf.not_before = not_before;
        leaf.not_after = not_after;
        let leaf = leaf.signed_by(&key, &ca).unwrap();

        std::fs::write(dir.join("ca.crt"), ca.pem()).unwrap();
        std::fs::write(dir.join("client.crt"), leaf.pem()).unwrap();
        std::fs::write(dir.join("client.key"), key.serialize_pem()).unwrap();
        ClientPki { dir }
    }

    fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    fn cert(&self) -> PathBuf {
        self.dir.join("client.crt")
    }

    fn key(&self) -> PathBuf {
        self.dir.join("client.key")
    }
}

/// Replaces `to` with `from`'s bytes in one rename, as a Secret volume
/// rotates: a poller never reads half a file.
fn install(from: &Path, to: &Path) {
    let partial = to.with_extension("partial");
    std::fs::copy(from, &partial).unwrap();
    std::fs::rename(&partial, to).unwrap();
}

/// A TLS client trusting the webhook's serving CA that presents `client`'s
/// certificate, or none.
fn connector(served: &Served, client: Option<&ClientPki>) -> TlsConnector {
    let Some(client) = client else {
        return common::tls_connector(&served.ca_pem(), &["http/1.1"]);
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&served.ca_pem()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let chain = CertificateDer::pem_file_iter(client.cert())
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(client.key()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    TlsConnector::from(Arc::new(config))
}

/// Posts a Node CREATE review on a fresh connection made by `connector`:
/// the HTTP status, or how the connection failed. In TLS 1.3 the client
/// finishes its side of the handshake before the server has checked its
/// certificate, so a refusal arrives as an alert on the first read.
async fn post_review(served: &Served, connector: &TlsConnector) -> Result<u16, String> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", served.webhook_port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let body = common::node_create("direct");
    let mut message = format!(
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    message.extend(body);
    // A refused client can see its write fail (the server has closed) before
    // it reads the alert that says why: read anyway, and report the alert.
    let written = tls.write_all(&message).await;
    let mut response = Vec::new();
    match (tls.read_to_end(&mut response).await, written) {
        (Ok(_), Ok(())) => {}
        // The server's close after its answer, without close_notify, is no
        // failure: the answer is complete.
        (Err(e), Ok(()))
            if e.kind() == std::io::ErrorKind::UnexpectedEof && !response.is_empty() => {}
        (Err(e), _) => return Err(format!("exchange: {e}")),
        (Ok(_), Err(e)) => return Err(format!("exchange: {e}")),
    }
    let text = String::from_utf8_lossy(&response);
    text.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no HTTP status in {text:?}"))
}

/// The value of the handshake-failure counter for `reason` (0 when absent).
async fn handshake_errors(served: &Served, reason: &str) -> u64 {
    let (status, metrics) = http_get(served.admin_port, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    let prefix = format!("node_holder_tls_handshake_errors_total{{reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// The kubeconfig MutatingAdmissionWebhook reads: one user, `user_name`,
/// with the client certificate of `client`. JSON is YAML, which it reads.
fn write_admission_kubeconfig(path: &Path, user_name: &str, client: &ClientPki) {
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "users": [{
            "name": user_name,
            "user": {
                "client-certificate": client.cert(),
                "client-key": client.key(),
            }
        }]
    });
    std::fs::write(path, serde_json::to_vec_pretty(&kubeconfig).unwrap()).unwrap();
}

/// Dry-run creates `probe` until the API server's answer satisfies `want`.
async fn probe_until(nodes: &Api<Node>, what: &str, want: impl Fn(&Node) -> bool) {
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let returned = nodes.create(&dry_run, &node("mtls-probe")).await.unwrap();
        if want(&returned) {
            return;
        }
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn the_api_server_presenting_its_client_certificate_gets_nodes_held_and_without_it_fails_open()
 {
    let dir = tempfile::tempdir().unwrap();
    let apiserver = ClientPki::new(dir.path(), "apiserver", "kube-apiserver-webhook-client");
    let kubeconfig = dir.path().join("admission-kubeconfig.yaml");
    // First a user for another host (the chart's Service, as a cluster would
    // name it): the API server then calls the loopback webhook without a
    // client certificate.
    write_admission_kubeconfig(&kubeconfig, "node-holder.node-holder.svc:443", &apiserver);
    let admission = dir.path().join("admission.yaml");
    let config = json!({
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [{
            "name": "MutatingAdmissionWebhook",
            "configuration": {
                "apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "WebhookAdmissionConfiguration",
                "kubeConfigFile": kubeconfig,
            }
        }]
    });
    std::fs::write(&admission, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    let mut cp = ControlPlane::start_with_args(&[format!(
        "--admission-control-config-file={}",
        admission.display()
    )])
    .await
    .unwrap();
    let client_ca = format!("--client-ca-file={}", apiserver.ca().display());
    let served = serve(&cp, &[&client_ca, "--log-level=debug"]).await;
    let (nodes, _) = create_webhook_configuration(&cp, served.webhook_port, served.ca_pem()).await;

    // Without a client certificate the webhook refuses the API server's
    // calls in the handshake; failurePolicy Ignore lets the node register
    // unheld, and the refusals are counted.
    eventually_logging(
        "the API server's certificate-less calls counted",
        Duration::from_secs(20),
        &served,
        || async {
            let returned = nodes
                .create(
                    &PostParams {
                        dry_run: true,
                        ..PostParams::default()
                    },
                    &node("mtls-probe"),
                )
                .await
                .unwrap();
            assert!(!held(&returned), "held without a client certificate");
            handshake_errors(&served, "no-client-certificate").await > 0
        },
    )
    .await;
    let unheld = nodes
        .create(&PostParams::default(), &node("registered-unheld"))
        .await
        .unwrap();
    assert!(
        !unheld
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(HOLD)
    );
    let event = cp
        .wait_for_node_create_event("registered-unheld")
        .await
        .unwrap();
    assert_eq!(
        event["annotations"]["failed-open.mutation.webhook.admission.k8s.io/round_0_index_0"],
        common::WEBHOOK_NAME,
        "{event}"
    );
    assert!(
        served.log().contains("a client sent no client certificate"),
        "{}",
        served.log()
    );

    // A user named for the webhook's URL host with its port (not 443, so the
    // port is part of the name): the API server presents the certificate and
    // the webhook holds the new node.
    write_admission_kubeconfig(
        &kubeconfig,
        &format!("127.0.0.1:{}", served.webhook_port),
        &apiserver,
    );
    cp.restart_apiserver(Duration::ZERO).await.unwrap();
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());
    probe_until(&nodes, "the webhook holding a dry-run node", held).await;
    let created = nodes
        .create(&PostParams::default(), &node("held-at-creation"))
        .await
        .unwrap();
    assert!(held(&created), "{:?}", created.metadata);
    let event = cp
        .wait_for_node_create_event("held-at-creation")
        .await
        .unwrap();
    assert_eq!(
        event["annotations"]["hold.node-holder.dev/decision"], "held",
        "{event}"
    );

    // Through refusals, webhook calls and the window task's patches, at
    // debug level: no credential in the log.
    let kubeconfig: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cp.node_holder_kubeconfig()).unwrap()).unwrap();
    let token = kubeconfig["users"][0]["user"]["token"].as_str().unwrap();
    let log = served.log();
    assert!(log.contains("admission decision"), "{log}");
    assert!(!log.contains(token), "the API token is logged:\n{log}");
    assert!(
        !log.contains("PRIVATE KEY"),
        "a private key is logged:\n{log}"
    );
}

#[tokio::test]
async fn direct_clients_need_a_certificate_of_the_client_ca_which_rotates_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ours = ClientPki::new(dir.path(), "ours", "kube-apiserver-webhook-client");
    let theirs = ClientPki::new(dir.path(), "theirs", "kube-apiserver-webhook-client");
    let client_ca = dir.path().join("client-ca.crt");
    install(&ours.ca(), &client_ca);
    let cp = ControlPlane::start().await.unwrap();
    let served = serve(&cp, &[&format!("--client-ca-file={}", client_ca.display())]).await;
    let (none, with_ours, with_theirs) = (
        connector(&served, None),
        connector(&served, Some(&ours)),
        connector(&served, Some(&theirs)),
    );

    // A certificate of the client CA: an answer.
    assert_eq!(post_review(&served, &with_ours).await, Ok(200));

    // No certificate: a fatal alert, counted.
    let refused = post_review(&served, &none).await.unwrap_err();
    assert!(refused.contains("CertificateRequired"), "{refused}");
    // A certificate of another CA with the same name: refused as unknown.
    let refused = post_review(&served, &with_theirs).await.unwrap_err();
    assert!(refused.contains("UnknownCA"), "{refused}");
    eventually_logging(
        "both refusals counted by reason",
        Duration::from_secs(5),
        &served,
        || async {
            handshake_errors(&served, "no-client-certificate").await == 1
                && handshake_errors(&served, "client-certificate-rejected").await == 1
        },
    )
    .await;
    let log = served.log();
    assert!(log.contains("a client certificate was refused"), "{log}");

    // The file rotates to the other CA: the new CA's certificates get in,
    // the old one's no longer; same process.
    let pid = served.child.id();
    install(&theirs.ca(), &client_ca);
    eventually(
        "the rotated client CA in force",
        Duration::from_secs(10),
        || async { post_review(&served, &with_theirs).await == Ok(200) },
    )
    .await;
    // The same connector, with a session from before the rotation to offer:
    // no resumption lets it skip the check.
    let refused = post_review(&served, &with_ours).await.unwrap_err();
    assert!(refused.contains("UnknownCA"), "{refused}");
    assert_eq!(served.child.id(), pid);
    assert!(served.log().contains("client CA reloaded"));

    // A broken file keeps the CA in force.
    std::fs::write(dir.path().join("garbage"), "not a certificate\n").unwrap();
    install(&dir.path().join("garbage"), &client_ca);
    eventually_logging(
        "the broken client CA reported",
        Duration::from_secs(10),
        &served,
        || async {
            served
                .log()
                .contains("client CA not reloaded; the previous one stays in force")
        },
    )
    .await;
    assert_eq!(post_review(&served, &with_theirs).await, Ok(200));
    let refused = post_review(&served, &none).await.unwrap_err();
    assert!(refused.contains("CertificateRequired"), "{refused}");
}

/// `node-holder serve` with a good serving certificate and `client_ca`;
/// exits before it needs a cluster. Its stderr.
fn refused_start(certs: &Path, client_ca: &Path) -> String {
    common::refused_start(
        &certs.join("tls.crt"),
        &certs.join("tls.key"),
        &[format!("--client-ca-file={}", client_ca.display())],
    )
}

#[test]
fn serve_refuses_to_start_with_an_unusable_client_ca_and_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let missing = dir.path().join("missing-ca.crt");
    let stderr = refused_start(dir.path(), &missing);
    assert!(
        stderr.contains(&format!(
            "reading client CA file {}: No such file",
            missing.display()
        )),
        "{stderr}"
    );
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let stderr = refused_start(dir.path(), &garbage);
    assert!(
        stderr.contains(&format!(
            "client CA file {} holds no certificate",
            garbage.display()
        )),
        "{stderr}"
    );
    // A private key where the CA belongs.
    let key = dir.path().join("tls.key");
    let stderr = refused_start(dir.path(), &key);
    assert!(
        stderr.contains(&format!(
            "client CA file {} holds no certificate",
            key.display()
        )),
        "{stderr}"
    );
    // A certificate block whose contents are not a certificate.
    let broken = dir.path().join("broken.crt");
    std::fs::write(
        &broken,
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let stderr = refused_start(dir.path(), &broken);
    assert!(
        stderr.contains(&format!(
            "client CA file {}: certificate 1 is not a usable CA certificate",
            broken.display()
        )),
        "{stderr}"
    );
}
