//! The chart installed as a user installs a release, on the real node, for
//! real (issue 39): node-holder's image and the chart are published to one
//! local OCI registry as the release workflow publishes them (the image
//! pushed, the chart packaged and pushed by the workflow's own
//! `.github/scripts/publish-chart.sh`), and `helm install` takes the chart
//! from `oci://` by its digest, with the image pinned by its digest too
//! (`image.registry`, `image.repository`, `image.digest`). The pods are placed
//! on the real node by the chart's own `nodeSelector` and `tolerations`
//! values, TLS by cert-manager (its controller and CA injector as processes,
//! as in `tests/install_cert_manager.rs`).
//!
//! Nothing between helm and the kubelet is made by hand: the Deployment and
//! ReplicaSet controllers make the pods, kube-scheduler places them, the
//! kubelet pulls the image, mounts cert-manager's Secret and the pods'
//! ServiceAccount tokens (TokenRequest, `kube-root-ca.crt`), and node-holder
//! reaches the API server in-cluster, at the `kubernetes` Service's ClusterIP.
//! The pods turn Ready by their probes, one leads (the Lease), and a Node
//! CREATE is held by the webhook through the chart's Service (kube-proxy's
//! rules). `helm test` runs its `self-check` Pod on the real node. A drain of
//! the node (cordon, then the Eviction API) honours the chart's
//! PodDisruptionBudget: one replica goes, the other is refused while its
//! replacement has nowhere to run, and new nodes are still held. `helm
//! upgrade` to a new image tag rolls the replicas while nodes are created
//! through the API and the real Karpenter (its KWOK provider, with kwok
//! beside it) launches nodes for pending pods: every one is held at its
//! CREATE. `helm uninstall` runs its pre-delete Job (`node-holder uninstall`) on the real
//! node too, after which nothing of node-holder's is left in the cluster.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret, Service};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};
use testenv::{
    Autoscaler, ControlPlane, Disruption, LocalRegistry, REAL_NODE_LABEL, REAL_NODE_TAINT, RealNode,
};

use testsupport::install::{self, CertManager, NAMESPACE, RELEASE};
use testsupport::window::{HOLD, MARKER, failed_open, held};

/// The Lease and the record ConfigMap node-holder keeps in its namespace.
const WINDOW: &str = "node-holder-window";
/// How long anything here may take on a loaded 2-core machine: the image
/// pull, cert-manager's issuance, the kubelet's Secret mount retries.
const LIMIT: Duration = Duration::from_secs(300);
/// `helm`'s own limit for install, test and uninstall.
const HELM_TIMEOUT: &str = "--timeout=5m";

#[test]
fn helm_installs_node_holder_on_the_real_node_tests_it_and_uninstalls_it() {
    // Worker threads: the relay that carries the pods' connections to the
    // API server, and the watch of the pods, run on this runtime while helm
    // runs. Its shutdown is bounded, after a failure too: once, a run whose
    // every check had passed and whose cluster was gone did not end until
    // nextest stopped it, and once a failed check was followed by 8 minutes
    // of nothing until nextest's timeout.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(install_test_uninstall())
    }));
    runtime.shutdown_timeout(Duration::from_secs(10));
    if let Err(failure) = ran {
        std::panic::resume_unwind(failure);
    }
}

