//! Policy mode (`admission.mode: policy`) against the real API server: the
//! chart's MutatingAdmissionPolicy holds each new Node exactly as the webhook
//! would (the hold keys and presets, the node selector, the marker and the
//! list of the keys node-holder added, a hold someone else put there never
//! claimed), with no node-holder process in the path; `serve --admission
//! policy` opens no webhook port and releases what the policy held, also the
//! nodes created while it was down; and `helm upgrade` between the modes and
//! `helm uninstall` leave no stale policy or webhook behind.

use testsupport as common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::install::{self, helm};
use common::policy::{self, admitted};
use common::window::{
    Cluster, HOLD, MARKER, carries_anything_of_node_holders, create, eventually_logging, fast,
    held, metric, node_holder_patches, strs,
};
use common::{node, node_with, operator, succeeded};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ObjectMeta};
use node_holder::core::holds::{Hold, Holds, Preset};
use node_holder::core::patch::add_holds;
use node_holder::core::selector::NodeScope;
use testenv::ControlPlane;

const FREEZE: &str = "example.com/freeze";
const SCALE_DOWN: &str = "cluster-autoscaler.kubernetes.io/scale-down-disabled";
const HOLD_KEYS: &str = "node-holder.dev/hold-keys";
const SELECTOR: &str = "pool in (a,b),!virtual";

/// Every combination of the labels the selector reads and the marker, with
/// every combination of the configured holds, a list of node-holder's, and
/// someone else's annotation, already on the node at its CREATE.
fn cases() -> Vec<Node> {
    let pools: [&[(&str, &str)]; 3] = [&[], &[("pool", "a")], &[("pool", "c")]];
    let virtuals: [&[(&str, &str)]; 2] = [&[], &[("virtual", "yes")]];
    let markers: [&[(&str, &str)]; 3] = [&[], &[(MARKER, "true")], &[(MARKER, "false")]];
    let disrupts: [&[(&str, &str)]; 3] = [&[], &[(HOLD, "true")], &[(HOLD, "false")]];
    let others: [&[(&str, &str)]; 3] = [
        &[],
        &[(FREEZE, "yes")],
        &[(FREEZE, "yes"), (SCALE_DOWN, "true")],
    ];
    let lists: [&[(&str, &str)]; 3] = [
        &[],
        &[(HOLD_KEYS, "a.example/k")],
        &[(
            HOLD_KEYS,
            " a.example/k, ,node-holder.dev/x,karpenter.sh/do-not-disrupt",
        )],
    ];
    let mut cases = Vec::new();
    for labels in itertools(&[&pools[..], &virtuals[..], &markers[..]]) {
        for (i, annotations) in itertools(&[&disrupts[..], &others[..], &lists[..]])
            .into_iter()
            .enumerate()
        {
            let mut annotations = annotations;
            if i % 5 == 0 {
                annotations.push(("example.com/owner", "team-a"));
            }
            let name = format!("case-{}", cases.len());
            cases.push(node_with(&name, &labels, &annotations));
        }
    }
    cases
}

/// The cartesian product of the choices, each a list of pairs, flattened.
fn itertools<'a>(choices: &[&[&'a [(&'a str, &'a str)]]]) -> Vec<Vec<(&'a str, &'a str)>> {
    let mut product: Vec<Vec<(&str, &str)>> = vec![Vec::new()];
    for options in choices {
        product = product
            .into_iter()
            .flat_map(|prefix| {
                options.iter().map(move |option| {
                    let mut next = prefix.clone();
                    next.extend_from_slice(option);
                    next
                })
            })
            .collect();
    }
    product
}

