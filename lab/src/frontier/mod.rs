//! The arithmetic of the churn frontier bench (`lab/benches/churn.rs`): what a
//! day of nodes costs, the clairvoyant optimum of a day, and paired
//! confidence intervals. Pure: no cluster, no clock.
//!
//! # The cost
//! `total = node-seconds + launches x launch cost`, where node-seconds run from
//! each NodeClaim's creation to its node being gone (so a launch's boot time
//! and a release's tail are in them) and the launch cost is the operator's
//! figure for what else a launch costs (image pulls, warm-up, a cold cache),
//! in node-seconds.
//!
//! # The clairvoyant optimum
//! Given the day's demand, the number of nodes the work needs at each instant
//! (one per running Job pod; for pods that share nodes, the pods' CPU over a
//! node's, rounded up), a clairvoyant operator launches each node
//! [`Costs::boot`] seconds before it is needed, and when a node falls idle it
//! either keeps it until its next use (paying the idle seconds) or lets it go
//! (paying [`Costs::release`] seconds of tail, Karpenter's own delay from
//! empty to gone) and launches again later (paying the boot and the launch
//! cost). With `N(t)` the nodes kept, the cost is `∫N dt + C x launches` for
//! `C = boot + release + launch`, and both terms split over the levels
//! `{t : N(t) >= k}`: level `k` costs its length plus `C` per stretch. So the
//! optimum fills each idle gap of each demand level that is shorter than `C`
//! and no other (the filled levels nest, since a gap of level `k + 1` shorter
//! than `C` only holds gaps of level `k` that are shorter still). The unit
//! tests check this against a brute force over every assignment of pods to
//! nodes.
//!
//! What the optimum leaves out, so that it stays a bound below every arm:
//! Karpenter's disruption budget (releases are never slowed by it), the
//! scheduler's placement (pods that share nodes are packed as a fluid), and
//! pod waits (the clairvoyant never makes a pod wait for a launch).
//!
//! The bench's other parts, beside this arithmetic: its [`arms`], its
//! [`days`], the [`workload`] each arm's pool runs, the [`recorder`]'s
//! watches, the [`trace`] a run leaves and the [`report`] made of the traces.

pub mod arms;
pub mod days;
pub mod recorder;
pub mod report;
pub mod trace;
pub mod workload;

use std::time::Duration;

/// How long an instance takes from launch to a registered Node (Karpenter's
/// KWOK `nodeRegistrationDelay` in the bench).
pub const BOOT: Duration = Duration::from_secs(45);
/// Karpenter's fastest release of an empty node: the disruption loop's
/// validation delay (`commandValidationDelay`, 15 s) before it acts.
pub const RELEASE: f64 = 15.0;
/// The launch costs the report prices, in node-seconds.
pub const LAUNCH_COSTS: [f64; 3] = [60.0, 300.0, 900.0];

/// The clairvoyant optimum of `day` at launch cost `launch`, with the
/// bench's [`BOOT`] and [`RELEASE`].
pub fn optimum_at(day: &days::Day, launch: f64) -> Priced {
    optimum(
        &day.demand(),
        Costs {
            launch,
            boot: BOOT.as_secs_f64(),
            release: RELEASE,
        },
    )
}

/// What a launch and a release cost, in node-seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Costs {
    /// The operator's price of a launch beyond its node-seconds.
    pub launch: f64,
    /// From NodeClaim creation to the node being ready for pods.
    pub boot: f64,
    /// From a node falling empty to its being gone, at Karpenter's fastest.
    pub release: f64,
}

impl Costs {
    /// What starting a stretch of a level costs beyond the stretch itself:
    /// the boot, the release at its end and the launch price.
    pub fn restart(&self) -> f64 {
        self.boot + self.release + self.launch
    }
}

/// A day's node count over time: `(seconds, change)` steps.
pub type Steps = [(f64, i64)];

/// The idle gaps and stretches of one demand level.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Level {
    /// Seconds the level is demanded.
    busy: f64,
    /// The first stretch started (the level is in use at all).
    started: bool,
    /// When the level last fell idle, if it is idle now.
    idle_since: Option<f64>,
    /// The idle gaps between one stretch and the next, in order: when
    /// each began and how long it was.
    gaps: Vec<(f64, f64)>,
    /// When the level was last raised: the start of the current stretch.
    raised_at: f64,
}

