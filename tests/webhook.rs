//! Every Node CREATE gets the hold, as the kube-apiserver really calls the
//! webhook: through a MutatingWebhookConfiguration, over TLS.

use testsupport as common;

use std::collections::BTreeMap;

use common::{WEBHOOK_NAME, node, register_webhook, register_webhook_probing, serve};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use testenv::ControlPlane;

fn map(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

#[tokio::test]
async fn a_new_node_without_annotations_or_labels_is_stored_held_and_marked() {
    let cp = ControlPlane::start().await.unwrap();
    let served = serve(&cp, &[]).await;
    register_webhook(&cp, &served).await;
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());

    nodes
        .create(&PostParams::default(), &node("bare"))
        .await
        .unwrap();
    let stored = nodes.get("bare").await.unwrap();
    assert_eq!(
        stored.metadata.annotations,
        map(&[
            ("karpenter.sh/do-not-disrupt", "true"),
            ("node-holder.dev/hold-keys", "karpenter.sh/do-not-disrupt")
        ])
    );
    assert_eq!(
        stored.metadata.labels,
        map(&[("node-holder.dev/held", "true")])
    );
}

#[tokio::test]
async fn existing_annotations_and_labels_are_kept_beside_the_hold() {
    let cp = ControlPlane::start().await.unwrap();
    let served = serve(&cp, &["--hold-preset=karpenter-v1,cluster-autoscaler"]).await;
    register_webhook(&cp, &served).await;
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());

    let mut n = node("dressed");
    n.metadata.annotations = map(&[("example.com/owner", "team-a"), ("note", "kept")]);
    n.metadata.labels = map(&[("kubernetes.io/hostname", "dressed")]);
    nodes.create(&PostParams::default(), &n).await.unwrap();

    let stored = nodes.get("dressed").await.unwrap().metadata;
    let annotations = stored.annotations.unwrap();
    assert_eq!(annotations["example.com/owner"], "team-a");
    assert_eq!(annotations["note"], "kept");
    assert_eq!(annotations["karpenter.sh/do-not-disrupt"], "true");
    assert_eq!(
        annotations["cluster-autoscaler.kubernetes.io/scale-down-disabled"],
        "true"
    );
    let labels = stored.labels.unwrap();
    assert_eq!(labels["kubernetes.io/hostname"], "dressed");
    assert_eq!(labels["node-holder.dev/held"], "true");
}

#[tokio::test]
async fn a_dry_run_create_returns_the_held_node_and_stores_nothing() {
    let cp = ControlPlane::start().await.unwrap();
    let served = serve(&cp, &[]).await;
    register_webhook(&cp, &served).await;
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());

    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let returned = nodes.create(&dry, &node("dry")).await.unwrap();
    assert_eq!(
        returned.metadata.annotations.unwrap()["karpenter.sh/do-not-disrupt"],
        "true"
    );
    assert!(
        nodes.get_opt("dry").await.unwrap().is_none(),
        "a dry run stores nothing"
    );
}

#[tokio::test]
async fn out_of_scope_nodes_are_created_untouched() {
    let cp = ControlPlane::start().await.unwrap();
    let served = serve(&cp, &["--node-selector=karpenter.sh/nodepool"]).await;
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());
    let mut in_scope = node("pooled");
    in_scope.metadata.labels = map(&[("karpenter.sh/nodepool", "default")]);
    register_webhook_probing(&cp, &served, in_scope).await;

    nodes
        .create(&PostParams::default(), &node("static"))
        .await
        .unwrap();
    let stored = nodes.get("static").await.unwrap();
    assert!(
        stored.metadata.annotations.is_none(),
        "{:?}",
        stored.metadata.annotations
    );
    assert!(stored.metadata.labels.is_none());
}

