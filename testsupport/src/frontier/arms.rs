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
    /// node-holder with `--window-follows-work`.
    pub follows_work: bool,
    /// node-holder with `--hold-policy learned` at this launch cost (in
    /// seconds); its `hold` is the fallback until it has learned.
    pub learned: Option<u64>,
    /// node-holder in `--scope node`, following the work: each node held
    /// from its own last work (a per-node keep-alive).
    pub per_node: bool,
    /// The NodePool consolidates only empty nodes (`WhenEmpty`), so that no
    /// pod is moved onto a node node-holder holds.
    pub when_empty: bool,
}

impl Arm {
    fn karpenter(after: u64) -> Arm {
        Arm {
            name: format!("ka-{}", knob(after)),
            consolidate_after: after,
            hold: None,
            follows_work: false,
            learned: None,
            per_node: false,
            when_empty: false,
        }
    }

    /// Karpenter alone with its pool at `WhenEmpty`: the native setting an
    /// operator would compare with `niw-`, where no pod is moved to fill a
    /// node and only empty nodes are removed.
    fn karpenter_when_empty(after: u64) -> Arm {
        Arm {
            name: format!("kaw-{}", knob(after)),
            when_empty: true,
            ..Arm::karpenter(after)
        }
    }

    fn node_holder(hold: u64) -> Arm {
        Arm {
            name: format!("nh-{}", knob(hold)),
            consolidate_after: 0,
            hold: Some(hold),
            follows_work: false,
            learned: None,
            per_node: false,
            when_empty: false,
        }
    }

    fn following_work(hold: u64) -> Arm {
        Arm {
            name: format!("nf-{}", knob(hold)),
            follows_work: true,
            ..Arm::node_holder(hold)
        }
    }

    /// The learned hold at node-holder's default terms (a launch counts as
    /// 5 node-minutes; holds of 1-30 minutes; 10 minutes until it has
    /// learned), following the work.
    fn learning() -> Arm {
        Arm {
            name: "nl-5m".into(),
            learned: Some(300),
            ..Arm::following_work(600)
        }
    }

    /// The per-node keep-alive: each node held from its own last work.
    fn per_node(hold: u64) -> Arm {
        Arm {
            name: format!("ni-{}", knob(hold)),
            per_node: true,
            ..Arm::following_work(hold)
        }
    }

    /// The per-node keep-alive with its pool at `WhenEmpty`: Karpenter's
    /// Underutilized consolidation moves long-lived pods onto nodes that
    /// node-holder holds (a held node is no candidate, but it is a
    /// destination, where a node under `consolidateAfter` is neither), so
    /// the next wave finds them full; this arm measures that cost.
    fn per_node_when_empty(hold: u64) -> Arm {
        Arm {
            name: format!("niw-{}", knob(hold)),
            when_empty: true,
            ..Arm::per_node(hold)
        }
    }

    /// The learned per-node keep-alive with its pool at `WhenEmpty` (as
    /// `niw-5m` is to `ni-5m`).
    fn per_node_learning_when_empty() -> Arm {
        Arm {
            name: "nilw-5m".into(),
            when_empty: true,
            ..Arm::per_node_learning()
        }
    }

    /// The per-node keep-alive with the learned hold at node-holder's
    /// default terms (as `nl-5m`).
    fn per_node_learning() -> Arm {
        Arm {
            name: "nil-5m".into(),
            learned: Some(300),
            ..Arm::per_node(600)
        }
    }

    /// Its NodePool's disruption: Karpenter's defaults
    /// (`WhenEmptyOrUnderutilized`, budget `nodes: 10%`; `WhenEmpty` for a
    /// [`Arm::when_empty`] arm) with the arm's `consolidateAfter`.
    pub fn disruption(&self) -> Disruption {
        let policy = if self.when_empty {
            "WhenEmpty"
        } else {
            "WhenEmptyOrUnderutilized"
        };
        Disruption {
            consolidation_policy: policy.into(),
            consolidate_after: format!("{}s", self.consolidate_after),
            budgets: json!([{"nodes": "10%"}]),
        }
    }

