//! The chart's Service path, for real: the API server calls the webhook the
//! way it does in a cluster, through the rendered MutatingWebhookConfiguration
//! (`service: node-holder/node-holder`, port 443), the chart's Service and an
//! EndpointSlice, at a pod address outside loopback (a network namespace
//! joined by a veth pair), verifying the serving certificate for the
//! Service's DNS name against the configuration's caBundle.
//!
//! TLS here is the chart's `provided` mode: a `kubernetes.io/tls` Secret made
//! for the Service's names from a throw-away CA, mounted (its
//! keys written to files) into node-holder's "pod", and the CA as
//! `tls.provided.caBundle`. `tests/install_cert_manager.rs` runs the same path
//! with the certificate cert-manager issues.

use testsupport as common;
use testsupport::install;

use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::window::{failed_open, held, strs};
use common::{WEBHOOK_NAME, node};
use install::{NAMESPACE, Pod, SERVICE_DNS_NAMES, one, template, wait_until_the_webhook_holds};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::ControlPlane;

const SECRET: &str = "node-holder-tls";

/// Throw-away certificates into `dir`, valid for `dns_names` besides
/// localhost and 127.0.0.1; returns the CA's PEM.
fn certs(dir: &Path, dns_names: &[&str]) -> Vec<u8> {
    testsupport::make_certs_for(dir, dns_names);
    std::fs::read(dir.join("ca.crt")).unwrap()
}

fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Writes `name`'s bytes to `dir/name` in one step (the server polling the
/// files never reads half a certificate).
fn replace_file(dir: &Path, name: &str, bytes: &[u8]) {
    let partial = dir.join(format!("{name}.partial"));
    std::fs::write(&partial, bytes).unwrap();
    std::fs::rename(&partial, dir.join(name)).unwrap();
}

/// The chart in `provided` mode, everything installed as `helm install`
/// would, plus what the cluster's controllers would add: the TLS Secret the
/// user made, the EndpointSlice of the one ready pod, and node-holder running
/// in that pod with the Secret mounted. Returns once the API server has the
/// webhook hold a dry-run node through the Service.
struct Installed {
    cp: ControlPlane,
    pod: Pod,
    mount: tempfile::TempDir,
}

async fn install(values: &[&str]) -> Installed {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.admin_client().await.unwrap();
    let made = tempfile::tempdir().unwrap();
    let ca = certs(made.path(), &SERVICE_DNS_NAMES);

    let mut args = vec![
        "--set=tls.mode=provided".to_string(),
        format!("--set=tls.provided.secretName={SECRET}"),
        format!("--set=tls.provided.caBundle={}", base64(&ca)),
    ];
    args.extend(values.iter().map(ToString::to_string));
    let objects = tokio::task::spawn_blocking(move || template(&strs(&args)))
        .await
        .unwrap();

    testenv::apply_objects(
        &admin,
        &[json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})],
    )
    .await
    .unwrap();
    // `kubectl create secret tls`, as chart/README.md tells.
    let read = |file: &str| base64(&std::fs::read(made.path().join(file)).unwrap());
    testenv::apply_objects(
        &admin,
        &[json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": SECRET, "namespace": NAMESPACE},
            "data": {"tls.crt": read("tls.crt"), "tls.key": read("tls.key")},
        })],
    )
    .await
    .unwrap();
    testenv::apply_objects(&admin, &objects).await.unwrap();

    // The kubelet mounts the Secret the Deployment names.
    let deployment = one(&objects, "Deployment");
    assert_eq!(
        deployment["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"],
        SECRET
    );
    let mount = tempfile::tempdir().unwrap();
    mount_secret(&cp, SECRET, mount.path()).await;

    let mut pod = Pod::start(&cp, &objects, mount.path()).await;
    testenv::apply_objects(&admin, &[install::endpoint_slice(&objects, pod.ip())])
        .await
        .unwrap();
    wait_until_the_webhook_holds(&cp, &mut pod, Duration::from_secs(30)).await;
    Installed { cp, pod, mount }
}

/// Writes the `kubernetes.io/tls` Secret's `tls.crt` and `tls.key` into
/// `dir`, as the kubelet's Secret volume does.
async fn mount_secret(cp: &ControlPlane, name: &str, dir: &Path) {
    let secrets: Api<Secret> = Api::namespaced(cp.admin_client().await.unwrap(), NAMESPACE);
    let secret = secrets.get(name).await.unwrap();
    let data = secret.data.unwrap();
    for file in ["tls.crt", "tls.key"] {
        replace_file(dir, file, &data[file].0);
    }
}

