//! The chart's values for a real cluster (`chart/values.yaml`): the escape
//! hatches (`extraArgs`, `extraEnv`, `extraVolumes`, `extraVolumeMounts`,
//! `extraObjects`, `podSecurityContext`, `additionalLabels`), `hostNetwork`,
//! the optional NetworkPolicy, the ServiceAccount, the default priority class
//! and placement (shared by the hooks' pods), the checks of what the cluster
//! serves (cert-manager, the Prometheus Operator, EKS Auto Mode), the
//! ServiceMonitor's relabelings and the alerts' runbook URLs, the `helm test`
//! hook, NOTES.txt, the chart's metadata, and the image (`image.registry`,
//! `image.repository`, `image.tag`, `image.digest`: the digest wins):
//! - each value's default, and its effect when set, in the rendered objects;
//! - the values schema refuses a wrong type for each;
//! - the objects rendered with them are accepted by the API server, and the
//!   `helm test` Pod's command, `node-holder self-check` run as the hook's
//!   ServiceAccount, passes only while new nodes are held and a replica leads.

use testsupport as common;
use testsupport::install;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use install::{
    NAMESPACE, RELEASE, all_of, chart, container, create_namespace, helm,
    install_cert_manager_crds, install_prometheus_operator_crds, kind, name, one, pod_of, repo,
    try_template,
};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use serde_json::{Value, json};
use testenv::ControlPlane;

const HOOK: &str = "helm.sh/hook";
const HOOK_DELETE: &str = "helm.sh/hook-delete-policy";
const TEST_NAME: &str = "node-holder-test";
/// The namespace whose Pod Security level lets a host-network pod in.
const PRIVILEGED_NAMESPACE: &str = "node-holder-privileged";

/// What a cluster with cert-manager serves, for `helm template` (the default
/// TLS mode renders its Certificates only where they are served).
const CERT_MANAGER: &str = "--api-versions=cert-manager.io/v1/Certificate";
const SERVICE_MONITOR: &str = "--api-versions=monitoring.coreos.com/v1/ServiceMonitor";
const PROMETHEUS_RULE: &str = "--api-versions=monitoring.coreos.com/v1/PrometheusRule";
/// What EKS Auto Mode serves.
const AUTO_MODE: &str = "--api-versions=eks.amazonaws.com/v1/NodeClass";

/// `helm template` with `values`, on a cluster that serves cert-manager's and
/// the Prometheus Operator's APIs.
fn try_render(values: &[&str]) -> Result<Vec<Value>, String> {
    let served = [CERT_MANAGER, SERVICE_MONITOR, PROMETHEUS_RULE];
    try_template(&[&served[..], values].concat())
}

fn render(values: &[&str]) -> Vec<Value> {
    try_render(values).unwrap_or_else(|err| panic!("helm template {values:?} failed:\n{err}"))
}

fn pod_spec(objects: &[Value]) -> &Value {
    &one(objects, "Deployment")["spec"]["template"]["spec"]
}

fn selector(objects: &[Value]) -> &Value {
    &one(objects, "Deployment")["spec"]["selector"]["matchLabels"]
}

/// The objects `helm test` creates (annotated `helm.sh/hook: test`).
fn hooks(objects: &[Value]) -> Vec<&Value> {
    objects
        .iter()
        .filter(|o| o["metadata"]["annotations"][HOOK] == "test")
        .collect()
}

fn hook_of<'a>(objects: &'a [Value], k: &str) -> &'a Value {
    let found: Vec<&Value> = hooks(objects)
        .into_iter()
        .filter(|o| kind(o) == k)
        .collect();
    assert_eq!(found.len(), 1, "exactly one test hook {k}");
    found[0]
}

/// The test Pod's environment: literal values, and `fieldRef:<path>` for
/// values taken from the pod.
fn test_env(objects: &[Value]) -> BTreeMap<String, String> {
    hook_of(objects, "Pod")["spec"]["containers"][0]["env"]
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

fn names_of(list: &Value) -> Vec<&str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect()
}

