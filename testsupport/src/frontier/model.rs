//! A model of a per-node keep-alive on a day's demand: Karpenter's
//! `consolidateAfter`, or node-holder's per-node hold, as a policy that says
//! how long an idle node is kept. It prices a policy over many seeds in a
//! moment, so that hold policies can be compared before a run with the real
//! Karpenter measures the few worth measuring; its figures are a model's, and
//! `benches/keepalive.rs` prints them beside the real runs it is calibrated
//! against.
//!
//! As the clairvoyant optimum ([`super::optimum`]) does, it splits the demand
//! into levels: level `k` is needed while at least `k` nodes are. When a level
//! falls idle, the node that served it is kept for the policy's hold and then
//! for Karpenter's `reaction` (its disruption loop finding, validating and
//! deleting the node); if the level is needed again by then, the node serves
//! it and the gap costs its length; otherwise the gap costs the hold and the
//! reaction, and the level's next stretch a boot and a launch. (Karpenter keeps
//! the most recently busy nodes no longer than the others, so a level
//! decomposition is the model's simplification: the real scheduler does not
//! always put a new pod on the node a level would.)

use super::{Costs, Priced, Steps};

/// One idle gap of one demand level: when the level fell idle and for how
/// long (infinite: it was never needed again).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gap {
    /// The level: 1 is needed whenever anything is.
    pub level: usize,
    pub start: f64,
    pub length: f64,
}

/// The stretches and gaps of every demand level.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Levels {
    /// Seconds some level was needed, summed over the levels.
    pub busy: f64,
    /// Levels that were needed at all: each is launched once at first.
    pub used: usize,
    /// Every level's idle gaps, the last one of each infinite, in the order
    /// they started.
    pub gaps: Vec<Gap>,
}

/// The levels of the demand `steps` (in time order), as the optimum splits
/// them.
pub fn levels(steps: &Steps) -> Levels {
    let mut out = Levels::default();
    for (k, level) in super::levels(steps).iter().enumerate() {
        if !level.started {
            continue;
        }
        out.used += 1;
        out.busy += level.busy;
        let finished = level.gaps.iter().copied();
        let last = level.idle_since.map(|since| (since, f64::INFINITY));
        for (start, length) in finished.chain(last) {
            out.gaps.push(Gap {
                level: k + 1,
                start,
                length,
            });
        }
    }
    out.gaps.sort_by(|a, b| a.start.total_cmp(&b.start));
    out
}

/// The day's cost when each idle node is kept for `hold(gap, seen)`
/// seconds: `gap` the level that fell idle and when (not its length), `seen`
/// the gaps that had ended by then (all of them, kept or not: the policy is
/// told how long each gap was, as a policy that matches launches to the nodes
/// it let go would learn). `costs.release` is Karpenter's reaction after the
/// hold.
pub fn keep_alive(
    levels: &Levels,
    costs: Costs,
    mut hold: impl FnMut(&Gap, &[Gap]) -> f64,
) -> Priced {
    let mut launches = levels.used;
    let mut node_seconds = levels.busy + costs.boot * levels.used as f64;
    let mut ended: Vec<Gap> = levels
        .gaps
        .iter()
        .filter(|g| g.length.is_finite())
        .copied()
        .collect();
    ended.sort_by(|a, b| (a.start + a.length).total_cmp(&(b.start + b.length)));
    let mut seen: Vec<Gap> = Vec::new();
    let mut next = 0;
    for gap in &levels.gaps {
        while next < ended.len() && ended[next].start + ended[next].length <= gap.start {
            seen.push(ended[next]);
            next += 1;
        }
        let asked = Gap {
            length: f64::NAN,
            ..*gap
        };
        let kept = hold(&asked, &seen).max(0.0) + costs.release;
        if gap.length <= kept {
            node_seconds += gap.length;
        } else {
            node_seconds += kept;
            if gap.length.is_finite() {
                launches += 1;
                node_seconds += costs.boot;
            }
        }
    }
    Priced {
        launches,
        node_seconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontier::tests::COSTS;

    #[test]
    fn levels_list_every_gap_with_the_last_one_open() {
        // Two pods, then one after a 40 s gap.
        let steps = [(0.0, 2), (50.0, -2), (90.0, 1), (100.0, -1)];
        let l = levels(&steps);
        assert_eq!(l.used, 2);
        assert_eq!(l.busy, 2.0 * 50.0 + 10.0);
        assert_eq!(
            l.gaps,
            [
                Gap {
                    level: 1,
                    start: 50.0,
                    length: 40.0
                },
                Gap {
                    level: 2,
                    start: 50.0,
                    length: f64::INFINITY
                },
                Gap {
                    level: 1,
                    start: 100.0,
                    length: f64::INFINITY
                },
            ]
        );
    }

    #[test]
    fn a_gap_within_the_hold_and_reaction_is_kept_a_longer_one_relaunches() {
        let steps = [(0.0, 1), (50.0, -1), (90.0, 1), (100.0, -1)];
        let l = levels(&steps);
        // Hold 30 + reaction 10 covers the 40 s gap: one launch, the gap
        // paid, and the end's hold and reaction.
        let kept = keep_alive(&l, COSTS, |_, _| 30.0);
        assert_eq!(kept.launches, 1);
        assert_eq!(kept.node_seconds, 60.0 + 30.0 + 40.0 + 40.0);
        // A hold of 0: the node goes 10 s after the level falls idle and the
        // level's next stretch boots again.
        let dropped = keep_alive(&l, COSTS, |_, _| 0.0);
        assert_eq!(dropped.launches, 2);
        assert_eq!(dropped.node_seconds, 60.0 + 2.0 * 30.0 + 10.0 + 10.0);
    }

    #[test]
    fn the_policy_is_told_only_the_gaps_that_ended_before() {
        let steps = [
            (0.0, 1),
            (10.0, -1),
            (30.0, 1),
            (40.0, -1),
            (100.0, 1),
            (110.0, -1),
        ];
        let l = levels(&steps);
        let mut asked = Vec::new();
        keep_alive(&l, COSTS, |gap, seen| {
            assert!(
                gap.length.is_nan(),
                "the policy is not told the gap's length"
            );
            asked.push((gap.start, seen.iter().map(|g| g.length).collect::<Vec<_>>()));
            0.0
        });
        assert_eq!(
            asked,
            [
                (10.0, vec![]),
                (40.0, vec![20.0]),
                (110.0, vec![20.0, 60.0])
            ]
        );
    }

    /// With a hold as long as a restart minus the reaction, the keep-alive
    /// keeps exactly the gaps the clairvoyant keeps and pays only the
    /// holds' tails on top: never cheaper than the optimum.
    #[test]
    fn no_keep_alive_is_cheaper_than_the_clairvoyant_optimum() {
        let mut rng = fastrand::Rng::with_seed(11);
        for _ in 0..200 {
            let mut steps: Vec<(f64, i64)> = (0..rng.usize(1..=8))
                .flat_map(|_| {
                    let start = f64::from(rng.u32(0..600));
                    [(start, 1), (start + f64::from(rng.u32(1..120)), -1)]
                })
                .collect();
            steps.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let l = levels(&steps);
            let best = super::super::optimum(&steps, COSTS).total(COSTS.launch);
            for hold in [0.0, 20.0, 60.0, 300.0] {
                let priced = keep_alive(&l, COSTS, |_, _| hold).total(COSTS.launch);
                assert!(priced >= best - 1e-6, "{steps:?} {hold}: {priced} < {best}");
            }
        }
    }
}
