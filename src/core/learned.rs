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
//! seconds. What a gap is depends on what is held:
//! - `cluster` scope holds the group as one, so a gap is the group's: from
//!   its last work to its next (a new node, or with `--window-follows-work`
//!   work on a held node), as passes see them; a pass that misses work in
//!   between sees one longer gap.
//! - `node` scope holds each node from its own last work, so a gap is a
//!   node's ([`NodeGaps`]): from its last work to the next work on it, or,
//!   for a node that went away, to the group's next launch (the launch it
//!   would have saved had it been held: the newest such node first, as the
//!   clairvoyant optimum matches demand levels). A node that went away and
//!   was not matched within the ceiling counts as a gap longer than any
//!   hold. So a busy pool, whose group is never idle, still learns.

use std::collections::HashMap;
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::plus;

/// How many of a group's last gaps are remembered.
pub const KEPT_GAPS: usize = 50;
/// How many of a group's gone nodes wait to be matched to a launch.
pub const KEPT_IDLE: usize = 100;
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
    /// `node` scope: since when each node that went away had been idle (its
    /// last work), oldest first, until a launch matches it or the ceiling
    /// passes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    gone_idle_since: Vec<Timestamp>,
}

impl History {
    /// Counts work seen at `at`: the gap since the last work is remembered
    /// when it is at least `floor`. Work older than the last changes
    /// nothing. Returns the gap remembered, if any.
    pub fn work(&mut self, at: Timestamp, floor: Duration) -> Option<Duration> {
        let last = self.touch(at)?;
        self.remember(last, at, floor)
    }

    /// Counts what one of the group's nodes did between two passes
    /// (`node` scope); returns the gap remembered, if any.
    pub fn node(&mut self, change: NodeChange, terms: &LearnedHold) -> Option<Duration> {
        match change {
            NodeChange::Worked { since, at } => {
                self.touch(at);
                self.remember(since, at, terms.floor)
            }
            NodeChange::Gone { idle_since } => {
                let at = self.gone_idle_since.partition_point(|&t| t <= idle_since);
                self.gone_idle_since.insert(at, idle_since);
                let over = self.gone_idle_since.len().saturating_sub(KEPT_IDLE);
                self.gone_idle_since.drain(..over);
                None
            }
            NodeChange::Launched { at } => {
                self.touch(at);
                // The newest gone node idle by then: the level it served.
                let newest = self.gone_idle_since.partition_point(|&t| t <= at);
                let since = self.gone_idle_since.remove(newest.checked_sub(1)?);
                self.remember(since, at, terms.floor)
            }
        }
    }

    /// `node` scope: the gone nodes no launch has matched by `now` within
    /// the ceiling are remembered as gaps as long as they have waited
    /// (longer than any hold). Returns how many.
    pub fn expire_gone(&mut self, now: Timestamp, terms: &LearnedHold) -> usize {
        let ceiling = terms.longest();
        let expired = self
            .gone_idle_since
            .partition_point(|&since| plus(since, ceiling) < now);
        let waited: Vec<Timestamp> = self.gone_idle_since.drain(..expired).collect();
        // Kept in whole seconds: at least a second past the ceiling, so
        // that no hold in the bounds counts as having covered it.
        for since in &waited {
            self.remember(*since, now.max(terms.past_ceiling(*since)), terms.floor);
        }
        waited.len()
    }

    /// When [`History::expire_gone`] next has something to count: a second
    /// past the ceiling of the oldest gone node waiting.
    pub fn next_expiry(&self, terms: &LearnedHold) -> Option<Timestamp> {
        Some(terms.past_ceiling(*self.gone_idle_since.first()?))
    }

    /// Moves the last work to `at` if later; returns the one before.
    fn touch(&mut self, at: Timestamp) -> Option<Timestamp> {
        self.last_work.replace(at.max(self.last_work.unwrap_or(at)))
    }

    /// Remembers the gap from `from` to `to` when it is at least `floor`.
    fn remember(&mut self, from: Timestamp, to: Timestamp, floor: Duration) -> Option<Duration> {
        let gap = Duration::try_from(to.duration_since(from)).ok()?;
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

    /// How many gone nodes wait to be matched to a launch.
    pub fn gone_waiting(&self) -> usize {
        self.gone_idle_since.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last_work.is_none() && self.gap_seconds.is_empty() && self.gone_idle_since.is_empty()
    }
}

/// What one node in `node` scope did between two passes, as [`NodeGaps`]
/// tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeChange {
    /// Work landed on it `at`, after none `since`.
    Worked { since: Timestamp, at: Timestamp },
    /// It went away, idle since its last work.
    Gone { idle_since: Timestamp },
    /// It is new, launched `at`.
    Launched { at: Timestamp },
}

