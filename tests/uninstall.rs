//! Nothing of node-holder's outlives it: `node-holder uninstall`, the chart's
//! pre-delete hook, run during an open window with exactly the hook's RBAC
//! (the chart's rendered roles, bound to the hook's ServiceAccount, which the
//! command impersonates), against the real API server. The release's
//! Deployment is a real object; no kubelet runs its pods, so the test plays
//! the kubelet: it stops the running `serve` (SIGTERM) once the Deployment
//! is scaled to 0. It leaves no hold,
//! no record, no Lease and no admission registration, and a person's own
//! hold stays. (The hook's Job itself is a container this cluster cannot
//! run; tests/install.rs-style rendering checks cover its spec.)

use testsupport as common;
use testsupport::install::{NAMESPACE, template};

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::window::{
    Cluster, HOLD, carries_anything_of_node_holders, create, eventually, eventually_logging, fast,
    marked, strs,
};
use common::{Served, register_webhook, serve};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use serde_json::{Value, json};
use testenv::ControlPlane;

const HOOK_USER: &str = "system:serviceaccount:node-holder:node-holder-uninstall";
/// What a cluster with cert-manager serves (the default TLS mode's
/// Certificate), for `helm template`.
const CERT_MANAGER_API: &str = "--api-versions=cert-manager.io/v1/Certificate";

/// The hook's roles and bindings as the chart renders them for `values`.
fn hook_rbac(values: &[&str]) -> Vec<Value> {
    let mut args = vec![
        "--show-only",
        "templates/uninstall-hook.yaml",
        CERT_MANAGER_API,
    ];
    args.extend_from_slice(values);
    template(&args)
        .into_iter()
        .filter(|o| o["kind"].as_str().is_some_and(|k| k.contains("Role")))
        .collect()
}

/// The release's Deployment as a bare object (its pods never run here).
async fn deployment(cp: &ControlPlane) {
    let admin = cp.admin_client().await.unwrap();
    let object = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "node-holder", "namespace": NAMESPACE},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "node-holder"}},
            "template": {
                "metadata": {"labels": {"app": "node-holder"}},
                "spec": {"containers": [{"name": "node-holder", "image": "node-holder:0.1.0"}]}
            }
        }
    });
    testenv::apply_objects(&admin, &[object]).await.unwrap();
}

