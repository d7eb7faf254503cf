//! The chaos soak with the real Karpenter:
//! `cargo bench -p node-holder-lab --bench soak`.
//!
//! Three replicas of `serve` (policy mode), Karpenter, Jobs launching nodes
//! and randomized faults for `NODE_HOLDER_SOAK_MINUTES` (default 20) with the
//! seed `NODE_HOLDER_SOAK_SEED` (default 1); a checker reads the cluster
//! every second (`node_holder_lab::soak` says what it checks). Prints the faults
//! injected, the checks made, the violations (the goal: none) and the worst
//! bounds observed; fails on any violation.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use node_holder_lab::soak::{self, OVERSTAY_BOUND, Soak, UNHELD_BOUND};

fn main() -> Result<()> {
    node_holder_lab::build_node_holder()?;
    let env = |name: &str, default: u64| -> Result<u64> {
        std::env::var(name)
            .ok()
            .map(|v| v.parse().with_context(|| format!("{name}={v}")))
            .transpose()
            .map(|v| v.unwrap_or(default))
    };
    let minutes = env("NODE_HOLDER_SOAK_MINUTES", 20)?;
    let seed = env("NODE_HOLDER_SOAK_SEED", 1)?;
    let report = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(soak::run(&Soak {
            duration: Duration::from_secs(minutes * 60),
            each_fault: 1,
            seed,
        }));
    println!("chaos soak: {minutes} minutes, seed {seed}");
    println!("faults injected: {:?}", report.faults);
    println!(
        "Jobs {}, nodes seen {}, checks {}, violations {}",
        report.jobs,
        report.nodes_seen,
        report.checks,
        report.violations.len()
    );
    println!(
        "worst: a node in its window unheld {:?} after its creation (bound {UNHELD_BOUND:?}); \
         node-holder's marker {:?} past the latest deadline (bound {OVERSTAY_BOUND:?})",
        report.worst_unheld, report.worst_overstay
    );
    for violation in &report.violations {
        println!("violation: {violation}");
    }
    ensure!(
        report.violations.is_empty(),
        "{} violations",
        report.violations.len()
    );
    Ok(())
}
