//! A short chaos soak in the suite (`cargo bench -p node-holder-lab --bench
//! soak` runs the long one): three replicas of `serve` in policy mode beside
//! the real Karpenter, Jobs launching nodes, and every kind of fault at least
//! once (the leader and a follower SIGKILLed, the leader SIGSTOPped past its
//! Lease, the API server restarted, node-holder's node writes answered 500
//! and 429 for a while, a person's hold on and off, the NodePool's owner
//! rewriting its budgets), with the checker of `node_holder_lab::soak`
//! reading the cluster every second: no promise may break.

use std::time::Duration;

use node_holder_lab::soak::{self, FAULTS, Soak};

#[tokio::test]
async fn a_short_chaos_soak_with_the_real_karpenter_breaks_no_promise() {
    node_holder_lab::ensure_node_holder().expect("the node-holder binary");
    let report = soak::run(&Soak {
        duration: Duration::from_secs(120),
        each_fault: 1,
        seed: 7,
    })
    .await;
    eprintln!("{report:#?}");
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    for fault in FAULTS {
        assert!(
            report.faults.get(fault).copied().unwrap_or(0) >= 1,
            "{fault}: {report:#?}"
        );
    }
    assert!(report.jobs >= 3 && report.nodes_seen >= 3, "{report:#?}");
    assert!(report.checks > 300, "{report:#?}");
}
