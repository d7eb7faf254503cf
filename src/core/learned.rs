//! The learned hold (`--hold-policy learned`): how long a group's window
//! holds after its last work, chosen from the idle gaps the group has shown
//! and what the operator says a launch costs.
//!
//! Holding an idle node until the next work costs the gap; letting it go
//! costs the hold spent waiting plus a launch when the work comes. For a hold
//! `h` and a gap `g` (both per node), the cost is `g` if `g <= h`, else
//! `h + launch`. The learned hold is the `h` in `[floor, ceiling]` whose mean
//! cost over the remembered gaps is least (ties: the shorter): a high
//! percentile of the gaps when launches are dear, the floor when the gaps are
//! long (the next wave is unlikely to come in time). With too few gaps it
//! falls back to `--hold-duration`, as the serverless keep-alive policies
//! fall back to a fixed keep-alive while a histogram is unrepresentative.
//!
//! Only gaps of at least the floor are remembered: shorter ones are held
//! whatever the choice, and within a busy stretch work comes every few
//! seconds. A gap is measured from the group's last work to its next (a new
//! node, or with `--window-follows-work` work on a held node), as passes see
//! them; a pass that misses work in between sees one longer gap.

use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// How many of a group's last gaps are remembered.
pub const KEPT_GAPS: usize = 20;
/// Fewer gaps than this, and the hold falls back to `--hold-duration`.
pub const MIN_GAPS: usize = 3;

/// What one group has shown: when work last landed, and its last gaps
/// (whole seconds, oldest first). Kept in the record with the group's window.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct History {
    #[serde(skip_serializing_if = "Option::is_none")]
    last_work: Option<Timestamp>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    gap_seconds: Vec<u64>,
}

impl History {
    /// Counts work seen at `at`: the gap since the last work is remembered
    /// when it is at least `floor`. Work older than the last changes
    /// nothing. Returns the gap remembered, if any.
    pub fn work(&mut self, at: Timestamp, floor: Duration) -> Option<Duration> {
        let last = self.last_work.replace(at.max(self.last_work.unwrap_or(at)));
        let gap = Duration::try_from(at.duration_since(last?)).ok()?;
        if gap.is_zero() || gap < floor {
            return None;
        }
        self.gap_seconds.push(gap.as_secs());
        let over = self.gap_seconds.len().saturating_sub(KEPT_GAPS);
        self.gap_seconds.drain(..over);
        Some(gap)
    }

    /// When work last landed, if ever.
    pub fn last_work(&self) -> Option<Timestamp> {
        self.last_work
    }

    /// The remembered gaps, oldest first.
    pub fn gaps(&self) -> impl Iterator<Item = Duration> + '_ {
        self.gap_seconds.iter().map(|&s| Duration::from_secs(s))
    }

    pub fn is_empty(&self) -> bool {
        self.last_work.is_none() && self.gap_seconds.is_empty()
    }
}

/// The operator's terms for the learned hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LearnedHold {
    /// What a launch costs beyond its node-seconds (`--launch-cost`).
    pub launch_cost: Duration,
    /// The shortest and longest hold it may choose.
    pub floor: Duration,
    pub ceiling: Duration,
    /// The hold while a group has shown fewer than [`MIN_GAPS`] gaps.
    pub fallback: Duration,
}

/// A group's hold and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub hold: Duration,
    pub why: Why,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// `shorter` of the last `of` gaps were no longer than the hold.
    Learned { shorter: usize, of: usize },
    /// Only `have` gaps so far: the fallback.
    TooFewGaps { have: usize },
}

impl LearnedHold {
    /// The hold for a group with `history`.
    pub fn choose(&self, history: &History) -> Choice {
        let gaps: Vec<Duration> = history.gaps().collect();
        self.choose_from(&gaps)
    }