/// The demand levels of a day: for each `k`, the stretches in which at least
/// `k` nodes are needed. `steps` must be in time order.
pub(crate) fn levels(steps: &Steps) -> Vec<Level> {
    let mut levels: Vec<Level> = Vec::new();
    let mut count: usize = 0;
    for &(at, change) in steps {
        let target =
            usize::try_from(i64::try_from(count).unwrap_or(i64::MAX) + change).unwrap_or(0);
        while count < target {
            if levels.len() <= count {
                levels.push(Level::default());
            }
            let level = &mut levels[count];
            if let Some(since) = level.idle_since.take() {
                level.gaps.push((since, at - since));
            }
            level.started = true;
            level.raised_at = at;
            count += 1;
        }
        while count > target {
            count -= 1;
            let level = &mut levels[count];
            level.busy += at - level.raised_at;
            level.idle_since = Some(at);
        }
    }
    levels
}

/// What a day of nodes cost: the clairvoyant schedule's
/// ([`optimum`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Priced {
    pub launches: usize,
    pub node_seconds: f64,
}

impl Priced {
    /// Node-seconds plus launches at `launch` node-seconds each.
    pub fn total(&self, launch: f64) -> f64 {
        total(self.node_seconds, self.launches, launch)
    }
}

/// `node_seconds + launches x launch`.
pub fn total(node_seconds: f64, launches: usize, launch: f64) -> f64 {
    node_seconds + launches as f64 * launch
}

/// The clairvoyant optimum of the demand `steps` (in time order; every
/// level ends at zero by the last step).
pub fn optimum(steps: &Steps, costs: Costs) -> Priced {
    let limit = costs.restart();
    let mut launches = 0;
    let mut node_seconds = 0.0;
    for level in levels(steps).iter().filter(|l| l.started) {
        launches += 1;
        node_seconds += level.busy + costs.boot + costs.release;
        for &(_, gap) in &level.gaps {
            if gap < limit {
                node_seconds += gap;
            } else {
                launches += 1;
                node_seconds += costs.boot + costs.release;
            }
        }
    }
    Priced {
        launches,
        node_seconds,
    }
}

/// Node-seconds of a node count over time (`(seconds, nodes)` after each
/// change, in time order): the area under it.
pub fn area(series: &[(f64, usize)]) -> f64 {
    series
        .windows(2)
        .map(|w| (w[1].0 - w[0].0) * w[0].1 as f64)
        .sum()
}

/// The mean of `samples` and the half-width of its 95% confidence interval
/// (Student's t; `NaN` width for fewer than two samples).
pub fn mean_ci95(samples: &[f64]) -> (f64, f64) {
    let n = samples.len();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mean = samples.iter().sum::<f64>() / n as f64;
    if n < 2 {
        return (mean, f64::NAN);
    }
    let var = samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    (mean, t95(n - 1) * (var / n as f64).sqrt())
}

