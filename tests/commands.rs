//! `node-holder status` and `node-holder release`, run as an operator runs
//! them (the admin's kubeconfig) against the real API server.

mod common;

use std::process::{Command, Output};
use std::time::Duration;

use common::{Served, node, register_webhook, serve};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, PostParams};
use testenv::ControlPlane;

fn node_holder(cp: &ControlPlane, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_node-holder"))
        .args(args)
        .env("KUBECONFIG", cp.admin_kubeconfig())
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

async fn marked(nodes: &Api<Node>) -> Vec<String> {
    nodes
        .list_metadata(&ListParams::default().labels("node-holder.dev/held=true"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect()
}

/// Starts serve with a long window, creates `names` through the webhook and
/// waits until the window task has counted them.
async fn held_cluster(cp: &ControlPlane, names: &[&str]) -> Served {
    let served = serve(
        cp,
        &[
            "--hold-duration=1h",
            "--coalesce-idle=200ms",
            "--coalesce-max=1s",
            "--lease-duration=3s",
        ],
    )
    .await;
    register_webhook(cp, &served).await;
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());
    for name in names {
        nodes
            .create(&PostParams::default(), &node(name))
            .await
            .unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let json: serde_json::Value =
            serde_json::from_str(&stdout(&node_holder(cp, &["status", "-o", "json"]))).unwrap();
        if json["open"] == true && json["heldNodes"].as_array().unwrap().len() == names.len() {
            return served;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "window never opened: {json}\n{}",
            served.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn status_shows_the_open_window_its_leader_and_the_held_nodes() {
    let cp = ControlPlane::start().await.unwrap();
    let served = held_cluster(&cp, &["ip-10-0-1-7", "ip-10-0-2-9"]).await;
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());
    let last = nodes.get("ip-10-0-2-9").await.unwrap();
    let created = last.metadata.creation_timestamp.unwrap().0;

    let json: serde_json::Value =
        serde_json::from_str(&stdout(&node_holder(&cp, &["status", "-o", "json"]))).unwrap();
    let identity = format!("serve-{}", served.webhook_port);
    assert_eq!(json["leader"]["identity"], identity.as_str());
    assert_eq!(json["leader"]["expired"], false);
    let deadline: Timestamp = json["deadline"].as_str().unwrap().parse().unwrap();
    assert_eq!(deadline, created + Duration::from_secs(3600));
    assert_eq!(json["settings"]["scope"], "cluster");
    assert_eq!(json["settings"]["holdDuration"], "1h");
    assert_eq!(json["settings"]["maxHold"], "2h");
    let held: Vec<&str> = json["heldNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(held, ["ip-10-0-1-7", "ip-10-0-2-9"]);
    assert_eq!(
        json["heldNodes"][0]["holds"],
        serde_json::json!(["karpenter.sh/do-not-disrupt"])
    );

    let text = stdout(&node_holder(&cp, &["status"]));
    assert!(
        text.starts_with(
            "Window:      open (cluster scope, all nodes, hold 1h, max 2h)\nOpened:      "
        ),
        "{text}"
    );
    assert!(
        text.contains(&format!("Deadline:    {deadline} (in 59m")),
        "{text}"
    );
    assert!(
        text.contains(&format!("Leader:      {identity} (renewed ")),
        "{text}"
    );
    assert!(text.contains("Held nodes:  2\n\nNODE "), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("ip-10-0-1-7 ") && l.ends_with(" karpenter.sh/do-not-disrupt")),
        "{text}"
    );
}

#[tokio::test]
async fn release_asks_the_running_leader_which_closes_the_window_and_strips_the_holds() {
    let cp = ControlPlane::start().await.unwrap();
    let served = held_cluster(&cp, &["a", "b"]).await;
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());
    assert_eq!(marked(&nodes).await.len(), 2);

    let out = stdout(&node_holder(&cp, &["release"]));
    assert!(
        out.contains("window open, 2 node(s) carry node-holder's hold"),
        "{out}"
    );
    assert!(
        out.contains(&format!("released by serve-{}", served.webhook_port)),
        "{out}"
    );
    assert!(marked(&nodes).await.is_empty());
    let a = nodes.get("a").await.unwrap().metadata;
    assert!(a.annotations.unwrap_or_default().is_empty(), "hold gone");
    assert!(
        served.log().contains("hold window released on request"),
        "{}",
        served.log()
    );
    let text = stdout(&node_holder(&cp, &["status"]));
    assert!(text.starts_with("Window:      closed"), "{text}");
    assert!(text.contains("Held nodes:  0"), "{text}");

    // A node created after the release opens a new window as usual (creation
    // times have whole seconds: one in the release's second counts as before).
    tokio::time::sleep(Duration::from_secs(1)).await;
    nodes
        .create(&PostParams::default(), &node("after"))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while marked(&nodes).await.len() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "no new window: {}",
            served.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn release_with_no_leader_running_strips_the_holds_itself() {
    let cp = ControlPlane::start().await.unwrap();
    let mut served = held_cluster(&cp, &["x", "y"]).await;
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());
    // The leader dies without handing over its lease.
    served.child.kill().unwrap();
    served.child.wait().unwrap();

    let started = std::time::Instant::now();
    let out = stdout(&node_holder(&cp, &["release"]));
    assert!(out.contains("no live leader: releasing here"), "{out}");
    assert!(out.contains("released 2 node(s)\n  x\n  y\n"), "{out}");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(marked(&nodes).await.is_empty());
    let text = stdout(&node_holder(&cp, &["status"]));
    assert!(text.starts_with("Window:      closed"), "{text}");
}
