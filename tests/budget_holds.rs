//! `--hold-mechanism budget` against the real API server with Karpenter's
//! CRDs (what Karpenter then does is in `tests/karpenter.rs`): node-holder's
//! entry goes on the NodePools in scope while a window is open and exactly it
//! comes off, whatever the owner wrote meanwhile and whichever leader takes it
//! off; a pool that cannot take one more budget has its nodes held by
//! annotation instead.

use testsupport as common;

use std::time::Duration;

use common::window::{Cluster, create, eventually_logging, fast, logged, marked, sigkill, strs};
use common::{Served, is_node_holders_budget, operator, split_budgets, succeeded};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use testenv::Disruption;

const LABEL: &str = "karpenter.sh/nodepool";

fn ours() -> Value {
    json!({"nodes": "0", "reasons": ["Underutilized", "Empty"]})
}

/// Creates NodePool `name` with `budgets` and `labels`, once the CRD serves.
async fn create_pool(pools: &Api<DynamicObject>, name: &str, budgets: Value, labels: Value) {
    let mut pool = testenv::node_pool_object(
        name,
        &Disruption {
            budgets,
            ..Disruption::default()
        },
    );
    pool["metadata"]["labels"] = labels;
    let pool: DynamicObject = serde_json::from_value(pool).unwrap();
    common::window::eventually("the NodePool created", Duration::from_secs(30), || async {
        match pools.create(&Default::default(), &pool).await {
            Ok(_) => true,
            Err(kube::Error::Api(status)) if status.code == 409 => true,
            Err(_) => false,
        }
    })
    .await;
}

async fn budgets(pools: &Api<DynamicObject>, name: &str) -> Value {
    pools.get(name).await.unwrap().data["spec"]["disruption"]["budgets"].clone()
}

async fn serve_budget(c: &Cluster) -> Served {
    common::install_rbac_for(&c.cp, "nodepools").await;
    let flags = fast(
        "60s",
        &["--hold-mechanism=budget", "--nodepool-selector=hold!=no"],
    );
    common::serve(&c.cp, &strs(&flags)).await
}

#[tokio::test]
async fn the_budget_goes_on_the_pools_in_scope_and_exactly_it_comes_off_after_a_new_leader() {
    let c = Cluster::start().await;
    testenv::install_karpenter_crds(&c.cp).await.unwrap();
    let pools = testenv::node_pools(&c.cp.admin_client().await.unwrap());
    let general = json!([{"nodes": "10%"}]);
    let gpu = json!([ours(), {"nodes": "1", "reasons": ["Drifted"]}]);
    create_pool(&pools, "general", general.clone(), json!({})).await;
    create_pool(&pools, "gpu", gpu.clone(), json!({})).await;
    create_pool(&pools, "left-alone", general.clone(), json!({"hold": "no"})).await;
    let full: Vec<Value> = (1..=50).map(|n| json!({"nodes": n.to_string()})).collect();
    create_pool(&pools, "full", json!(full), json!({})).await;

    let mut first = serve_budget(&c).await;
    for (node, pool) in [("g-1", "general"), ("gpu-1", "gpu"), ("full-1", "full")] {
        create(&c.nodes, node, &[(LABEL, pool)], &[]).await;
    }
    create(&c.nodes, "plain", &[], &[]).await;

    // While the window is open: the entry on every pool in scope (the gpu
    // pool's owner has one like it, without an end: node-holder adds its own
    // and leaves the owner's), none
    // on the excluded one; the nodes carry no annotation, but the full
    // pool's node, whose pool cannot take a 51st budget.
    eventually_logging(
        "the pools hold",
        Duration::from_secs(30),
        &first,
        || async {
            split_budgets(&budgets(&pools, "general").await) == (general.clone(), 1)
                && split_budgets(&budgets(&pools, "gpu").await) == (gpu.clone(), 1)
                && marked(&c.nodes).await == ["full-1"]
        },
    )
    .await;
    // node-holder's own entry is last, after the owner's.
    let general_now = budgets(&pools, "general").await;
    assert!(is_node_holders_budget(&general_now[1]), "{general_now}");
    assert_eq!(budgets(&pools, "left-alone").await, general);
    assert_eq!(budgets(&pools, "full").await, json!(full));
    assert!(
        logged(
            &first,
            "NodePool budget not written; its nodes are held by annotation"
        )
        .iter()
        .any(|l| l["pool"] == "full"
            && l["error"]
                .as_str()
                .is_some_and(|e| e.contains("50 budgets"))),
        "{}",
        first.log()
    );
    let status = succeeded(&operator(&c.cp, &["status"]));
    assert!(
        status.contains("Budget on:   NodePool(s) general, gpu\n"),
        "{status}"
    );

    // The owner edits the general pool meanwhile (a new first entry).
    let edit =
        json!([{"op": "add", "path": "/spec/disruption/budgets/0", "value": {"nodes": "5"}}]);
    let edit: json_patch::Patch = serde_json::from_value(edit).unwrap();
    pools
        .patch("general", &PatchParams::default(), &Patch::Json::<()>(edit))
        .await
        .unwrap();

    // The leader dies; the next one takes what was added from the record
    // and, on release, removes exactly node-holder's entries.
    sigkill(&mut first);
    let second = serve_budget(&c).await;
    succeeded(&operator(&c.cp, &["release"]));
    eventually_logging(
        "the pools released",
        Duration::from_secs(30),
        &second,
        || async { budgets(&pools, "gpu").await == gpu },
    )
    .await;
    assert_eq!(
        budgets(&pools, "general").await,
        json!([{"nodes": "5"}, {"nodes": "10%"}])
    );
    assert_eq!(budgets(&pools, "left-alone").await, general);
    assert!(marked(&c.nodes).await.is_empty());
    let status = succeeded(&operator(&c.cp, &["status"]));
    assert!(
        status.contains("Budget on:   NodePool(s) none\n"),
        "{status}"
    );
}