/// Each node's group and last work (or creation) as the last pass saw them,
/// to tell what each node did by the next: the `node` scope's gaps. Kept in
/// memory only (a node each); a new leader starts with its first pass and
/// learns from the second, as the record keeps what was learned.
#[derive(Debug, Default)]
pub struct NodeGaps {
    last: Option<HashMap<String, Seen>>,
}

/// One node in `node` scope as a pass sees it.
#[derive(Debug, Clone, Copy)]
pub struct NodeSeen<'a> {
    pub name: &'a str,
    pub group: &'a str,
    pub created: Timestamp,
    /// Its last work, when known (else its creation counts).
    pub last_work: Option<Timestamp>,
}

/// What [`NodeGaps`] keeps of a node between passes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    group: String,
    created: Timestamp,
    /// Its last work, or its creation if later or unknown.
    last: Timestamp,
}

impl NodeGaps {
    /// What each node did since the last pass, with its group, gone nodes
    /// first and then in time order (so that a launch can match a node that
    /// went just before it). The first pass tells nothing.
    pub fn pass<'a>(
        &mut self,
        nodes: impl IntoIterator<Item = NodeSeen<'a>>,
    ) -> Vec<(String, NodeChange)> {
        let now: HashMap<String, Seen> = nodes
            .into_iter()
            .map(|n| {
                let seen = Seen {
                    group: n.group.to_string(),
                    created: n.created,
                    last: n.last_work.unwrap_or(n.created).max(n.created),
                };
                (n.name.to_string(), seen)
            })
            .collect();
        let changes = self.last.as_ref().map(|before| changes(before, &now));
        self.last = Some(now);
        changes.unwrap_or_default()
    }
}

