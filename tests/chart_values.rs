//! The chart's values for a real cluster (`chart/values.yaml`): the escape
//! hatches (`extraArgs`, `extraEnv`, `extraVolumes`, `extraVolumeMounts`,
//! `podSecurityContext`, `additionalLabels`), `hostNetwork`, the optional
//! NetworkPolicy, the default priority class and scheduling, the `helm test`
//! hook and the chart's metadata:
//! - each value's default, and its effect when set, in the rendered objects;
//! - the values schema refuses a wrong type for each;
//! - the objects rendered with them are accepted by the API server, and the
//!   `helm test` Pod's script, run with the pinned kubectl as the hook's
//!   ServiceAccount, passes only while new nodes are held.

use testsupport as common;
use testsupport::install;

use std::path::Path;
use std::process::{Command, Output};

use install::{
    NAMESPACE, RELEASE, all_of, chart, container, create_namespace, helm,
    install_cert_manager_crds, kind, name, one, pod_of, repo, template, try_template,
};
use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};
use testenv::ControlPlane;

const HOOK: &str = "helm.sh/hook";
const HOOK_DELETE: &str = "helm.sh/hook-delete-policy";
const TEST_NAME: &str = "node-holder-test";
/// The namespace whose Pod Security level lets a host-network pod in.
const PRIVILEGED_NAMESPACE: &str = "node-holder-privileged";

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

