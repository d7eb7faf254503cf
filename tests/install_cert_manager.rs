//! The chart's default TLS mode with cert-manager running for real: its
//! controller and CA injector, built from the module pinned in
//! `testenv/tools/cert-manager`, against the test API server. The chart's
//! Issuers and Certificates are issued, the CA is injected into the rendered
//! MutatingWebhookConfiguration, and node-holder, serving the certificate
//! cert-manager wrote into the Secret, holds a new Node that the API server
//! sent it through the chart's Service at a pod address (a network
//! namespace, as in `tests/install_service.rs`), trusting only the injected
//! caBundle.

use testsupport as common;
use testsupport::install;

use std::time::{Duration, Instant};

use common::window::{failed_open, held};
use common::{WEBHOOK_NAME, node};
use install::{
    CertManager, NAMESPACE, Pod, SERVICE_DNS_NAMES, install_cert_manager_crds, name, one,
    release_objects, template, wait_until_the_webhook_holds,
};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};
use testenv::ControlPlane;

/// The `Ready` condition's status of cert-manager object `object`, if any.
fn ready(object: &DynamicObject) -> Option<String> {
    object.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["status"].as_str().map(str::to_string))
}

#[tokio::test]
async fn cert_manager_issues_the_charts_certificate_and_the_webhook_holds_with_it() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.admin_client().await.unwrap();
    install_cert_manager_crds(&cp).await;
    let mut cert_manager = CertManager::start(&cp).await;

    // `helm install` with the default values: tls.mode=certManager, the
    // chart's own self-signed CA.
    // What `helm install` creates: the release's objects, not its hooks
    // (`helm test`'s, the pre-delete cleanup's).
    // The API cert-manager's CRDs serve, as `helm install` would see it.
    let served = "--api-versions=cert-manager.io/v1/Certificate";
    let objects = tokio::task::spawn_blocking(move || release_objects(&template(&[served])))
        .await
        .unwrap();
    // The rendered registration has no caBundle: cert-manager's cainjector
    // fills it in (read from the cluster, it may already have).
    let rendered: MutatingWebhookConfiguration =
        serde_json::from_value(one(&objects, "MutatingWebhookConfiguration").clone()).unwrap();
    assert!(
        rendered.webhooks.as_ref().unwrap()[0]
            .client_config
            .ca_bundle
            .is_none(),
        "the chart leaves the caBundle to cert-manager"
    );
    testenv::apply_objects(
        &admin,
        &[json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})],
    )
    .await
    .unwrap();
    testenv::apply_objects(&admin, &objects).await.unwrap();
    let configs: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());

    // cert-manager issues every Certificate, makes every Issuer ready...
    let api = |kind: &str| -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("cert-manager.io", "v1", kind);
        Api::namespaced_with(admin.clone(), NAMESPACE, &ApiResource::from_gvk(&gvk))
    };
    let (issuers, certificates) = (api("Issuer"), api("Certificate"));
    let wanted: Vec<(&str, &str)> = objects
        .iter()
        .filter(|o| o["apiVersion"] == "cert-manager.io/v1")
        .map(|o| (o["kind"].as_str().unwrap(), name(o)))
        .collect();
    assert_eq!(wanted.len(), 4, "two Issuers, two Certificates: {wanted:?}");
    let deadline = Instant::now() + Duration::from_secs(120);
    for (kind, object_name) in &wanted {
        let api = if *kind == "Issuer" {
            &issuers
        } else {
            &certificates
        };
        loop {
            cert_manager.check_running();
            let object = api.get(object_name).await.unwrap();
            if ready(&object).as_deref() == Some("True") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{kind} {object_name} never became ready: {:?}",
                object.data["status"]
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    // ...writes the serving certificate, for the Service's names, into the
    // Secret the Deployment mounts...
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NAMESPACE);
    let secret = secrets.get("node-holder-tls").await.unwrap();
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let data = secret.data.unwrap();
    let serving: &Value = &certificates.get("node-holder-serving").await.unwrap().data;
    assert_eq!(serving["spec"]["dnsNames"], json!(SERVICE_DNS_NAMES));
    let ca_pem = data["ca.crt"].0.clone();
    assert!(String::from_utf8_lossy(&ca_pem).contains("BEGIN CERTIFICATE"));

    // ...and the injector puts its CA into the webhook configuration.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        cert_manager.check_running();
        let config = configs.get("node-holder").await.unwrap();
        let bundle = config.webhooks.unwrap()[0].client_config.ca_bundle.clone();
        if let Some(bundle) = bundle {
            assert_eq!(bundle.0, ca_pem, "the injected caBundle is the CA");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "cainjector never injected the caBundle"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // node-holder in its pod, the Secret mounted, behind the Service.
    let mount = tempfile::tempdir().unwrap();
    for file in ["tls.crt", "tls.key"] {
        std::fs::write(mount.path().join(file), &data[file].0).unwrap();
    }
    let mut pod = Pod::start(&cp, &objects, mount.path()).await;
    testenv::apply_objects(&admin, &[install::endpoint_slice(&objects, pod.ip())])
        .await
        .unwrap();
    wait_until_the_webhook_holds(&cp, &mut pod, Duration::from_secs(30)).await;

    let nodes: Api<Node> = Api::all(admin);
    let created = nodes
        .create(&PostParams::default(), &node("issued-by-cert-manager"))
        .await
        .unwrap();
    assert!(held(&created), "the create came back held");
    assert!(
        held(&nodes.get("issued-by-cert-manager").await.unwrap()),
        "stored held"
    );
    let event = cp
        .wait_for_node_create_event("issued-by-cert-manager")
        .await
        .unwrap();
    assert_eq!(
        event["annotations"][format!("{WEBHOOK_NAME}/decision")],
        "held"
    );
    assert!(!failed_open(&event), "{event}");
    assert!(
        pod.log_lines()
            .iter()
            .any(|l| l["target"] == "node_holder::audit"
                && l["node"] == "issued-by-cert-manager"
                && l["decision"] == "held"),
        "{}",
        pod.log()
    );
}
