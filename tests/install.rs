//! The install: the Helm chart (`chart/`), the plain manifests
//! (`webhook-config/`) and the Dockerfile, checked with the pinned helm (built
//! from its Go module, `testenv/tools/helm`) and against the real API server:
//! - `helm lint` passes and `helm template` renders each TLS mode;
//! - every rendered object is accepted by the API server (server-side dry
//!   run), cert-manager's kinds against the CRDs of the pinned cert-manager
//!   module (`testenv/tools/cert-manager`), the pod under Pod Security
//!   `restricted` enforcement;
//! - the chart's RBAC is exactly `webhook-config/rbac.yaml`'s, and its webhook
//!   settings exactly those of the plain manifests;
//! - node-holder running with nothing but the rendered chart's RBAC and
//!   configuration completes a whole hold and release, and is refused
//!   anything outside it.

use testsupport as common;
use testsupport::install;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use common::window::{eventually_logging, held, strs};
use common::{Served, has_node_events, launch, make_certs, node, register_webhook};
use install::{
    NAMESPACE, RELEASE, all_of, chart, container, env_of, helm, install_cert_manager_crds, kind,
    name, one, pod_command, pod_of, release_objects, repo, use_cert_files,
};
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, MutatingWebhookConfiguration};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::ControlPlane;

const HOLD: &str = "karpenter.sh/do-not-disrupt";
const WINDOW: &str = "node-holder-window";
const CERT_MANAGER_GROUPS: [&str; 2] = ["cert-manager.io", "acme.cert-manager.io"];
/// What a cluster with cert-manager serves, for `helm template`.
const CERT_MANAGER_API: &str = "--api-versions=cert-manager.io/v1/Certificate";

/// `helm template` with `values` on a cluster that serves cert-manager: the
/// default TLS mode renders cert-manager's Certificate only where it is
/// served (`.Capabilities.APIVersions`; `helm template` knows the built-in
/// APIs and those given with --api-versions).
fn try_template(values: &[&str]) -> Result<Vec<Value>, String> {
    install::try_template(&[&[CERT_MANAGER_API][..], values].concat())
}

fn template(values: &[&str]) -> Vec<Value> {
    install::template(&[&[CERT_MANAGER_API][..], values].concat())
}

/// The values of each TLS mode, by name.
fn tls_modes() -> Vec<(&'static str, Vec<String>)> {
    let ca = tempfile::tempdir().unwrap();
    make_certs(ca.path());
    let ca_bundle = base64::engine::general_purpose::STANDARD
        .encode(std::fs::read(ca.path().join("ca.crt")).unwrap());
    vec![
        ("cert-manager, self-signed CA", vec![]),
        (
            "cert-manager, given issuer",
            vec![
                "--set=tls.certManager.issuerRef.name=corp-ca".into(),
                "--set=tls.certManager.issuerRef.kind=ClusterIssuer".into(),
            ],
        ),
        (
            "provided Secret and caBundle",
            vec![
                "--set=tls.mode=provided".into(),
                "--set=tls.provided.secretName=node-holder-provided-tls".into(),
                format!("--set=tls.provided.caBundle={ca_bundle}"),
            ],
        ),
    ]
}

fn is_cert_manager(object: &Value) -> bool {
    let group = object["apiVersion"]
        .as_str()
        .unwrap_or_default()
        .split('/')
        .next()
        .unwrap_or_default();
    CERT_MANAGER_GROUPS.contains(&group)
}

/// Every environment variable `node-holder serve` reads (its flags' and the
/// global flags'), from its own help.
fn serve_env_vars() -> BTreeSet<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_node-holder"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    let vars: BTreeSet<String> = help
        .split("[env: ")
        .skip(1)
        .map(|rest| rest.split(['=', ']']).next().unwrap().to_string())
        .collect();
    assert!(
        vars.len() > 15,
        "serve --help names its variables: {vars:?}"
    );
    vars
}

fn rules_of(object: &Value) -> Vec<PolicyRule> {
    serde_json::from_value(object["rules"].clone()).unwrap()
}

fn webhook_of(objects: &[Value]) -> MutatingWebhook {
    let config: MutatingWebhookConfiguration =
        serde_json::from_value(one(objects, "MutatingWebhookConfiguration").clone()).unwrap();
    let mut webhooks = config.webhooks.unwrap();
    assert_eq!(webhooks.len(), 1);
    webhooks.remove(0)
}

fn manifest(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(repo().join(path)).unwrap();
    testenv::parse_manifests(&text).unwrap()
}

#[test]
fn helm_lint_passes_for_each_tls_mode() {
    for (mode, values) in tls_modes() {
        let out = helm()
            .args(["lint", "--strict", testsupport::install::IMAGE])
            .arg(chart())
            .args(strs(&values))
            .output()
            .unwrap();
        let text = testsupport::output_text(&out);
        assert!(out.status.success(), "helm lint ({mode}):\n{text}");
        assert!(text.contains("0 chart(s) failed"), "{mode}:\n{text}");
        assert!(
            !text.contains("[ERROR]") && !text.contains("[WARNING]"),
            "{mode}:\n{text}"
        );
    }
}