#[tokio::test]
async fn without_karpenters_nodepool_api_each_pass_says_why_and_the_pools_hold_once_it_is_there() {
    let c = Cluster::start().await;
    common::install_rbac_for(&c.cp, "nodepools").await;
    let flags = fast("10m", &["--hold-mechanism=budget", "--log-level=debug"]);
    let mut served = common::serve(&c.cp, &strs(&flags)).await;
    create(&c.nodes, "g-1", &[(LABEL, "general")], &[]).await;
    // The generations of pool `general` the NodePool watch saw.
    let seen = |served: &Served| -> Vec<i64> {
        logged(served, "NodePool changed")
            .iter()
            .filter(|l| l["pool"] == "general")
            .filter_map(|l| l["generation"].as_i64())
            .collect()
    };

    // No NodePool API: every pass fails, saying what is missing, and is
    // retried; the process keeps running and holds nothing by annotation.
    let says_why = |served: &Served| {
        logged(served, "hold window pass failed").iter().any(|l| {
            l["error"]
                .as_str()
                .is_some_and(|e| e.contains("--hold-mechanism budget needs Karpenter v1"))
        })
    };
    eventually_logging(
        "a pass says why it failed",
        Duration::from_secs(30),
        &served,
        || std::future::ready(says_why(&served)),
    )
    .await;
    assert!(served.child.try_wait().unwrap().is_none(), "serve exited");
    assert!(marked(&c.nodes).await.is_empty());

    // Karpenter's API is there but the node's pool is not: a retried pass
    // succeeds and holds the node by annotation (nothing is left unheld).
    testenv::install_karpenter_crds(&c.cp).await.unwrap();
    eventually_logging(
        "the node of a missing pool held by annotation",
        Duration::from_secs(90),
        &served,
        || async { marked(&c.nodes).await == ["g-1"] },
    )
    .await;

    // The pool appears. No node changes and the window's deadline is ten
    // minutes away: the NodePool watch sees it (at its generation, or a
    // later one if a pass that the node's own patch set off wrote it
    // first) and its pass puts the budget on and takes the node's
    // annotation off.
    let pools = testenv::node_pools(&c.cp.admin_client().await.unwrap());
    create_pool(&pools, "general", json!([{"nodes": "10%"}]), json!({})).await;
    let created = pools
        .get("general")
        .await
        .unwrap()
        .metadata
        .generation
        .unwrap();
    let owners = json!([{"nodes": "10%"}]);
    let held = || async { split_budgets(&budgets(&pools, "general").await) == (owners.clone(), 1) };
    eventually_logging(
        "the new pool holds instead of the annotation",
        Duration::from_secs(30),
        &served,
        || async {
            seen(&served).iter().any(|&g| g >= created)
                && held().await
                && marked(&c.nodes).await.is_empty()
        },
    )
    .await;

    // The owner writes the list back as it has it (a GitOps sync): the
    // watch sees it and the entry is put back on, the owner's own left as
    // written.
    let sync =
        json!([{"op": "replace", "path": "/spec/disruption/budgets", "value": [{"nodes": "10%"}]}]);
    let sync: json_patch::Patch = serde_json::from_value(sync).unwrap();
    let synced = pools
        .patch("general", &PatchParams::default(), &Patch::Json::<()>(sync))
        .await
        .unwrap()
        .metadata
        .generation
        .unwrap();
    eventually_logging(
        "the entry put back",
        Duration::from_secs(30),
        &served,
        || async { seen(&served).iter().any(|&g| g >= synced) && held().await },
    )
    .await;
    assert!(marked(&c.nodes).await.is_empty());
    // The log says so, once: a fight with the owner shows there.
    let missing = logged(
        &served,
        "node-holder's budget entry is missing from the NodePool; putting it back",
    );
    assert_eq!(missing.len(), 1, "{}", served.log());
    assert_eq!(missing[0]["pool"], "general");
}