/// What node-holder's webhook would make of `input`: its patch applied when
/// the node is in scope, the node unchanged when not.
fn as_the_webhook_would(input: &Node, holds: &Holds, scope: &NodeScope) -> ObjectMeta {
    let meta = input.metadata.clone();
    if !scope.matches(&meta.labels.clone().unwrap_or_default()) {
        return meta;
    }
    let (patch, _) = add_holds(&meta, holds);
    let mut value = serde_json::to_value(&meta).unwrap();
    let mut wrapped = serde_json::json!({ "metadata": value.take() });
    json_patch::patch(&mut wrapped, &patch).unwrap();
    serde_json::from_value(wrapped["metadata"].clone()).unwrap()
}

fn maps(meta: &ObjectMeta) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    (
        meta.labels.clone().unwrap_or_default(),
        meta.annotations.clone().unwrap_or_default(),
    )
}

#[tokio::test]
async fn the_policy_holds_each_new_node_exactly_as_the_webhook_would() {
    let cp = ControlPlane::start().await.unwrap();
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());
    let values = [
        "--set-json",
        r#"config.holdPresets=["karpenter-v1","cluster-autoscaler"]"#,
        "--set-json",
        r#"config.holdAnnotations={"example.com/freeze":"yes"}"#,
        "--set-string",
        "config.nodeSelector=pool in (a\\,b)\\,!virtual",
    ];
    let objects = policy::objects(&values);
    let probe = node_with("probe", &[("pool", "a")], &[]);
    policy::apply(&cp, &objects, &probe, HOLD).await;

    let holds = Holds::new(
        &[Preset::KarpenterV1, Preset::ClusterAutoscaler],
        &[Hold {
            key: FREEZE.into(),
            value: "yes".into(),
        }],
    )
    .unwrap();
    let scope = NodeScope::parse(SELECTOR).unwrap();
    let cases = cases();
    assert_eq!(cases.len(), 486);
    let (mut in_scope, mut changed) = (0, 0);
    for (i, input) in cases.iter().enumerate() {
        // A few are stored for real; a dry run goes through the same
        // admission and stores nothing.
        let stored = if i % 40 == 0 {
            nodes
                .create(&Default::default(), input)
                .await
                .unwrap()
                .metadata
        } else {
            admitted(&nodes, input).await.metadata
        };
        let expected = as_the_webhook_would(input, &holds, &scope);
        assert_eq!(
            maps(&stored),
            maps(&expected),
            "input: {:?}",
            input.metadata
        );
        in_scope += usize::from(scope.matches(&maps(&input.metadata).0));
        changed += usize::from(maps(&stored) != maps(&input.metadata));
    }
    // The cases cover both sides of the selector and of "already held".
    assert_eq!(in_scope, 81, "pool a without virtual: 1 x 1 x 3 x 27");
    assert!(changed > 0 && changed < in_scope, "{changed} of {in_scope}");
}

#[tokio::test]
async fn with_node_holder_down_new_nodes_are_still_held_and_released_once_it_is_back() {
    let c = Cluster::start().await;
    let probe = node("probe");
    policy::apply(&c.cp, &policy::objects(&[]), &probe, HOLD).await;
    // A hold a person put on a node before: never node-holder's.
    create(&c.nodes, "theirs", &[], &[(HOLD, "true")]).await;

    let args = fast("8s", &[]);
    let served = policy::serve(&c.cp, &strs(&args)).await;
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", served.webhook_port))
            .await
            .is_err(),
        "policy mode opens no webhook port"
    );
    let first = create(&c.nodes, "new-1", &[], &[]).await;
    assert!(held(&first), "held at its CREATE: {:?}", first.metadata);
    eventually_logging(
        "new-1 counted as held at its CREATE",
        Duration::from_secs(30),
        &served,
        async || {
            metric(&served, r#"node_holder_new_nodes_total{at_create="held"}"#).await == Some(1.0)
        },
    )
    .await;
    drop(served);

    // node-holder is gone: the API server still holds every new node.
    for name in ["down-1", "down-2"] {
        let created = create(&c.nodes, name, &[], &[]).await;
        assert!(held(&created), "{name}: {:?}", created.metadata);
    }
    let served = policy::serve(&c.cp, &strs(&args)).await;
    eventually_logging(
        "every hold released",
        Duration::from_secs(60),
        &served,
        async || {
            let list = c.nodes.list(&Default::default()).await.unwrap();
            list.items
                .iter()
                .all(|n| !carries_anything_of_node_holders(n))
        },
    )
    .await;
    for name in ["new-1", "down-1", "down-2"] {
        assert!(
            node_holder_patches(&c.cp, name).len() == 1,
            "{name}: only the release was node-holder's write"
        );
    }
    let theirs = c.nodes.get("theirs").await.unwrap();
    let annotations = theirs.metadata.annotations.unwrap_or_default();
    assert_eq!(annotations.get(HOLD).map(String::as_str), Some("true"));
}