async fn install_test_uninstall() {
    let started = Instant::now();
    let log = |what: &str| eprintln!("real_install: {what} at {:.0?}", started.elapsed());
    // The API server calls the webhook at its Service's ClusterIP, and pods
    // get ServiceAccount tokens, as in a cluster.
    let cp = ControlPlane::start_with_args(&[
        testenv::CLUSTER_IP_ROUTING.into(),
        testenv::SERVICE_ACCOUNTS.into(),
    ])
    .await
    .unwrap();
    let admin = cp.admin_client().await.unwrap();
    install::install_cert_manager_crds(&cp).await;
    let mut cert_manager = CertManager::start(&cp).await;

    // The node (with kube-proxy, kube-controller-manager and kube-scheduler)
    // joins while node-holder's image is built as `cargo xtask image` builds
    // it; the image is pushed to a registry the node trusts.
    let registry = LocalRegistry::start().unwrap();
    let layout_dir = tempfile::tempdir().unwrap();
    let layout_path = layout_dir.path().join("layout");
    let tag = format!("real-install-{}", std::process::id());
    let build = {
        let (layout_path, tag) = (layout_path.clone(), tag.clone());
        tokio::task::spawn_blocking(move || {
            let binary = xtask::image::build_static().unwrap();
            xtask::image::build_image(&binary, &layout_path, &tag).unwrap()
        })
    };
    let (node, layout) = tokio::join!(RealNode::join_with_services(&cp), build);
    let node = node.unwrap();
    let layout = layout.unwrap();
    let repository = format!("{}/node-holder", registry.host());
    let pushed = registry
        .crane(&[
            "push",
            layout_path.to_str().unwrap(),
            &format!("{repository}:{tag}"),
        ])
        .unwrap();
    assert!(pushed.ends_with(&layout.manifest_digest), "{pushed}");
    node.trust_registry(registry.host()).unwrap();
    // The image by digest: what the pods must run, whatever a tag says.
    let image = format!("{repository}@{}", layout.manifest_digest);

    // The chart, as the release workflow publishes it: packaged at the
    // release's version and pushed to the same registry, named by digest.
    let version = chart_version();
    let charts = format!("oci://{}/charts", registry.host());
    let published = tokio::task::spawn_blocking({
        let (version, charts) = (version.clone(), charts.clone());
        move || install::publish_chart(&version, &charts, &["--plain-http"])
    })
    .await
    .unwrap();
    let chart = String::from_utf8_lossy(&published.stdout)
        .trim()
        .to_string();
    assert!(
        published.status.success(),
        "{}",
        testsupport::output_text(&published)
    );
    let chart_digest = chart
        .strip_prefix(&format!("{charts}/node-holder@"))
        .unwrap_or_else(|| panic!("not the chart by digest: {chart}"))
        .to_string();
    assert_eq!(
        registry
            .crane(&[
                "digest",
                &format!("{}/charts/node-holder:{version}", registry.host())
            ])
            .unwrap(),
        chart_digest
    );
    log("node Ready, image and chart pushed");

    // Every pod of the namespace as it changes, to see the hooks' pods,
    // which helm deletes once they succeed.
    let seen = watch_pods(admin.clone());

    // `helm install`, as a user runs it: the chart from the registry by its
    // digest, the image from the registry by its own, the pods pinned to the
    // real node with the chart's placement values, TLS by cert-manager (the
    // chart's default).
    let placement = format!(
        "--set-json=nodeSelector={}",
        json!({REAL_NODE_LABEL: "true"})
    );
    let tolerations = format!(
        "--set-json=tolerations={}",
        json!([{"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}])
    );
    helm(
        &cp,
        &[
            "install",
            RELEASE,
            &chart,
            "--plain-http",
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            // The webhook through the chart's Service and cert-manager's
            // certificate: on this 1.36+ cluster the default would be the
            // admission policy, which needs neither.
            "--set=admission.mode=webhook",
            &format!("--set=image.registry={}", registry.host()),
            "--set=image.repository=node-holder",
            &format!("--set=image.digest={}", layout.manifest_digest),
            &placement,
            &tolerations,
            HELM_TIMEOUT,
        ],
    )
    .await;
    log("helm install done");
    // The release is the published chart: its version, and the values that
    // pin the image.
    let metadata: Value = serde_json::from_str(
        &helm(
            &cp,
            &[
                "get",
                "metadata",
                RELEASE,
                "--namespace",
                NAMESPACE,
                "-o",
                "json",
            ],
        )
        .await,
    )
    .unwrap();
    assert_eq!(metadata["chart"], "node-holder", "{metadata}");
    assert_eq!(metadata["version"], version.as_str(), "{metadata}");

    // The Deployment's replicas, made by the ReplicaSet controller, placed
    // by the scheduler on the real node, Ready by their probes.
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), NAMESPACE);
    let deployment = until(
        &node,
        &mut cert_manager,
        "the Deployment's replicas Ready",
        || async {
            let d = deployments.get(RELEASE).await.unwrap();
            let want = d.spec.replicas.unwrap_or(1);
            let status = d.status.clone().unwrap_or_default();
            (status.ready_replicas == Some(want) && status.updated_replicas == Some(want))
                .then_some(d)
        },
    )
    .await;
    let replicas = deployment.spec.replicas.unwrap();
    log("the Deployment's replicas are Ready");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    let selector =
        format!("app.kubernetes.io/name=node-holder,app.kubernetes.io/instance={RELEASE}");
    let running: Vec<Value> = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| serde_json::to_value(p).unwrap())
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .collect();
    assert_eq!(running.len(), replicas as usize, "{running:#?}");
    for pod in &running {
        let name = pod["metadata"]["name"].as_str().unwrap();
        assert_eq!(pod["spec"]["nodeName"], node.name(), "{name}");
        let owner = &pod["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "ReplicaSet", "{name}: {owner}");
        // The image by digest, as the values pinned it, and the image the
        // kubelet ran is that digest.
        assert_eq!(
            pod["spec"]["containers"][0]["image"],
            image.as_str(),
            "{name}"
        );
        let status = &pod["status"]["containerStatuses"][0];
        assert_eq!(status["ready"], true, "{name}: {status}");
        assert!(
            status["imageID"]
                .as_str()
                .is_some_and(|id| id.ends_with(&format!("@{}", layout.manifest_digest))),
            "{name}: {status}"
        );
        // The ServiceAccount's token, projected by the kubelet.
        let volumes = pod["spec"]["volumes"].as_array().unwrap();
        assert!(
            volumes.iter().any(|v| v["projected"]["sources"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s["serviceAccountToken"].is_object()))),
            "{name}: no ServiceAccount token volume in {volumes:#?}"
        );
    }
    let names: Vec<&str> = running
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap())
        .collect();

    // One replica leads: it holds the Lease.
    let leases: Api<Lease> = Api::namespaced(admin.clone(), NAMESPACE);
    let leader = until(
        &node,
        &mut cert_manager,
        "a replica holding the Lease",
        || async {
            let lease = leases.get_opt(WINDOW).await.unwrap()?;
            let holder = lease.spec?.holder_identity?;
            names.iter().any(|n| holder.contains(n)).then_some(holder)
        },
    )
    .await;
    log(&format!("{leader} leads"));

    // cert-manager's CA is in the webhook configuration, and the API server
    // calls the webhook through the Service's ClusterIP: a Node CREATE comes
    // back held.
    let configs: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    let nodes: Api<Node> = Api::all(admin.clone());
    until(
        &node,
        &mut cert_manager,
        "a dry-run Node held by the webhook",
        || dry_run_held(&nodes, "probe"),
    )
    .await;
    // The caBundle is cert-manager's CA, injected by its cainjector; the
    // pods serve the certificate it issued into the Secret they mount.
    let config = configs.get(RELEASE).await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NAMESPACE);
    let issued = secrets.get("node-holder-tls").await.unwrap().data.unwrap();
    assert_eq!(
        config.webhooks.unwrap()[0].client_config.ca_bundle,
        Some(issued["ca.crt"].clone()),
        "the caBundle is cert-manager's CA"
    );
    let created = nodes
        .create(
            &PostParams::default(),
            &testsupport::node("via-helm-install"),
        )
        .await
        .unwrap();
    assert!(held(&created), "the create came back held: {created:?}");
    let event = cp
        .wait_for_node_create_event("via-helm-install")
        .await
        .unwrap();
    assert!(!failed_open(&event), "{event}");

    // The paths were the cluster's: the kernel's connection tracking holds
    // the API server's connection to the Service's ClusterIP, port 443,
    // answered by a replica's webhook port, and the replicas' in-cluster
    // connections to the `kubernetes` Service (10.0.0.1:443), answered by
    // the API server's relay on the node: both through kube-proxy's DNAT.
    let services: Api<Service> = Api::namespaced(admin.clone(), NAMESPACE);
    let cluster_ip = services
        .get(RELEASE)
        .await
        .unwrap()
        .spec
        .unwrap()
        .cluster_ip
        .unwrap();
    let pod_ips: Vec<String> = running
        .iter()
        .map(|p| p["status"]["podIP"].as_str().unwrap().to_string())
        .collect();
    let relay = node.api_server_for_pods().unwrap();
    let (relay_ip, relay_port) = (relay.ip().to_string(), relay.port().to_string());
    let conntrack = std::fs::read_to_string("/proc/net/nf_conntrack").unwrap();
    let connections: Vec<_> = conntrack.lines().map(testenv::tracked_connection).collect();
    assert!(
        connections.iter().any(
            |(original, reply)| original == &[cluster_ip.as_str(), "443"]
                && pod_ips.iter().any(|ip| reply == &[ip.as_str(), "8443"])
        ),
        "no tracked connection to {cluster_ip}:443 answered by a replica:\n{conntrack}"
    );
    assert!(
        connections.iter().any(|(original, reply)| original
            == &[testenv::KUBERNETES_SERVICE_IP, "443"]
            && reply == &[relay_ip.as_str(), relay_port.as_str()]),
        "no tracked connection to the kubernetes Service answered by {relay}:\n{conntrack}"
    );
    log("a new Node is held");

    // `helm test`: node-holder's self-check in a Pod of its own, on the real
    // node.
    let out = match try_helm(
        &cp,
        &["test", RELEASE, "--namespace", NAMESPACE, HELM_TIMEOUT],
    )
    .await
    {
        Ok(out) => out,
        Err(err) => panic!("{err}\n{}\n{}", pod_logs(&pods).await, node.log_tails()),
    };
    assert!(out.contains("Succeeded"), "{out}");
    let test_pod = format!("{RELEASE}-test");
    ran_on_the_real_node(&seen, &node, |name| name == test_pod);
    log("helm test passed");

    a_drain_honours_the_disruption_budget(&node, &mut cert_manager, &admin, &names).await;
    log("a drain honoured the PodDisruptionBudget");

    // `helm upgrade` to a new tag of the image while nodes keep coming.
    let next_tag = format!("{tag}-next");
    registry
        .crane(&[
            "push",
            layout_path.to_str().unwrap(),
            &format!("{repository}:{next_tag}"),
        ])
        .unwrap();
    let upgrade = [
        "upgrade",
        RELEASE,
        &chart,
        "--plain-http",
        "--namespace",
        NAMESPACE,
        "--reuse-values",
        "--set=image.digest=",
        &format!("--set=image.tag={next_tag}"),
        HELM_TIMEOUT,
    ];
    let upgraded = format!("{repository}:{next_tag}");
    // The real Karpenter (its KWOK provider) launches nodes for pending pods
    // during the upgrade, beside nodes created through the API.
    let autoscaler = Autoscaler::attach(&cp, &Disruption::default())
        .await
        .unwrap();
    log("Karpenter ready");
    an_upgrade_holds_every_node_created_during_it(
        &cp,
        &node,
        &mut cert_manager,
        &seen,
        &upgrade,
        &upgraded,
    )
    .await;
    log("every node created during helm upgrade was held at its CREATE");
    drop(autoscaler);

    // `helm uninstall`: the pre-delete hook Job runs `node-holder uninstall`
    // on the real node, then helm deletes the release.
    if let Err(err) = try_helm(
        &cp,
        &["uninstall", RELEASE, "--namespace", NAMESPACE, HELM_TIMEOUT],
    )
    .await
    {
        panic!("{err}\n{}\n{}", pod_logs(&pods).await, node.log_tails());
    }
    let job = format!("{RELEASE}-uninstall-");
    ran_on_the_real_node(&seen, &node, |name| name.starts_with(&job));
    log("helm uninstall done");

    // Nothing of node-holder's is left: no hold or marker on any node, no
    // record, no Lease, no webhook configuration, no pod.
    let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), NAMESPACE);
    let cluster_roles: Api<ClusterRole> = Api::all(admin.clone());
    until(
        &node,
        &mut cert_manager,
        "nothing of node-holder's left",
        || async {
            let left_nodes: Vec<String> = nodes
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|n| {
                    let labels = n.metadata.labels.clone().unwrap_or_default();
                    let annotations = n.metadata.annotations.clone().unwrap_or_default();
                    labels.contains_key(MARKER)
                        || annotations.contains_key(HOLD)
                        || annotations
                            .keys()
                            .any(|k| k.starts_with("node-holder.dev/"))
                })
                .map(|n| n.metadata.name.unwrap_or_default())
                .collect();
            let left_pods = pods.list(&ListParams::default()).await.unwrap().items;
            let left_roles = cluster_roles
                .list(
                    &ListParams::default().labels(&format!("app.kubernetes.io/instance={RELEASE}")),
                )
                .await
                .unwrap()
                .items;
            let left = (
                left_nodes.is_empty(),
                configmaps.get_opt(WINDOW).await.unwrap().is_none(),
                leases.get_opt(WINDOW).await.unwrap().is_none(),
                configs.get_opt(RELEASE).await.unwrap().is_none(),
                deployments.get_opt(RELEASE).await.unwrap().is_none(),
                left_pods.is_empty(),
                left_roles.is_empty(),
            );
            (left == (true, true, true, true, true, true, true)).then_some(())
        },
    )
    .await;
    // The Node that was held is still there, without the hold.
    let after = nodes.get("via-helm-install").await.unwrap();
    assert!(!held(&after), "{after:?}");
    log("nothing of node-holder's is left; done");
}