/// A kubeconfig that is the admin's, impersonating the hook's
/// ServiceAccount: only the hook's RBAC applies to what it does.
fn hook_kubeconfig(cp: &ControlPlane) -> std::path::PathBuf {
    let admin = std::fs::read_to_string(cp.admin_kubeconfig()).unwrap();
    let mut config = testenv::parse_manifests(&admin).unwrap().remove(0);
    for user in config["users"].as_array_mut().unwrap() {
        user["user"]["as"] = HOOK_USER.into();
        user["user"]["as-groups"] = json!(["system:serviceaccounts", "system:authenticated"]);
    }
    // JSON is YAML: the kubeconfig reader takes it as it is.
    let path = cp.dir().join("uninstall-hook.kubeconfig");
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

/// `node-holder uninstall` with `args`, as the hook's identity.
fn uninstall(cp: &ControlPlane, args: &[&str]) -> Child {
    Command::new(common::node_holder_binary())
        .arg("uninstall")
        .args(args)
        .arg("--timeout=60s")
        .env("KUBECONFIG", hook_kubeconfig(cp))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Plays the kubelet: stops `served` once the Deployment is scaled to 0.
async fn stop_when_scaled_down(cp: &ControlPlane, served: &Served) {
    let deployments: Api<Deployment> = Api::namespaced(cp.admin_client().await.unwrap(), NAMESPACE);
    eventually(
        "the Deployment scaled to 0",
        Duration::from_secs(60),
        || async {
            let d = deployments.get("node-holder").await.unwrap();
            d.spec.replicas == Some(0)
        },
    )
    .await;
    served.terminate();
}

/// Waits for the command and returns its output, asserting it succeeded.
async fn finished(child: Child) -> String {
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let text = testsupport::output_text(&out);
    assert!(out.status.success(), "uninstall failed:\n{text}");
    text
}

/// Neither the record nor the Lease is left.
async fn no_record_or_lease(cp: &ControlPlane) {
    let admin = cp.admin_client().await.unwrap();
    let records: Api<ConfigMap> = Api::namespaced(admin.clone(), NAMESPACE);
    let leases: Api<Lease> = Api::namespaced(admin, NAMESPACE);
    assert!(
        records
            .get_opt("node-holder-window")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        leases
            .get_opt("node-holder-window")
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn uninstall_during_an_open_window_leaves_no_hold_record_lease_or_webhook() {
    let c = Cluster::start().await;
    create(&c.nodes, "theirs", &[], &[(HOLD, "true")]).await;
    let args = fast("10m", &[]);
    let served = serve(&c.cp, &strs(&args)).await;
    register_webhook(&c.cp, &served).await;
    deployment(&c.cp).await;
    let admin = c.cp.admin_client().await.unwrap();
    testenv::apply_objects(&admin, &hook_rbac(&[]))
        .await
        .unwrap();
    for name in ["new-1", "new-2"] {
        create(&c.nodes, name, &[], &[]).await;
    }
    eventually_logging(
        "every node held",
        Duration::from_secs(30),
        &served,
        async || marked(&c.nodes).await.len() == 2,
    )
    .await;

    // The hook's identity has the hook's rights and no more.
    let hook = testenv::client_from_kubeconfig(&hook_kubeconfig(&c.cp))
        .await
        .unwrap();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(hook.clone(), NAMESPACE);
    match secrets.list(&Default::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403),
        other => panic!("the hook's identity listed Secrets: {other:?}"),
    }
    let others: Api<MutatingWebhookConfiguration> = Api::all(hook);
    match others.delete("someone-elses", &Default::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403),
        other => panic!("the hook's identity may delete any webhook: {other:?}"),
    }
    // webhook-config/webhook-local.yaml's name, which register_webhook uses.
    let name = "node-holder";
    let child = uninstall(
        &c.cp,
        &[
            "--deployment=node-holder",
            "--webhook-configuration=node-holder",
        ],
    );
    stop_when_scaled_down(&c.cp, &served).await;
    let output = finished(child).await;

    for node in c.nodes.list(&Default::default()).await.unwrap() {
        assert!(!carries_anything_of_node_holders(&node), "{output}");
    }
    let theirs = c.nodes.get("theirs").await.unwrap();
    assert_eq!(
        theirs
            .metadata
            .annotations
            .unwrap_or_default()
            .get(HOLD)
            .map(String::as_str),
        Some("true"),
        "a person's hold stays"
    );
    no_record_or_lease(&c.cp).await;
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(admin);
    assert!(webhooks.get_opt(name).await.unwrap().is_none(), "{output}");
    // Nothing holds a new node any more.
    let later = create(&c.nodes, "later", &[], &[]).await;
    assert!(!carries_anything_of_node_holders(&later));
}

/// The hook as the chart renders it: a pre-delete Job running `uninstall`
/// with the release's names for the mode, its identity and rights hooks too
/// (gone once it succeeded); `uninstall.cleanup=false` renders none of it.
#[test]
fn the_hook_runs_uninstall_with_the_releases_names_for_each_mode() {
    let render = |values: &[&str]| {
        let mut args = vec![
            "--show-only",
            "templates/uninstall-hook.yaml",
            CERT_MANAGER_API,
        ];
        args.extend_from_slice(values);
        template(&args)
    };
    for (mode, flag) in [
        ("webhook", "--webhook-configuration=node-holder"),
        ("policy", "--admission-policy=node-holder"),
    ] {
        let objects = render(&["--set", &format!("admission.mode={mode}")]);
        let job = testsupport::install::one(&objects, "Job");
        let args: Vec<&str> = job["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(
            args,
            [
                "uninstall",
                "--deployment=node-holder",
                flag,
                "--timeout=3m"
            ]
        );
        for object in &objects {
            let annotations = &object["metadata"]["annotations"];
            assert_eq!(annotations["helm.sh/hook"], "pre-delete", "{object}");
            let policy = annotations["helm.sh/hook-delete-policy"].as_str().unwrap();
            assert!(policy.contains("hook-succeeded"), "{object}");
        }
        let job_spec = &job["spec"]["template"]["spec"];
        assert_eq!(job_spec["serviceAccountName"], "node-holder-uninstall");
        assert_eq!(job_spec["securityContext"]["runAsNonRoot"], true);
    }
    // No NodePools: node-holder never writes one.
    let rules = testsupport::install::one(&render(&[]), "ClusterRole")["rules"].to_string();
    assert!(!rules.contains("nodepools"), "{rules}");
    let none = testsupport::install::try_template(&[
        "--show-only",
        "templates/uninstall-hook.yaml",
        CERT_MANAGER_API,
        "--set",
        "uninstall.cleanup=false",
    ]);
    assert!(
        none.is_err_and(|e| e.contains("could not find template")),
        "nothing rendered"
    );
}