/// `helm` against the test cluster, as its admin.
fn helm_on(cp: &ControlPlane, args: &[&str]) -> String {
    let mut command = helm();
    command.env("KUBECONFIG", cp.admin_kubeconfig()).args(args);
    if matches!(args.first(), Some(&("install" | "upgrade" | "template"))) {
        command.arg(testsupport::install::IMAGE);
    }
    let out = command.output().unwrap();
    succeeded(&out)
}

const RELEASE: &str = "nh";
const NAMESPACE: &str = "nh-system";
/// The release's full name: the policy, its binding and the webhook
/// configuration are all called this.
const FULLNAME: &str = "nh-node-holder";

/// Installs or upgrades the release in `mode` (`tls.mode=provided`: no
/// cert-manager in the test cluster; no pod runs there either).
fn helm_upgrade(cp: &ControlPlane, mode: &str) {
    let chart = install::chart();
    helm_on(
        cp,
        &[
            "upgrade",
            "--install",
            RELEASE,
            chart.to_str().unwrap(),
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            "--set",
            &format!("admission.mode={mode}"),
            "--set",
            "tls.mode=provided",
            "--set",
            "tls.provided.secretName=nh-tls",
            "--set",
            "tls.provided.caBundle=Y2E=",
        ],
    );
}

/// (policies, bindings, webhook configurations) of the release.
async fn registered(client: &kube::Client) -> (bool, bool, bool) {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    let ours = |names: Vec<String>| names.iter().any(|n| n == FULLNAME);
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let webhook = webhooks.get_opt(FULLNAME).await.unwrap().is_some();
    (
        ours(policy::names(client, "MutatingAdmissionPolicy").await),
        ours(policy::names(client, "MutatingAdmissionPolicyBinding").await),
        webhook,
    )
}

#[tokio::test]
async fn switching_modes_with_helm_and_uninstalling_leave_nothing_stale() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    let probe = node("probe");

    helm_upgrade(&cp, "webhook");
    assert_eq!(registered(&admin).await, (false, false, true));

    helm_upgrade(&cp, "policy");
    assert_eq!(registered(&admin).await, (true, true, false));
    policy::wait_until_probe(&nodes, &probe, HOLD, true).await;
    let created = create(&nodes, "after-switch", &[], &[]).await;
    assert!(held(&created), "{:?}", created.metadata);

    helm_upgrade(&cp, "webhook");
    assert_eq!(registered(&admin).await, (false, false, true));

    helm_upgrade(&cp, "policy");
    // Without the pre-delete hook: its Job needs a kubelet, which this
    // cluster has not (tests/uninstall.rs runs what it runs).
    helm_on(
        &cp,
        &["uninstall", RELEASE, "--namespace", NAMESPACE, "--no-hooks"],
    );
    assert_eq!(registered(&admin).await, (false, false, false));
    policy::wait_until_probe(&nodes, &probe, HOLD, false).await;
    let created = create(&nodes, "after-uninstall", &[], &[]).await;
    assert!(!carries_anything_of_node_holders(&created));
    // The node held in policy mode keeps its hold: the window task, gone
    // with the release, would have released it (with no leader left,
    // `node-holder uninstall` does it by hand).
    let out = operator(&cp, &["uninstall", "--namespace", NAMESPACE]);
    succeeded(&out);
    assert!(!carries_anything_of_node_holders(
        &nodes.get("after-switch").await.unwrap()
    ));
}