/// The test Pod's environment variable `var`.
fn test_env(objects: &[Value], var: &str) -> String {
    hook_of(objects, "Pod")["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == var)
        .unwrap_or_else(|| panic!("{var} in the test Pod"))["value"]
        .as_str()
        .unwrap()
        .to_string()
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
    let plain = template(&[]);
    let c = container(&plain);
    assert_eq!(c["args"], json!(["serve"]));
    assert!(
        names_of(&c["env"])
            .iter()
            .all(|n| n.starts_with("NODE_HOLDER_"))
    );
    assert_eq!(names_of(&c["volumeMounts"]), ["tls"]);
    assert_eq!(names_of(&pod_spec(&plain)["volumes"]), ["tls"]);

    let objects = template(&[
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
    let objects = template(&[]);
    assert_eq!(pod_spec(&objects)["securityContext"], hardened());
    // The test Pod runs with the same.
    assert_eq!(
        hook_of(&objects, "Pod")["spec"]["securityContext"],
        hardened()
    );
    // Helm merges a given key into the default; null drops one.
    let objects = template(&[
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
        let objects = template(&[
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
    let objects = template(&[]);
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
    let objects = template(&["--set=additionalLabels.tier=a", "--set=podLabels.tier=b"]);
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
    let objects = template(&[]);
    let pod = pod_spec(&objects);
    assert!(pod.get("hostNetwork").is_none());
    assert!(pod.get("dnsPolicy").is_none());
    let objects = template(&[
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
    let objects = template(&args);
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
        all_of(&template(&[]), "NetworkPolicy").is_empty(),
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
    let objects = template(&[]);
    assert_eq!(
        pod_spec(&objects)["priorityClassName"],
        "system-cluster-critical"
    );
    let objects = template(&["--set=priorityClassName="]);
    assert!(pod_spec(&objects).get("priorityClassName").is_none());
    let objects = template(&["--set=priorityClassName=platform"]);
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
    let objects = template(&[]);
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
    let objects = template(&["--set=avoidKarpenterNodes=false"]);
    let affinity = &pod_spec(&objects)["affinity"];
    assert!(affinity.get("nodeAffinity").is_none());
    assert!(affinity.get("podAntiAffinity").is_some());
    // A given affinity or spread replaces the default whole.
    let affinity = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}]}}});
    let spread = json!([{"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"a": "b"}}}]);
    let objects = template(&[
        &format!("--set-json=affinity={affinity}"),
        &format!("--set-json=topologySpreadConstraints={spread}"),
    ]);
    let pod = pod_spec(&objects);
    assert_eq!(pod["affinity"], affinity);
    assert_eq!(pod["topologySpreadConstraints"], spread);
}

/// The test hooks: their order and deletion, and RBAC that allows the
/// test's own ServiceAccount to create nodes and nothing else.
fn assert_hooks_with_create_only_rbac(objects: &[Value]) {
    let found: Vec<&str> = hooks(objects).iter().map(|o| kind(o)).collect();
    assert_eq!(
        found,
        ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Pod"]
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
    // Create on nodes, nothing else, for the test's own ServiceAccount.
    assert_eq!(
        hook_of(objects, "ClusterRole")["rules"],
        json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["create"]}])
    );
    let binding = hook_of(objects, "ClusterRoleBinding");
    assert_eq!(binding["roleRef"]["name"], TEST_NAME);
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": TEST_NAME, "namespace": NAMESPACE}])
    );
}

#[test]
fn the_helm_test_hook_dry_runs_a_node_create_with_create_only_rbac() {
    let objects = template(&[]);
    assert_hooks_with_create_only_rbac(&objects);
    let pod = hook_of(&objects, "Pod");
    assert_eq!(pod["spec"]["serviceAccountName"], TEST_NAME);
    assert_eq!(pod["spec"]["restartPolicy"], "Never");
    assert_eq!(
        pod["spec"]["containers"][0]["image"],
        "bitnami/kubectl:1.36"
    );
    let script = pod["spec"]["containers"][0]["args"][0].as_str().unwrap();
    assert!(
        script.contains("kubectl create --dry-run=server -f -"),
        "{script}"
    );
    // Not one of the Deployment's pods (Service, PDB, NetworkPolicy).
    let labels = &pod["metadata"]["labels"];
    assert_ne!(
        labels["app.kubernetes.io/name"],
        selector(&objects)["app.kubernetes.io/name"]
    );
    // The default hold, on an unlabelled Node of the test's name.
    assert_eq!(
        test_env(&objects, "HOLD_KEY"),
        "karpenter.sh/do-not-disrupt"
    );
    assert_eq!(test_env(&objects, "HOLD_VALUE"), "true");
    assert_eq!(
        test_env(&objects, "HOLD_PATH"),
        r"{.metadata.annotations.karpenter\.sh/do-not-disrupt}"
    );
    let node: Value = serde_json::from_str(&test_env(&objects, "NODE")).unwrap();
    assert_eq!(
        node,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-holder-helm-test"}})
    );
}

#[test]
fn the_helm_test_hook_follows_the_holds_and_can_be_turned_off() {
    // The first configured hold, as the webhook and the policy add them:
    // presets first.
    let objects = template(&[
        "--set=config.holdPresets={cluster-autoscaler}",
        "--set=config.holdAnnotations.example\\.com/hold=yes",
        "--set=test.nodeLabels.pool=a",
        "--set=test.image=registry.example/kubectl@sha256:0123",
    ]);
    assert_eq!(
        test_env(&objects, "HOLD_KEY"),
        "cluster-autoscaler.kubernetes.io/scale-down-disabled"
    );
    assert_eq!(
        test_env(&objects, "HOLD_PATH"),
        r"{.metadata.annotations.cluster-autoscaler\.kubernetes\.io/scale-down-disabled}"
    );
    let node: Value = serde_json::from_str(&test_env(&objects, "NODE")).unwrap();
    assert_eq!(node["metadata"]["labels"], json!({"pool": "a"}));
    assert_eq!(
        hook_of(&objects, "Pod")["spec"]["containers"][0]["image"],
        "registry.example/kubectl@sha256:0123"
    );
    let objects = template(&["--set=config.holdAnnotations.example\\.com/hold=yes"]);
    assert_eq!(test_env(&objects, "HOLD_KEY"), "example.com/hold");
    assert_eq!(test_env(&objects, "HOLD_VALUE"), "yes");
    // Off, or nothing that holds at CREATE (no webhook registered): no hook.
    for values in [
        ["--set=test.enabled=false"],
        ["--set=webhook.enabled=false"],
    ] {
        assert!(hooks(&template(&values)).is_empty(), "{values:?}");
    }
    // Policy mode holds at CREATE with or without the webhook value.
    let objects = template(&["--set=admission.mode=policy", "--set=webhook.enabled=false"]);
    assert_eq!(hooks(&objects).len(), 4);
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
    ("--set=test.image=", "at '/test/image'"),
    (
        "--set-json=test.nodeLabels={\"pool\":1}",
        "at '/test/nodeLabels/pool': got number, want string",
    ),
    (
        "--set=test.timeout=1m",
        "at '/test': additional properties 'timeout' not allowed",
    ),
];

#[test]
fn the_schema_refuses_a_wrong_type_for_each_new_value() {
    for (value, says) in WRONG_TYPES {
        let err = try_template(&[value]).expect_err(&format!("{value} renders"));
        assert!(err.contains(says), "{value}: {err}");
    }
}

#[test]
fn helm_lint_passes_with_the_new_values_set() {
    let out = helm()
        .args(["lint", "--strict"])
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
fn the_chart_names_its_sources_maintainers_and_the_workspaces_license() {
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
    ]
}

#[tokio::test]
async fn objects_with_the_new_values_are_accepted_by_the_api_server() {
    let cp = ControlPlane::start().await.unwrap();
    let client = cp.admin_client().await.unwrap();
    create_namespace(&client, NAMESPACE, "restricted").await;
    create_namespace(&client, PRIVILEGED_NAMESPACE, "privileged").await;
    install_cert_manager_crds(&cp).await;
    let objects = tokio::task::spawn_blocking(|| template(&everything_set()))
        .await
        .unwrap();
    assert_eq!(all_of(&objects, "NetworkPolicy").len(), 1);
    assert_eq!(hooks(&objects).len(), 4);
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
        template(&[
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

/// The test Pod's container run here as the kubelet would run it: its
/// command and environment, with the pinned kubectl on `PATH`, the
/// kubeconfig in place of the ServiceAccount's mounted token and a scratch
/// home in place of its emptyDir. (It blocks the test's runtime thread for
/// a second: nothing else runs on it meanwhile.)
fn run_test_pod(objects: &[Value], kubeconfig: &Path, home: &Path) -> Output {
    let c = &hook_of(objects, "Pod")["spec"]["containers"][0];
    let command: Vec<String> = serde_json::from_value(c["command"].clone()).unwrap();
    let args: Vec<String> = serde_json::from_value(c["args"].clone()).unwrap();
    let kubectl = testenv::ensure_kubectl_built().expect("kubectl from the control plane's pin");
    let mut run = Command::new(&command[0]);
    run.args(&command[1..]).args(&args).env_clear();
    for e in c["env"].as_array().unwrap() {
        run.env(e["name"].as_str().unwrap(), e["value"].as_str().unwrap());
    }
    run.env(
        "PATH",
        format!("{}:/usr/bin:/bin", kubectl.parent().unwrap().display()),
    )
    .env("HOME", home)
    .env("KUBECONFIG", kubeconfig)
    .output()
    .unwrap()
}

fn text(out: &Output) -> String {
    testsupport::output_report(out)
}

#[tokio::test]
async fn the_helm_test_pod_passes_only_while_new_nodes_are_held() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.admin_client().await.unwrap();
    create_namespace(&admin, NAMESPACE, "restricted").await;
    // Policy mode: the API server holds without node-holder running. A hold
    // key of its own and a node selector the test Node must match.
    let values = [
        "--set=admission.mode=policy",
        "--set=config.holdAnnotations.example\\.com/hold=yes",
        "--set=config.nodeSelector=pool=a",
        "--set=test.nodeLabels.pool=a",
    ];
    let objects = tokio::task::spawn_blocking(move || template(&values))
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
    let home = dir.path();

    // Nothing holds new nodes yet: the test fails, and says why.
    let out = run_test_pod(&objects, &kubeconfig, home);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("not held: a new Node gets example.com/hold=\"\""),
        "{}",
        text(&out)
    );

    // The chart's policy in place: it passes.
    hold_with_the_charts_policy(&cp, &objects).await;
    let out = run_test_pod(&objects, &kubeconfig, home);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("held: a new Node gets example.com/hold=yes"),
        "{}",
        text(&out)
    );

    // Its identity may not read nodes, and the dry run stored nothing.
    assert_forbidden_to_list_nodes(&kubeconfig, home);
    let nodes: kube::Api<Node> = kube::Api::all(admin);
    assert!(
        nodes
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
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
