//! `--window-per-label`: one hold window per value of a node label, against
//! the real API server. A new node opens and extends only its own group's
//! window, which holds only its group's nodes; the record keeps every
//! group's window across a change of leader; `status` lists the groups;
//! `release --group` closes one group's window and leaves the others.

use testsupport as common;

use std::time::Duration;

use common::window::{
    Cluster, create, eventually_logging, fast, logged, marked, metric, sigkill, sleep_until, strs,
};
use common::{Served, operator, succeeded};
use testenv::ControlPlane;

const LABEL: &str = "pool";

fn status_json(cp: &ControlPlane) -> serde_json::Value {
    serde_json::from_str(&succeeded(&operator(cp, &["status", "-o", "json"]))).unwrap()
}

/// The group's entry in `status -o json`.
fn group(status: &serde_json::Value, name: &str) -> serde_json::Value {
    status["groups"]
        .as_array()
        .and_then(|groups| groups.iter().find(|g| g["group"] == name))
        .cloned()
        .unwrap_or(serde_json::Value::Null)
}

async fn serve_grouped(c: &Cluster) -> Served {
    let label = format!("--window-per-label={LABEL}");
    common::serve(&c.cp, &strs(&fast("40s", &[&label]))).await
}

/// Waits until exactly `names` carry node-holder's hold (sorted).
async fn held_exactly(c: &Cluster, served: &Served, what: &str, names: &[&str]) {
    eventually_logging(what, Duration::from_secs(30), served, || async {
        marked(&c.nodes).await == names
    })
    .await;
}

#[tokio::test]
async fn each_label_value_has_its_own_window_kept_across_a_new_leader_and_released_alone() {
    let c = Cluster::start().await;
    for (name, pool) in [
        ("gpu-old", "gpu"),
        ("general-1", "general"),
        ("general-2", "general"),
    ] {
        create(&c.nodes, name, &[(LABEL, pool)], &[]).await;
    }
    create(&c.nodes, "plain", &[], &[]).await;
    let mut first = serve_grouped(&c).await;
    // Every node is new: each group's window opens and holds its nodes.
    let everything = ["general-1", "general-2", "gpu-old", "plain"];
    held_exactly(
        &c,
        &first,
        "each group's window holds its nodes",
        &everything,
    )
    .await;
    let status = status_json(&c.cp);
    assert_eq!(status["settings"]["windowPerLabel"], LABEL, "{status}");
    assert_eq!(status["open"], true, "the unlabelled group: {status}");
    assert_eq!(group(&status, "general")["open"], true, "{status}");
    assert_eq!(group(&status, "gpu")["heldNodes"], 1, "{status}");

    // `release` closes every group's window. It consumes the nodes created
    // up to its request, and creation times have whole seconds: the next
    // node is created in a later second.
    succeeded(&operator(&c.cp, &["release"]));
    held_exactly(&c, &first, "release lets every node go", &[]).await;
    let released: jiff::Timestamp = status_json(&c.cp)["releaseRequestedAt"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    sleep_until(released + Duration::from_secs(1)).await;

    // A GPU scale-up: only the GPU group's window opens, and it holds the
    // GPU nodes only, the old one included.
    create(&c.nodes, "gpu-new", &[(LABEL, "gpu")], &[]).await;
    held_exactly(
        &c,
        &first,
        "the GPU window holds the GPU nodes",
        &["gpu-new", "gpu-old"],
    )
    .await;
    let status = status_json(&c.cp);
    assert_eq!(group(&status, "gpu")["open"], true, "{status}");
    assert_eq!(group(&status, "gpu")["heldNodes"], 2, "{status}");
    assert_eq!(group(&status, "general")["open"], false, "{status}");
    assert_eq!(status["open"], false, "the unlabelled group: {status}");
    let text = succeeded(&operator(&c.cp, &["status"]));
    assert!(text.contains(&format!("one window per {LABEL}")), "{text}");
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()[..3] == ["gpu", "2", "open"]),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["general", "0", "closed"]),
        "{text}"
    );
    let opened = logged(&first, "hold window opened");
    assert!(
        opened
            .iter()
            .any(|l| l["node"] == "gpu-new" && l["group"] == "gpu"),
        "{opened:?}"
    );
    eventually_logging(
        "the GPU group's metric",
        Duration::from_secs(10),
        &first,
        || async {
            metric(
                &first,
                r#"node_holder_window_group_held_nodes{group="gpu"}"#,
            )
            .await
                == Some(2.0)
                && metric(
                    &first,
                    r#"node_holder_window_group_held_nodes{group="general"}"#,
                )
                .await
                    == Some(0.0)
        },
    )
    .await;

    // The leader dies; the next one takes the groups up from the record: it
    // keeps the GPU nodes held and holds nothing else.
    sigkill(&mut first);
    let second = serve_grouped(&c).await;
    eventually_logging(
        "the new leader leads",
        Duration::from_secs(30),
        &second,
        || async {
            metric(
                &second,
                r#"node_holder_window_group_held_nodes{group="gpu"}"#,
            )
            .await
                == Some(2.0)
        },
    )
    .await;
    assert_eq!(marked(&c.nodes).await, ["gpu-new", "gpu-old"]);
    assert!(
        logged(&second, "nodes patched").is_empty(),
        "nothing to patch: {}",
        second.log()
    );

    // A general-purpose scale-up opens that group's window beside the GPU's.
    create(&c.nodes, "general-3", &[(LABEL, "general")], &[]).await;
    let both = ["general-1", "general-2", "general-3", "gpu-new", "gpu-old"];
    held_exactly(&c, &second, "both groups' windows hold", &both).await;

    // `release --group gpu` closes the GPU window only.
    let out = succeeded(&operator(&c.cp, &["release", "--group", "gpu"]));
    assert!(out.contains("for group gpu: its window open"), "{out}");
    assert_eq!(
        marked(&c.nodes).await,
        ["general-1", "general-2", "general-3"],
        "{out}"
    );
    let status = status_json(&c.cp);
    assert_eq!(group(&status, "gpu")["open"], false, "{status}");
    assert_eq!(group(&status, "general")["open"], true, "{status}");
    assert_eq!(status["releaseGroup"], "gpu", "{status}");
    assert!(status["release"].is_null(), "the release is done: {status}");
}