/// The chart's version (`chart/Chart.yaml`): what a release of this checkout
/// publishes.
fn chart_version() -> String {
    let text = std::fs::read_to_string(install::chart().join("Chart.yaml")).unwrap();
    let chart = &testenv::parse_manifests(&text).unwrap()[0];
    chart["version"].as_str().unwrap().to_string()
}

/// Runs the pinned helm against `cp` as the admin; fails with its output
/// unless it succeeds, else returns its standard output.
async fn helm(cp: &ControlPlane, args: &[&str]) -> String {
    try_helm(cp, args)
        .await
        .unwrap_or_else(|err| panic!("{err}"))
}

/// Runs the pinned helm against `cp` as the admin (on a blocking thread:
/// the runtime goes on serving the relay and the watch): its standard
/// output, or its output and error when it fails.
async fn try_helm(cp: &ControlPlane, args: &[&str]) -> Result<String, String> {
    let mut command = install::helm();
    command.env("KUBECONFIG", cp.admin_kubeconfig()).args(args);
    let out = tokio::task::spawn_blocking(move || command.output().expect("helm runs"))
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "helm {args:?} failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    eprintln!("helm {}:\n{stdout}", args[0]);
    Ok(stdout)
}

/// The status and log of every pod in node-holder's namespace, for a
/// failure's message.
async fn pod_logs(pods: &Api<Pod>) -> String {
    let mut text = String::new();
    for pod in pods.list(&ListParams::default()).await.unwrap().items {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let log = pods
            .logs(&name, &kube::api::LogParams::default())
            .await
            .unwrap_or_else(|err| format!("(no log: {err})"));
        let status = serde_json::to_string_pretty(&pod.status).unwrap();
        text += &format!("pod {name}: {status}\nlog:\n{log}\n");
    }
    text
}