#[test]
fn the_escape_hatches_are_appended_to_the_pod_and_empty_by_default() {
    let plain = render(&[]);
    let c = container(&plain);
    assert_eq!(c["args"], json!(["serve"]));
    assert!(
        names_of(&c["env"])
            .iter()
            .all(|n| n.starts_with("NODE_HOLDER_"))
    );
    assert_eq!(names_of(&c["volumeMounts"]), ["tls"]);
    assert_eq!(names_of(&pod_spec(&plain)["volumes"]), ["tls"]);

    let objects = render(&[
        "--set=extraArgs={--log-level=debug,--api-qps=10}",
        "--set-json=extraEnv=[{\"name\":\"RUST_BACKTRACE\",\"value\":\"1\"},{\"name\":\"TOKEN\",\"valueFrom\":{\"secretKeyRef\":{\"name\":\"s\",\"key\":\"k\"}}}]",
        "--set-json=extraVolumes=[{\"name\":\"scratch\",\"emptyDir\":{}}]",
        "--set-json=extraVolumeMounts=[{\"name\":\"scratch\",\"mountPath\":\"/scratch\"}]",
    ]);
    let c = container(&objects);
    assert_eq!(
        c["args"],
        json!(["serve", "--log-level=debug", "--api-qps=10"])
    );
    // After the chart's own, which stay as they were.
    let env = c["env"].as_array().unwrap();
    let chart_env = container(&plain)["env"].as_array().unwrap();
    assert_eq!(env[..chart_env.len()], chart_env[..]);
    assert_eq!(
        env[chart_env.len()..],
        [
            json!({"name": "RUST_BACKTRACE", "value": "1"}),
            json!({"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}),
        ]
    );
    assert_eq!(
        c["volumeMounts"],
        json!([
            {"name": "tls", "mountPath": "/etc/node-holder/tls", "readOnly": true},
            {"name": "scratch", "mountPath": "/scratch"},
        ])
    );
    let volumes = &pod_spec(&objects)["volumes"];
    assert_eq!(names_of(volumes), ["tls", "scratch"]);
    assert_eq!(volumes[1], json!({"name": "scratch", "emptyDir": {}}));
}

/// The hardened default, which the chart rendered before the value existed.
fn hardened() -> Value {
    json!({
        "runAsNonRoot": true,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "fsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    })
}

#[test]
fn the_pod_security_context_defaults_to_the_hardened_one_and_can_be_replaced() {
    let objects = render(&[]);
    assert_eq!(pod_spec(&objects)["securityContext"], hardened());
    // The test Pod runs with the same.
    assert_eq!(
        hook_of(&objects, "Pod")["spec"]["securityContext"],
        hardened()
    );
    // Helm merges a given key into the default; null drops one.
    let objects = render(&[
        "--set=podSecurityContext.fsGroup=null",
        "--set=podSecurityContext.runAsUser=1000",
        "--set=podSecurityContext.supplementalGroups={5}",
    ]);
    let mut expected = hardened();
    expected.as_object_mut().unwrap().remove("fsGroup");
    expected["runAsUser"] = json!(1000);
    expected["supplementalGroups"] = json!([5]);
    assert_eq!(pod_spec(&objects)["securityContext"], expected);
    // The container's own is fixed.
    let c = container(&objects);
    assert_eq!(c["securityContext"]["runAsUser"], 65532);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
}

#[test]
fn additional_labels_land_on_every_object_and_the_pods() {
    for mode in ["webhook", "policy"] {
        let objects = render(&[
            &format!("--set=admission.mode={mode}"),
            "--set=additionalLabels.team=infra",
            "--set-string=additionalLabels.example\\.com/cost-center=42",
            "--set=networkPolicy.enabled=true",
            "--set=metrics.serviceMonitor.enabled=true",
            "--set=metrics.prometheusRule.enabled=true",
            "--set=metrics.dashboard.enabled=true",
            "--set=podLabels.tier=ops",
        ]);
        assert!(objects.len() > 10, "{mode}");
        for object in &objects {
            let labels = &object["metadata"]["labels"];
            let what = format!("{mode}: {} {}", kind(object), name(object));
            assert_eq!(labels["team"], "infra", "{what}");
            assert_eq!(labels["example.com/cost-center"], "42", "{what}");
            assert_eq!(labels["app.kubernetes.io/managed-by"], "Helm", "{what}");
        }
        let pod_labels = &one(&objects, "Deployment")["spec"]["template"]["metadata"]["labels"];
        assert_eq!(pod_labels["team"], "infra");
        assert_eq!(pod_labels["tier"], "ops");
        // The selector is unchanged.
        assert_eq!(
            selector(&objects),
            &json!({"app.kubernetes.io/name": "node-holder", "app.kubernetes.io/instance": RELEASE})
        );
    }
    // Default: the chart's labels only.
    let objects = render(&[]);
    for object in &objects {
        let labels = object["metadata"]["labels"].as_object().unwrap();
        assert!(
            labels
                .keys()
                .all(|k| k.starts_with("app.kubernetes.io/") || k == "helm.sh/chart"),
            "{} {}: {labels:?}",
            kind(object),
            name(object)
        );
    }
    // podLabels win over additionalLabels on the pods.
    let objects = render(&["--set=additionalLabels.tier=a", "--set=podLabels.tier=b"]);
    assert_eq!(
        one(&objects, "Deployment")["spec"]["template"]["metadata"]["labels"]["tier"],
        "b"
    );
    assert_eq!(
        one(&objects, "Deployment")["metadata"]["labels"]["tier"],
        "a"
    );
}

#[test]
fn host_network_binds_the_ports_on_the_node_and_is_off_by_default() {
    let objects = render(&[]);
    let pod = pod_spec(&objects);
    assert!(pod.get("hostNetwork").is_none());
    assert!(pod.get("dnsPolicy").is_none());
    let objects = render(&[
        "--set=hostNetwork=true",
        "--set=webhookPort=9443",
        "--set=adminPort=9080",
    ]);
    let pod = pod_spec(&objects);
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    let env = install::env_of(&objects);
    assert_eq!(env["NODE_HOLDER_WEBHOOK_ADDR"], "0.0.0.0:9443");
    assert_eq!(env["NODE_HOLDER_ADMIN_ADDR"], "0.0.0.0:9080");
    let ports: Vec<&Value> = container(&objects)["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["containerPort"])
        .collect();
    assert_eq!(ports, [&json!(9443), &json!(9080)]);
}

/// The rules of the NetworkPolicy rendered with `values`: (port, from) of
/// each ingress rule, and the policy itself.
fn network_policy(values: &[&str]) -> (Vec<(Value, Value)>, Value) {
    let mut args = vec!["--set=networkPolicy.enabled=true"];
    args.extend_from_slice(values);
    let objects = render(&args);
    let policy = one(&objects, "NetworkPolicy").clone();
    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"],
        *selector(&objects)
    );
    assert_eq!(policy["metadata"]["namespace"], NAMESPACE);
    let rules = policy["spec"]["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rule| {
            assert_eq!(rule["ports"].as_array().unwrap().len(), 1);
            assert_eq!(rule["ports"][0]["protocol"], "TCP");
            (rule["ports"][0]["port"].clone(), rule["from"].clone())
        })
        .collect();
    (rules, policy)
}

#[test]
fn the_network_policy_lets_in_the_webhook_and_admin_ports_only() {
    assert!(
        all_of(&render(&[]), "NetworkPolicy").is_empty(),
        "off by default"
    );
    // Anyone may reach both ports; egress is not restricted.
    let (rules, policy) = network_policy(&[]);
    assert_eq!(
        rules,
        [(json!(8443), Value::Null), (json!(8080), Value::Null)]
    );
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    assert!(policy["spec"].get("egress").is_none());
    // Peers and egress rules as given; the ports follow the values.
    let monitoring = json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]);
    let control_plane = json!([{"ipBlock": {"cidr": "10.0.0.0/16"}}]);
    let egress = json!([{"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}], "ports": [{"port": 443, "protocol": "TCP"}]}]);
    let (rules, policy) = network_policy(&[
        &format!("--set-json=networkPolicy.metricsFrom={monitoring}"),
        &format!("--set-json=networkPolicy.webhookFrom={control_plane}"),
        &format!("--set-json=networkPolicy.egress={egress}"),
        "--set=webhookPort=9443",
        "--set=adminPort=9080",
    ]);
    assert_eq!(
        rules,
        [(json!(9443), control_plane), (json!(9080), monitoring)]
    );
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    assert_eq!(policy["spec"]["egress"], egress);
    // Policy mode opens no webhook port.
    let (rules, _) = network_policy(&["--set=admission.mode=policy"]);
    assert_eq!(rules, [(json!(8080), Value::Null)]);
}

#[test]
fn the_priority_class_defaults_to_system_cluster_critical() {
    let objects = render(&[]);
    assert_eq!(
        pod_spec(&objects)["priorityClassName"],
        "system-cluster-critical"
    );
    let objects = render(&["--set=priorityClassName="]);
    assert!(pod_spec(&objects).get("priorityClassName").is_none());
    let objects = render(&["--set=priorityClassName=platform"]);
    assert_eq!(pod_spec(&objects)["priorityClassName"], "platform");
}

/// The default node affinity: off Karpenter's nodes.
fn off_karpenter_nodes() -> Value {
    json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "karpenter.sh/nodepool", "operator": "DoesNotExist"}]}
    ]}})
}