    /// The hold for the idle `gaps` seen (the last [`KEPT_GAPS`] of them at
    /// least `floor`, as [`History`] keeps them).
    pub fn choose_from(&self, gaps: &[Duration]) -> Choice {
        if gaps.len() < MIN_GAPS {
            return Choice {
                hold: self
                    .fallback
                    .clamp(self.floor, self.ceiling.max(self.floor)),
                why: Why::TooFewGaps { have: gaps.len() },
            };
        }
        let ceiling = self.ceiling.max(self.floor);
        let candidates = std::iter::once(self.floor).chain(
            gaps.iter()
                .copied()
                .filter(|g| *g > self.floor && *g <= ceiling),
        );
        let mut best = (self.floor, f64::INFINITY);
        for hold in candidates {
            let cost = self.mean_cost(gaps, hold);
            if cost < best.1 || (cost == best.1 && hold < best.0) {
                best = (hold, cost);
            }
        }
        let hold = best.0;
        Choice {
            hold,
            why: Why::Learned {
                shorter: gaps.iter().filter(|g| **g <= hold).count(),
                of: gaps.len(),
            },
        }
    }

    /// The mean cost per node of holding `hold` after work, over `gaps`.
    fn mean_cost(&self, gaps: &[Duration], hold: Duration) -> f64 {
        let launch = self.launch_cost.as_secs_f64();
        let sum: f64 = gaps
            .iter()
            .map(|g| {
                if *g <= hold {
                    g.as_secs_f64()
                } else {
                    hold.as_secs_f64() + launch
                }
            })
            .sum();
        sum / gaps.len() as f64
    }
}