#[tokio::test]
async fn the_audit_log_shows_the_webhooks_annotations_and_the_mutation() {
    let cp = ControlPlane::start().await.unwrap();
    let served = serve(&cp, &[]).await;
    register_webhook(&cp, &served).await;
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());
    nodes
        .create(&PostParams::default(), &node("audited"))
        .await
        .unwrap();

    let event = cp.wait_for_node_create_event("audited").await.unwrap();
    let annotations = &event["annotations"];
    assert_eq!(annotations[format!("{WEBHOOK_NAME}/decision")], "held");
    assert_eq!(
        annotations[format!("{WEBHOOK_NAME}/holds-added")],
        "karpenter.sh/do-not-disrupt=true"
    );
    let mutation: serde_json::Value = serde_json::from_str(
        annotations["mutation.webhook.admission.k8s.io/round_0_index_0"]
            .as_str()
            .expect("mutation annotation"),
    )
    .unwrap();
    assert_eq!(mutation["webhook"], WEBHOOK_NAME);
    assert_eq!(mutation["mutated"], true);
    // Request level records the patch itself.
    let patch = annotations["patch.webhook.admission.k8s.io/round_0_index_0"]
        .as_str()
        .expect("patch annotation");
    assert!(
        patch.contains("karpenter.sh~1do-not-disrupt") || patch.contains("/metadata/annotations"),
        "{patch}"
    );
}

#[tokio::test]
async fn every_decision_writes_one_structured_audit_line() {
    let cp = ControlPlane::start().await.unwrap();
    let served = serve(&cp, &[]).await;
    register_webhook(&cp, &served).await;
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());
    nodes
        .create(&PostParams::default(), &node("logged"))
        .await
        .unwrap();

    let lines: Vec<_> = served
        .log_lines()
        .into_iter()
        .filter(|l| l["target"] == "node_holder::audit" && l["node"] == "logged")
        .collect();
    assert_eq!(lines.len(), 1, "{}", served.log());
    let line = &lines[0];
    assert_eq!(line["message"], "admission decision");
    assert_eq!(line["operation"], "CREATE");
    assert_eq!(line["kind"], "Node");
    assert_eq!(line["user"], testenv::ADMIN_USER);
    assert_eq!(line["dry_run"], false);
    assert_eq!(line["decision"], "held");
    assert_eq!(line["patched"], true);
    assert_eq!(line["holds"], "karpenter.sh/do-not-disrupt=true");
    assert!(line["latency_us"].is_u64(), "{line}");
    // The line carries the admission uid; the API server's audit event of the
    // same create names the node.
    let event = cp.wait_for_node_create_event("logged").await.unwrap();
    assert!(
        line["uid"].as_str().is_some_and(|uid| !uid.is_empty()),
        "{line}"
    );
    assert_eq!(event["objectRef"]["name"], "logged");
    // The probe's dry run is logged as such.
    assert!(
        served
            .log_lines()
            .iter()
            .any(|l| l["node"] == "webhook-probe" && l["dry_run"] == true),
        "{}",
        served.log()
    );
}

#[tokio::test]
async fn with_the_webhook_down_nodes_register_unheld_and_the_audit_log_shows_the_fail_open() {
    let cp = ControlPlane::start().await.unwrap();
    let served = serve(&cp, &[]).await;
    register_webhook(&cp, &served).await;
    drop(served);
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());

    nodes
        .create(&PostParams::default(), &node("unheld"))
        .await
        .expect("failurePolicy Ignore: the create succeeds");
    let stored = nodes.get("unheld").await.unwrap();
    assert!(stored.metadata.annotations.is_none());

    let event = cp.wait_for_node_create_event("unheld").await.unwrap();
    let failed_open =
        event["annotations"]["failed-open.mutation.webhook.admission.k8s.io/round_0_index_0"]
            .as_str()
            .unwrap_or_else(|| panic!("no fail-open annotation in {event}"));
    assert_eq!(failed_open, WEBHOOK_NAME);
}