#[test]
fn default_scheduling_avoids_karpenter_nodes_and_spreads_over_zones() {
    let objects = render(&[]);
    let pod = pod_spec(&objects);
    assert_eq!(pod["affinity"]["nodeAffinity"], off_karpenter_nodes());
    let anti =
        &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(
        anti[0]["podAffinityTerm"]["topologyKey"],
        "kubernetes.io/hostname"
    );
    assert_eq!(
        pod["topologySpreadConstraints"],
        json!([{
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector(&objects)},
        }])
    );
    // avoidKarpenterNodes=false: only the anti-affinity.
    let objects = render(&["--set=avoidKarpenterNodes=false"]);
    let affinity = &pod_spec(&objects)["affinity"];
    assert!(affinity.get("nodeAffinity").is_none());
    assert!(affinity.get("podAntiAffinity").is_some());
    // A given affinity or spread replaces the default whole.
    let affinity = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}]}}});
    let spread = json!([{"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"a": "b"}}}]);
    let objects = render(&[
        &format!("--set-json=affinity={affinity}"),
        &format!("--set-json=topologySpreadConstraints={spread}"),
    ]);
    let pod = pod_spec(&objects);
    assert_eq!(pod["affinity"], affinity);
    assert_eq!(pod["topologySpreadConstraints"], spread);
}

/// The test hooks: their order and deletion, and RBAC that allows the
/// test's own ServiceAccount to create nodes and to read the Lease, nothing
/// else.
fn assert_hooks_with_least_rbac(objects: &[Value]) {
    let found: Vec<&str> = hooks(objects).iter().map(|o| kind(o)).collect();
    assert_eq!(
        found,
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Pod"
        ]
    );
    for hook in hooks(objects) {
        assert_eq!(name(hook), TEST_NAME);
        let annotations = &hook["metadata"]["annotations"];
        assert_eq!(
            annotations[HOOK_DELETE],
            "before-hook-creation,hook-succeeded"
        );
        // The RBAC before the Pod.
        let weight = if kind(hook) == "Pod" { "0" } else { "-1" };
        assert_eq!(annotations["helm.sh/hook-weight"], weight, "{}", kind(hook));
    }
    // Create on nodes; get on the Lease by name, in the release namespace.
    assert_eq!(
        hook_of(objects, "ClusterRole")["rules"],
        json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["create"]}])
    );
    let role = hook_of(objects, "Role");
    assert_eq!(role["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["node-holder-window"], "verbs": ["get"]}])
    );
    let subjects = json!([{"kind": "ServiceAccount", "name": TEST_NAME, "namespace": NAMESPACE}]);
    for (binding, role) in [
        ("ClusterRoleBinding", "ClusterRole"),
        ("RoleBinding", "Role"),
    ] {
        let binding = hook_of(objects, binding);
        assert_eq!(binding["roleRef"]["kind"], role);
        assert_eq!(binding["roleRef"]["name"], TEST_NAME);
        assert_eq!(binding["subjects"], subjects);
    }
}

#[test]
fn the_helm_test_hook_runs_node_holders_self_check_with_least_rbac() {
    let objects = render(&[]);
    assert_hooks_with_least_rbac(&objects);
    let pod = hook_of(&objects, "Pod");
    assert_eq!(pod["spec"]["serviceAccountName"], TEST_NAME);
    assert_eq!(pod["spec"]["restartPolicy"], "Never");
    // node-holder's own image, the Deployment's; no third-party image.
    let c = &pod["spec"]["containers"][0];
    assert_eq!(c["image"], container(&objects)["image"]);
    assert_eq!(c["image"], "node-holder:0.1.0");
    assert_eq!(c["imagePullPolicy"], container(&objects)["imagePullPolicy"]);
    assert_eq!(c["args"], json!(["self-check"]));
    assert!(c.get("command").is_none());
    // Not one of the Deployment's pods (Service, PDB, NetworkPolicy).
    let labels = &pod["metadata"]["labels"];
    assert_ne!(
        labels["app.kubernetes.io/name"],
        selector(&objects)["app.kubernetes.io/name"]
    );
    // The default hold (no hold variables), the release namespace, no labels.
    assert_eq!(
        test_env(&objects),
        BTreeMap::from([(
            "NODE_HOLDER_NAMESPACE".to_string(),
            "fieldRef:metadata.namespace".to_string()
        )])
    );
}

#[test]
fn the_helm_test_hook_follows_the_holds_and_can_be_turned_off() {
    // The holds as the Deployment's container has them, and the labels.
    let objects = render(&[
        "--set=config.holdPresets={cluster-autoscaler}",
        "--set=config.holdAnnotations.example\\.com/hold=yes",
        "--set=test.nodeLabels.pool=a",
        "--set=test.nodeLabels.zone=b",
    ]);
    let env = test_env(&objects);
    let deployment = install::env_of(&objects);
    for var in ["NODE_HOLDER_HOLD_PRESETS", "NODE_HOLDER_HOLD_ANNOTATIONS"] {
        assert_eq!(env[var], deployment[var], "{var}");
    }
    assert_eq!(env["NODE_HOLDER_HOLD_PRESETS"], "cluster-autoscaler");
    assert_eq!(env["NODE_HOLDER_HOLD_ANNOTATIONS"], "example.com/hold=yes");
    assert_eq!(env["NODE_HOLDER_SELF_CHECK_NODE_LABELS"], "pool=a,zone=b");
    // Off, or nothing that holds at CREATE (no webhook registered): no hook.
    for values in [
        ["--set=test.enabled=false"],
        ["--set=webhook.enabled=false"],
    ] {
        assert!(hooks(&render(&values)).is_empty(), "{values:?}");
    }
    // Policy mode holds at CREATE with or without the webhook value.
    let objects = render(&["--set=admission.mode=policy", "--set=webhook.enabled=false"]);
    assert_eq!(hooks(&objects).len(), 6);
}