#[test]
fn helm_is_the_pinned_release() {
    let out = helm().args(["version", "--short"]).output().unwrap();
    let version = String::from_utf8(out.stdout).unwrap();
    let pinned = testenv::required_version(&testenv::helm_module_dir(), "helm.sh/helm/v4").unwrap();
    assert!(version.starts_with(&pinned), "{version} is not {pinned}");
}

/// `webhook.enabled=false` registers no webhook (new nodes are held a pass
/// later); everything else renders as before.
#[test]
fn the_webhook_registration_can_be_turned_off() {
    let objects = release_objects(&template(&["--set=webhook.enabled=false"]));
    assert!(
        !objects
            .iter()
            .any(|o| kind(o) == "MutatingWebhookConfiguration")
    );
    let kinds = |objects: &[Value]| -> BTreeSet<String> {
        objects.iter().map(|o| kind(o).to_string()).collect()
    };
    let mut with = kinds(&release_objects(&template(&[])));
    with.remove("MutatingWebhookConfiguration");
    assert_eq!(kinds(&objects), with);
}

#[test]
fn each_tls_mode_renders_its_certificates_and_ca_bundle() {
    for (mode, values) in tls_modes() {
        let objects = template(&strs(&values));
        let webhook = webhook_of(&objects);
        let config = one(&objects, "MutatingWebhookConfiguration");
        let inject = &config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"];
        let volume_secret = &one(&objects, "Deployment")["spec"]["template"]["spec"]["volumes"][0]
            ["secret"]["secretName"];
        let service = webhook.client_config.service.as_ref().unwrap();
        assert_eq!(
            (
                service.name.as_str(),
                service.namespace.as_str(),
                service.path.as_deref(),
                service.port
            ),
            (RELEASE, NAMESPACE, Some("/mutate"), Some(443)),
            "{mode}"
        );
        assert!(webhook.client_config.url.is_none(), "{mode}");
        // Every namespaced object lands in the release namespace.
        for object in &objects {
            let cluster_scoped = matches!(
                kind(object),
                "ClusterRole" | "ClusterRoleBinding" | "MutatingWebhookConfiguration"
            );
            assert_eq!(
                object["metadata"]["namespace"].as_str(),
                (!cluster_scoped).then_some(NAMESPACE),
                "{mode}: {} {}",
                kind(object),
                name(object)
            );
        }
        let certificates = all_of(&objects, "Certificate");
        let issuers = all_of(&objects, "Issuer");
        match mode {
            "cert-manager, self-signed CA" => {
                assert_eq!(inject, "node-holder/node-holder-serving");
                assert!(webhook.client_config.ca_bundle.is_none());
                assert_eq!(volume_secret, "node-holder-tls");
                let names: BTreeSet<&str> = issuers.iter().map(|i| name(i)).collect();
                assert_eq!(
                    names,
                    BTreeSet::from(["node-holder-selfsigned", "node-holder-ca"])
                );
                let selfsigned = issuers
                    .iter()
                    .find(|i| name(i) == "node-holder-selfsigned")
                    .unwrap();
                assert_eq!(selfsigned["spec"], json!({"selfSigned": {}}));
                let ca_issuer = issuers
                    .iter()
                    .find(|i| name(i) == "node-holder-ca")
                    .unwrap();
                assert_eq!(ca_issuer["spec"]["ca"]["secretName"], "node-holder-ca");
                assert_eq!(certificates.len(), 2);
                let ca = certificates
                    .iter()
                    .find(|c| name(c) == "node-holder-ca")
                    .unwrap();
                assert_eq!(ca["spec"]["isCA"], true);
                assert_eq!(ca["spec"]["secretName"], "node-holder-ca");
                assert_eq!(ca["spec"]["issuerRef"]["name"], "node-holder-selfsigned");
                let serving = certificates
                    .iter()
                    .find(|c| name(c) == "node-holder-serving")
                    .unwrap();
                assert_eq!(serving["spec"]["issuerRef"]["name"], "node-holder-ca");
                assert_eq!(serving["spec"]["issuerRef"]["kind"], "Issuer");
            }
            "cert-manager, given issuer" => {
                assert_eq!(inject, "node-holder/node-holder-serving");
                assert!(webhook.client_config.ca_bundle.is_none());
                assert!(issuers.is_empty(), "no issuer of the chart's own");
                assert_eq!(certificates.len(), 1);
                assert_eq!(
                    certificates[0]["spec"]["issuerRef"],
                    json!({"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"})
                );
            }
            "provided Secret and caBundle" => {
                assert!(inject.is_null());
                assert!(
                    objects.iter().all(|o| !is_cert_manager(o)),
                    "no cert-manager objects"
                );
                assert_eq!(volume_secret, "node-holder-provided-tls");
                let bundle = webhook.client_config.ca_bundle.unwrap().0;
                assert!(
                    String::from_utf8(bundle)
                        .unwrap()
                        .contains("BEGIN CERTIFICATE"),
                    "the caBundle is the PEM CA"
                );
            }
            other => unreachable!("{other}"),
        }
        if let Some(serving) = certificates
            .iter()
            .find(|c| name(c) == "node-holder-serving")
        {
            assert_eq!(serving["spec"]["secretName"], "node-holder-tls");
            assert_eq!(
                serving["spec"]["dnsNames"],
                json!([
                    "node-holder.node-holder.svc",
                    "node-holder.node-holder.svc.cluster.local"
                ]),
                "{mode}: the Service's DNS names"
            );
            assert!(
                serving["spec"]["usages"]
                    .as_array()
                    .unwrap()
                    .contains(&json!("server auth"))
            );
        }
    }
}