/// node-holder's entry ends by itself a little after the deadline it was
/// written for, and is renewed, in one write, when the hold grows past it
/// (here a manual hold of 30 minutes over a one-minute window).
#[tokio::test]
async fn the_entry_ends_by_itself_after_its_deadline_and_is_renewed_when_the_hold_grows() {
    let c = Cluster::start().await;
    testenv::install_karpenter_crds(&c.cp).await.unwrap();
    let pools = testenv::node_pools(&c.cp.admin_client().await.unwrap());
    let owners = json!([{"nodes": "10%"}]);
    create_pool(&pools, "general", owners.clone(), json!({})).await;
    let served = serve_budget(&c).await;
    create(&c.nodes, "g-1", &[(LABEL, "general")], &[]).await;
    let ours = || async {
        let budgets = budgets(&pools, "general").await;
        let (others, count) = split_budgets(&budgets);
        assert_eq!(others, owners, "{budgets}");
        (count == 1).then(|| budgets[1].clone())
    };
    eventually_logging("the entry on", Duration::from_secs(30), &served, || async {
        ours().await.is_some()
    })
    .await;
    // A 60 s hold: the entry runs a minute past the deadline, in whole
    // minutes, from the minute before it was written.
    let first = ours().await.unwrap();
    let minutes = |entry: &Value| -> u64 {
        entry["duration"]
            .as_str()
            .unwrap()
            .trim_end_matches('m')
            .parse()
            .unwrap()
    };
    assert!((2..=4).contains(&minutes(&first)), "{first}");

    // Beside it, the pool says until when: the entry's end, at most its
    // duration after now.
    let marker = || async {
        let pool = pools.get("general").await.unwrap();
        let annotations = pool.metadata.annotations.unwrap_or_default();
        annotations
            .get("node-holder.dev/budget-until")
            .map(|t| t.parse::<jiff::Timestamp>().unwrap())
    };
    let until = marker().await.expect("the marker beside the entry");
    let span = jiff::SignedDuration::from_mins(minutes(&first) as i64);
    assert!(
        until > jiff::Timestamp::now() && until <= jiff::Timestamp::now() + span,
        "{until}"
    );

    succeeded(&operator(&c.cp, &["hold", "--for=30m", "--reason=test"]));
    eventually_logging(
        "the entry renewed",
        Duration::from_secs(30),
        &served,
        || async { ours().await.is_some_and(|entry| minutes(&entry) >= 31) },
    )
    .await;
    let renewed = marker().await.expect("the marker beside the renewed entry");
    let later = jiff::Timestamp::now() + jiff::SignedDuration::from_mins(29);
    assert!(renewed >= later, "{renewed}");
    succeeded(&operator(&c.cp, &["release"]));
    eventually_logging(
        "the entry off",
        Duration::from_secs(30),
        &served,
        || async { budgets(&pools, "general").await == owners },
    )
    .await;
    assert_eq!(marker().await, None, "the marker goes with the entry");
}