/// The field [`watch_pods`] adds to each state: when it saw it.
const SEEN_AT: &str = "seenAt";

/// Every state of every pod in node-holder's namespace, by name, as a
/// watch sees them (until the test ends), each with [`SEEN_AT`].
fn watch_pods(client: kube::Client) -> Arc<Mutex<BTreeMap<String, Vec<Value>>>> {
    let seen: Arc<Mutex<BTreeMap<String, Vec<Value>>>> = Arc::default();
    let pods: Api<Pod> = Api::namespaced(client, NAMESPACE);
    let record = seen.clone();
    tokio::spawn(async move {
        let mut stream = watcher(pods, watcher::Config::default()).boxed();
        while let Some(event) = stream.next().await {
            let pod = match event {
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
                _ => continue,
            };
            let name = pod.metadata.name.clone().unwrap_or_default();
            let mut value = serde_json::to_value(pod).unwrap();
            // When the watch saw this state: finer than the object's own
            // timestamps, which have whole seconds.
            value[SEEN_AT] = json!(jiff::Timestamp::now().to_string());
            record.lock().unwrap().entry(name).or_default().push(value);
        }
    });
    seen
}

/// Asserts that a pod whose name `matches` ran on `node` and its container
/// exited 0: a real pod, its process really run.
fn ran_on_the_real_node(
    seen: &Mutex<BTreeMap<String, Vec<Value>>>,
    node: &RealNode,
    matches: impl Fn(&str) -> bool,
) {
    let seen = seen.lock().unwrap();
    let states: Vec<&Value> = seen
        .iter()
        .filter(|(name, _)| matches(name))
        .flat_map(|(_, states)| states)
        .collect();
    assert!(!states.is_empty(), "no such pod seen: {:?}", seen.keys());
    assert!(
        states
            .iter()
            .all(|p| p["spec"]["nodeName"].is_null() || p["spec"]["nodeName"] == node.name()),
        "{states:#?}"
    );
    assert!(
        states.iter().any(|p| {
            p["spec"]["nodeName"] == node.name()
                && p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
        }),
        "no state of the pod says its container exited 0 on {}: {states:#?}",
        node.name()
    );
}