#[tokio::test]
async fn a_rotated_certificate_from_a_new_ca_is_served_without_a_restart() {
    let cp = ControlPlane::start().await.unwrap();
    let mut served = serve(&cp, &[]).await;
    register_webhook(&cp, &served).await;
    let client = cp.admin_client().await.unwrap();
    let pid = served.child.id();

    // Rotate: a new CA and serving pair in place; once node-holder serves
    // it, the new caBundle. (Until the API server has the new caBundle its
    // calls fail open; a dry run held before both switched proves nothing.)
    // A new CA and serving pair in place of the old.
    common::make_certs(&served.cert_dir());
    let reloaded = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !served.log().contains("serving certificate reloaded") {
        assert!(
            std::time::Instant::now() < reloaded,
            "never reloaded: {}",
            served.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let configs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let mut config = configs.get("node-holder").await.unwrap();
    config.webhooks.as_mut().unwrap()[0].client_config.ca_bundle =
        Some(k8s_openapi::ByteString(served.ca_pem()));
    configs
        .replace("node-holder", &PostParams::default(), &config)
        .await
        .unwrap();

    let nodes: Api<Node> = Api::all(client);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    while nodes
        .create(&dry_run, &node("rotated"))
        .await
        .unwrap()
        .metadata
        .annotations
        .is_none()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the API server never trusted the rotated certificate"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    nodes
        .create(&PostParams::default(), &node("rotated"))
        .await
        .unwrap();
    let stored = nodes.get("rotated").await.unwrap();
    assert_eq!(
        stored.metadata.annotations.unwrap()["karpenter.sh/do-not-disrupt"],
        "true"
    );
    assert!(served.child.try_wait().unwrap().is_none(), "still running");
    assert_eq!(served.child.id(), pid);
}

#[tokio::test]
async fn an_expired_serving_certificate_fails_open_and_shows_in_metrics_and_logs() {
    let cp = ControlPlane::start().await.unwrap();
    let served = serve(&cp, &[]).await;
    register_webhook(&cp, &served).await;
    // The certificate rotates into one that expired yesterday, from a CA the
    // API server is told to trust: only the expiry is wrong.
    let day = time::Duration::days(1);
    let now = time::OffsetDateTime::now_utc();
    let (from, to) = (now - day - day, now - day);
    let expired = testenv::certs::generate_between(&[], from.into(), to.into()).unwrap();
    testenv::certs::write(&expired, &served.cert_dir()).unwrap();
    let client = cp.admin_client().await.unwrap();
    let configs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let mut config = configs.get("node-holder").await.unwrap();
    config.webhooks.as_mut().unwrap()[0].client_config.ca_bundle =
        Some(k8s_openapi::ByteString(expired.ca_pem.into_bytes()));
    configs
        .replace("node-holder", &PostParams::default(), &config)
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !served.log().contains("the serving certificate has expired") {
        assert!(std::time::Instant::now() < deadline, "{}", served.log());
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    // Nodes still register: the API server fails open.
    let nodes: Api<Node> = Api::all(client);
    let mut failed_open = false;
    for attempt in 0..50 {
        let name = format!("expired-{attempt}");
        nodes
            .create(&PostParams::default(), &node(&name))
            .await
            .unwrap();
        let event = cp.wait_for_node_create_event(&name).await.unwrap();
        if event["annotations"]["failed-open.mutation.webhook.admission.k8s.io/round_0_index_0"]
            == WEBHOOK_NAME
        {
            failed_open = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(failed_open, "the API server never failed open");

    let (_, metrics) = common::http_get(served.admin_port, "/metrics")
        .await
        .unwrap();
    let not_after: i64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("node_holder_tls_certificate_not_after_seconds "))
        .unwrap_or_else(|| panic!("no expiry metric in\n{metrics}"))
        .parse()
        .unwrap();
    assert!(not_after < (now - day + time::Duration::minutes(1)).unix_timestamp());
    // The API server failed open as soon as its handshake failed; node-holder
    // counts the rejection when it reads the client's alert, which can come
    // later on a busy machine.
    let rejected = "node_holder_tls_handshake_errors_total{reason=\"certificate-rejected\"} ";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (_, metrics) = common::http_get(served.admin_port, "/metrics")
            .await
            .unwrap();
        let count: u64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(rejected))
            .unwrap_or_else(|| panic!("no rejected handshakes in\n{metrics}"))
            .parse()
            .unwrap();
        if count >= 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{metrics}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        served
            .log()
            .contains("a client rejected the serving certificate"),
        "{}",
        served.log()
    );
}
