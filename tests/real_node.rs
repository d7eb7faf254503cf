//! One real node in the test cluster (issue 39): a kubelet built from the
//! control plane's own Kubernetes release, with Debian's containerd, runc and
//! CNI plugins (`testenv::RealNode`), joins the test control plane and turns
//! Ready. node-holder's runtime image, built as `cargo xtask image` builds it
//! (static release binary, OCI layout) and pushed to a local registry, runs
//! there as a Pod: containerd pulls it over HTTP, the runtime starts it as the
//! non-root user with a read-only root filesystem, no capabilities, no new
//! privileges and the RuntimeDefault seccomp profile (read from the
//! container's process in /proc, no exec), and the kubelet's readiness probe
//! on node-holder's `/readyz` turns it Ready over the pod network. A pod that
//! asks for root with `runAsNonRoot` is refused by the kubelet with
//! `CreateContainerConfigError`.
//!
//! With Services (`RealNode::join_with_services`: kube-proxy and
//! kube-controller-manager's EndpointSlice controller), the API server calls node-holder's webhook
//! through the chart's Service: the rendered MutatingWebhookConfiguration
//! names the Service, the API server dials its ClusterIP, kube-proxy's rules
//! in the host's nat OUTPUT chain send the connection to the pod, and a Node
//! CREATE comes back held. No EndpointSlice or route is made by hand.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};
use testenv::{ControlPlane, LocalRegistry, REAL_NODE_LABEL, REAL_NODE_TAINT, RealNode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use testsupport::install;
use testsupport::window::{failed_open, held};

const NAMESPACE: &str = testenv::NODE_HOLDER_NAMESPACE;
/// node-holder's admin port (/healthz, /readyz, /metrics), as the chart sets it.
const ADMIN_PORT: u16 = 8080;
/// The user the image runs as (xtask::image::USER).
const USER: u64 = 65532;
const POD_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a Service may take to route: the EndpointSlice controller and
/// kube-proxy on a loaded 2-core machine.
const SERVICE_TIMEOUT: Duration = Duration::from_secs(180);

/// A real node joined to `cp` and node-holder's image, built as `cargo
/// xtask image` builds it while the node joins, pushed to a local registry
/// the node trusts.
struct NodeWithImage {
    node: RealNode,
    /// The image's reference in the registry.
    image: String,
    /// The pushed manifest's digest.
    manifest_digest: String,
    _registry: LocalRegistry,
    _layout_dir: tempfile::TempDir,
}

async fn node_with_image(cp: &ControlPlane, services: bool, started: Instant) -> NodeWithImage {
    let registry = LocalRegistry::start().unwrap();
    let layout_dir = tempfile::tempdir().unwrap();
    let layout_path = layout_dir.path().join("layout");
    let tag = format!("real-node-{}-{services}", std::process::id());
    let build = {
        let (layout_path, tag) = (layout_path.clone(), tag.clone());
        tokio::task::spawn_blocking(move || {
            let binary = xtask::image::build_static().unwrap();
            xtask::image::build_image(&binary, &layout_path, &tag).unwrap()
        })
    };
    let join = async {
        if services {
            RealNode::join_with_services(cp).await
        } else {
            RealNode::join(cp).await
        }
    };
    let (node, layout) = tokio::join!(join, build);
    let node = node.unwrap();
    let layout = layout.unwrap();
    eprintln!(
        "real_node: node Ready and image built at {:.0?}",
        started.elapsed()
    );
    let image = format!("{}/node-holder:{tag}", registry.host());
    let pushed = registry
        .crane(&["push", layout_path.to_str().unwrap(), &image])
        .unwrap();
    assert!(pushed.ends_with(&layout.manifest_digest), "{pushed}");
    node.trust_registry(registry.host()).unwrap();
    NodeWithImage {
        node,
        image,
        manifest_digest: layout.manifest_digest,
        _registry: registry,
        _layout_dir: layout_dir,
    }
}

#[tokio::test]
async fn a_real_node_runs_node_holders_image_from_the_registry_as_the_chart_secures_it() {
    let started = Instant::now();
    let cp = ControlPlane::start().await.unwrap();
    let setup = node_with_image(&cp, false, started).await;
    let (node, image, manifest_digest) = (&setup.node, &setup.image, &setup.manifest_digest);

    let client = cp.admin_client().await.unwrap();
    the_node_is_real(&client, node).await;

    // node-holder as the chart runs it: its identity (RBAC), a serving
    // certificate in a Secret, and a kubeconfig that reaches the API server
    // from the pod network (no ServiceAccount tokens without a
    // controller-manager).
    let serving =
        rcgen::generate_simple_self_signed(vec!["node-holder.node-holder.svc".to_string()])
            .unwrap();
    install_identity_and_secrets(
        &cp,
        node,
        &serving.cert.pem(),
        &serving.signing_key.serialize_pem(),
    )
    .await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    pods.create(
        &PostParams::default(),
        &node_holder_pod("node-holder", image, node.name(), json!({}), &json!({})),
    )
    .await
    .unwrap();
    // Root, asked for where the pod says runAsNonRoot: the kubelet refuses.
    pods.create(
        &PostParams::default(),
        &node_holder_pod(
            "as-root",
            image,
            node.name(),
            json!({"runAsUser": 0}),
            &json!({}),
        ),
    )
    .await
    .unwrap();

    let pod = wait_for_pod(&pods, "node-holder", node, |pod| {
        condition(pod, "Ready") && container(pod)["ready"] == true
    })
    .await;
    eprintln!("real_node: node-holder Ready at {:.0?}", started.elapsed());
    let status = container(&pod);
    assert!(status["state"]["running"].is_object(), "{status}");
    assert_eq!(status["restartCount"], 0, "{status}");
    // Pulled from the registry: the image the kubelet ran is the pushed
    // manifest.
    let image_id = status["imageID"].as_str().unwrap();
    assert!(
        image_id.ends_with(&format!("@{manifest_digest}")),
        "{image_id} is not {manifest_digest}"
    );

    // On the pod network, and node-holder answers there as the probe saw it.
    let pod_ip: Ipv4Addr = pod["status"]["podIP"].as_str().unwrap().parse().unwrap();
    let subnet = node.pod_subnet();
    let prefix = subnet.trim_end_matches("0/24");
    assert!(
        pod_ip.to_string().starts_with(prefix),
        "{pod_ip} not in {subnet}"
    );
    let (code, body) = http_get(pod_ip, ADMIN_PORT, "/readyz").await;
    assert_eq!((code, body.trim()), (200, "ok"));

    the_runtime_enforces_the_security_context(node, status["containerID"].as_str().unwrap());

    // The API server reaches the kubelet (its client certificate, the
    // node's InternalIP): the container's log, as `kubectl logs` reads it.
    let log = pods
        .logs("node-holder", &kube::api::LogParams::default())
        .await
        .unwrap();
    eprintln!("real_node: node-holder's log:\n{log}");

    let refused = wait_for_pod(&pods, "as-root", node, |pod| {
        container(pod)["state"]["waiting"]["reason"] == "CreateContainerConfigError"
    })
    .await;
    let waiting = &container(&refused)["state"]["waiting"];
    let message = waiting["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("runAsUser breaks non-root policy"),
        "{waiting}"
    );
    assert!(container(&refused)["containerID"].is_null(), "{refused}");

    eprintln!("real_node: done in {:.0?}", started.elapsed());
}

#[tokio::test]
async fn the_api_server_calls_node_holders_webhook_on_the_real_node_through_the_charts_service() {
    let started = Instant::now();
    // The API server dials a webhook's Service at its ClusterIP, as in a
    // cluster; kube-proxy on the real node routes it.
    let cp = ControlPlane::start_with_args(&[testenv::CLUSTER_IP_ROUTING.into()])
        .await
        .unwrap();
    let setup = node_with_image(&cp, true, started).await;
    let node = &setup.node;
    let client = cp.admin_client().await.unwrap();

    // A serving certificate for the Service's names from a throw-away CA,
    // and the chart rendered with it (`tls.mode=provided`).
    let certs = tempfile::tempdir().unwrap();
    testsupport::make_certs_for(certs.path(), &install::SERVICE_DNS_NAMES);
    let read = |file: &str| std::fs::read_to_string(certs.path().join(file)).unwrap();
    install_identity_and_secrets(&cp, node, &read("tls.crt"), &read("tls.key")).await;
    let ca_bundle = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(read("ca.crt"))
    };
    let values = [
        "--set=tls.mode=provided".to_string(),
        "--set=tls.provided.secretName=node-holder-tls".to_string(),
        format!("--set=tls.provided.caBundle={ca_bundle}"),
    ];
    let objects = tokio::task::spawn_blocking(move || {
        install::template(&values.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap();
    let service = install::one(&objects, "Service").clone();
    let webhook = install::one(&objects, "MutatingWebhookConfiguration").clone();
    assert_eq!(
        webhook["webhooks"][0]["clientConfig"]["service"],
        json!({"name": "node-holder", "namespace": NAMESPACE, "path": "/mutate", "port": 443}),
        "{webhook:#}"
    );
    testenv::apply_objects(&client, std::slice::from_ref(&service))
        .await
        .unwrap();

    // node-holder's pod, labelled as the chart's Deployment labels it (what
    // the Service selects).
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    pods.create(
        &PostParams::default(),
        &node_holder_pod(
            "node-holder",
            &setup.image,
            node.name(),
            json!({}),
            &service["spec"]["selector"],
        ),
    )
    .await
    .unwrap();
    let pod = wait_for_pod(&pods, "node-holder", node, |pod| {
        condition(pod, "Ready") && container(pod)["ready"] == true
    })
    .await;
    let pod_ip = pod["status"]["podIP"].as_str().unwrap().to_string();
    eprintln!("real_node: node-holder Ready at {:.0?}", started.elapsed());

    // The EndpointSlice controller, not the test, lists the ready pod.
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NAMESPACE);
    let deadline = Instant::now() + SERVICE_TIMEOUT;
    let slice = loop {
        let listed = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=node-holder"))
            .await
            .unwrap();
        let ready = listed.items.into_iter().find(|slice| {
            slice.endpoints.iter().flatten().any(|e| {
                e.addresses == [pod_ip.clone()]
                    && e.conditions.as_ref().and_then(|c| c.ready) == Some(true)
            })
        });
        if let Some(slice) = ready {
            break slice;
        }
        assert!(
            Instant::now() < deadline,
            "no ready endpoint {pod_ip} for Service node-holder within {SERVICE_TIMEOUT:?}\n{}",
            node.log_tails()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let labels = slice.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels
            .get("endpointslice.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("endpointslice-controller.k8s.io"),
        "{labels:?}"
    );

    // From the host to the ClusterIP: the admin port behind the Service's
    // `metrics` port, through kube-proxy's DNAT.
    let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    let cluster_ip: Ipv4Addr = services
        .get("node-holder")
        .await
        .unwrap()
        .spec
        .unwrap()
        .cluster_ip
        .unwrap()
        .parse()
        .unwrap();
    // From the control plane's Service range (10.0.0.0/24), not a pod address.
    assert_eq!(cluster_ip.octets()[..3], [10, 0, 0], "{cluster_ip}");
    let deadline = Instant::now() + SERVICE_TIMEOUT;
    loop {
        match try_http_get(cluster_ip, ADMIN_PORT, "/readyz").await {
            Ok((200, body)) if body.trim() == "ok" => break,
            other => assert!(
                Instant::now() < deadline,
                "GET http://{cluster_ip}:{ADMIN_PORT}/readyz: {other:?} after {SERVICE_TIMEOUT:?}\n{}",
                node.log_tails()
            ),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!(
        "real_node: the ClusterIP {cluster_ip} answers at {:.0?}",
        started.elapsed()
    );

    // The webhook, registered as the chart renders it: the API server calls
    // it through the Service's ClusterIP and verifies the certificate for
    // node-holder.node-holder.svc. failurePolicy is Ignore, so wait until a
    // dry-run create comes back held.
    testenv::apply_objects(&client, &[webhook]).await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + SERVICE_TIMEOUT;
    loop {
        let probe = nodes
            .create(
                &PostParams {
                    dry_run: true,
                    ..PostParams::default()
                },
                &testsupport::node("probe"),
            )
            .await
            .unwrap();
        if held(&probe) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the webhook did not hold a dry-run Node within {SERVICE_TIMEOUT:?}\n{}",
            node.log_tails()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let created = nodes
        .create(&PostParams::default(), &testsupport::node("via-cluster-ip"))
        .await
        .unwrap();
    assert!(held(&created), "the create came back held: {created:?}");
    let event = cp
        .wait_for_node_create_event("via-cluster-ip")
        .await
        .unwrap();
    assert!(!failed_open(&event), "{event}");
    let mutation: Value = serde_json::from_str(
        event["annotations"]["mutation.webhook.admission.k8s.io/round_0_index_0"]
            .as_str()
            .unwrap_or_else(|| panic!("no mutation annotation in {event}")),
    )
    .unwrap();
    assert_eq!(mutation["mutated"], true, "{event}");

    // The API server dialled the ClusterIP, and kube-proxy's DNAT sent the
    // connection to the pod's webhook port: the kernel's connection tracking
    // holds it (original direction to the ClusterIP's port 443, the reply
    // from the pod's 8443), not a connection straight to the pod.
    let conntrack = std::fs::read_to_string("/proc/net/nf_conntrack").unwrap();
    let (cluster_ip, pod_ip) = (cluster_ip.to_string(), pod_ip.as_str());
    assert!(
        conntrack
            .lines()
            .map(testenv::tracked_connection)
            .any(|(original, reply)| {
                original == [cluster_ip.as_str(), "443"] && reply == [pod_ip, "8443"]
            }),
        "no tracked connection to {cluster_ip}:443 answered by {pod_ip}:8443:\n{conntrack}"
    );

    // ...answered by the pod on the real node.
    let log = pods
        .logs("node-holder", &kube::api::LogParams::default())
        .await
        .unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("node_holder::audit") && l.contains("via-cluster-ip")),
        "{log}"
    );
    eprintln!("real_node: done in {:.0?}", started.elapsed());
}

/// node-holder's identity (RBAC, as `webhook-config/rbac.yaml`) and the
/// Secrets its pod mounts: the serving certificate `cert`/`key`, and a
/// kubeconfig that reaches the API server from the pod network (no
/// ServiceAccount tokens without the ServiceAccount admission plugin).
async fn install_identity_and_secrets(cp: &ControlPlane, node: &RealNode, cert: &str, key: &str) {
    cp.install_node_holder_rbac().await.unwrap();
    let client = cp.admin_client().await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(client, NAMESPACE);
    let kubeconfig = node.pod_kubeconfig(cp.node_holder_kubeconfig()).unwrap();
    for (name, data) in [
        ("node-holder-tls", json!({"tls.crt": cert, "tls.key": key})),
        ("node-holder-kubeconfig", json!({"kubeconfig": kubeconfig})),
    ] {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": name},
            "stringData": data,
        }))
        .unwrap();
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }
}

/// The Node is the kubelet's: the label and taint it registered with, its
/// containerd and the control plane's Kubernetes release, its bridge address.
async fn the_node_is_real(client: &kube::Client, node: &RealNode) {
    let nodes: Api<Node> = Api::all(client.clone());
    let object = serde_json::to_value(nodes.get(node.name()).await.unwrap()).unwrap();
    assert_eq!(object["metadata"]["labels"][REAL_NODE_LABEL], "true");
    let taints = object["spec"]["taints"].as_array().unwrap();
    assert!(
        taints
            .iter()
            .any(|t| t["key"] == REAL_NODE_TAINT && t["effect"] == "NoSchedule"),
        "{taints:?}"
    );
    let info = &object["status"]["nodeInfo"];
    assert_eq!(
        info["containerRuntimeVersion"], "containerd://1.6.20",
        "{info}"
    );
    let pinned = testenv::kubernetes_version(&testenv::module_dir()).unwrap();
    assert_eq!(info["kubeletVersion"], pinned.as_str(), "{info}");
    let addresses = object["status"]["addresses"].as_array().unwrap();
    assert!(
        addresses.iter().any(|a| a["type"] == "InternalIP"
            && a["address"] == node.internal_ip().to_string().as_str()),
        "{addresses:?}"
    );
}

/// What the runtime really started, read from the container's init process
/// in /proc: user and group 65532, no effective capabilities, no new
/// privileges, a seccomp filter, and `/` mounted read-only.
fn the_runtime_enforces_the_security_context(node: &RealNode, container_id: &str) {
    let pid = node.container_pid(container_id).unwrap();
    let proc = Path::new("/proc").join(pid.to_string());
    let status = std::fs::read_to_string(proc.join("status")).unwrap();
    let field = |name: &str| -> Vec<String> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .unwrap_or_else(|| panic!("no {name} in {status}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    assert_eq!(field("Uid"), vec![USER.to_string(); 4], "{status}");
    assert_eq!(field("Gid"), vec![USER.to_string(); 4], "{status}");
    assert_eq!(field("CapEff"), vec!["0000000000000000"], "{status}");
    assert_eq!(field("CapPrm"), vec!["0000000000000000"], "{status}");
    assert_eq!(field("NoNewPrivs"), vec!["1"], "{status}");
    // 2: a seccomp filter (SECCOMP_MODE_FILTER).
    assert_eq!(field("Seccomp"), vec!["2"], "{status}");
    let mounts = std::fs::read_to_string(proc.join("mountinfo")).unwrap();
    let root = mounts
        .lines()
        .find(|l| l.split(' ').nth(4) == Some("/"))
        .unwrap_or_else(|| panic!("no / in {mounts}"));
    let options = root.split(' ').nth(5).unwrap();
    assert!(
        options.split(',').any(|o| o == "ro"),
        "the root filesystem is not read-only: {root}"
    );
}

/// node-holder's Pod as the chart's Deployment makes it (its pod and
/// container securityContext, ports, probes, TLS volume), bound to `node`
/// and tolerating its taint, with `container_security` merged into the
/// container's securityContext and `labels` into its labels.
fn node_holder_pod(
    name: &str,
    image: &str,
    node: &str,
    container_security: Value,
    labels: &Value,
) -> Pod {
    let mut security = json!({
        "runAsNonRoot": true,
        "runAsUser": USER,
        "runAsGroup": USER,
        "readOnlyRootFilesystem": true,
        "allowPrivilegeEscalation": false,
        "privileged": false,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    });
    for (key, value) in container_security.as_object().unwrap() {
        security[key] = value.clone();
    }
    let mut pod_labels = json!({"app.kubernetes.io/name": "node-holder"});
    for (key, value) in labels.as_object().unwrap() {
        pod_labels[key] = value.clone();
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": pod_labels},
        "spec": {
            "nodeName": node,
            "tolerations": [{"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "securityContext": {
                "runAsNonRoot": true,
                "runAsUser": USER,
                "runAsGroup": USER,
                "fsGroup": USER,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "node-holder",
                "image": image,
                "imagePullPolicy": "Always",
                "args": ["serve"],
                "ports": [
                    {"name": "webhook", "containerPort": 8443, "protocol": "TCP"},
                    {"name": "admin", "containerPort": ADMIN_PORT, "protocol": "TCP"},
                ],
                "env": [
                    {"name": "KUBECONFIG", "value": "/etc/node-holder/kubeconfig/kubeconfig"},
                    {"name": "NODE_HOLDER_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                ],
                "livenessProbe": {
                    "httpGet": {"path": "/healthz", "port": "admin"},
                    "periodSeconds": 10, "timeoutSeconds": 2, "failureThreshold": 3,
                },
                "readinessProbe": {
                    "httpGet": {"path": "/readyz", "port": "admin"},
                    "periodSeconds": 2, "timeoutSeconds": 2, "failureThreshold": 1,
                },
                "securityContext": security,
                "volumeMounts": [
                    {"name": "tls", "mountPath": "/etc/node-holder/tls", "readOnly": true},
                    {"name": "kubeconfig", "mountPath": "/etc/node-holder/kubeconfig", "readOnly": true},
                ],
            }],
            "volumes": [
                {"name": "tls", "secret": {"secretName": "node-holder-tls", "defaultMode": 288}},
                {"name": "kubeconfig", "secret": {"secretName": "node-holder-kubeconfig", "defaultMode": 288}},
            ],
        },
    }))
    .unwrap()
}

/// Waits (up to [`POD_TIMEOUT`]) until pod `name`, as JSON, satisfies `done`;
/// fails with the pod and the node's logs.
async fn wait_for_pod(
    pods: &Api<Pod>,
    name: &str,
    node: &RealNode,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + POD_TIMEOUT;
    loop {
        let pod = serde_json::to_value(pods.get(name).await.unwrap()).unwrap();
        if done(&pod) {
            return pod;
        }
        assert!(
            Instant::now() < deadline,
            "pod {name} not as expected within {POD_TIMEOUT:?}: {:#}\n{}",
            pod["status"],
            node.log_tails()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn condition(pod: &Value, kind: &str) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == kind && c["status"] == "True")
    })
}

/// The pod's one container's status (null before the kubelet reports it).
fn container(pod: &Value) -> &Value {
    &pod["status"]["containerStatuses"][0]
}

/// A plain HTTP/1.0 GET: (status, body).
async fn http_get(ip: Ipv4Addr, port: u16, path: &str) -> (u16, String) {
    try_http_get(ip, port, path).await.unwrap()
}

/// A plain HTTP/1.0 GET with a 10 s limit: (status, body), or the error.
async fn try_http_get(ip: Ipv4Addr, port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let get = async {
        let mut stream = tokio::net::TcpStream::connect((ip, port)).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {ip}\r\n\r\n").as_bytes())
            .await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(10), get)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in 10 s"))??;
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}