/// Polls `check` every 500 ms until it returns something, up to [`LIMIT`];
/// fails with `what` and the node's logs. cert-manager must keep running.
/// A drain of the real node, as `kubectl drain` makes it: the node cordoned,
/// then each of node-holder's replicas evicted through the Eviction API. The
/// chart's PodDisruptionBudget (`minAvailable: 1`) lets one go and refuses
/// the other (429) while its replacement has nowhere to run; the one left
/// keeps holding new nodes. Uncordoned, the replacement runs and the budget
/// lets the other go too.
async fn a_drain_honours_the_disruption_budget(
    node: &RealNode,
    cert_manager: &mut CertManager,
    admin: &kube::Client,
    replicas: &[&str],
) {
    let [first, second] = replicas else {
        panic!("the chart runs two replicas by default: {replicas:?}");
    };
    let nodes: Api<Node> = Api::all(admin.clone());
    let cordon = |unschedulable: bool| {
        let patch = json!({"spec": {"unschedulable": unschedulable}});
        let nodes = nodes.clone();
        async move {
            nodes
                .patch(node.name(), &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        }
    };
    let started = Instant::now();
    let step = |what: &str| eprintln!("real_install: drain: {what} at {:.0?}", started.elapsed());
    cordon(true).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    // The budget's status comes from the disruption controller: the first
    // eviction goes once it has counted both replicas Ready.
    until(node, cert_manager, "the first replica evicted", || async {
        pods.evict(first, &EvictParams::default()).await.ok()
    })
    .await;
    step("the first replica evicted");
    match pods.evict(second, &EvictParams::default()).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 429, "{status:?}");
            assert!(status.message.contains("disruption budget"), "{status:?}");
        }
        other => panic!("the second replica's eviction was not refused: {other:?}"),
    }
    step("the second replica's eviction refused");
    // The Service's endpoints follow the eviction: a Node CREATE comes back
    // held through the replica left.
    until(
        node,
        cert_manager,
        "a dry-run Node held during the drain",
        || dry_run_held(&nodes, "during-the-drain"),
    )
    .await;
    step("a dry-run Node held during the drain");

    cordon(false).await;
    until(node, cert_manager, "the second replica evicted", || async {
        pods.evict(second, &EvictParams::default()).await.ok()
    })
    .await;
}

