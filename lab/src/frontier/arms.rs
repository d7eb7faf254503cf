//! The churn bench's arms: each a way of running the day (Karpenter alone
//! at a `consolidateAfter`, or node-holder with a hold), the same grid on
//! every day, the clusters they play in, and each node-holder arm's
//! `node-holder serve` flags.

use serde::Serialize;
use serde_json::json;
use testenv::Disruption;

/// The label every pod of an arm carries: its arm's name.
pub const ARM_LABEL: &str = "bench-arm";

/// One way of running the day.
#[derive(Debug, Clone, Serialize)]
pub struct Arm {
    /// Its NodePool's name, and its label on everything it runs.
    pub name: String,
    /// The NodePool's `consolidateAfter`, in seconds.
    pub consolidate_after: u64,
    /// node-holder's `--hold-duration` in seconds, if node-holder holds it.
    pub hold: Option<u64>,
    /// node-holder's `--launch-cost` in seconds: the schedule hold.
    pub launch_cost: Option<u64>,
    /// node-holder's `--warm-before-runs` in seconds: capacity in time.
    pub warm: Option<u64>,
    /// The NodePool's `consolidationPolicy`.
    pub policy: &'static str,
    /// A Karpenter `CapacityBuffer` in its pool of each CronJob's run: the
    /// operator's headroom for scheduled runs, all day.
    pub buffer: bool,
}

/// Karpenter's default consolidation policy.
const DEFAULT_POLICY: &str = "WhenEmptyOrUnderutilized";

/// `--warm-before-runs` of the warmed arms, in seconds.
const WARM_LEAD: u64 = 90;

impl Arm {
    fn karpenter(after: u64) -> Arm {
        Arm {
            name: format!("ka-{}", knob(after)),
            consolidate_after: after,
            hold: None,
            launch_cost: None,
            warm: None,
            policy: DEFAULT_POLICY,
            buffer: false,
        }
    }

    /// Karpenter alone with its pool at `WhenEmpty`: no pod is moved to
    /// fill a node and only empty nodes are removed.
    fn karpenter_when_empty(after: u64) -> Arm {
        Arm {
            name: format!("kaw-{}", knob(after)),
            policy: "WhenEmpty",
            ..Arm::karpenter(after)
        }
    }

    /// Karpenter alone with its pool at `Balanced` (v1.14: a move must save
    /// at least half as much as it disrupts; no feature gate).
    fn karpenter_balanced(after: u64) -> Arm {
        Arm {
            name: format!("kab-{}", knob(after)),
            policy: "Balanced",
            ..Arm::karpenter(after)
        }
    }

    /// Karpenter alone at `WhenEmpty` with a `CapacityBuffer` (v1.14,
    /// feature gate `CapacityBuffer`) of each CronJob's run in its pool:
    /// what Karpenter itself offers for runs that must not wait for a
    /// launch.
    fn karpenter_buffered(after: u64) -> Arm {
        Arm {
            name: format!("kcb-{}", knob(after)),
            buffer: true,
            ..Arm::karpenter_when_empty(after)
        }
    }

    fn node_holder(hold: u64) -> Arm {
        Arm {
            name: format!("nh-{}", knob(hold)),
            consolidate_after: 0,
            hold: Some(hold),
            launch_cost: None,
            warm: None,
            policy: DEFAULT_POLICY,
            buffer: false,
        }
    }

    /// The schedule hold at a launch cost of `launch` seconds (the day's
    /// other work held by a window of the same length).
    fn scheduled(launch: u64) -> Arm {
        Arm {
            name: format!("ns-{}", knob(launch)),
            launch_cost: Some(launch),
            ..Arm::node_holder(launch)
        }
    }

    /// The schedule hold with its pool at `WhenEmpty`: a kept node is then
    /// no destination of Karpenter's moves either (the two-schedules day,
    /// seed 1, saw `Underutilized` moves fill the node kept for a run).
    fn scheduled_when_empty(launch: u64) -> Arm {
        Arm {
            name: format!("nsw-{}", knob(launch)),
            policy: "WhenEmpty",
            ..Arm::scheduled(launch)
        }
    }

    /// The schedule hold at `WhenEmpty` with warms: placeholders ask for a
    /// run's nodes 90 s before it (KWOK nodes register 45 s after their
    /// launch) when the gap let them go.
    fn warmed(launch: u64) -> Arm {
        Arm {
            name: format!("nsx-{}", knob(launch)),
            warm: Some(WARM_LEAD),
            ..Arm::scheduled_when_empty(launch)
        }
    }

    /// Its NodePool's disruption: Karpenter's default budget (`nodes:
    /// 10%`) with the arm's policy and `consolidateAfter`.
    pub fn disruption(&self) -> Disruption {
        Disruption {
            consolidation_policy: self.policy.into(),
            consolidate_after: format!("{}s", self.consolidate_after),
            budgets: json!([{"nodes": "10%"}]),
        }
    }