#[test]
fn helm_template_refuses_incomplete_or_unsafe_values() {
    for (values, says) in [
        // No image is published by default: the chart asks for one.
        (
            vec!["--set=image.repository="],
            "image.repository is required",
        ),
        (vec!["--set=tls.mode=provided"], "tls.provided.caBundle"),
        (
            vec!["--set=config.warmBeforeRuns=2m"],
            "config.warmBeforeRuns needs config.launchCost",
        ),
        (
            vec![
                "--set=tls.mode=provided",
                "--set=tls.provided.caBundle=Zm9v",
            ],
            "tls.provided.secretName",
        ),
        // The values schema (chart/values.schema.json), before any template.
        (
            vec!["--set=tls.mode=selfmade"],
            "at '/tls/mode': value must be one of 'certManager', 'provided'",
        ),
        (
            vec!["--set=config.holdDurration=1m"],
            "at '/config': additional properties 'holdDurration' not allowed",
        ),
        // A value of a removed flag (docs/upgrading.md).
        (
            vec!["--set=config.releasePace=10%/1m"],
            "at '/config': additional properties 'releasePace' not allowed",
        ),
        (
            vec!["--set=config.holdMechanism=budget"],
            "at '/config': additional properties 'holdMechanism' not allowed",
        ),
        (
            vec!["--set=config.windowPerLabel=karpenter.sh/nodepool"],
            "at '/config': additional properties 'windowPerLabel' not allowed",
        ),
        (
            vec!["--set=replicaCount=two"],
            "at '/replicaCount': got string, want integer",
        ),
        (
            vec!["--set=config.holdPresets={karpenter-v2}"],
            "at '/config/holdPresets/0': value must be one of",
        ),
        (
            vec!["--set=config.logLevel=loud"],
            "at '/config/logLevel': value must be one of",
        ),
        (
            vec!["--set=podDisruptionBudget.enable=false"],
            "at '/podDisruptionBudget': additional properties 'enable' not allowed",
        ),
        (
            vec!["--set=tls.certManager.issuerRef.kind=ClusterIssuer"],
            "issuerRef.name",
        ),
        // 10s + 2s + 2s: the kubelet would kill a replica still draining.
        (
            vec!["--set=terminationGracePeriodSeconds=14"],
            "must be longer than",
        ),
        (
            vec!["--set=config.requestTimeout=10 fortnights"],
            "unknown duration unit",
        ),
        (
            vec!["--set=webhook.timeoutSeconds=60"],
            "webhook.timeoutSeconds",
        ),
        (
            vec![
                "--set=config.clientCA.secretName=a",
                "--set=config.clientCA.configMapName=b",
            ],
            "not both",
        ),
    ] {
        let err = try_template(&values).expect_err(&format!("{values:?} renders"));
        assert!(err.contains(says), "{values:?}: {err}");
    }
}