/// The pod spec of each pod the chart makes: the Deployment's, the `helm
/// test` Pod's and the pre-delete Job's.
fn every_pod_spec(objects: &[Value]) -> [(&'static str, &Value); 3] {
    let job = objects
        .iter()
        .find(|o| kind(o) == "Job")
        .expect("the pre-delete Job");
    [
        ("Deployment", pod_spec(objects)),
        ("test Pod", &hook_of(objects, "Pod")["spec"]),
        ("uninstall Job", &job["spec"]["template"]["spec"]),
    ]
}

/// Every pod of the chart is placed, sized and secured like the
/// Deployment's.
fn assert_placed_alike(objects: &[Value]) -> &Value {
    let [(_, deployment), others @ ..] = every_pod_spec(objects);
    for (what, spec) in others {
        for field in [
            "priorityClassName",
            "imagePullSecrets",
            "securityContext",
            "nodeSelector",
            "tolerations",
            "affinity",
        ] {
            assert_eq!(spec.get(field), deployment.get(field), "{what}: {field}");
        }
        let (mine, theirs) = (&spec["containers"][0], &deployment["containers"][0]);
        for field in ["resources", "securityContext", "image"] {
            assert_eq!(mine[field], theirs[field], "{what}: container {field}");
        }
    }
    deployment
}

/// A digest of the form `sha256:<64 hex digits>`.
const DIGEST: &str = "sha256:4f0e6a5c2b7d9e1f3a8c6b4d2e0f1a3c5b7d9e1f3a8c6b4d2e0f1a3c5b7d9e1f";

/// The image every pod of the chart runs, checked to be one.
fn image_of(values: &[&str]) -> String {
    let objects = render(values);
    let images: Vec<&Value> = every_pod_spec(&objects)
        .iter()
        .map(|(_, spec)| &spec["containers"][0]["image"])
        .collect();
    assert!(
        images.iter().all(|i| *i == images[0]),
        "{values:?}: {images:?}"
    );
    images[0].as_str().unwrap().to_string()
}

#[test]
fn the_image_is_the_registry_and_repository_at_the_digest_or_else_the_tag_in_every_pod() {
    // The default: the repository at the chart's appVersion.
    assert_eq!(image_of(&[]), "node-holder:0.1.0");
    assert_eq!(image_of(&["--set=image.tag=v9"]), "node-holder:v9");
    // The registry goes before the repository.
    let release = [
        "--set=image.registry=ghcr.io",
        "--set=image.repository=owner/node-holder",
    ];
    assert_eq!(image_of(&release), "ghcr.io/owner/node-holder:0.1.0");
    // A registry with a port, and a repository that names its registry
    // itself, as before image.registry.
    assert_eq!(
        image_of(&[
            "--set=image.registry=127.0.0.1:5000",
            "--set=image.tag=1.2.3-rc.1"
        ]),
        "127.0.0.1:5000/node-holder:1.2.3-rc.1"
    );
    assert_eq!(
        image_of(&["--set=image.repository=127.0.0.1:5000/charts/node-holder"]),
        "127.0.0.1:5000/charts/node-holder:0.1.0"
    );
    // The digest wins over the tag, given or not: nothing but the digest
    // decides what runs.
    let digest = format!("--set=image.digest={DIGEST}");
    assert_eq!(
        image_of(&[&release[..], &[digest.as_str()]].concat()),
        format!("ghcr.io/owner/node-holder@{DIGEST}")
    );
    assert_eq!(
        image_of(&[&release[..], &["--set=image.tag=v9", digest.as_str()]].concat()),
        format!("ghcr.io/owner/node-holder@{DIGEST}")
    );
    assert_eq!(
        image_of(&[digest.as_str()]),
        format!("node-holder@{DIGEST}")
    );
    // Without a repository there is no image, whatever else is given.
    let err = try_render(&[
        "--set=image.repository=",
        "--set=image.registry=ghcr.io",
        &digest,
    ])
    .expect_err("an image without a repository renders");
    assert!(err.contains("image.repository is required"), "{err}");
}

#[test]
fn the_schema_refuses_an_image_reference_in_the_wrong_value() {
    for (value, says) in [
        // A tag or a digest in the repository: they have values of their own.
        (
            "--set=image.repository=node-holder:0.1.0",
            "at '/image/repository'",
        ),
        (
            "--set=image.repository=node-holder@sha256:0123",
            "at '/image/repository'",
        ),
        ("--set=image.repository=charts/", "at '/image/repository'"),
        // A registry is a host and a port, not an address or a path.
        (
            "--set=image.registry=https://ghcr.io",
            "at '/image/registry'",
        ),
        ("--set=image.registry=ghcr.io/owner", "at '/image/registry'"),
        ("--set=image.registry=ghcr.io/", "at '/image/registry'"),
        // A digest is sha256 and 64 lower-case hex digits.
        ("--set=image.digest=sha256:0123", "at '/image/digest'"),
        ("--set=image.digest=latest", "at '/image/digest'"),
        (
            "--set=image.digest=4f0e6a5c2b7d9e1f3a8c6b4d2e0f1a3c5b7d9e1f3a8c6b4d2e0f1a3c5b7d9e1f",
            "at '/image/digest'",
        ),
        ("--set=image.tag=v1@sha256", "at '/image/tag'"),
        ("--set=image.tag=-rc", "at '/image/tag'"),
        (
            "--set=image.pin=true",
            "additional properties 'pin' not allowed",
        ),
    ] {
        let err = try_render(&[value]).expect_err(&format!("{value} renders"));
        assert!(err.contains(says), "{value}: {err}");
    }
}

#[test]
fn every_pod_runs_on_linux_tolerating_critical_addons_only_placed_like_the_deployment() {
    let deployment = assert_placed_alike(&render(&[])).clone();
    assert_eq!(
        deployment["nodeSelector"],
        json!({"kubernetes.io/os": "linux"})
    );
    assert_eq!(
        deployment["tolerations"],
        json!([{"key": "CriticalAddonsOnly", "operator": "Exists"}])
    );
    assert_eq!(
        deployment["affinity"]["nodeAffinity"],
        off_karpenter_nodes()
    );
    assert_eq!(
        deployment["containers"][0]["resources"],
        json!({"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}})
    );
    // Given values reach every pod alike: a nodeSelector merged into the
    // default (null drops the default's key), tolerations, affinity,
    // resources, the pod's securityContext, priority and pull secrets.
    let affinity = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}]}}});
    let tolerations =
        json!([{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}]);
    let objects = render(&[
        "--set=nodeSelector.pool=system",
        &format!("--set-json=tolerations={tolerations}"),
        &format!("--set-json=affinity={affinity}"),
        "--set=resources.requests.cpu=100m",
        "--set=resources.limits.memory=512Mi",
        "--set=podSecurityContext.runAsUser=1000",
        "--set=priorityClassName=platform",
        "--set-json=imagePullSecrets=[{\"name\":\"pull\"}]",
        "--set=image.repository=registry.example/node-holder",
        "--set=image.tag=1.2.3",
    ]);
    let deployment = assert_placed_alike(&objects);
    assert_eq!(
        deployment["nodeSelector"],
        json!({"kubernetes.io/os": "linux", "pool": "system"})
    );
    assert_eq!(deployment["tolerations"], tolerations);
    assert_eq!(deployment["affinity"], affinity);
    assert_eq!(
        deployment["containers"][0]["resources"],
        json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}})
    );
    assert_eq!(deployment["securityContext"]["runAsUser"], 1000);
    assert_eq!(deployment["priorityClassName"], "platform");
    assert_eq!(
        deployment["containers"][0]["image"],
        "registry.example/node-holder:1.2.3"
    );
    // Everything dropped: no selector, no toleration, no priority.
    let objects = render(&[
        "--set=nodeSelector.kubernetes\\.io/os=null",
        "--set=tolerations=null",
        "--set=priorityClassName=",
    ]);
    for (what, spec) in every_pod_spec(&objects) {
        for field in ["nodeSelector", "tolerations", "priorityClassName"] {
            assert!(spec.get(field).is_none(), "{what}: {field}");
        }
    }
}

