//! `node-holder hold`, run as an operator runs it (the admin's kubeconfig)
//! against the real API server: every node in scope held until the hold's
//! end, whatever the window does; who asked, why and until when in `status`,
//! an Event and the leader's log; kept across a change of leader; ended
//! early by `release`; with no leader, recorded for the next one to carry
//! out.

use testsupport as common;

use std::time::Duration;

use common::window::{eventually_logging, logged, marked, metric};
use common::{Served, operator, succeeded};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use testenv::{ADMIN_USER, ControlPlane, NODE_HOLDER_NAMESPACE};

const REASON: &str = "payments rollout";

/// `serve` with a 2 s window: nodes created now are held for it and
/// released after it, so that only a manual hold holds them later.
async fn serve_short_window(cp: &ControlPlane) -> Served {
    serve_short_window_with(cp, &[]).await
}

/// [`serve_short_window`] with `extra` flags.
async fn serve_short_window_with(cp: &ControlPlane, extra: &[&str]) -> Served {
    let mut flags = vec!["--hold-duration=2s", "--lease-duration=3s"];
    flags.extend_from_slice(extra);
    common::serve(cp, &flags).await
}

/// The nodes of `names` that carry `node-holder.dev/held-until`.
async fn stamped(nodes: &Api<Node>, names: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for name in names {
        let node = nodes.get(name).await.unwrap();
        if node
            .metadata
            .annotations
            .is_some_and(|a| a.contains_key("node-holder.dev/held-until"))
        {
            out.push(name.to_string());
        }
    }
    out
}

/// Creates `names` and waits until their window has come and gone: no node
/// carries node-holder's hold, the window is closed.
async fn nodes_past_their_window(cp: &ControlPlane, served: &Served, names: &[&str]) -> Api<Node> {
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());
    for name in names {
        nodes
            .create(&PostParams::default(), &common::node(name))
            .await
            .unwrap();
    }
    eventually_logging(
        "the nodes' window closes",
        Duration::from_secs(30),
        served,
        || async {
            let status = status_json(cp);
            status["open"] == false
                && status["closedThrough"].is_string()
                && marked(&nodes).await.is_empty()
        },
    )
    .await;
    nodes
}

fn status_json(cp: &ControlPlane) -> serde_json::Value {
    serde_json::from_str(&succeeded(&operator(cp, &["status", "-o", "json"]))).unwrap()
}

/// node-holder's Events on its window record.
async fn record_events(cp: &ControlPlane) -> Vec<Event> {
    let events: Api<Event> =
        Api::namespaced(cp.admin_client().await.unwrap(), NODE_HOLDER_NAMESPACE);
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding
                .as_ref()
                .is_some_and(|r| r.kind.as_deref() == Some("ConfigMap"))
        })
        .collect()
}