    /// The same grid on every day: nothing tuned per day or per arm.
    pub fn all() -> Vec<Arm> {
        let karpenter = [0, 30, 60, 120, 300, 600].map(Arm::karpenter);
        let karpenter_when_empty = [0, 30, 120, 300].map(Arm::karpenter_when_empty);
        let karpenter_balanced = [0, 30, 120, 300].map(Arm::karpenter_balanced);
        let holder = [120, 300, 600].map(Arm::node_holder);
        karpenter
            .into_iter()
            .chain(karpenter_when_empty)
            .chain(karpenter_balanced)
            .chain([Arm::karpenter_buffered(0)])
            .chain(holder)
            .chain([
                Arm::scheduled(300),
                Arm::scheduled_when_empty(300),
                Arm::warmed(300),
            ])
            .collect()
    }
}

/// A cluster for each node-holder arm: one install holds every node in its
/// scope with one window, and two installs in one cluster would strip each
/// other's holds. Karpenter's own arms join the first of them
/// (node-holder's selector leaves their pools alone), or make a cluster of
/// their own when no node-holder arm plays.
pub fn by_cluster(arms: &[Arm]) -> Vec<Vec<Arm>> {
    let karpenter: Vec<Arm> = arms.iter().filter(|a| a.hold.is_none()).cloned().collect();
    let mut clusters: Vec<Vec<Arm>> = arms
        .iter()
        .filter(|a| a.hold.is_some())
        .map(|a| vec![a.clone()])
        .collect();
    match clusters.first_mut() {
        Some(first) => first.splice(0..0, karpenter).for_each(drop),
        None if !karpenter.is_empty() => clusters.push(karpenter),
        None => {}
    }
    clusters
}

/// `30s`, `2m`: a knob as Karpenter and node-holder write it.
fn knob(seconds: u64) -> String {
    if seconds >= 60 && seconds.is_multiple_of(60) {
        format!("{}m", seconds / 60)
    } else {
        format!("{seconds}s")
    }
}

/// The flags of the `node-holder serve` of `arm`, a node-holder arm: its
/// pool in scope, its hold, holding for schedules and warming if it does.
pub fn serve_args(arm: &Arm) -> Vec<String> {
    let mut args = vec![
        format!("--node-selector=karpenter.sh/nodepool={}", arm.name),
        "--max-hold=4h".to_string(),
    ];
    if let Some(hold) = arm.hold {
        args.push(format!("--hold-duration={hold}s"));
    }
    if let Some(launch) = arm.launch_cost {
        args.push(format!("--launch-cost={launch}s"));
    }
    if let Some(lead) = arm.warm {
        args.push(format!("--warm-before-runs={lead}s"));
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(prefixes: &[&str]) -> Vec<Arm> {
        Arm::all()
            .into_iter()
            .filter(|a| prefixes.iter().any(|p| a.name.starts_with(p)))
            .collect()
    }

    fn names(clusters: &[Vec<Arm>]) -> Vec<Vec<&str>> {
        clusters
            .iter()
            .map(|c| c.iter().map(|a| a.name.as_str()).collect())
            .collect()
    }

    #[test]
    fn karpenter_arms_share_the_first_node_holder_cluster() {
        let clusters = by_cluster(&named(&["kaw-", "nh-"]));
        assert_eq!(
            names(&clusters),
            [
                vec!["kaw-0s", "kaw-30s", "kaw-2m", "kaw-5m", "nh-2m"],
                vec!["nh-5m"],
                vec!["nh-10m"]
            ]
        );
        let all = by_cluster(&Arm::all());
        let holders = Arm::all().iter().filter(|a| a.hold.is_some()).count();
        assert_eq!(all.len(), holders, "{:?}", names(&all));
        assert!(all[1..].iter().all(|c| c.len() == 1 && c[0].hold.is_some()));
    }

    #[test]
    fn karpenter_arms_alone_make_one_cluster_without_node_holder() {
        let clusters = by_cluster(&named(&["ka-"]));
        assert_eq!(clusters.len(), 1);
        assert_eq!(clusters[0].len(), 6);
        assert!(by_cluster(&[]).is_empty());
    }

    #[test]
    fn node_holder_selects_only_its_own_pool() {
        let arm = |name: &str| Arm::all().into_iter().find(|a| a.name == name).unwrap();
        let args = serve_args(&arm("nh-10m"));
        assert_eq!(args[0], "--node-selector=karpenter.sh/nodepool=nh-10m");
        assert!(args.contains(&"--hold-duration=600s".to_string()));
        assert!(!args.iter().any(|a| a.starts_with("--launch-cost")));
        let scheduled = serve_args(&arm("ns-5m"));
        assert!(scheduled.contains(&"--launch-cost=300s".to_string()));
        assert!(
            !scheduled
                .iter()
                .any(|a| a.starts_with("--warm-before-runs"))
        );
        let warmed = serve_args(&arm("nsx-5m"));
        assert!(warmed.contains(&"--warm-before-runs=90s".to_string()));
    }

    #[test]
    fn each_arm_runs_its_pool_at_its_policy() {
        for arm in Arm::all() {
            let policy = arm.disruption().consolidation_policy;
            let expected = match &arm.name[..arm.name.find('-').unwrap()] {
                "kaw" | "kcb" | "nsw" | "nsx" => "WhenEmpty",
                "kab" => "Balanced",
                _ => "WhenEmptyOrUnderutilized",
            };
            assert_eq!(policy, expected, "{}", arm.name);
        }
    }
}