#[test]
fn the_deployment_sets_every_serve_flag_and_runs_locked_down() {
    // Every variable `node-holder serve` reads is set, and nothing else.
    let objects = template(&[
        "--set=config.holdPresets={karpenter-v1,cluster-autoscaler}",
        "--set=config.holdAnnotations.example\\.com/hold=yes",
        "--set=config.holdAnnotations.a\\.example\\.com/keep=please",
        "--set=config.launchCost=5m",
        "--set=config.warmBeforeRuns=2m",
    ]);
    let env = env_of(&objects);
    let names: BTreeSet<String> = env.keys().cloned().collect();
    assert_eq!(names, serve_env_vars(), "chart env vs `serve --help`");
    assert_eq!(
        env["NODE_HOLDER_HOLD_PRESETS"],
        "karpenter-v1,cluster-autoscaler"
    );
    assert_eq!(
        env["NODE_HOLDER_HOLD_ANNOTATIONS"],
        "a.example.com/keep=please,example.com/hold=yes"
    );
    assert_eq!(env["NODE_HOLDER_LAUNCH_COST"], "5m");
    assert_eq!(env["NODE_HOLDER_NAMESPACE"], "fieldRef:metadata.namespace");
    assert_eq!(env["NODE_HOLDER_WEBHOOK_ADDR"], "0.0.0.0:8443");
    assert_eq!(env["NODE_HOLDER_ADMIN_ADDR"], "0.0.0.0:8080");
    assert_eq!(
        env["NODE_HOLDER_TLS_CERT_FILE"],
        "/etc/node-holder/tls/tls.crt"
    );
    assert_eq!(
        env["NODE_HOLDER_TLS_KEY_FILE"],
        "/etc/node-holder/tls/tls.key"
    );

    // Defaults: the flags' own defaults, but JSON logs; empty lists unset
    // (serve refuses an empty list).
    let objects = template(&[]);
    let env = env_of(&objects);
    for (var, value) in [
        ("NODE_HOLDER_HOLD_DURATION", "20m"),
        ("NODE_HOLDER_MAX_HOLD", "2h"),
        ("NODE_HOLDER_NODE_SELECTOR", ""),
        ("NODE_HOLDER_LEASE_DURATION", "15s"),
        ("NODE_HOLDER_API_QPS", "250"),
        ("NODE_HOLDER_REQUEST_TIMEOUT", "2s"),
        ("NODE_HOLDER_MAX_CONNECTIONS", "1024"),
        ("NODE_HOLDER_IDLE_TIMEOUT", "120s"),
        ("NODE_HOLDER_SHUTDOWN_GRACE", "10s"),
        ("NODE_HOLDER_LOG_FORMAT", "json"),
        ("NODE_HOLDER_LOG_LEVEL", "info"),
        // Empty: no client certificates required.
        ("NODE_HOLDER_CLIENT_CA_FILE", ""),
    ] {
        assert_eq!(env[var], value, "{var}");
    }
    assert!(!env.contains_key("NODE_HOLDER_HOLD_PRESETS"));
    assert!(!env.contains_key("NODE_HOLDER_HOLD_ANNOTATIONS"));
    assert!(!env.contains_key("NODE_HOLDER_WINDOW_PER_LABEL"));
    assert!(!env.contains_key("NODE_HOLDER_HOLD_MECHANISM"));
    assert!(
        !env.contains_key("NODE_HOLDER_LAUNCH_COST"),
        "the schedule hold is off"
    );

    let deployment = one(&objects, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let c = container(&objects);
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_eq!(pod["serviceAccountName"], "node-holder");
    assert_eq!(c["args"], json!(["serve"]));
    let anti =
        &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(
        anti["podAffinityTerm"]["topologyKey"],
        "kubernetes.io/hostname"
    );
    assert_eq!(
        anti["podAffinityTerm"]["labelSelector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let pdb = one(&objects, "PodDisruptionBudget");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let port = |name: &str| {
        c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()["containerPort"]
            .clone()
    };
    assert_eq!(port("webhook"), 8443);
    assert_eq!(port("admin"), 8080);
    assert_eq!(
        c["livenessProbe"]["httpGet"],
        json!({"path": "/healthz", "port": "admin"})
    );
    assert_eq!(
        c["readinessProbe"]["httpGet"],
        json!({"path": "/readyz", "port": "admin"})
    );
    let security = &c["securityContext"];
    assert_eq!(security["runAsNonRoot"], true);
    assert_eq!(security["runAsUser"], 65532);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(security["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(
        c["volumeMounts"],
        json!([{"name": "tls", "mountPath": "/etc/node-holder/tls", "readOnly": true}])
    );
    assert!(c["resources"]["requests"]["memory"].is_string());
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    // The client CA, when given, is mounted read-only and named to serve.
    let with_ca = template(&["--set=config.clientCA.secretName=apiserver-client-ca"]);
    assert_eq!(
        env_of(&with_ca)["NODE_HOLDER_CLIENT_CA_FILE"],
        "/etc/node-holder/client-ca/ca.crt"
    );
    assert_eq!(
        container(&with_ca)["volumeMounts"][1],
        json!({"name": "client-ca", "mountPath": "/etc/node-holder/client-ca", "readOnly": true})
    );
    // Longer than --shutdown-grace + the drain (10s, and 2s + 2s after it).
    assert!(pod["terminationGracePeriodSeconds"].as_i64().unwrap() > 14);
    let service = one(&objects, "Service");
    assert_eq!(
        service["spec"]["selector"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(
        service["spec"]["ports"][0],
        json!({"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"})
    );

    // Values reach the pod.
    let objects = template(&[
        "--set=priorityClassName=system-cluster-critical",
        "--set=config.shutdownGrace=1m",
        "--set=config.requestTimeout=30s",
        "--set=config.holdDuration=90s",
        "--set=config.apiQps=1000000",
        "--set=replicaCount=3",
        "--set=webhook.objectSelector.matchLabels.pool=batch",
    ]);
    let pod = &one(&objects, "Deployment")["spec"]["template"]["spec"];
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert!(pod["terminationGracePeriodSeconds"].as_i64().unwrap() > 90);
    let env = env_of(&objects);
    assert_eq!(env["NODE_HOLDER_HOLD_DURATION"], "90s");
    assert_eq!(env["NODE_HOLDER_API_QPS"], "1000000");
    assert_eq!(one(&objects, "Deployment")["spec"]["replicas"], 3);
    let webhook = webhook_of(&objects);
    assert_eq!(
        serde_json::to_value(webhook.object_selector).unwrap(),
        json!({"matchLabels": {"pool": "batch"}})
    );
    // One replica: no PodDisruptionBudget that would block every drain.
    assert!(all_of(&template(&["--set=replicaCount=1"]), "PodDisruptionBudget").is_empty());
}

#[test]
fn the_dockerfile_builds_node_holder_for_a_non_root_user() {
    let instructions = install::dockerfile_instructions();
    let lines: Vec<&str> = instructions.iter().map(String::as_str).collect();
    let dockerfile = instructions.join("\n");
    let stages: Vec<&&str> = lines.iter().filter(|l| l.starts_with("FROM ")).collect();
    assert!(stages[0].ends_with(" AS build"), "{stages:?}");
    // The runtime stage adds nothing but node-holder's own files (what they
    // are: tests/image.rs, which builds it).
    assert_eq!(stages.last().map(|s| **s), Some("FROM scratch"));
    assert!(
        dockerfile.contains("+crt-static"),
        "static: no libraries in the image"
    );
    assert!(dockerfile.contains("--locked"));
    assert!(dockerfile.contains("--bin node-holder"));
    // Instructions after the last FROM describe the runtime image.
    let runtime = &lines[lines.iter().rposition(|l| l.starts_with("FROM ")).unwrap()..];
    let user = runtime
        .iter()
        .find_map(|l| l.strip_prefix("USER "))
        .unwrap();
    assert_eq!(
        user.split(':').next(),
        Some("65532"),
        "runs as the chart's runAsUser"
    );
    assert!(runtime.contains(&r#"ENTRYPOINT ["/usr/local/bin/node-holder"]"#));
    assert!(runtime.contains(&r#"CMD ["serve"]"#));
    let ignore = std::fs::read_to_string(repo().join(".dockerignore")).unwrap();
    for entry in ["target/", ".git/", "certs/dev/"] {
        assert!(ignore.lines().any(|l| l.trim() == entry), "{entry} ignored");
    }
}

#[test]
fn the_charts_rbac_is_exactly_webhook_config_rbac() {
    let plain = manifest("webhook-config/rbac.yaml");
    for (mode, values) in tls_modes() {
        // The release's own; its hooks' rights are tests/uninstall.rs's and
        // tests/chart_values.rs's.
        let objects = release_objects(&template(&strs(&values)));
        for k in ["ClusterRole", "Role"] {
            assert_eq!(
                rules_of(one(&objects, k)),
                rules_of(one(&plain, k)),
                "{mode}: {k} rules"
            );
        }
        for k in ["ClusterRoleBinding", "RoleBinding"] {
            assert_eq!(
                one(&objects, k)["subjects"],
                one(&plain, k)["subjects"],
                "{mode}: {k}"
            );
            assert_eq!(
                one(&objects, k)["roleRef"],
                one(&plain, k)["roleRef"],
                "{mode}: {k}"
            );
        }
        let account = one(&objects, "ServiceAccount");
        assert_eq!(account["metadata"]["name"], "node-holder");
        assert_eq!(account["metadata"]["namespace"], "node-holder");
        assert_eq!(
            format!("system:serviceaccount:{NAMESPACE}:{}", name(account)),
            testenv::NODE_HOLDER_USER,
            "the identity the tests run node-holder as"
        );
        // The chart grants nothing else.
        let rbac_kinds = objects
            .iter()
            .filter(|o| kind(o).contains("Role") || kind(o) == "ServiceAccount")
            .count();
        assert_eq!(rbac_kinds, 5, "{mode}");
    }
    // The schedule hold adds exactly webhook-config/rbac-schedules.yaml.
    adds_exactly("--set=config.launchCost=5m", "schedules");
    warms_add_exactly_their_rbac();
}

/// Warms (`config.warmBeforeRuns`, beside `config.launchCost`) add exactly
/// `webhook-config/rbac-warm.yaml`: a Role for the placeholder Jobs in the
/// release's namespace and a ClusterRole for their PriorityClass.
fn warms_add_exactly_their_rbac() {
    let plain = manifest("webhook-config/rbac-warm.yaml");
    let values = [
        "--set=config.launchCost=5m",
        "--set=config.warmBeforeRuns=2m",
    ];
    let objects = release_objects(&template(&values));
    for role_kind in ["Role", "ClusterRole"] {
        let added = objects
            .iter()
            .find(|o| kind(o) == role_kind && name(o).ends_with("-warm"))
            .unwrap_or_else(|| panic!("the warm {role_kind}"));
        assert_eq!(
            rules_of(added),
            rules_of(one(&plain, role_kind)),
            "{role_kind}"
        );
        let binding_kind = format!("{role_kind}Binding");
        let binding = objects
            .iter()
            .find(|o| kind(o) == binding_kind && name(o).ends_with("-warm"))
            .unwrap_or_else(|| panic!("the warm {binding_kind}"));
        assert_eq!(binding["roleRef"]["name"], name(added));
        assert_eq!(binding["subjects"], one(&plain, &binding_kind)["subjects"]);
    }
    let env = objects
        .iter()
        .find(|o| kind(o) == "Deployment")
        .map(|d| d["spec"]["template"]["spec"]["containers"][0]["env"].clone())
        .unwrap_or_default();
    let warm = env
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "NODE_HOLDER_WARM_BEFORE_RUNS");
    assert_eq!(warm.map(|e| e["value"].clone()), Some(Value::from("2m")));
}

/// With `value` set, the chart adds one ClusterRole and its binding, named
/// `*-{what}`, exactly as `webhook-config/rbac-{what}.yaml`.
fn adds_exactly(value: &str, what: &str) {
    let plain = manifest(&format!("webhook-config/rbac-{what}.yaml"));
    let objects = release_objects(&template(&[value]));
    let roles: Vec<&Value> = objects
        .iter()
        .filter(|o| kind(o) == "ClusterRole")
        .collect();
    assert_eq!(roles.len(), 2, "{value}");
    let suffix = format!("-{what}");
    let added = roles
        .iter()
        .find(|r| name(r).ends_with(&suffix))
        .expect("the added ClusterRole");
    assert_eq!(rules_of(added), rules_of(one(&plain, "ClusterRole")));
    let bindings = objects.iter().filter(|o| kind(o) == "ClusterRoleBinding");
    let binding = bindings
        .into_iter()
        .find(|b| name(b).ends_with(&suffix))
        .expect("the added ClusterRoleBinding");
    assert_eq!(
        binding["subjects"],
        one(&plain, "ClusterRoleBinding")["subjects"]
    );
    assert_eq!(binding["roleRef"]["name"], name(added));
}

/// `assert_eq!(a.field, b.field, "{what}: label")` for each field.
macro_rules! assert_same_fields {
    ($a:expr, $b:expr, $what:expr, { $($field:ident: $label:literal),+ $(,)? }) => {
        $(assert_eq!($a.$field, $b.$field, "{}: {}", $what, $label);)+
    };
}

#[test]
fn the_plain_webhook_manifests_carry_the_charts_rules_and_settings() {
    let service_manifest = manifest("webhook-config/webhook-service.yaml");
    let local_manifest = manifest("webhook-config/webhook-local.yaml");
    let plain_service = webhook_of(&service_manifest);
    let local = webhook_of(&local_manifest);
    for (mode, values) in tls_modes() {
        let objects = template(&strs(&values));
        let chart = webhook_of(&objects);
        for (file, plain) in [
            ("webhook-service.yaml", &plain_service),
            ("webhook-local.yaml", &local),
        ] {
            let what = format!("{mode} vs {file}");
            assert_same_fields!(chart, plain, what, {
                name: "name",
                rules: "rules",
                failure_policy: "failurePolicy",
                side_effects: "sideEffects",
                timeout_seconds: "timeoutSeconds",
                admission_review_versions: "admissionReviewVersions",
                reinvocation_policy: "reinvocationPolicy",
                match_policy: "matchPolicy",
                object_selector: "objectSelector",
                match_conditions: "matchConditions",
                namespace_selector: "namespaceSelector",
            });
        }
        // The settings themselves, as issue 7 and REFERENCE.md ask.
        assert_eq!(chart.failure_policy.as_deref(), Some("Ignore"));
        assert_eq!(chart.side_effects, "None");
        assert!(chart.timeout_seconds.is_some_and(|t| (1..=5).contains(&t)));
        assert_eq!(chart.admission_review_versions, vec!["v1".to_string()]);
        let rule = &chart.rules.as_ref().unwrap()[0];
        assert_eq!(rule.operations, Some(vec!["CREATE".to_string()]));
        assert_eq!(rule.resources, Some(vec!["nodes".to_string()]));
        assert_eq!(rule.scope.as_deref(), Some("Cluster"));
        // The Service route is the chart's.
        assert_eq!(
            chart.client_config.service, plain_service.client_config.service,
            "{mode}: service clientConfig"
        );
        assert_eq!(
            one(&objects, "MutatingWebhookConfiguration")["metadata"]["name"],
            one(&service_manifest, "MutatingWebhookConfiguration")["metadata"]["name"]
        );
        let service = one(&objects, "Service");
        let plain = one(&service_manifest, "Service");
        assert_eq!(service["metadata"]["name"], plain["metadata"]["name"]);
        assert_eq!(
            service["metadata"]["namespace"],
            plain["metadata"]["namespace"]
        );
        assert_eq!(service["spec"]["selector"], plain["spec"]["selector"]);
        let ports = |s: &Value| -> Vec<(Value, Value)> {
            s["spec"]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p["name"].clone(), p["port"].clone()))
                .collect()
        };
        assert_eq!(ports(service), ports(plain), "{mode}: Service ports");
    }
    assert!(local.client_config.service.is_none());
    assert_eq!(
        local.client_config.url.as_deref(),
        Some("https://127.0.0.1:8443/mutate")
    );
}

async fn create_restricted_namespace(cp: &ControlPlane) {
    let client = cp.admin_client().await.unwrap();
    install::create_namespace(&client, NAMESPACE, "restricted").await;
}

#[tokio::test]
async fn every_rendered_object_is_accepted_by_the_api_server() {
    let cp = ControlPlane::start().await.unwrap();
    let client = cp.admin_client().await.unwrap();
    create_restricted_namespace(&cp).await;
    install_cert_manager_crds(&cp).await;
    for (mode, values) in tokio::task::spawn_blocking(tls_modes).await.unwrap() {
        let objects = tokio::task::spawn_blocking(move || template(&strs(&values)))
            .await
            .unwrap();
        testenv::dry_run_objects(&client, &objects)
            .await
            .unwrap_or_else(|err| panic!("{mode}: {err:#}"));
        // The pod the Deployment makes passes `restricted` enforcement.
        testenv::dry_run_objects(&client, &[pod_of(&objects, NAMESPACE)])
            .await
            .unwrap_or_else(|err| panic!("{mode}: the pod: {err:#}"));
    }
    // ...with a priority class too.
    let objects = tokio::task::spawn_blocking(|| {
        template(&["--set=priorityClassName=system-cluster-critical"])
    })
    .await
    .unwrap();
    testenv::dry_run_objects(
        &client,
        &[
            one(&objects, "Deployment").clone(),
            pod_of(&objects, NAMESPACE),
        ],
    )
    .await
    .unwrap();
    // ...and with the webhook's optional selectors, which the API server
    // checks (CEL compiled, selector parsed).
    let objects = tokio::task::spawn_blocking(|| {
        template(&[
            "--set-json=webhook.objectSelector={\"matchExpressions\":[{\"key\":\"node-holder.dev/skip\",\"operator\":\"DoesNotExist\"}]}",
            "--set-json=webhook.matchConditions=[{\"name\":\"not-virtual\",\"expression\":\"!has(object.metadata.labels) || object.metadata.labels[?'type'].orValue('') != 'virtual-kubelet'\"}]",
        ])
    })
    .await
    .unwrap();
    let webhook = webhook_of(&objects);
    assert_eq!(
        webhook.match_conditions.as_ref().unwrap()[0].name,
        "not-virtual"
    );
    assert!(webhook.object_selector.is_some());
    testenv::dry_run_objects(
        &client,
        &[one(&objects, "MutatingWebhookConfiguration").clone()],
    )
    .await
    .unwrap();
    let mut broken = one(&objects, "MutatingWebhookConfiguration").clone();
    broken["webhooks"][0]["matchConditions"][0]["expression"] = json!("object.metadata.(");
    testenv::dry_run_objects(&client, &[broken])
        .await
        .expect_err("a CEL expression that does not compile is refused");
    // The enforcement is real: a pod that may escalate is refused.
    let mut loose = pod_of(&objects, NAMESPACE);
    loose["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = json!(true);
    let err = testenv::dry_run_objects(&client, &[loose])
        .await
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("allowPrivilegeEscalation"),
        "{err:#}"
    );

    // The plain manifests too.
    for path in [
        "webhook-config/rbac.yaml",
        "webhook-config/webhook-service.yaml",
        "webhook-config/webhook-local.yaml",
    ] {
        testenv::dry_run_objects(&client, &manifest(path))
            .await
            .unwrap_or_else(|err| panic!("{path}: {err:#}"));
    }
    // Nothing was stored.
    let configs: Api<MutatingWebhookConfiguration> = Api::all(client);
    assert!(
        configs
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

/// Starts `node-holder serve` as node-holder's restricted identity with the
/// rendered Deployment's arguments and environment: the pod's own fields
/// filled in as the kubelet would, the addresses and certificate files local.
/// Grants nothing (unlike `common::serve`, which installs
/// webhook-config/rbac.yaml).
async fn serve_as_the_chart_configures_it(cp: &ControlPlane, objects: &[Value]) -> Served {
    let (args, mut env) = pod_command(objects);
    launch(cp, |command, at| {
        env.insert(
            "NODE_HOLDER_WEBHOOK_ADDR".into(),
            format!("127.0.0.1:{}", at.webhook_port),
        );
        env.insert(
            "NODE_HOLDER_ADMIN_ADDR".into(),
            format!("127.0.0.1:{}", at.admin_port),
        );
        use_cert_files(&mut env, at.cert_dir);
        for (var, _) in std::env::vars() {
            if var.starts_with("NODE_HOLDER_") {
                command.env_remove(var);
            }
        }
        command.args(&args).envs(&env);
    })
    .await
}

/// Anything of node-holder's on `node`, or the hold annotation itself.
fn carries_a_hold_or_anything_of_node_holders(node: &Node) -> bool {
    common::window::carries_anything_of_node_holders(node)
        || node
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(HOLD))
}

fn forbidden<T: std::fmt::Debug>(what: &str, result: Result<T, kube::Error>) {
    match result {
        Err(kube::Error::Api(status)) if status.code == 403 => {}
        other => panic!("{what}: expected 403 Forbidden, got {other:?}"),
    }
}

#[tokio::test]
async fn node_holder_with_only_the_charts_rbac_holds_and_releases_and_nothing_more() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.admin_client().await.unwrap();
    let restricted = cp.node_holder_client().await.unwrap();
    create_restricted_namespace(&cp).await;
    // Before the chart's RBAC, node-holder's identity may do nothing.
    let restricted_nodes: Api<Node> = Api::all(restricted.clone());
    forbidden(
        "listing nodes before the chart's RBAC",
        restricted_nodes.list(&ListParams::default()).await,
    );

    // The chart's RBAC objects and configuration, with a short window.
    let objects = tokio::task::spawn_blocking(|| {
        template(&[
            "--set=config.holdDuration=4s",
            "--set=config.leaseDuration=3s",
        ])
    })
    .await
    .unwrap();
    let rbac: Vec<Value> = release_objects(&objects)
        .iter()
        .filter(|o| {
            matches!(
                kind(o),
                "ServiceAccount" | "ClusterRole" | "ClusterRoleBinding" | "Role" | "RoleBinding"
            )
        })
        .cloned()
        .collect();
    assert_eq!(rbac.len(), 5);
    testenv::apply_objects(&admin, &rbac).await.unwrap();

    // A node older than the hold: it opens no window, but is held in one.
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .create(&PostParams::default(), &node("old-1"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;

    let served = serve_as_the_chart_configures_it(&cp, &objects).await;
    register_webhook(&cp, &served).await;
    let created = nodes
        .create(&PostParams::default(), &node("new-1"))
        .await
        .unwrap();
    assert!(held(&created), "held by the webhook");
    let api = &nodes;
    eventually_logging(
        "the old node held by the window task",
        Duration::from_secs(10),
        &served,
        || async move { held(&api.get("old-1").await.unwrap()) },
    )
    .await;
    // The window record and the Lease, the pod's name as the identity.
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), NAMESPACE);
    assert!(config_maps.get(WINDOW).await.is_ok(), "the window record");
    let leases: Api<Lease> = Api::namespaced(admin.clone(), NAMESPACE);
    let lease = leases.get(WINDOW).await.unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("node-holder-5d8f7-abcde")
    );

    eventually_logging(
        "every hold released",
        Duration::from_secs(15),
        &served,
        || async move {
            api.list(&ListParams::default())
                .await
                .unwrap()
                .items
                .iter()
                .all(|n| !carries_a_hold_or_anything_of_node_holders(n))
        },
    )
    .await;
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let events = &events;
    eventually_logging(
        "hold and release events",
        Duration::from_secs(10),
        &served,
        || async move {
            has_node_events(
                events,
                &[
                    ("new-1", "HoldWindowOpened"),
                    ("old-1", "HoldApplied"),
                    ("old-1", "HoldReleased"),
                ],
            )
            .await
        },
    )
    .await;
    let log = served.log();
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "node-holder was refused something it needs:\n{log}"
    );

    // Outside the chart's RBAC: refused.
    let config_map = |name: &str| ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    config_maps
        .create(&PostParams::default(), &config_map("other"))
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(restricted.clone(), NAMESPACE);
    forbidden(
        "listing Secrets",
        secrets.list(&ListParams::default()).await,
    );
    forbidden("reading a Secret", secrets.get("node-holder-tls").await);
    let all_secrets: Api<Secret> = Api::all(restricted.clone());
    forbidden(
        "listing Secrets cluster-wide",
        all_secrets.list(&ListParams::default()).await,
    );
    forbidden(
        "deleting a node",
        restricted_nodes
            .delete("old-1", &DeleteParams::default())
            .await,
    );
    forbidden(
        "creating a node",
        restricted_nodes
            .create(&PostParams::default(), &node("by-node-holder"))
            .await,
    );
    let restricted_config_maps: Api<ConfigMap> = Api::namespaced(restricted.clone(), NAMESPACE);
    forbidden(
        "patching a ConfigMap of another name",
        restricted_config_maps
            .patch(
                "other",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"x": "y"}})),
            )
            .await,
    );
    forbidden(
        "reading a ConfigMap of another name",
        restricted_config_maps.get("other").await,
    );
    forbidden(
        "deleting the window record",
        restricted_config_maps
            .delete(WINDOW, &DeleteParams::default())
            .await,
    );
    let restricted_leases: Api<Lease> = Api::namespaced(restricted.clone(), NAMESPACE);
    forbidden(
        "reading another Lease",
        restricted_leases.get("other").await,
    );
    let default_config_maps: Api<ConfigMap> = Api::namespaced(restricted.clone(), "default");
    forbidden(
        "creating a ConfigMap in another namespace",
        default_config_maps
            .create(&PostParams::default(), &config_map(WINDOW))
            .await,
    );
    let pods: Api<Pod> = Api::all(restricted.clone());
    forbidden("listing pods", pods.list(&ListParams::default()).await);
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(restricted.clone());
    forbidden(
        "listing webhook configurations",
        webhooks.list(&ListParams::default()).await,
    );
    // ...and inside it: allowed.
    assert!(restricted_config_maps.get(WINDOW).await.is_ok());
    assert!(restricted_leases.get(WINDOW).await.is_ok());
    assert!(restricted_nodes.list(&ListParams::default()).await.is_ok());
}