#[tokio::test]
async fn a_manual_hold_holds_every_node_survives_a_new_leader_and_release_ends_it() {
    let cp = ControlPlane::start().await.unwrap();
    let first = serve_short_window(&cp).await;
    let nodes = nodes_past_their_window(&cp, &first, &["old-1", "old-2"]).await;

    let out = succeeded(&operator(
        &cp,
        &["hold", "--for", "10m", "--reason", REASON],
    ));
    assert!(
        out.contains(&format!(
            "manual hold requested by {ADMIN_USER}: every node in scope held until "
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!("handled by serve-{}", first.webhook_port)),
        "{out}"
    );
    assert!(out.contains("2 node(s) carry node-holder's hold"), "{out}");
    assert_eq!(marked(&nodes).await, ["old-1", "old-2"]);

    // Who asked, why and until when: status, the Event, the leader's log.
    let status = status_json(&cp);
    assert_eq!(status["open"], true, "{status}");
    assert_eq!(status["manual"]["by"], ADMIN_USER, "{status}");
    assert_eq!(status["manual"]["reason"], REASON, "{status}");
    assert_eq!(status["deadline"], status["manual"]["until"], "{status}");
    let text = succeeded(&operator(&cp, &["status"]));
    assert!(
        text.lines().any(|l| l.starts_with("Manual hold: until ")
            && l.ends_with(&format!("by {ADMIN_USER}: {REASON}"))),
        "{text}"
    );
    let events = record_events(&cp).await;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("ManualHoldStarted")
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.contains(REASON) && n.contains(ADMIN_USER))),
        "{events:?}"
    );
    let lines = logged(&first, "manual hold");
    assert!(
        lines
            .iter()
            .any(|l| l["by"] == ADMIN_USER && l["reason"] == REASON && l["outcome"] == "Started"),
        "{lines:?}"
    );

    // The leader dies without handing over; the next one keeps the hold: its
    // first passes hold both nodes and release nothing.
    drop(first);
    let second = serve_short_window(&cp).await;
    eventually_logging(
        "the new leader counts the held nodes",
        Duration::from_secs(30),
        &second,
        || async { metric(&second, "node_holder_held_nodes").await == Some(2.0) },
    )
    .await;
    assert_eq!(marked(&nodes).await, ["old-1", "old-2"]);
    assert_eq!(status_json(&cp)["manual"]["reason"], REASON);
    assert!(
        logged(&second, "nodes patched")
            .iter()
            .all(|l| l["action"] != "release"),
        "{}",
        second.log()
    );

    // release ends it early.
    let out = succeeded(&operator(&cp, &["release"]));
    assert!(
        out.contains(&format!("released by serve-{}", second.webhook_port)),
        "{out}"
    );
    assert!(marked(&nodes).await.is_empty());
    let status = status_json(&cp);
    assert_eq!(status["open"], false, "{status}");
    assert!(status["manual"].is_null(), "{status}");
}

/// With no live leader, `hold` says so and fails, and holds nothing: the
/// request stays in the record. The next leader, started with other
/// settings, carries it out (every node held and stamped with the hold's
/// end, by the leader, not the command) and writes its own settings at its
/// first pass.
#[tokio::test]
async fn a_manual_hold_asked_with_no_leader_is_carried_out_by_the_next_leader() {
    let cp = ControlPlane::start().await.unwrap();
    let served = serve_short_window_with(&cp, &["--max-hold=3h"]).await;
    let nodes = nodes_past_their_window(&cp, &served, &["a", "b"]).await;
    let recorded = |status: &serde_json::Value| status["settings"]["maxHold"].clone();
    assert_eq!(recorded(&status_json(&cp)), "3h");
    // The leader dies without handing over its lease.
    drop(served);

    let out = operator(&cp, &["hold", "--for", "1h", "--reason", REASON]);
    let said = common::output_report(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains(
            "no live leader: the request is recorded, and the next leader carries it out"
        ),
        "{said}"
    );
    assert!(marked(&nodes).await.is_empty(), "the command held nothing");

    let served = serve_short_window(&cp).await;
    eventually_logging(
        "the recorded hold carried out by the new leader",
        Duration::from_secs(30),
        &served,
        || async { marked(&nodes).await == ["a", "b"] },
    )
    .await;
    eventually_logging(
        "the nodes stamped and the new leader's settings recorded",
        Duration::from_secs(30),
        &served,
        || async {
            stamped(&nodes, &["a", "b"]).await == ["a", "b"] && recorded(&status_json(&cp)) == "2h"
        },
    )
    .await;
    let status = status_json(&cp);
    assert_eq!(status["manual"]["by"], ADMIN_USER, "{status}");
    assert_eq!(status["manual"]["reason"], REASON, "{status}");

    // A second, shorter hold leaves the longer one in force and says so.
    let out = succeeded(&operator(
        &cp,
        &["hold", "--for", "5m", "--reason", "a short one"],
    ));
    assert!(
        out.contains(&format!("a manual hold asked for earlier lasts longer and stays: until {} by {ADMIN_USER} ({REASON})", status["manual"]["until"].as_str().unwrap())),
        "{out}"
    );
    assert_eq!(status_json(&cp)["manual"]["reason"], REASON);
}
