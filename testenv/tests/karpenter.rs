//! The Karpenter cluster works as a cluster: a pod nobody can place makes the
//! real Karpenter launch a node through the API, kwok turns it Ready, the
//! scheduler binds the pod there and kwok runs it.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use testenv::{Disruption, KarpenterCluster, NODE_POOL};

#[tokio::test]
async fn a_pending_pod_gets_a_node_from_karpenter_and_runs_there() {
    let starting = Instant::now();
    let mut cluster = KarpenterCluster::start(&Disruption::default())
        .await
        .expect("the cluster starts");
    eprintln!("the cluster started in {:.1?}", starting.elapsed());
    let client = cluster.control_plane().admin_client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let nodes: Api<Node> = Api::all(client.clone());
    pods.create(&PostParams::default(), &testenv::filler_pod("first"))
        .await
        .unwrap();

    let deadline = Instant::now() + Duration::from_secs(120);
    let node_name = loop {
        cluster.check_running().unwrap();
        let pod = pods.get("first").await.unwrap();
        let status = pod.status.unwrap_or_default();
        if status.phase.as_deref() == Some("Running") {
            break pod.spec.unwrap().node_name.expect("a running pod is bound");
        }
        assert!(Instant::now() < deadline, "the pod never ran: {status:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // The node is Karpenter's: its NodePool's label, a NodeClaim that names
    // it, and the KWOK provider's instance.
    let node = nodes.get(&node_name).await.unwrap();
    let labels = node.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels.get("karpenter.sh/nodepool").map(String::as_str),
        Some(NODE_POOL)
    );
    assert_eq!(
        labels
            .get("node.kubernetes.io/instance-type")
            .map(String::as_str),
        Some(testenv::INSTANCE_TYPE)
    );
    let claims = testenv::node_claims(&client);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = claims.list(&ListParams::default()).await.unwrap().items;
        assert_eq!(listed.len(), 1, "one NodeClaim: {listed:?}");
        if listed[0].data["status"]["nodeName"].as_str() == Some(node_name.as_str()) {
            break;
        }
        assert!(Instant::now() < deadline, "{:?}", listed[0].data["status"]);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Karpenter's own identity created it (the audit log tells who).
    let create = cluster
        .control_plane()
        .wait_for_node_create_event(&node_name)
        .await
        .unwrap();
    assert_eq!(create["user"]["username"], testenv::AUTOSCALER_USER);
}