#[test]
fn on_eks_auto_mode_avoiding_karpenter_nodes_is_refused_with_the_fix() {
    // Every node of Auto Mode carries karpenter.sh/nodepool.
    let err = try_render(&[AUTO_MODE]).expect_err("avoidKarpenterNodes on Auto Mode");
    assert!(
        err.contains("this cluster is EKS Auto Mode")
            && err.contains("Set avoidKarpenterNodes=false"),
        "{err}"
    );
    // With the value off the pods may run on Auto Mode's nodes.
    let objects = render(&[AUTO_MODE, "--set=avoidKarpenterNodes=false"]);
    for (what, spec) in every_pod_spec(&objects) {
        assert!(spec["affinity"].get("nodeAffinity").is_none(), "{what}");
    }
    // An affinity of one's own replaces the default, and is taken as given.
    let affinity = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "eks.amazonaws.com/compute-type", "operator": "In", "values": ["auto"]}]}]}}});
    let objects = render(&[AUTO_MODE, &format!("--set-json=affinity={affinity}")]);
    assert_eq!(pod_spec(&objects)["affinity"], affinity);
    // Elsewhere the default stays.
    assert_eq!(
        pod_spec(&render(&[]))["affinity"]["nodeAffinity"],
        off_karpenter_nodes()
    );
}

#[test]
fn objects_of_cert_manager_or_the_prometheus_operator_need_their_apis_served() {
    // The default TLS mode, where cert-manager is not served: a clear
    // message, with the way out and how to render without a cluster.
    let err = try_template(&[]).expect_err("certManager mode without cert-manager");
    assert!(
        err.contains(
            "tls.mode=certManager, but this cluster does not serve cert-manager.io/v1 Certificate"
        ) && err.contains("pass --api-versions cert-manager.io/v1/Certificate"),
        "{err}"
    );
    assert!(!all_of(&template_with(&[CERT_MANAGER]), "Certificate").is_empty());
    // The modes without a Certificate need nothing.
    for values in [
        &["--set=admission.mode=policy"][..],
        &[
            "--set=tls.mode=provided",
            "--set=tls.provided.secretName=s",
            "--set=tls.provided.caBundle=Y2E=",
        ],
    ] {
        let objects = template_with(values);
        assert!(all_of(&objects, "Certificate").is_empty(), "{values:?}");
    }
    // The ServiceMonitor and the PrometheusRule, each on its own kind.
    for (kind_, value, served) in [
        ("ServiceMonitor", "serviceMonitor", SERVICE_MONITOR),
        ("PrometheusRule", "prometheusRule", PROMETHEUS_RULE),
    ] {
        let enabled = format!("--set=metrics.{value}.enabled=true");
        let err = try_template(&[CERT_MANAGER, &enabled]).expect_err(kind_);
        assert!(
            err.contains(&format!(
                "metrics.{value}.enabled, but this cluster does not serve monitoring.coreos.com/v1 {kind_}"
            )) && err.contains(&format!("pass --api-versions monitoring.coreos.com/v1/{kind_}")),
            "{err}"
        );
        let objects = template_with(&[CERT_MANAGER, &enabled, served]);
        assert_eq!(all_of(&objects, kind_).len(), 1);
    }
}

/// `helm template` with `values` as given, no API assumed served but those
/// passed with --api-versions.
fn template_with(values: &[&str]) -> Vec<Value> {
    try_template(values).unwrap_or_else(|err| panic!("{values:?}: {err}"))
}

#[test]
fn the_service_account_can_be_annotated_or_brought_by_the_user() {
    // Made by default, with the given annotations (IRSA, Pod Identity).
    let role = "arn:aws:iam::111122223333:role/node-holder";
    let objects = render(&[&format!(
        "--set=serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn={role}"
    )]);
    let release = install::release_objects(&objects);
    let account = one(&release, "ServiceAccount");
    assert_eq!(name(account), "node-holder");
    assert_eq!(
        account["metadata"]["annotations"],
        json!({"eks.amazonaws.com/role-arn": role})
    );
    // Brought by the user: not made, and named, or refused.
    let err = try_render(&["--set=serviceAccount.create=false"]).expect_err("no name");
    assert!(
        err.contains("serviceAccount.name is required with serviceAccount.create=false"),
        "{err}"
    );
    let objects = render(&[
        "--set=serviceAccount.create=false",
        "--set=serviceAccount.name=platform-node-holder",
    ]);
    let release = install::release_objects(&objects);
    assert!(all_of(&release, "ServiceAccount").is_empty());
    assert_eq!(
        pod_spec(&objects)["serviceAccountName"],
        "platform-node-holder"
    );
    // node-holder's RBAC is bound to it.
    for binding in all_of(&release, "ClusterRoleBinding")
        .into_iter()
        .chain(all_of(&release, "RoleBinding"))
    {
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": "platform-node-holder", "namespace": NAMESPACE}]),
            "{}",
            name(binding)
        );
    }
}

/// Two extra objects: a map whose strings are templates, and a YAML string.
const EXTRA_OBJECTS: &str = r#"--set-json=extraObjects=[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"{{ include \"node-holder.fullname\" . }}-extra","namespace":"{{ .Release.Namespace }}"},"data":{"release":"{{ .Release.Name }}"}},"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-a-string\n  namespace: {{ .Release.Namespace }}\ndata:\n  replicas: \"{{ .Values.replicaCount }}\"\n"]"#;

#[test]
fn extra_objects_are_rendered_with_tpl_and_none_by_default() {
    let plain = render(&[]);
    let objects = render(&[EXTRA_OBJECTS]);
    assert_eq!(objects.len(), plain.len() + 2);
    let maps: Vec<&Value> = all_of(&objects, "ConfigMap");
    assert_eq!(
        maps.iter().map(|m| name(m)).collect::<Vec<_>>(),
        ["node-holder-extra", "from-a-string"]
    );
    assert_eq!(maps[0]["metadata"]["namespace"], NAMESPACE);
    assert_eq!(maps[0]["data"], json!({"release": RELEASE}));
    assert_eq!(maps[1]["data"], json!({"replicas": "2"}));
    assert!(all_of(&plain, "ConfigMap").is_empty());
}

#[test]
fn the_service_monitor_takes_relabelings_and_the_runbooks_a_base_url() {
    let monitor = |values: &[&str]| {
        let mut args = vec!["--set=metrics.serviceMonitor.enabled=true"];
        args.extend_from_slice(values);
        one(&render(&args), "ServiceMonitor")["spec"]["endpoints"][0].clone()
    };
    let endpoint = monitor(&[]);
    assert!(endpoint.get("relabelings").is_none());
    assert!(endpoint.get("metricRelabelings").is_none());
    let relabelings =
        json!([{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}]);
    let metric = json!([{"sourceLabels": ["__name__"], "regex": "go_.*", "action": "drop"}]);
    let endpoint = monitor(&[
        &format!("--set-json=metrics.serviceMonitor.relabelings={relabelings}"),
        &format!("--set-json=metrics.serviceMonitor.metricRelabelings={metric}"),
    ]);
    assert_eq!(endpoint["relabelings"], relabelings);
    assert_eq!(endpoint["metricRelabelings"], metric);

    // Each alert's runbook: the base, then its section's anchor.
    let runbooks = |values: &[&str]| -> Vec<String> {
        let mut args = vec!["--set=metrics.prometheusRule.enabled=true"];
        args.extend_from_slice(values);
        let objects = render(&args);
        let rule = one(&objects, "PrometheusRule");
        rule["spec"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap())
            .filter_map(|r| r["annotations"]["runbook_url"].as_str())
            .map(str::to_string)
            .collect()
    };
    let default = runbooks(&[]);
    assert!(default.len() > 5);
    let base = "https://node-holder.dev/docs/operations#";
    assert!(default.iter().all(|u| u.starts_with(base)), "{default:?}");
    let own = runbooks(&[
        "--set=metrics.prometheusRule.runbookUrlBase=https://wiki.example/runbooks/node-holder/",
    ]);
    let expected: Vec<String> = default
        .iter()
        .map(|u| u.replace(base, "https://wiki.example/runbooks/node-holder#"))
        .collect();
    assert_eq!(own, expected);
}