    /// The same grid on every day: nothing tuned per day or per arm.
    pub fn all() -> Vec<Arm> {
        let karpenter = [0, 30, 60, 120, 300, 600].map(Arm::karpenter);
        let karpenter_when_empty = [0, 30, 120, 300].map(Arm::karpenter_when_empty);
        let holder = [120, 300, 600].map(Arm::node_holder);
        let following = [120, 300, 600].map(Arm::following_work);
        let per_node = [120, 300].map(Arm::per_node);
        karpenter
            .into_iter()
            .chain(karpenter_when_empty)
            .chain(holder)
            .chain(following)
            .chain([Arm::learning()])
            .chain(per_node)
            .chain([
                Arm::per_node_learning(),
                Arm::per_node_when_empty(300),
                Arm::per_node_learning_when_empty(),
            ])
            .collect()
    }
}

/// The arms of each node-holder configuration (following the work or not,
/// in node scope or not), for a cluster each: two installs in one cluster
/// would strip each other's holds. Karpenter's own arms join the first of
/// them (node-holder's selector leaves their pools alone), or make a
/// cluster of their own when no node-holder arm plays.
pub fn by_cluster(arms: &[Arm]) -> Vec<Vec<Arm>> {
    let karpenter: Vec<Arm> = arms.iter().filter(|a| a.hold.is_none()).cloned().collect();
    let mut clusters: Vec<Vec<Arm>> = [(false, false), (true, false), (true, true)]
        .iter()
        .map(|&(follows, per_node)| {
            arms.iter()
                .filter(|a| a.hold.is_some())
                .filter(|a| a.follows_work == follows && a.per_node == per_node)
                .cloned()
                .collect()
        })
        .filter(|part: &Vec<Arm>| !part.is_empty())
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
/// each with the arm's hold (`--group-hold-duration`, or the learned hold),
/// only those pools in scope, following the work if they do.
pub fn serve_args(arms: &[Arm]) -> Vec<String> {
    let pools: Vec<&str> = arms
        .iter()
        .filter(|a| a.hold.is_some())
        .map(|a| a.name.as_str())
        .collect();
    let fixed: Vec<String> = arms
        .iter()
        .filter(|a| a.learned.is_none())
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
    if let Some((launch, fallback)) = arms.iter().find_map(|a| Some((a.learned?, a.hold?))) {
        args.push("--hold-policy=learned".to_string());
        args.push(format!("--launch-cost={launch}s"));
        args.push(format!("--hold-duration={fallback}s"));
    }
    if arms.iter().any(|a| a.follows_work) {
        args.push("--window-follows-work".to_string());
    }
    if arms.iter().any(|a| a.per_node) {
        args.push("--scope=node".to_string());
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
        let clusters = by_cluster(&named(&["kaw-", "niw-", "nilw-"]));
        assert_eq!(
            names(&clusters),
            [["kaw-0s", "kaw-30s", "kaw-2m", "kaw-5m", "niw-5m", "nilw-5m"]]
        );
        let all = by_cluster(&Arm::all());
        assert_eq!(all.len(), 3, "{:?}", names(&all));
        assert!(all[0].iter().take(10).all(|a| a.hold.is_none()));
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
        let args = serve_args(&named(&["kaw-", "niw-", "nilw-"]));
        assert_eq!(
            args[0],
            "--node-selector=karpenter.sh/nodepool in (niw-5m,nilw-5m)"
        );
        assert!(args.contains(&"--group-hold-duration=niw-5m=300s".to_string()));
        assert!(args.contains(&"--scope=node".to_string()));
    }

    #[test]
    fn when_empty_arms_consolidate_only_empty_nodes() {
        for arm in Arm::all() {
            let policy = arm.disruption().consolidation_policy;
            let expected = arm.name.starts_with("kaw-")
                || arm.name.starts_with("niw-")
                || arm.name.starts_with("nilw-");
            assert_eq!(policy == "WhenEmpty", expected, "{}", arm.name);
        }
    }
}
