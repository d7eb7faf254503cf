//! Policy mode fixtures (`admission.mode: policy`): the chart's
//! MutatingAdmissionPolicy and binding, applied to a real API server and
//! waited for, and `node-holder serve --admission policy`, which opens no
//! webhook port and reads no certificate.
#![allow(dead_code)] // each test binary uses a different part

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::Value;
use testenv::ControlPlane;

use crate::{Listen, Served, install, install_node_holder_rbac, launch};

/// The chart's policy and binding for `values` (helm arguments), in policy
/// mode.
pub fn objects(values: &[&str]) -> Vec<Value> {
    let mut args = vec![
        "--set",
        "admission.mode=policy",
        "--show-only",
        "templates/admissionpolicy.yaml",
    ];
    args.extend_from_slice(values);
    install::template(&args)
}

/// The API resource of the policy (`MutatingAdmissionPolicy`) or of its
/// binding (`MutatingAdmissionPolicyBinding`).
pub fn resource(kind: &str) -> ApiResource {
    ApiResource {
        group: "admissionregistration.k8s.io".into(),
        version: "v1".into(),
        api_version: "admissionregistration.k8s.io/v1".into(),
        kind: kind.into(),
        plural: match kind.to_lowercase().strip_suffix('y') {
            Some(stem) => format!("{stem}ies"),
            None => format!("{}s", kind.to_lowercase()),
        },
    }
}

/// The names of the cluster's objects of `kind` (a policy or a binding).
pub async fn names(client: &kube::Client, kind: &str) -> Vec<String> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource(kind));
    api.list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect()
}

/// What a CREATE of `node` would store now: a server-side dry run, which
/// goes through admission (the policy included) and stores nothing.
pub async fn admitted(nodes: &Api<Node>, node: &Node) -> Node {
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    nodes.create(&dry_run, node).await.unwrap()
}

/// Creates `objects` (the policy and its binding) and waits until the API
/// server applies them: a dry-run CREATE of `probe` comes back with
/// `holds`' key. (The API server loads new policies asynchronously.)
pub async fn apply(cp: &ControlPlane, objects: &[Value], probe: &Node, hold: &str) {
    let admin = cp.admin_client().await.unwrap();
    testenv::apply_objects(&admin, objects).await.unwrap();
    wait_until_probe(&Api::all(admin), probe, hold, true).await;
}

/// Waits until a dry-run CREATE of `probe` comes back with `hold` (`true`)
/// or without it (`false`).
pub async fn wait_until_probe(nodes: &Api<Node>, probe: &Node, hold: &str, held: bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let node = admitted(nodes, probe).await;
        let carries = node
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(hold));
        if carries == held {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "a dry-run CREATE still {} {hold} after 60 s",
            if held { "lacks" } else { "carries" }
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `node-holder serve --admission policy` as node-holder's restricted
/// identity (`webhook-config/rbac.yaml`), with `extra` flags. It is given a
/// webhook address but no certificate: policy mode must neither read one nor
/// open the port.
pub async fn serve(cp: &ControlPlane, extra: &[&str]) -> Served {
    install_node_holder_rbac(cp).await;
    launch(cp, |command, at: &Listen| {
        command
            .args(["serve", "--admission", "policy", "--log-format", "json"])
            .env("HOSTNAME", format!("serve-{}", at.admin_port))
            .arg(format!("--webhook-addr=127.0.0.1:{}", at.webhook_port))
            .arg(format!("--admin-addr=127.0.0.1:{}", at.admin_port))
            .arg("--tls-cert-file=/nonexistent/tls.crt")
            .arg("--tls-key-file=/nonexistent/tls.key")
            .args(extra);
    })
    .await
}