/// NOTES.txt as `helm install` prints it, rendered offline (a client-side
/// dry run: no cluster, no API beyond the built-in ones).
fn notes(values: &[&str]) -> String {
    let out = helm()
        .args(["install", RELEASE])
        .arg(chart())
        .args([
            "--namespace",
            NAMESPACE,
            "--dry-run=client",
            "--output=json",
            testsupport::install::IMAGE,
        ])
        .args(values)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let release: Value = serde_json::from_slice(&out.stdout).unwrap();
    release["info"]["notes"].as_str().unwrap().to_string()
}

/// Provided TLS: renders without cert-manager's API.
const PROVIDED: [&str; 3] = [
    "--set=tls.mode=provided",
    "--set=tls.provided.secretName=s",
    "--set=tls.provided.caBundle=Y2E=",
];

#[test]
fn notes_say_what_is_configured() {
    // The defaults (TLS provided): the webhook, every node, 20m, drift let through.
    let said = notes(&PROVIDED);
    for line in [
        "Which nodes: every node.",
        "The hold: karpenter.sh/do-not-disrupt=true.",
        "every new node in scope is held by node-holder's webhook",
        "The window: one for every node in scope; each new node opens or extends it\nfor 20m, 2h at most.",
        "Karpenter does not\nconsolidate them. A node Karpenter marks drifted (a rollout) loses its hold at\nonce",
        "holds come off at once.",
        "helm test node-holder -n node-holder --logs",
        "kubectl node-holder status -n node-holder",
    ] {
        assert!(said.contains(line), "{line:?} not in:\n{said}");
    }
    assert!(!said.contains("Schedule hold"), "{said}");
    assert!(!said.contains("whole cluster"), "{said}");

    // Policy mode, a scope and the schedule hold:
    // each said as configured.
    let said = notes(&[
        "--set=admission.mode=policy",
        "--set=config.nodeSelector=pool=batch",
        "--set=config.holdAnnotations.example\\.com/hold=yes",
        "--set=config.holdDuration=45m",
        "--set=config.maxHold=0",
        "--set=config.launchCost=5m",
    ]);
    for line in [
        "Which nodes: those matching config.nodeSelector `pool=batch`.",
        "The hold: example.com/hold=yes.",
        "held by the MutatingAdmissionPolicy node-holder",
        "The window: one for every node in scope",
        "for 45m, with no cap.",
        "every node in scope carries the hold",
        "Schedule hold (config.launchCost 5m)",
        "kubectl get mutatingadmissionpolicy,mutatingadmissionpolicybinding node-holder",
    ] {
        assert!(said.contains(line), "{line:?} not in:\n{said}");
    }
    assert!(!said.contains("node-holder's webhook"), "{said}");

    // Nothing at CREATE: said, and no helm test to run.
    let mut values = PROVIDED.to_vec();
    values.push("--set=webhook.enabled=false");
    let said = notes(&values);
    assert!(
        said.contains("nothing holds new nodes (webhook.enabled=false)"),
        "{said}"
    );
    assert!(!said.contains("helm test"), "{said}");
}

/// A wrong value of each new key, and what the schema's refusal says.
const WRONG_TYPES: &[(&str, &str)] = &[
    (
        "--set=extraArgs=--debug",
        "at '/extraArgs': got string, want array",
    ),
    (
        "--set-json=extraArgs=[1]",
        "at '/extraArgs/0': got number, want string",
    ),
    ("--set=extraEnv=A", "at '/extraEnv': got string, want array"),
    (
        "--set-json=extraEnv=[{\"value\":\"1\"}]",
        "at '/extraEnv/0': missing property 'name'",
    ),
    (
        "--set=extraVolumes=v",
        "at '/extraVolumes': got string, want array",
    ),
    (
        "--set-json=extraVolumeMounts=[{\"name\":\"v\"}]",
        "at '/extraVolumeMounts/0': missing property 'mountPath'",
    ),
    (
        "--set=podSecurityContext=strict",
        "at '/podSecurityContext': got string, want object",
    ),
    (
        "--set=additionalLabels=team",
        "at '/additionalLabels': got string, want object",
    ),
    (
        "--set-json=additionalLabels={\"cost\":42}",
        "at '/additionalLabels/cost': got number, want string",
    ),
    (
        "--set=additionalLabels.app\\.kubernetes\\.io/name=x",
        // (helm names the wrong path for a propertyNames failure.)
        "invalid propertyName 'app.kubernetes.io/name'",
    ),
    (
        "--set=hostNetwork=yes",
        "at '/hostNetwork': got string, want boolean",
    ),
    (
        "--set=networkPolicy.enabled=on",
        "at '/networkPolicy/enabled': got string, want boolean",
    ),
    (
        "--set=networkPolicy.webhookFrom=any",
        "at '/networkPolicy/webhookFrom': got string, want array",
    ),
    (
        "--set-json=networkPolicy.metricsFrom=[{\"namespace\":\"monitoring\"}]",
        "at '/networkPolicy/metricsFrom/0'",
    ),
    (
        "--set=networkPolicy.egress=none",
        "at '/networkPolicy/egress': got string, want array",
    ),
    (
        "--set=networkPolicy.ingress=x",
        "at '/networkPolicy': additional properties 'ingress' not allowed",
    ),
    (
        "--set=priorityClassName=1",
        "at '/priorityClassName': got number, want string",
    ),
    (
        "--set=avoidKarpenterNodes=no",
        "at '/avoidKarpenterNodes': got string, want boolean",
    ),
    (
        "--set=test.enabled=maybe",
        "at '/test/enabled': got string, want boolean",
    ),
    (
        // node-holder's own image runs the test now.
        "--set=test.image=bitnami/kubectl:1.36",
        "at '/test': additional properties 'image' not allowed",
    ),
    (
        "--set-json=test.nodeLabels={\"pool\":1}",
        "at '/test/nodeLabels/pool': got number, want string",
    ),
    (
        "--set=test.timeout=1m",
        "at '/test': additional properties 'timeout' not allowed",
    ),
    (
        "--set=serviceAccount.create=no",
        "at '/serviceAccount/create': got string, want boolean",
    ),
    (
        "--set=extraObjects=x",
        "at '/extraObjects': got string, want array",
    ),
    ("--set-json=extraObjects=[{}]", "at '/extraObjects/0'"),
    (
        "--set=metrics.serviceMonitor.relabelings=x",
        "at '/metrics/serviceMonitor/relabelings': got string, want array",
    ),
    (
        "--set-json=metrics.serviceMonitor.metricRelabelings=[1]",
        "at '/metrics/serviceMonitor/metricRelabelings/0': got number, want object",
    ),
    (
        "--set=metrics.prometheusRule.runbookUrlBase=wiki/node-holder",
        "at '/metrics/prometheusRule/runbookUrlBase'",
    ),
    (
        "--set=tolerations=CriticalAddonsOnly",
        "at '/tolerations': got string, want array",
    ),
];