impl Choice {
    /// One line for `status`: "holding 7m: 8 of the last 10 gaps were
    /// shorter; a launch counts as 5 node-minutes".
    pub fn explain(&self, launch_cost: Duration) -> String {
        let hold = humantime::format_duration(self.hold);
        let secs = launch_cost.as_secs();
        let launch = if secs >= 60 && secs.is_multiple_of(60) {
            format!("{} node-minutes", secs / 60)
        } else {
            format!("{secs} node-seconds")
        };
        let reason = match self.why {
            Why::Learned { shorter, of } => {
                format!("{shorter} of the last {of} gaps were no longer")
            }
            Why::TooFewGaps { have } => {
                format!("{have} of {MIN_GAPS} gaps seen so far, the fixed hold until then")
            }
        };
        format!("holding {hold}: {reason}; a launch counts as {launch}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn mins(m: u64) -> Duration {
        Duration::from_secs(m * 60)
    }

    fn terms(launch_minutes: u64) -> LearnedHold {
        LearnedHold {
            launch_cost: mins(launch_minutes),
            floor: mins(1),
            ceiling: mins(30),
            fallback: mins(10),
        }
    }

    fn history(gap_minutes: &[u64]) -> History {
        let mut h = History::default();
        let mut at = 0;
        h.work(t(at), mins(1));
        for g in gap_minutes {
            at += i64::try_from(g * 60).unwrap();
            h.work(t(at), mins(1));
        }
        h
    }

    #[test]
    fn gaps_shorter_than_the_floor_and_old_work_are_not_remembered() {
        let mut h = History::default();
        assert_eq!(h.work(t(0), mins(1)), None, "no work before");
        assert_eq!(h.work(t(30), mins(1)), None, "within a busy stretch");
        assert_eq!(h.work(t(300), mins(1)), Some(Duration::from_secs(270)));
        assert_eq!(h.work(t(200), mins(1)), None, "older than the last");
        assert_eq!(h.work(t(420), mins(1)), Some(mins(2)));
        assert_eq!(
            h.gaps().collect::<Vec<_>>(),
            [Duration::from_secs(270), mins(2)]
        );
        let json = serde_json::to_value(&h).unwrap();
        assert_eq!(json["gapSeconds"], serde_json::json!([270, 120]));
        assert_eq!(serde_json::from_value::<History>(json).unwrap(), h);
    }

    #[test]
    fn only_the_last_gaps_are_kept_even_from_an_oversized_record() {
        let h = history(&[2; KEPT_GAPS + 5]);
        assert_eq!(h.gaps().count(), KEPT_GAPS);
        let mut big: History =
            serde_json::from_value(serde_json::json!({"gapSeconds": vec![120; 30]})).unwrap();
        big.work(t(0), mins(1));
        big.work(t(600), mins(1));
        assert_eq!(big.gaps().count(), KEPT_GAPS);
        assert_eq!(big.gaps().last(), Some(mins(10)));
    }

    #[test]
    fn too_few_gaps_fall_back_to_the_fixed_hold() {
        let choice = terms(5).choose(&history(&[2, 3]));
        assert_eq!(choice.hold, mins(10));
        assert_eq!(choice.why, Why::TooFewGaps { have: 2 });
    }

    #[test]
    fn a_busy_group_is_held_over_its_gaps_and_a_quiet_one_let_go() {
        // Waves every 4-6 minutes: holding 6m covers them all, and 6 idle
        // minutes are cheaper than a launch of 15.
        let busy = terms(15).choose(&history(&[4, 5, 6, 4, 5, 6]));
        assert_eq!(busy.hold, mins(6));
        assert_eq!(busy.why, Why::Learned { shorter: 6, of: 6 });
        // Gaps of hours: no hold pays for itself; the floor.
        let quiet = terms(15).choose(&history(&[120, 180, 240]));
        assert_eq!(quiet.hold, mins(1));
        // A cheap launch does not pay for a 4-minute wait either.
        assert_eq!(terms(1).choose(&history(&[4, 5, 6])).hold, mins(1));
    }

    #[test]
    fn the_status_line_says_the_hold_and_why() {
        let choice = terms(15).choose(&history(&[4, 5, 6, 40]));
        assert_eq!(
            choice.explain(mins(15)),
            "holding 6m: 3 of the last 4 gaps were no longer; a launch counts as 15 node-minutes"
        );
    }

    proptest! {
        #[test]
        fn the_hold_stays_within_its_bounds_and_is_cheapest_among_them(
            gaps in prop::collection::vec(0u64..7200, 0..30),
            launch in 0u64..3600,
            floor in 0u64..600,
            span in 0u64..7200,
        ) {
            let lh = LearnedHold {
                launch_cost: Duration::from_secs(launch),
                floor: Duration::from_secs(floor),
                ceiling: Duration::from_secs(floor + span),
                fallback: mins(10),
            };
            let mut h = History::default();
            let mut at = 0i64;
            h.work(t(at), lh.floor);
            for g in &gaps {
                at += i64::try_from(*g).unwrap();
                h.work(t(at), lh.floor);
            }
            let choice = lh.choose(&h);
            prop_assert!(choice.hold >= lh.floor && choice.hold <= lh.ceiling);
            if let Why::Learned { .. } = choice.why {
                // No hold in the bounds, second by second, costs less.
                let remembered: Vec<Duration> = h.gaps().collect();
                let best = lh.mean_cost(&remembered, choice.hold);
                for s in (floor..=floor + span).step_by(37) {
                    let other = lh.mean_cost(&remembered, Duration::from_secs(s));
                    prop_assert!(best <= other + 1e-9, "{s}s costs {other} < {best}");
                }
            }
        }

        #[test]
        fn a_dearer_launch_never_shortens_the_hold(
            gaps in prop::collection::vec(60u64..7200, 3..20),
            launch in 0u64..1800,
            more in 0u64..1800,
        ) {
            let mut h = History::default();
            let mut at = 0i64;
            h.work(t(at), mins(1));
            for g in &gaps {
                at += i64::try_from(*g).unwrap();
                h.work(t(at), mins(1));
            }
            let at_cost = |l: u64| LearnedHold {
                launch_cost: Duration::from_secs(l),
                ..terms(0)
            }
            .choose(&h)
            .hold;
            prop_assert!(at_cost(launch + more) >= at_cost(launch));
        }
    }
}