/// `helm upgrade` (`args`) to the image `image` while a Node is created
/// every 100 ms through the API and Karpenter launches a node for each
/// pending pod created every 2 s: the Deployment replaces its replicas one
/// at a time on the real node (`maxUnavailable: 0`, a replica stopping stays
/// ready-less but serving for its grace), and every Node created meanwhile
/// comes back held from its CREATE, none failed open.
async fn an_upgrade_holds_every_node_created_during_it(
    cp: &ControlPlane,
    node: &RealNode,
    cert_manager: &mut CertManager,
    seen: &Mutex<BTreeMap<String, Vec<Value>>>,
    args: &[&str],
    image: &str,
) {
    let admin = cp.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    let stop = tokio_util::sync::CancellationToken::new();
    let creating = tokio::spawn({
        let (nodes, stop) = (nodes.clone(), stop.clone());
        async move {
            let (mut created, mut unheld) = (Vec::new(), Vec::new());
            while !stop.is_cancelled() {
                let name = format!("during-upgrade-{}", created.len());
                let made = nodes
                    .create(&PostParams::default(), &testsupport::node(&name))
                    .await
                    .unwrap();
                if !held(&made) {
                    unheld.push(name.clone());
                }
                created.push(name);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (created, unheld)
        }
    });
    let launching = tokio::spawn(pods_pending_for_karpenter(admin.clone(), stop.clone()));
    // The routes are watched a little longer than the rollout, until the
    // CREATEs are audited: the last replica's route may go after it.
    let routes_stop = tokio_util::sync::CancellationToken::new();
    let routing = tokio::spawn(watch_routes(routes_stop.clone()));
    let upgrade_started = jiff::Timestamp::now();
    helm(cp, args).await;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    let selector =
        format!("app.kubernetes.io/name=node-holder,app.kubernetes.io/instance={RELEASE}");
    until(
        node,
        cert_manager,
        "every replica on the new image, Ready",
        || async {
            let d = deployments.get(RELEASE).await.unwrap();
            let want = d.spec.replicas.unwrap_or(1);
            let status = d.status.clone().unwrap_or_default();
            let rolled = status.observed_generation == d.metadata.generation
                && status.updated_replicas == Some(want)
                && status.ready_replicas == Some(want)
                && status.replicas == Some(want);
            let listed = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .unwrap();
            let all_new = listed.items.iter().all(|p| {
                p.spec
                    .as_ref()
                    .is_some_and(|s| s.containers[0].image.as_deref() == Some(image))
            });
            (rolled && all_new).then_some(())
        },
    )
    .await;
    let rolled_out = jiff::Timestamp::now();
    stop.cancel();
    let (created, unheld) = creating.await.unwrap();
    assert!(!created.is_empty(), "no node created during the upgrade");
    let waves = launching.await.unwrap();
    karpenters_nodes_held(
        cp,
        node,
        cert_manager,
        &nodes,
        &waves,
        (upgrade_started, rolled_out),
    )
    .await;
    // The API server's word for it: each CREATE's audit event, none of
    // them failed open (read first, so that an unheld node's failure says
    // why the API server let it through).
    let events = until(node, cert_manager, "every CREATE audited", || async {
        let events: Vec<Value> = cp
            .audit_events()
            .unwrap()
            .into_iter()
            .filter(|e| {
                e["verb"] == "create"
                    && e["objectRef"]["resource"] == "nodes"
                    && e["stage"] == "ResponseComplete"
                    && e["objectRef"]["name"]
                        .as_str()
                        .is_some_and(|n| created.iter().any(|c| c == n))
            })
            .collect();
        (events.len() >= created.len()).then_some(events)
    })
    .await;
    routes_stop.cancel();
    let routes = routing.await.unwrap();
    let failed: Vec<&Value> = events.iter().filter(|e| failed_open(e)).collect();
    let lags = routing_lags(seen, &routes);
    assert!(
        unheld.is_empty() && failed.is_empty(),
        "{} of {} nodes created during the upgrade came unheld: {unheld:?}\n\
         kube-proxy's routes to each replica deleted, after its deletion: {lags:#?}\n{}",
        unheld.len(),
        created.len(),
        why_failed_open(cp, node, seen, &failed)
    );
    eprintln!(
        "real_install: kube-proxy stopped routing the webhook's Service to each replica \
         deleted during the upgrade, after its deletion: {lags:?}"
    );
}

/// The replicas the webhook's Service routes to, by pod address, each time
/// that changes until `stop`: what kube-proxy's rules in the host's nat
/// table say (`iptables-save`), polled every 100 ms. A diagnostic: a failed
/// read is said and ends the watch, it does not fail the test.
async fn watch_routes(
    stop: tokio_util::sync::CancellationToken,
) -> Vec<(jiff::Timestamp, Vec<String>)> {
    let mut changes: Vec<(jiff::Timestamp, Vec<String>)> = Vec::new();
    let rule = format!("\"{NAMESPACE}/{RELEASE}:webhook -> ");
    while !stop.is_cancelled() {
        let saved = tokio::task::spawn_blocking(|| {
            std::process::Command::new("iptables-save")
                .args(["-t", "nat"])
                .output()
        })
        .await;
        let saved = match saved {
            Ok(Ok(out)) if out.status.success() => out.stdout,
            other => {
                eprintln!(
                    "real_install: iptables-save failed, routes no longer watched: {other:?}"
                );
                break;
            }
        };
        let text = String::from_utf8_lossy(&saved);
        let mut routed: Vec<String> = text
            .lines()
            .filter_map(|l| l.split(&rule).nth(1))
            .filter_map(|rest| rest.split(':').next())
            .map(str::to_owned)
            .collect();
        routed.sort();
        routed.dedup();
        if changes.last().is_none_or(|(_, last)| *last != routed) {
            changes.push((jiff::Timestamp::now(), routed));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    changes
}

/// For each of node-holder's replicas deleted while `routes` were watched:
/// how long after its deletion was seen kube-proxy's rules stopped routing
/// to it (the replica serves for its grace after the deletion).
fn routing_lags(
    seen: &Mutex<BTreeMap<String, Vec<Value>>>,
    routes: &[(jiff::Timestamp, Vec<String>)],
) -> BTreeMap<String, String> {
    let Some((watched_from, _)) = routes.first() else {
        return BTreeMap::new();
    };
    let routed_at = |at: jiff::Timestamp, ip: &str| {
        routes
            .iter()
            .rev()
            .find(|(change, _)| *change <= at)
            .is_some_and(|(_, routed)| routed.iter().any(|r| r == ip))
    };
    let mut lags = BTreeMap::new();
    for (name, states) in seen.lock().unwrap().iter() {
        let ip = states
            .iter()
            .rev()
            .find_map(|s| s["status"]["podIP"].as_str());
        let (Some((deleted, _)), Some(ip)) = (deletion(states), ip) else {
            continue;
        };
        if deleted < *watched_from {
            continue;
        }
        let lag = if routed_at(deleted, ip) {
            routes
                .iter()
                .find(|(at, routed)| *at > deleted && !routed.iter().any(|r| r == ip))
                .map_or_else(
                    || "still routed when the watch ended".to_string(),
                    |(at, _)| format!("{:.1} s", at.duration_since(deleted).as_secs_f64()),
                )
        } else {
            "not routed when deleted".to_string()
        };
        lags.insert(name.clone(), lag);
    }
    lags
}

/// When the watch saw a pod's deletion, and the deletion's grace.
fn deletion(states: &[Value]) -> Option<(jiff::Timestamp, i64)> {
    let deleting = states
        .iter()
        .find(|s| !s["metadata"]["deletionTimestamp"].is_null())?;
    let seen: jiff::Timestamp = deleting[SEEN_AT].as_str()?.parse().ok()?;
    let grace = deleting["metadata"]["deletionGracePeriodSeconds"].as_i64()?;
    Some((seen, grace))
}

/// What a failed-open CREATE during the upgrade needs to be explained, the
/// reasons first (a panic's message may be cut short): the API server's own
/// words for each call it failed open, when each CREATE began and ended,
/// when each of node-holder's pods was made, turned Ready and was deleted,
/// and kube-proxy's syncs of the rules that route the Service to them.
fn why_failed_open(
    cp: &ControlPlane,
    node: &RealNode,
    seen: &Mutex<BTreeMap<String, Vec<Value>>>,
    failed: &[&Value],
) -> String {
    let reasons = cp.apiserver_log_lines(|l| l.contains("failing open"));
    let creates: Vec<String> = failed
        .iter()
        .map(|e| {
            format!(
                "{} received {} completed {}",
                e["objectRef"]["name"], e["requestReceivedTimestamp"], e["stageTimestamp"]
            )
        })
        .collect();
    let pods: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(name, _)| name.starts_with(&format!("{RELEASE}-")))
        .filter_map(|(name, states)| {
            let last = states.last()?;
            let ready = last["status"]["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
                .map(|c| format!("{} since {}", c["status"], c["lastTransitionTime"]));
            let deleting = deletion(states).map(|(at, grace)| format!("{at} (grace {grace} s)"));
            Some(format!(
                "{name} ip {} created {} Ready {} deleted {} last seen {}",
                last["status"]["podIP"],
                last["metadata"]["creationTimestamp"],
                ready.unwrap_or_default(),
                deleting.unwrap_or_default(),
                last[SEEN_AT]
            ))
        })
        .collect();
    let proxy = std::fs::read_to_string(node.dir().join("kube-proxy.log")).unwrap_or_default();
    let syncs: Vec<&str> = proxy
        .lines()
        .filter(|l| l.contains("SyncProxyRules complete") || l.contains(NAMESPACE))
        .collect();
    let syncs = &syncs[syncs.len().saturating_sub(40)..];
    format!(
        "the API server's reasons: {reasons:#?}\nthe CREATEs failed open: {creates:#?}\n\
         node-holder's pods: {pods:#?}\nkube-proxy's last syncs: {syncs:#?}"
    )
}

/// Creates a pod that fills a node of Karpenter's every 2 s (ten at most)
/// until `stop`; their names.
async fn pods_pending_for_karpenter(
    admin: kube::Client,
    stop: tokio_util::sync::CancellationToken,
) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(admin, "default");
    let mut names = Vec::new();
    while !stop.is_cancelled() && names.len() < 10 {
        let name = format!("upgrade-wave-{}", names.len());
        pods.create(&PostParams::default(), &testenv::filler_pod(&name))
            .await
            .unwrap();
        names.push(name);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    names
}

/// Once every pod of `waves` runs: the nodes Karpenter launched for them
/// were held at their CREATE (the audit log), and at least one of them was
/// created while the upgrade rolled out (`during`).
async fn karpenters_nodes_held(
    cp: &ControlPlane,
    node: &RealNode,
    cert_manager: &mut CertManager,
    nodes: &Api<Node>,
    waves: &[String],
    during: (jiff::Timestamp, jiff::Timestamp),
) {
    let pods: Api<Pod> = Api::namespaced(nodes.clone().into_client(), "default");
    let launched = until(
        node,
        cert_manager,
        "Karpenter's nodes for the wave",
        || async {
            let mut on = std::collections::BTreeSet::new();
            for name in waves {
                let pod = pods.get(name).await.unwrap();
                on.insert(pod.spec.and_then(|s| s.node_name)?);
            }
            Some(on)
        },
    )
    .await;
    testsupport::window::created_held(cp, &launched);
    let mut created = Vec::new();
    for name in &launched {
        created.push(testsupport::window::created(
            &nodes.get(name).await.unwrap(),
        ));
    }
    assert!(
        created.iter().any(|&at| during.0 <= at && at <= during.1),
        "none of Karpenter's nodes {launched:?} was created during the upgrade \
         ({during:?}): {created:?}"
    );
}

/// `Some` when a Node `name` created as a server-side dry run comes back
/// held by the webhook.
async fn dry_run_held(nodes: &Api<Node>, name: &str) -> Option<()> {
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let probe = nodes
        .create(&dry_run, &testsupport::node(name))
        .await
        .unwrap();
    held(&probe).then_some(())
}

async fn until<T, F, Fut>(
    node: &RealNode,
    cert_manager: &mut CertManager,
    what: &str,
    check: F,
) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + LIMIT;
    loop {
        cert_manager.check_running();
        if let Some(found) = check().await {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "not within {LIMIT:?}: {what}\n{}",
            node.log_tails()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