#[test]
fn the_schema_refuses_a_wrong_type_for_each_new_value() {
    for (value, says) in WRONG_TYPES {
        let err = try_render(&[value]).expect_err(&format!("{value} renders"));
        assert!(err.contains(says), "{value}: {err}");
    }
}

#[test]
fn helm_lint_passes_with_the_new_values_set() {
    let out = helm()
        .args(["lint", "--strict", testsupport::install::IMAGE])
        .arg(chart())
        .args(everything_set())
        .output()
        .unwrap();
    let text = testsupport::output_text(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        !text.contains("[ERROR]") && !text.contains("[WARNING]"),
        "{text}"
    );
}

#[test]
fn the_chart_names_its_sources_maintainers_and_the_workspaces_license_whose_text_is_beside_it() {
    let text = std::fs::read_to_string(chart().join("Chart.yaml")).unwrap();
    let meta = &testenv::parse_manifests(&text).unwrap()[0];
    assert!(!meta["sources"].as_array().unwrap().is_empty());
    assert_eq!(meta["maintainers"][0]["name"], "node-holder maintainers");
    let cargo = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let license = cargo
        .lines()
        .find_map(|l| l.strip_prefix("license = "))
        .expect("the workspace's license")
        .trim_matches('"');
    assert_eq!(meta["annotations"]["artifacthub.io/license"], license);
    // The license's full text beside it (krew and the image claim it too).
    let text = std::fs::read_to_string(repo().join("LICENSE")).expect("LICENSE");
    assert_eq!(license, "Apache-2.0");
    assert!(text.contains("Apache License\n                           Version 2.0, January 2004"));
    for section in [
        "1. Definitions.",
        "2. Grant of Copyright License.",
        "3. Grant of Patent License.",
        "4. Redistribution.",
        "5. Submission of Contributions.",
        "6. Trademarks.",
        "7. Disclaimer of Warranty.",
        "8. Limitation of Liability.",
        "9. Accepting Warranty or Additional Liability.",
        "END OF TERMS AND CONDITIONS",
        "APPENDIX: How to apply the Apache License to your work.",
    ] {
        assert!(text.contains(section), "{section} missing from LICENSE");
    }
}

/// Every new value set at once (for lint and the API server).
fn everything_set() -> Vec<&'static str> {
    vec![
        "--set=hostNetwork=true",
        "--set=networkPolicy.enabled=true",
        "--set-json=networkPolicy.metricsFrom=[{\"namespaceSelector\":{\"matchLabels\":{\"kubernetes.io/metadata.name\":\"monitoring\"}}},{\"ipBlock\":{\"cidr\":\"10.0.0.0/8\",\"except\":[\"10.1.0.0/16\"]}}]",
        "--set-json=networkPolicy.webhookFrom=[{\"ipBlock\":{\"cidr\":\"0.0.0.0/0\"}}]",
        "--set-json=networkPolicy.egress=[{\"to\":[{\"ipBlock\":{\"cidr\":\"10.0.0.1/32\"}}],\"ports\":[{\"port\":443,\"protocol\":\"TCP\"}]}]",
        "--set=extraArgs={--log-level=debug}",
        "--set-json=extraEnv=[{\"name\":\"RUST_BACKTRACE\",\"value\":\"1\"},{\"name\":\"NODE_IP\",\"valueFrom\":{\"fieldRef\":{\"fieldPath\":\"status.hostIP\"}}}]",
        "--set-json=extraVolumes=[{\"name\":\"scratch\",\"emptyDir\":{\"sizeLimit\":\"16Mi\"}}]",
        "--set-json=extraVolumeMounts=[{\"name\":\"scratch\",\"mountPath\":\"/scratch\"}]",
        "--set=podSecurityContext.supplementalGroups={65532}",
        "--set=additionalLabels.team=infra",
        "--set=test.nodeLabels.pool=a",
        "--set=serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::111122223333:role/node-holder",
        "--set=nodeSelector.pool=system",
        "--set-json=tolerations=[{\"key\":\"dedicated\",\"operator\":\"Equal\",\"value\":\"ops\",\"effect\":\"NoSchedule\"}]",
        EXTRA_OBJECTS,
        "--set=metrics.serviceMonitor.enabled=true",
        "--set-json=metrics.serviceMonitor.relabelings=[{\"sourceLabels\":[\"__meta_kubernetes_pod_node_name\"],\"targetLabel\":\"node\"}]",
        "--set-json=metrics.serviceMonitor.metricRelabelings=[{\"sourceLabels\":[\"__name__\"],\"regex\":\"go_.*\",\"action\":\"drop\"}]",
        "--set=metrics.prometheusRule.enabled=true",
        "--set=metrics.prometheusRule.runbookUrlBase=https://wiki.example/runbooks/node-holder",
        "--set=image.registry=ghcr.io",
        "--set=image.repository=owner/node-holder",
        "--set=image.digest=sha256:4f0e6a5c2b7d9e1f3a8c6b4d2e0f1a3c5b7d9e1f3a8c6b4d2e0f1a3c5b7d9e1f",
    ]
}

#[tokio::test]
async fn objects_with_the_new_values_are_accepted_by_the_api_server() {
    let cp = ControlPlane::start().await.unwrap();
    let client = cp.admin_client().await.unwrap();
    create_namespace(&client, NAMESPACE, "restricted").await;
    create_namespace(&client, PRIVILEGED_NAMESPACE, "privileged").await;
    install_cert_manager_crds(&cp).await;
    install_prometheus_operator_crds(&cp).await;
    let objects = tokio::task::spawn_blocking(|| render(&everything_set()))
        .await
        .unwrap();
    assert_eq!(all_of(&objects, "NetworkPolicy").len(), 1);
    assert_eq!(all_of(&objects, "ServiceMonitor").len(), 1);
    assert_eq!(all_of(&objects, "ConfigMap").len(), 2);
    assert_eq!(hooks(&objects).len(), 6);
    // Every object, the test Pod under `restricted` enforcement included.
    testenv::dry_run_objects(&client, &objects)
        .await
        .unwrap_or_else(|err| panic!("{err:#}"));
    // A host-network pod fails the `restricted` level, as values.yaml says;
    // it is accepted where the namespace allows it.
    let err = testenv::dry_run_objects(&client, &[pod_of(&objects, NAMESPACE)])
        .await
        .expect_err("a host-network pod under restricted enforcement");
    assert!(format!("{err:#}").contains("hostNetwork"), "{err:#}");
    testenv::dry_run_objects(&client, &[pod_of(&objects, PRIVILEGED_NAMESPACE)])
        .await
        .unwrap_or_else(|err| panic!("the host-network pod: {err:#}"));
    // The defaults (priority class, node affinity, zone spread) and the
    // policy mode's NetworkPolicy, the pod under `restricted` enforcement.
    let objects = tokio::task::spawn_blocking(|| {
        render(&[
            "--set=networkPolicy.enabled=true",
            "--set=admission.mode=policy",
        ])
    })
    .await
    .unwrap();
    let pod = pod_of(&objects, NAMESPACE);
    assert_eq!(pod["spec"]["priorityClassName"], "system-cluster-critical");
    testenv::dry_run_objects(&client, &objects)
        .await
        .unwrap_or_else(|err| panic!("policy mode: {err:#}"));
    testenv::dry_run_objects(&client, &[pod])
        .await
        .unwrap_or_else(|err| panic!("the default pod: {err:#}"));
}