#[tokio::test]
async fn release_refuses_a_group_when_windows_are_not_grouped() {
    let c = Cluster::start().await;
    let served = common::serve(&c.cp, &strs(&fast("20s", &[]))).await;
    create(&c.nodes, "n", &[], &[]).await;
    eventually_logging(
        "the leader records its settings",
        Duration::from_secs(30),
        &served,
        || async { status_json(&c.cp)["settings"].is_object() },
    )
    .await;
    let out = operator(&c.cp, &["release", "--group", "gpu"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--group needs windows grouped by a label"),
        "{stderr}"
    );
    // Nothing was asked of the leader.
    assert!(status_json(&c.cp)["releaseRequestedAt"].is_null());
}

/// `--group-hold-duration`: a group with a hold of its own holds its nodes
/// that long while the others' windows end after `--hold-duration`; the
/// record keeps the setting and `status` says it.
#[tokio::test]
async fn a_group_with_a_hold_of_its_own_outlasts_the_default_hold() {
    let c = Cluster::start().await;
    create(&c.nodes, "gpu-1", &[(LABEL, "gpu")], &[]).await;
    create(&c.nodes, "general-1", &[(LABEL, "general")], &[]).await;
    let label = format!("--window-per-label={LABEL}");
    let served = common::serve(
        &c.cp,
        &strs(&fast("3s", &[&label, "--group-hold-duration=gpu=10m"])),
    )
    .await;
    eventually_logging(
        "the general window ends and the GPU window holds on",
        Duration::from_secs(40),
        &served,
        || async {
            let status = status_json(&c.cp);
            group(&status, "general")["open"] == false
                && group(&status, "gpu")["open"] == true
                && marked(&c.nodes).await == ["gpu-1"]
        },
    )
    .await;
    let status = status_json(&c.cp);
    assert_eq!(
        status["settings"]["groupHoldDurations"]["gpu"], "10m",
        "{status}"
    );
    let deadline: jiff::Timestamp = group(&status, "gpu")["deadline"]
        .as_str()
        .unwrap_or_default()
        .parse()
        .unwrap_or_else(|e| panic!("a GPU deadline: {e}: {status}"));
    let left = deadline.duration_since(jiff::Timestamp::now());
    assert!(left > jiff::SignedDuration::from_secs(5 * 60), "{left:?}");
    let text = succeeded(&operator(&c.cp, &["status"]));
    assert!(text.contains("gpu holds 10m"), "{text}");
}