/// Student's t quantile 0.975 for `df` degrees of freedom.
fn t95(df: usize) -> f64 {
    const TABLE: [f64; 10] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    ];
    match df {
        0 => f64::NAN,
        1..=10 => TABLE[df - 1],
        11..=20 => 2.086 + (20 - df) as f64 * (2.228 - 2.086) / 10.0,
        21..=30 => 2.042 + (30 - df) as f64 * (2.086 - 2.042) / 10.0,
        _ => 1.96,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The costs the frontier's unit tests price with.
    pub(crate) const COSTS: Costs = Costs {
        launch: 60.0,
        boot: 30.0,
        release: 10.0,
    };

    /// Pods as `(start, end)`, one node each, into demand steps.
    fn steps(pods: &[(f64, f64)]) -> Vec<(f64, i64)> {
        let mut steps: Vec<(f64, i64)> =
            pods.iter().flat_map(|&(s, e)| [(s, 1), (e, -1)]).collect();
        // Ends before starts at the same instant: a node freed at t serves a
        // pod starting at t.
        steps.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        steps
    }

    /// Every way of giving each pod a node: a node that is free when the
    /// pod starts (its last pod has ended) or a new launch; each node costs
    /// a restart plus the time from its first pod's start to its last
    /// pod's end. The cheapest of them all.
    fn brute_force(pods: &[(f64, f64)], costs: Costs) -> f64 {
        let mut pods = pods.to_vec();
        pods.sort_by(|a, b| a.0.total_cmp(&b.0));
        // Each node as (first start, last end).
        fn search(pods: &[(f64, f64)], nodes: &mut Vec<(f64, f64)>, costs: Costs) -> f64 {
            let Some((&(start, end), rest)) = pods.split_first() else {
                return nodes.iter().map(|(s, e)| costs.restart() + e - s).sum();
            };
            let mut best = f64::INFINITY;
            for i in 0..nodes.len() {
                if nodes[i].1 <= start {
                    let before = nodes[i].1;
                    nodes[i].1 = end;
                    best = best.min(search(rest, nodes, costs));
                    nodes[i].1 = before;
                }
            }
            nodes.push((start, end));
            best = best.min(search(rest, nodes, costs));
            nodes.pop();
            best
        }
        search(&pods, &mut Vec::new(), costs)
    }

    #[test]
    fn one_pod_costs_its_run_a_boot_a_release_and_one_launch() {
        let best = optimum(&steps(&[(0.0, 100.0)]), COSTS);
        assert_eq!(best.launches, 1);
        assert_eq!(best.node_seconds, 100.0 + 30.0 + 10.0);
        assert_eq!(best.total(60.0), 200.0);
    }

    #[test]
    fn a_gap_shorter_than_a_restart_is_held_and_a_longer_one_is_not() {
        // Restart = 30 + 10 + 60 = 100 s.
        let held = optimum(&steps(&[(0.0, 10.0), (99.0, 109.0)]), COSTS);
        assert_eq!(
            (held.launches, held.node_seconds),
            (1, 20.0 + 99.0 - 10.0 + 40.0)
        );
        let dropped = optimum(&steps(&[(0.0, 10.0), (111.0, 121.0)]), COSTS);
        assert_eq!((dropped.launches, dropped.node_seconds), (2, 20.0 + 80.0));
    }

    #[test]
    fn levels_are_priced_apart_a_wave_of_three_then_one() {
        // Three pods, then one 50 s after they end: level 1 is held over
        // the gap, levels 2 and 3 are not needed again.
        let best = optimum(
            &steps(&[(0.0, 60.0), (0.0, 60.0), (0.0, 60.0), (110.0, 130.0)]),
            COSTS,
        );
        assert_eq!(best.launches, 3);
        assert_eq!(best.node_seconds, 3.0 * 60.0 + 3.0 * 40.0 + 50.0 + 20.0);
    }

    #[test]
    fn the_optimum_matches_a_brute_force_over_every_assignment_of_pods_to_nodes() {
        let mut rng = fastrand::Rng::with_seed(7);
        for case in 0..300 {
            let pods: Vec<(f64, f64)> = (0..rng.usize(1..=6))
                .map(|_| {
                    let start = f64::from(rng.u32(0..400));
                    (start, start + f64::from(rng.u32(1..80)))
                })
                .collect();
            let costs = Costs {
                launch: f64::from(rng.u32(0..120)),
                boot: f64::from(rng.u32(0..40)),
                release: f64::from(rng.u32(0..20)),
            };
            let fast = optimum(&steps(&pods), costs).total(costs.launch);
            let slow = brute_force(&pods, costs);
            assert!(
                (fast - slow).abs() < 1e-6,
                "case {case}: {pods:?} {costs:?}: {fast} against {slow}"
            );
        }
    }

    #[test]
    fn the_area_under_a_node_count() {
        let series = [(0.0, 0), (10.0, 2), (20.0, 1), (30.0, 0)];
        assert_eq!(area(&series), 2.0 * 10.0 + 10.0);
    }

    #[test]
    fn a_confidence_interval_of_paired_differences() {
        let (mean, half) = mean_ci95(&[1.0, 2.0, 3.0]);
        assert_eq!(mean, 2.0);
        // s = 1, n = 3: 4.303 / sqrt(3).
        assert!((half - 4.303 / 3f64.sqrt()).abs() < 1e-9, "{half}");
        assert!(mean_ci95(&[5.0]).1.is_nan());
        assert!(mean_ci95(&[]).0.is_nan());
    }
}