/// A kubeconfig acting as the test hook's ServiceAccount: the admin's
/// credentials, impersonating it (the API server then authorizes the
/// ServiceAccount, with its groups).
fn test_account_kubeconfig(cp: &ControlPlane, dir: &Path) -> std::path::PathBuf {
    let admin = std::fs::read(cp.admin_kubeconfig()).unwrap();
    let mut config: Value = serde_json::from_slice(&admin).unwrap();
    for user in config["users"].as_array_mut().unwrap() {
        user["user"]["as"] = json!(format!("system:serviceaccount:{NAMESPACE}:{TEST_NAME}"));
    }
    let path = dir.join("kubeconfig");
    std::fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    path
}

/// The test Pod's container run here as the kubelet would run it: node-holder
/// (this build) with its arguments and environment, the namespace filled in
/// from the pod, the kubeconfig in place of the ServiceAccount's mounted
/// token, and each check tried once. (It blocks the test's runtime thread
/// for a second: nothing else runs on it meanwhile.)
fn run_test_pod(objects: &[Value], kubeconfig: &Path) -> Output {
    let c = &hook_of(objects, "Pod")["spec"]["containers"][0];
    let args: Vec<String> = serde_json::from_value(c["args"].clone()).unwrap();
    let mut run = Command::new(env!("CARGO_BIN_EXE_node-holder"));
    run.args(&args).env_clear();
    for (var, value) in test_env(objects) {
        let value = match value.as_str() {
            "fieldRef:metadata.namespace" => NAMESPACE.to_string(),
            other => other.to_string(),
        };
        run.env(var, value);
    }
    run.env("KUBECONFIG", kubeconfig)
        .env("NODE_HOLDER_SELF_CHECK_TIMEOUT", "0s")
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    testsupport::output_report(out)
}

#[tokio::test]
async fn the_helm_test_pod_passes_only_while_new_nodes_are_held_and_a_replica_leads() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.admin_client().await.unwrap();
    create_namespace(&admin, NAMESPACE, "restricted").await;
    // Policy mode: the API server holds without node-holder running. A hold
    // key of its own beside a preset, and a node selector the test Node must
    // match.
    let values = [
        "--set=admission.mode=policy",
        "--set=config.holdPresets={karpenter-v1}",
        "--set=config.holdAnnotations.example\\.com/hold=yes",
        "--set=config.nodeSelector=pool=a",
        "--set=test.nodeLabels.pool=a",
    ];
    let objects = tokio::task::spawn_blocking(move || render(&values))
        .await
        .unwrap();
    // The hook's RBAC, which `helm test` creates before the Pod.
    let rbac: Vec<Value> = hooks(&objects)
        .into_iter()
        .filter(|o| kind(o) != "Pod")
        .cloned()
        .collect();
    testenv::apply_objects(&admin, &rbac).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = test_account_kubeconfig(&cp, dir.path());

    // Nothing holds new nodes yet: the test fails, and says why.
    let out = run_test_pod(&objects, &kubeconfig);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("not held: a new Node gets karpenter.sh/do-not-disrupt=\"\" (not \"true\"), example.com/hold=\"\" (not \"yes\")"),
        "{}",
        text(&out)
    );

    // The chart's policy in place, but no replica leads: it fails on that.
    hold_with_the_charts_policy(&cp, &objects).await;
    let out = run_test_pod(&objects, &kubeconfig);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(
            "held: a new Node gets karpenter.sh/do-not-disrupt=true, example.com/hold=yes"
        ),
        "{}",
        text(&out)
    );
    assert!(
        text(&out).contains("no leader: nobody holds the Lease node-holder/node-holder-window"),
        "{}",
        text(&out)
    );

    // A replica holds the Lease: it passes.
    lead(&admin, "node-holder-5d8f7-abcde").await;
    let out = run_test_pod(&objects, &kubeconfig);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(
            "leading: node-holder-5d8f7-abcde holds the Lease node-holder/node-holder-window"
        ),
        "{}",
        text(&out)
    );

    // Its identity may not read nodes, and the dry runs stored nothing.
    assert_forbidden_to_list_nodes(&kubeconfig, dir.path());
    let nodes: kube::Api<Node> = kube::Api::all(admin);
    let stored = nodes.list(&Default::default()).await.unwrap().items;
    assert!(stored.is_empty(), "{stored:?}");
}

/// The Lease `node-holder-window`, held by `identity` and just renewed, as a
/// leading replica keeps it.
async fn lead(admin: &kube::Client, identity: &str) {
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("node-holder-window".to_string()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(identity.to_string()),
            lease_duration_seconds: Some(60),
            renew_time: Some(MicroTime(jiff::Timestamp::now())),
            ..LeaseSpec::default()
        }),
    };
    let leases: kube::Api<Lease> = kube::Api::namespaced(admin.clone(), NAMESPACE);
    leases.create(&Default::default(), &lease).await.unwrap();
}

/// Applies the chart's MutatingAdmissionPolicy and binding in `objects` and
/// waits until the API server holds a node of the test's labels with them.
async fn hold_with_the_charts_policy(cp: &ControlPlane, objects: &[Value]) {
    let policy: Vec<Value> = objects
        .iter()
        .filter(|o| kind(o).starts_with("MutatingAdmissionPolicy"))
        .cloned()
        .collect();
    assert_eq!(policy.len(), 2);
    let mut probe = common::node("probe");
    probe.metadata.labels = Some([("pool".to_string(), "a".to_string())].into());
    common::policy::apply(cp, &policy, &probe, "example.com/hold").await;
}

/// `kubectl get nodes` with `kubeconfig` is refused.
fn assert_forbidden_to_list_nodes(kubeconfig: &Path, home: &Path) {
    let kubectl = testenv::ensure_kubectl_built().unwrap();
    let out = Command::new(kubectl)
        .args(["get", "nodes"])
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", home)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("Forbidden"), "{}", text(&out));
}
