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
    /// The NodePool consolidates only empty nodes (`WhenEmpty`).
    pub when_empty: bool,
}

impl Arm {
    fn karpenter(after: u64) -> Arm {
        Arm {
            name: format!("ka-{}", knob(after)),
            consolidate_after: after,
            hold: None,
            follows_work: false,
            when_empty: false,
        }
    }

    /// Karpenter alone with its pool at `WhenEmpty`: no pod is moved to
    /// fill a node and only empty nodes are removed.
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
        karpenter
            .into_iter()
            .chain(karpenter_when_empty)
            .chain(holder)
            .chain(following)
            .collect()
    }
}

/// The arms of each node-holder configuration (following the work or
/// not), for a cluster each: two installs in one cluster
/// would strip each other's holds. Karpenter's own arms join the first of
/// them (node-holder's selector leaves their pools alone), or make a
/// cluster of their own when no node-holder arm plays.
pub fn by_cluster(arms: &[Arm]) -> Vec<Vec<Arm>> {
    let karpenter: Vec<Arm> = arms.iter().filter(|a| a.hold.is_none()).cloned().collect();
    let mut clusters: Vec<Vec<Arm>> = [false, true]
        .iter()
        .map(|&follows| {
            arms.iter()
                .filter(|a| a.hold.is_some() && a.follows_work == follows)
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
/// each with the arm's hold (`--group-hold-duration`), only those pools in
/// scope, following the work if they do.
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
    if arms.iter().any(|a| a.follows_work) {
        args.push("--window-follows-work".to_string());
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
        assert_eq!(all.len(), 2, "{:?}", names(&all));
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
        let args = serve_args(&named(&["kaw-", "nf-"]));
        assert_eq!(
            args[0],
            "--node-selector=karpenter.sh/nodepool in (nf-2m,nf-5m,nf-10m)"
        );
        assert!(
            args.contains(&"--group-hold-duration=nf-2m=120s,nf-5m=300s,nf-10m=600s".to_string())
        );
        assert!(args.contains(&"--window-follows-work".to_string()));
    }

    #[test]
    fn when_empty_arms_consolidate_only_empty_nodes() {
        for arm in Arm::all() {
            let policy = arm.disruption().consolidation_policy;
            let expected = arm.name.starts_with("kaw-");
            assert_eq!(policy == "WhenEmpty", expected, "{}", arm.name);
        }
    }
}