fn audit_annotation<'a>(event: &'a Value, key: &str) -> &'a str {
    event["annotations"][key]
        .as_str()
        .unwrap_or_else(|| panic!("no {key} in {event}"))
}

#[tokio::test]
async fn a_node_create_is_held_through_the_charts_service_at_a_pod_address() {
    let Installed { cp, pod, mount: _ } = install(&[]).await;
    let admin = cp.admin_client().await.unwrap();

    // The registration is the rendered one: a Service reference, no URL.
    let configs: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    let config = configs.get("node-holder").await.unwrap();
    let client_config = &config.webhooks.as_ref().unwrap()[0].client_config;
    assert!(client_config.url.is_none());
    let service = client_config.service.as_ref().unwrap();
    assert_eq!(
        (
            service.namespace.as_str(),
            service.name.as_str(),
            service.port
        ),
        (NAMESPACE, "node-holder", Some(443))
    );
    assert!(
        !pod.ip().is_loopback(),
        "the endpoint is a pod address, not loopback"
    );

    let nodes: Api<Node> = Api::all(admin);
    let created = nodes
        .create(&PostParams::default(), &node("via-service"))
        .await
        .unwrap();
    assert!(held(&created), "the create came back held");
    assert!(
        held(&nodes.get("via-service").await.unwrap()),
        "stored held"
    );

    // The API server's audit event: the webhook mutated it, and did not fail.
    let event = cp.wait_for_node_create_event("via-service").await.unwrap();
    assert_eq!(
        audit_annotation(&event, &format!("{WEBHOOK_NAME}/decision")),
        "held"
    );
    let mutation: Value = serde_json::from_str(audit_annotation(
        &event,
        "mutation.webhook.admission.k8s.io/round_0_index_0",
    ))
    .unwrap();
    assert_eq!(mutation["webhook"], WEBHOOK_NAME);
    assert_eq!(mutation["mutated"], true);
    assert!(!failed_open(&event), "{event}");

    // ...and node-holder in the namespace answered it.
    let lines: Vec<Value> = pod
        .log_lines()
        .into_iter()
        .filter(|l| l["target"] == "node_holder::audit" && l["node"] == "via-service")
        .collect();
    assert_eq!(lines.len(), 1, "{}", pod.log());
    assert_eq!(lines[0]["decision"], "held");
    assert_eq!(lines[0]["dry_run"], false);
}

#[tokio::test]
async fn the_api_server_verifies_the_webhook_certificate_for_the_services_name() {
    // Certificates are re-read every 2 s, so a swap shows quickly.
    let Installed { cp, pod, mount } = install(&[]).await;
    let admin = cp.admin_client().await.unwrap();

    // Same path, same kind of certificate, from a CA the caBundle trusts, but
    // valid for localhost and 127.0.0.1 only: not for the Service's name.
    let other = tempfile::tempdir().unwrap();
    let ca = certs(other.path(), &["localhost"]);
    for file in ["tls.crt", "tls.key"] {
        replace_file(
            mount.path(),
            file,
            &std::fs::read(other.path().join(file)).unwrap(),
        );
    }
    let configs: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    configs
        .patch(
            "node-holder",
            &PatchParams::default(),
            &Patch::<()>::Json(
                serde_json::from_value(json!([{
                    "op": "replace",
                    "path": "/webhooks/0/clientConfig/caBundle",
                    "value": base64(&ca),
                }]))
                .unwrap(),
            ),
        )
        .await
        .unwrap();

    // The API server refuses the certificate for its name (the CA is fine).
    let expected = format!(
        "x509: certificate is valid for localhost, not {}",
        SERVICE_DNS_NAMES[0]
    );
    let apiserver_log = cp.dir().join("kube-apiserver.log");
    let nodes: Api<Node> = Api::all(admin);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let returned = nodes.create(&dry_run, &node("name-probe")).await.unwrap();
        let log = std::fs::read_to_string(&apiserver_log).unwrap();
        if !held(&returned) && log.contains(&expected) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the API server never refused the certificate for its name; its log:\n{}",
            log.lines()
                .filter(|l| l.contains("webhook"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log_before = std::fs::read_to_string(&apiserver_log).unwrap().len();

    // A real create goes through unheld: the webhook failed open.
    let created = nodes
        .create(&PostParams::default(), &node("wrong-name"))
        .await
        .unwrap();
    assert!(!held(&created), "the create came back held: {created:?}");
    let event = cp.wait_for_node_create_event("wrong-name").await.unwrap();
    assert!(failed_open(&event), "{event}");
    let log = std::fs::read_to_string(&apiserver_log).unwrap();
    assert!(
        log[log_before..].contains(&expected),
        "this create failed for the name too:\n{}",
        &log[log_before..]
    );
    drop(pod);
}
