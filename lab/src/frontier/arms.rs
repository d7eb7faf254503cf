//! The churn bench's arms: each a way of running the day (Karpenter alone
//! at a `consolidateAfter`, or node-holder with a hold), the same grid on
//! every day, and the `node-holder serve` flags of the arms one cluster
//! holds.

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

/// The arms of each node-holder configuration (holding for schedules or
/// not, warming or not), for a cluster each: two installs in one
/// cluster would strip each other's holds. Karpenter's own arms join the first of
/// them (node-holder's selector leaves their pools alone), or make a
/// cluster of their own when no node-holder arm plays.
pub fn by_cluster(arms: &[Arm]) -> Vec<Vec<Arm>> {
    let karpenter: Vec<Arm> = arms.iter().filter(|a| a.hold.is_none()).cloned().collect();
    let configuration = |a: &Arm| (a.launch_cost.is_some(), a.warm.is_some());
    let mut configurations: Vec<(bool, bool)> = arms
        .iter()
        .filter(|a| a.hold.is_some())
        .map(configuration)
        .collect();
    configurations.sort_unstable();
    configurations.dedup();
    let mut clusters: Vec<Vec<Arm>> = configurations
        .iter()
        .map(|&c| {
            arms.iter()
                .filter(|a| a.hold.is_some() && configuration(a) == c)
                .cloned()
                .collect()
        })
        .collect();
    if clusters.is_empty() {
        clusters.push(Vec::new());
    }
    if let Some(first) = clusters.first_mut() {
        first.splice(0..0, karpenter);
    }
    clusters.retain(|part| !part.is_empty());
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

/// The flags of one `node-holder serve` for every node-holder arm of
/// `arms`: a window per pool (`--window-per-label karpenter.sh/nodepool`),
/// each with the arm's hold (`--group-hold-duration`), only those pools in
/// scope, holding for schedules and warming if they do.
pub fn serve_args(arms: &[Arm]) -> Vec<String> {
    let pools: Vec<&str> = arms
        .iter()
        .filter(|a| a.hold.is_some())
        .map(|a| a.name.as_str())
        .collect();
    let fixed: Vec<String> = arms
        .iter()
        .filter_map(|a| Some(format!("{}={}s", a.name, a.hold?)))
        .collect();
    let mut args = vec![
        format!(
            "--node-selector=karpenter.sh/nodepool in ({})",
            pools.join(",")
        ),
        "--window-per-label=karpenter.sh/nodepool".to_string(),
        "--max-hold=4h".to_string(),
    ];
    if !fixed.is_empty() {
        args.push(format!("--group-hold-duration={}", fixed.join(",")));
    }
    if let Some(launch) = arms.iter().find_map(|a| a.launch_cost) {
        args.push(format!("--launch-cost={launch}s"));
    }
    if let Some(lead) = arms.iter().find_map(|a| a.warm) {
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
            [[
                "kaw-0s", "kaw-30s", "kaw-2m", "kaw-5m", "nh-2m", "nh-5m", "nh-10m"
            ]]
        );
        let all = by_cluster(&Arm::all());
        assert_eq!(all.len(), 3, "{:?}", names(&all));
        assert!(all[0].iter().take(14).all(|a| a.hold.is_none()));
        let names = names(&all);
        assert!(
            names.contains(&vec!["ns-5m", "nsw-5m"]) && names.contains(&vec!["nsx-5m"]),
            "the schedule hold apart, and with warms apart again: {names:?}"
        );
        assert!(all[1..].iter().flatten().all(|a| a.hold.is_some()));
    }

    #[test]
    fn karpenter_arms_alone_make_one_cluster_without_node_holder() {
        let clusters = by_cluster(&named(&["ka-"]));
        assert_eq!(clusters.len(), 1);
        assert_eq!(clusters[0].len(), 6);
        assert!(by_cluster(&[]).is_empty());
    }

    #[test]
    fn node_holder_selects_only_its_own_pools() {
        let args = serve_args(&named(&["kaw-", "nh-"]));
        assert_eq!(
            args[0],
            "--node-selector=karpenter.sh/nodepool in (nh-2m,nh-5m,nh-10m)"
        );
        assert!(
            args.contains(&"--group-hold-duration=nh-2m=120s,nh-5m=300s,nh-10m=600s".to_string())
        );
        assert!(!args.iter().any(|a| a.starts_with("--launch-cost")));
        let scheduled = serve_args(&named(&["ns-"]));
        assert!(scheduled.contains(&"--launch-cost=300s".to_string()));
        assert!(
            !scheduled
                .iter()
                .any(|a| a.starts_with("--warm-before-runs"))
        );
        let warmed = serve_args(&named(&["nsx-"]));
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
