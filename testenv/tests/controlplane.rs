//! The test control plane is a real Kubernetes API server: it stores Nodes,
//! enforces RBAC and writes an audit log.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use testenv::{ADMIN_USER, ControlPlane};

fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some([("test".to_string(), "controlplane".to_string())].into()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

#[tokio::test]
async fn admin_creates_a_node_and_reads_it_back() {
    let cp = ControlPlane::start().await.expect("control plane starts");
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());

    let created = nodes
        .create(&PostParams::default(), &node("worker-1"))
        .await
        .unwrap();
    assert!(
        created.metadata.uid.is_some(),
        "the API server assigns a uid"
    );

    let read = nodes.get("worker-1").await.unwrap();
    assert_eq!(read.metadata.uid, created.metadata.uid);
    assert_eq!(
        read.metadata
            .labels
            .unwrap()
            .get("test")
            .map(String::as_str),
        Some("controlplane")
    );
}

#[tokio::test]
async fn rbac_forbids_node_holder_what_the_admin_may_do() {
    let cp = ControlPlane::start().await.expect("control plane starts");
    let admin: Api<Node> = Api::all(cp.admin_client().await.unwrap());
    let restricted: Api<Node> = Api::all(cp.node_holder_client().await.unwrap());

    admin
        .list(&ListParams::default())
        .await
        .expect("the admin lists nodes");
    let err = restricted
        .list(&ListParams::default())
        .await
        .expect_err("node-holder's identity has no binding yet");
    match err {
        kube::Error::Api(status) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("expected 403 Forbidden, got {other:?}"),
    }
    let err = restricted
        .create(&PostParams::default(), &node("sneaky"))
        .await
        .expect_err("node-holder's identity may not create nodes");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 403),
        "{err:?}"
    );
}

#[tokio::test]
async fn audit_log_records_the_node_create() {
    let cp = ControlPlane::start().await.expect("control plane starts");
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());
    nodes
        .create(&PostParams::default(), &node("audited"))
        .await
        .unwrap();

    let event = cp.wait_for_node_create_event("audited").await.unwrap();
    assert_eq!(event["user"]["username"], ADMIN_USER);
    assert_eq!(event["responseStatus"]["code"], 201);
    // The policy records Node CREATEs at Request level: the body is there.
    assert_eq!(event["level"], "Request");
    assert_eq!(
        event["requestObject"]["metadata"]["labels"]["test"],
        "controlplane"
    );
}

#[tokio::test]
async fn api_server_reports_the_pinned_release() {
    let cp = ControlPlane::start().await.expect("control plane starts");
    let info = cp
        .admin_client()
        .await
        .unwrap()
        .apiserver_version()
        .await
        .unwrap();
    let pinned = testenv::kubernetes_version(&testenv::module_dir()).unwrap();
    assert_eq!(info.git_version, pinned);
}