/// The chart in policy mode: the policy and its binding, and nothing of the
/// webhook's (no registration, certificate, Service port, TLS volume or
/// container port).
#[test]
fn policy_mode_renders_the_policy_and_nothing_of_the_webhooks() {
    let objects = install::template(&["--set", "admission.mode=policy"]);
    let kinds: Vec<&str> = objects.iter().map(install::kind).collect();
    for absent in ["MutatingWebhookConfiguration", "Certificate", "Issuer"] {
        assert!(!kinds.contains(&absent), "{absent} in {kinds:?}");
    }
    for present in ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"] {
        assert_eq!(
            install::one(&objects, present)["metadata"]["name"],
            "node-holder"
        );
    }
    let container = install::container(&objects);
    let ports: Vec<&str> = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(ports, ["admin"]);
    assert!(
        container["volumeMounts"]
            .as_array()
            .is_none_or(Vec::is_empty)
    );
    let service = install::one(&objects, "Service");
    assert_eq!(service["spec"]["ports"].as_array().unwrap().len(), 1);
    assert_eq!(install::env_of(&objects)["NODE_HOLDER_ADMISSION"], "policy");
    // The default, `auto`: the policy where the cluster serves it ...
    let served = "--api-versions=admissionregistration.k8s.io/v1/MutatingAdmissionPolicy";
    let objects = install::template(&[served]);
    assert_eq!(install::env_of(&objects)["NODE_HOLDER_ADMISSION"], "policy");
    assert!(install::all_of(&objects, "MutatingWebhookConfiguration").is_empty());
    assert_eq!(
        install::all_of(&objects, "MutatingAdmissionPolicy").len(),
        1
    );
    // ... and the webhook (with cert-manager served) where it does not.
    let objects = install::template(&["--api-versions=cert-manager.io/v1/Certificate"]);
    assert_eq!(
        install::env_of(&objects)["NODE_HOLDER_ADMISSION"],
        "webhook"
    );
    assert!(install::all_of(&objects, "MutatingAdmissionPolicy").is_empty());
    assert_eq!(
        install::all_of(&objects, "MutatingWebhookConfiguration").len(),
        1
    );
}

#[test]
fn the_chart_refuses_policy_mode_before_kubernetes_1_36_and_unknown_modes() {
    let err =
        install::try_template(&["--set", "admission.mode=policy", "--kube-version", "1.35.4"])
            .unwrap_err();
    assert!(err.contains("needs Kubernetes 1.36 or later"), "{err}");
    assert!(
        install::try_template(&["--set", "admission.mode=policy", "--kube-version", "1.36.0"])
            .is_ok()
    );
    let err = install::try_template(&["--set", "admission.mode=both"]).unwrap_err();
    assert!(err.contains("/admission/mode"), "{err}");
}

/// `webhook-config/admission-policy.yaml` is the chart's policy and binding
/// for its defaults, without Helm's labels.
#[test]
fn the_plain_policy_manifest_is_the_charts() {
    let path = install::repo().join("webhook-config/admission-policy.yaml");
    let plain = testenv::parse_manifests(&std::fs::read_to_string(path).unwrap()).unwrap();
    let chart = policy::objects(&[]);
    assert_eq!(plain.len(), 2);
    for (plain, chart) in plain.iter().zip(&chart) {
        assert_eq!(plain["kind"], chart["kind"]);
        assert_eq!(plain["metadata"]["name"], chart["metadata"]["name"]);
        assert_eq!(plain["spec"], chart["spec"], "{}", plain["kind"]);
    }
}