/// What changed from `before` to `now`.
fn changes(
    before: &HashMap<String, Seen>,
    now: &HashMap<String, Seen>,
) -> Vec<(String, NodeChange)> {
    // (gone first, when, group, what)
    let mut out: Vec<(bool, Timestamp, &str, NodeChange)> = Vec::new();
    for (name, was) in before {
        match now.get(name) {
            None => out.push((
                false,
                was.last,
                &was.group,
                NodeChange::Gone {
                    idle_since: was.last,
                },
            )),
            Some(is) if is.last > was.last => out.push((
                true,
                is.last,
                &was.group,
                NodeChange::Worked {
                    since: was.last,
                    at: is.last,
                },
            )),
            Some(_) => {}
        }
    }
    for (name, is) in now {
        if !before.contains_key(name) {
            let at = is.created;
            out.push((true, at, &is.group, NodeChange::Launched { at }));
        }
    }
    out.sort_by(|a, b| (a.0, a.1, a.2).cmp(&(b.0, b.1, b.2)));
    out.into_iter()
        .map(|(_, _, group, change)| (group.to_string(), change))
        .collect()
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
    /// The longest hold it may choose: the ceiling, or the floor if that is
    /// higher.
    fn longest(&self) -> Duration {
        self.ceiling.max(self.floor)
    }

    /// A second past [`LearnedHold::longest`] after `since`: the least a gap
    /// that no hold covered is remembered as, and when one from `since` is
    /// known to be such a gap.
    fn past_ceiling(&self, since: Timestamp) -> Timestamp {
        plus(since, self.longest().saturating_add(Duration::from_secs(1)))
    }
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
                hold: self.fallback.clamp(self.floor, self.longest()),
                why: Why::TooFewGaps { have: gaps.len() },
            };
        }
        let ceiling = self.longest();
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
            serde_json::from_value(serde_json::json!({"gapSeconds": vec![120; KEPT_GAPS + 10]}))
                .unwrap();
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

    fn seen<'a>(name: &'a str, created: i64, last: Option<i64>) -> NodeSeen<'a> {
        NodeSeen {
            name,
            group: "g",
            created: t(created),
            last_work: last.map(t),
        }
    }

    #[test]
    fn node_gaps_tell_gone_nodes_first_then_work_and_launches_in_time_order() {
        let mut gaps = NodeGaps::default();
        let first = gaps.pass([
            seen("a", 0, Some(30)),
            seen("b", 0, None),
            seen("c", 0, None),
        ]);
        assert_eq!(first, [], "the first pass only looks");
        let second = gaps.pass([
            // Work again on a, none on c, b gone, d and e new.
            seen("a", 0, Some(200)),
            seen("c", 0, None),
            seen("e", 190, Some(195)),
            seen("d", 150, None),
        ]);
        let g = |c| ("g".to_string(), c);
        assert_eq!(
            second,
            [
                g(NodeChange::Gone { idle_since: t(0) }),
                g(NodeChange::Launched { at: t(150) }),
                g(NodeChange::Launched { at: t(190) }),
                g(NodeChange::Worked {
                    since: t(30),
                    at: t(200)
                }),
            ]
        );
        assert_eq!(
            gaps.pass([seen("a", 0, Some(200))]).len(),
            3,
            "c, d, e gone"
        );
    }

    #[test]
    fn a_launch_matches_the_newest_node_gone_idle_before_it() {
        let terms = terms(5);
        let mut h = History::default();
        for since in [0, 600, 300] {
            h.node(
                NodeChange::Gone {
                    idle_since: t(since),
                },
                &terms,
            );
        }
        h.node(NodeChange::Gone { idle_since: t(900) }, &terms);
        // At 800 the node idle since 900 was busy still: the one since 600.
        let gap = h.node(NodeChange::Launched { at: t(800) }, &terms);
        assert_eq!(gap, Some(Duration::from_secs(200)));
        assert_eq!(
            h.node(NodeChange::Launched { at: t(1000) }, &terms),
            Some(mins(1) + Duration::from_secs(40))
        );
        assert_eq!(h.gone_waiting(), 2);
        // Work on a node that stayed: its own gap, if at least the floor.
        let worked = |since, at| NodeChange::Worked {
            since: t(since),
            at: t(at),
        };
        assert_eq!(h.node(worked(1000, 1030), &terms), None, "under the floor");
        assert_eq!(h.node(worked(1000, 1240), &terms), Some(mins(4)));
        assert_eq!(
            h.gaps().collect::<Vec<_>>(),
            [Duration::from_secs(200), Duration::from_secs(100), mins(4)]
        );
        assert_eq!(h.last_work(), Some(t(1240)));
        let json = serde_json::to_value(&h).unwrap();
        assert_eq!(
            json["goneIdleSince"].as_array().map(Vec::len),
            Some(2),
            "{json}"
        );
        assert_eq!(serde_json::from_value::<History>(json).unwrap(), h);
    }

    #[test]
    fn gone_nodes_no_launch_matched_within_the_ceiling_count_as_long_gaps() {
        let terms = terms(5);
        let mut h = History::default();
        h.node(NodeChange::Gone { idle_since: t(0) }, &terms);
        h.node(NodeChange::Gone { idle_since: t(600) }, &terms);
        assert_eq!(
            h.expire_gone(t(1800), &terms),
            0,
            "not past the ceiling yet"
        );
        assert_eq!(
            h.expire_gone(t(1800) + Duration::from_millis(500), &terms),
            1
        );
        assert_eq!(
            h.gaps().collect::<Vec<_>>(),
            [Duration::from_secs(1801)],
            "past the ceiling"
        );
        assert_eq!(h.gone_waiting(), 1);
        // A launch now finds only the node gone at 600.
        assert_eq!(
            h.node(NodeChange::Launched { at: t(1900) }, &terms),
            Some(Duration::from_secs(1300))
        );
        assert_eq!(h.node(NodeChange::Launched { at: t(2000) }, &terms), None);
    }

    #[test]
    fn a_busy_pool_whose_group_is_never_idle_learns_its_nodes_gaps() {
        // Two nodes busy all along with one long pod each; a third, and
        // then its replacements, come 190 s after the last one fell idle:
        // gaps the group never shows.
        let terms = terms(15);
        let mut gaps = NodeGaps::default();
        let mut h = History::default();
        let busy = |_| [seen("x", 0, Some(0)), seen("y", 0, Some(0))];
        let mut pass = |nodes: Vec<NodeSeen>, h: &mut History| {
            for (_, change) in gaps.pass(nodes) {
                h.node(change, &terms);
            }
        };
        pass(busy(0).to_vec(), &mut h);
        for n in 0..4i64 {
            let start = n * 300;
            let name = format!("z{n}");
            let mut nodes = busy(start + 5).to_vec();
            nodes.push(seen(&name, start + 10, Some(start + 120)));
            pass(nodes, &mut h);
            pass(busy(start + 200).to_vec(), &mut h);
        }
        let gap = Duration::from_secs(190);
        assert_eq!(h.gaps().collect::<Vec<_>>(), [gap; 3]);
        assert_eq!(h.gone_waiting(), 1, "the last one waits for a launch");
        assert_eq!(
            terms.choose(&h).hold,
            gap,
            "held over them: cheaper than 15m launches"
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