/// Nodes keep coming while `helm upgrade` switches the release to policy mode
/// and back; with node-holder's window task running (as the test's process,
/// not the release's pod, which no kubelet runs here), every one of them ends
/// up held: at its CREATE while the policy is in force, by the window task
/// otherwise.
#[tokio::test]
async fn switching_modes_with_helm_leaves_no_node_unheld() {
    let c = Cluster::start().await;
    let args = fast("10m", &[]);
    let served = policy::serve(&c.cp, &strs(&args)).await;
    let cp = std::sync::Arc::new(c.cp);
    let upgrade = |mode: &'static str| {
        let cp = std::sync::Arc::clone(&cp);
        tokio::task::spawn_blocking(move || helm_upgrade(&cp, mode))
    };
    upgrade("webhook").await.unwrap();

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let creator = tokio::spawn({
        let (nodes, stop) = (c.nodes.clone(), std::sync::Arc::clone(&stop));
        async move {
            let mut created = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let name = format!("during-{}", created.len());
                let node = create(&nodes, &name, &[], &[]).await;
                created.push((name, held(&node)));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            created
        }
    });
    upgrade("policy").await.unwrap();
    policy::wait_until_probe(&c.nodes, &node("probe"), HOLD, true).await;
    upgrade("webhook").await.unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let created = creator.await.unwrap();

    assert!(
        created.iter().any(|(_, at_create)| *at_create),
        "some came held by the policy: {created:?}"
    );
    eventually_logging(
        "every node held",
        Duration::from_secs(60),
        &served,
        async || {
            for (name, _) in &created {
                if !held(&c.nodes.get(name).await.unwrap()) {
                    return false;
                }
            }
            true
        },
    )
    .await;
}

/// The chart as a release ships it: `helm package` makes the `.tgz`,
/// `helm push` publishes it to an OCI registry (crane's, on loopback), and
/// the release is installed from `oci://` (in policy mode here), then
/// upgraded from the `.tgz` file itself: both ways an operator gets the chart.
#[tokio::test]
async fn the_packaged_chart_installs_from_an_oci_registry_and_its_tgz() {
    let cp = ControlPlane::start().await.unwrap();
    let registry = testenv::LocalRegistry::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let chart = install::chart();
    let dest = dir.path().to_str().unwrap();
    let packaged = helm_on(
        &cp,
        &["package", chart.to_str().unwrap(), "--destination", dest],
    );
    let tgz = dir.path().join("node-holder-0.1.0.tgz");
    assert!(tgz.exists(), "{packaged}");
    let repository = format!("oci://{}/charts", registry.host());
    let tgz = tgz.to_str().unwrap();
    helm_on(&cp, &["push", tgz, &repository, "--plain-http"]);
    let published = format!("{repository}/node-holder");
    let shown = helm_on(
        &cp,
        &[
            "show",
            "chart",
            &published,
            "--version",
            "0.1.0",
            "--plain-http",
        ],
    );
    assert!(shown.contains("name: node-holder"), "{shown}");

    let from = |source: &str, verb: &str| {
        let mut args = vec![
            verb,
            RELEASE,
            source,
            "--namespace",
            NAMESPACE,
            "--create-namespace",
        ];
        // No admission.mode: the default, `auto`, takes the policy on this
        // cluster, which serves admissionregistration.k8s.io/v1.
        if source.starts_with("oci://") {
            args.extend(["--version", "0.1.0", "--plain-http"]);
        }
        helm_on(&cp, &args)
    };
    from(&published, "install");
    let admin = cp.admin_client().await.unwrap();
    assert_eq!(registered(&admin).await, (true, true, false));
    let history = helm_on(&cp, &["history", RELEASE, "--namespace", NAMESPACE]);
    assert!(history.contains("node-holder-0.1.0"), "{history}");
    from(tgz, "upgrade");
    assert_eq!(registered(&admin).await, (true, true, false));
    let status = helm_on(&cp, &["status", RELEASE, "--namespace", NAMESPACE]);
    assert!(status.contains("STATUS: deployed"), "{status}");
    assert!(status.contains("REVISION: 2"), "{status}");
}
