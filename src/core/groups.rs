//! One window per group of nodes (`--window-per-label KEY`): each value of
//! the label has its own window, opened and extended only by new nodes that
//! carry that value, and holding only the nodes that carry it. Nodes without
//! the label, or with an empty value, form the unlabelled group. Without the
//! flag every node is in the unlabelled group: one window for the cluster.
//!
//! A manual hold belongs to no group: it holds every group, including one
//! whose first node arrives during it. It is kept with the unlabelled group's
//! window, where a record written before groups existed keeps everything, so
//! such a record reads as it is.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::grouping::UNLABELLED;
use super::window::{ManualHold, ManualHoldOutcome, Observed, Window, WindowConfig};

/// Every group's window, stored in the record as JSON: the unlabelled
/// group's fields at the top (as a record without groups has them), the other
/// groups under `groups`, by label value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Windows {
    #[serde(flatten)]
    unlabelled: Window,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    groups: BTreeMap<String, Window>,
}

impl From<Window> for Windows {
    /// One window for every node: the unlabelled group's.
    fn from(unlabelled: Window) -> Self {
        Windows {
            unlabelled,
            groups: BTreeMap::new(),
        }
    }
}

impl Windows {
    /// The group's window; `None` for a group the record does not know.
    pub fn window(&self, group: &str) -> Option<&Window> {
        if group == UNLABELLED {
            Some(&self.unlabelled)
        } else {
            self.groups.get(group)
        }
    }

    fn window_mut(&mut self, group: &str) -> &mut Window {
        if group == UNLABELLED {
            &mut self.unlabelled
        } else {
            self.groups.entry(group.to_string()).or_default()
        }
    }

    /// Every group's window: the unlabelled group's first, then by value.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Window)> {
        std::iter::once((UNLABELLED, &self.unlabelled))
            .chain(self.groups.iter().map(|(group, w)| (group.as_str(), w)))
    }

    /// The manual hold, which holds every group (it may have ended until a
    /// pass ticks it).
    pub fn manual(&self) -> Option<&ManualHold> {
        self.unlabelled.manual()
    }

    fn manual_until(&self) -> Option<Timestamp> {
        self.manual().map(|manual| manual.until)
    }

    /// Catches every group's window up with its nodes, given as (group,
    /// creation), and closes what ended by `now` (see
    /// [`Window::observe_all`]). Returns what each node did, in the order
    /// given. A group that has no node left and holds nothing is forgotten.
    pub fn observe_all<'g>(
        &mut self,
        nodes: impl IntoIterator<Item = (&'g str, Timestamp)>,
        now: Timestamp,
        cfg: &WindowConfig,
    ) -> Vec<Observed> {
        let nodes: Vec<(&str, Timestamp)> = nodes.into_iter().collect();
        let mut by_group: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, &(group, _)) in nodes.iter().enumerate() {
            by_group.entry(group).or_default().push(i);
        }
        let mut observed = vec![Observed::Unchanged; nodes.len()];
        for (&group, indices) in &by_group {
            let creations = indices.iter().map(|&i| nodes[i].1);
            let group_cfg = cfg.for_group(group);
            let seen = self
                .window_mut(group)
                .observe_all(creations, now, &group_cfg);
            for (&i, what) in indices.iter().zip(seen) {
                observed[i] = what;
            }
        }
        // A group without nodes now closes too, when its time comes.
        self.unlabelled.tick(now);
        self.groups.values_mut().for_each(|w| {
            w.tick(now);
        });
        self.forget_idle(&by_group.into_keys().collect());
        observed
    }

    /// Drops the labelled groups that have no node and hold nothing: a node
    /// of such a group arriving later is new and opens a window.
    fn forget_idle(&mut self, present: &BTreeSet<&str>) {
        self.groups
            .retain(|group, w| w.is_held() || present.contains(group.as_str()));
    }

    /// Until when the nodes of `group` are held at `now`: by its group's
    /// window or by the manual hold, whichever ends later; `None` when
    /// neither holds them.
    pub fn held_until(&self, group: &str, now: Timestamp) -> Option<Timestamp> {
        self.deadline(group).filter(|&end| now < end)
    }

    /// Until when the manual hold holds every node, if it does at `now`.
    pub fn manual_held_until(&self, now: Timestamp) -> Option<Timestamp> {
        self.manual_until().filter(|&end| now < end)
    }

    /// When the hold of every node in `group` ends: its window's deadline or
    /// the manual hold's end, whichever is later.
    pub fn deadline(&self, group: &str) -> Option<Timestamp> {
        let own = self.window(group).and_then(Window::deadline);
        own.max(self.manual_until())
    }

    /// Whether `group` is held at `now` (a deadline may pass before a pass).
    pub fn holds(&self, group: &str, now: Timestamp) -> bool {
        self.deadline(group).is_some_and(|deadline| now < deadline)
    }

    /// The latest deadline of any group (the manual hold's included).
    pub fn latest_deadline(&self) -> Option<Timestamp> {
        self.iter().filter_map(|(_, w)| w.deadline()).max()
    }

    /// When a pass must run next to close what ends (see
    /// [`Window::next_wake`]).
    pub fn next_wake(&self) -> Option<Timestamp> {
        self.iter().filter_map(|(_, w)| w.next_wake()).min()
    }

    /// Holds every group until `hold.until` (see [`Window::hold_manually`]).
    pub fn hold_manually(&mut self, hold: ManualHold, now: Timestamp) -> ManualHoldOutcome {
        self.unlabelled.hold_manually(hold, now)
    }

    /// Closes windows now (the `release` command): every group's, and the
    /// manual hold, or only `group`'s window (the manual hold, if any, still
    /// holds it). Returns whether anything that was holding ended.
    pub fn release_now(&mut self, now: Timestamp, group: Option<&str>) -> bool {
        match group {
            Some(group) => self.window_mut(group).release_window(now),
            None => {
                let manual = self.unlabelled.release_now(now);
                self.groups
                    .values_mut()
                    .fold(manual, |any, w| w.release_window(now) || any)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::core::grouping::Grouping;

    fn t(m: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + m * 60).unwrap()
    }

    fn cfg() -> WindowConfig {
        WindowConfig {
            hold: Duration::from_secs(10 * 60),
            max_hold: Some(Duration::from_secs(30 * 60)),
            groups: Grouping::per_label(Some("pool".into())),
            group_holds: BTreeMap::new(),
        }
    }

    fn hold(until: i64) -> ManualHold {
        ManualHold {
            requested_at: t(0),
            until: t(until),
            by: "ops".into(),
            reason: "rollout".into(),
        }
    }

    #[test]
    fn a_record_without_groups_reads_as_the_unlabelled_groups_window() {
        let mut w = Window::default();
        w.observe(t(0), t(0), &cfg());
        let json = serde_json::to_string(&w).unwrap();
        let read: Windows = serde_json::from_str(&json).unwrap();
        assert_eq!(read, Windows::from(w));
        assert_eq!(
            serde_json::to_string(&read).unwrap(),
            json,
            "written the same way"
        );
        assert_eq!(read.iter().count(), 1);
    }

    #[test]
    fn a_group_with_a_hold_of_its_own_holds_that_long_and_the_others_the_default() {
        let mut cfg = cfg();
        cfg.group_holds = BTreeMap::from([("gpu".to_string(), Duration::from_secs(3 * 60))]);
        let mut w = Windows::default();
        w.observe_all([("gpu", t(0)), ("general", t(0))], t(0), &cfg);
        assert_eq!(w.deadline("gpu"), Some(t(3)));
        assert_eq!(w.deadline("general"), Some(t(10)));
        assert_eq!(w.held_until("gpu", t(1)), Some(t(3)));
        // A later node extends the group by the group's own hold.
        w.observe_all([("gpu", t(2))], t(2), &cfg);
        assert_eq!(w.deadline("gpu"), Some(t(5)));
        w.observe_all([("gpu", t(2)), ("general", t(0))], t(6), &cfg);
        assert!(w.window("gpu").is_some_and(|w| w.open().is_none()));
        assert_eq!(w.deadline("general"), Some(t(10)));
    }

    #[test]
    fn a_groups_new_node_opens_and_holds_only_its_group() {
        let cfg = cfg();
        let mut w = Windows::default();
        let observed = w.observe_all([("gpu", t(0)), ("general", t(-60))], t(0), &cfg);
        assert_eq!(observed, [Observed::Opened, Observed::Expired]);
        assert_eq!(w.held_until("gpu", t(1)), Some(t(10)));
        assert_eq!(w.held_until("general", t(1)), None);
        assert_eq!(w.held_until(UNLABELLED, t(1)), None);
        // Another group's new node extends its own window only.
        w.observe_all([("gpu", t(0)), ("general", t(5))], t(5), &cfg);
        assert_eq!(w.deadline("gpu"), Some(t(10)));
        assert_eq!(w.deadline("general"), Some(t(15)));
        assert_eq!(w.latest_deadline(), Some(t(15)));
        assert_eq!(w.next_wake(), Some(t(10)));
        let json = serde_json::to_value(&w).unwrap();
        assert!(json["groups"]["gpu"]["open"].is_object(), "{json}");
    }

    #[test]
    fn the_manual_hold_holds_every_group_even_one_that_appears_later() {
        let cfg = cfg();
        let mut w = Windows::default();
        w.observe_all([("general", t(-60))], t(0), &cfg);
        assert_eq!(w.hold_manually(hold(45), t(0)), ManualHoldOutcome::Started);
        assert_eq!(w.held_until("general", t(1)), Some(t(45)));
        assert_eq!(w.held_until("gpu", t(1)), Some(t(45)));
        assert!(w.holds("gpu", t(44)) && !w.holds("gpu", t(45)));
        // Releasing one group leaves the manual hold, which still holds it.
        assert!(!w.release_now(t(2), Some("general")));
        assert_eq!(w.held_until("general", t(3)), Some(t(45)));
        // Releasing everything ends it.
        assert!(w.release_now(t(3), None));
        assert_eq!(w.manual(), None);
        assert_eq!(w.held_until("general", t(4)), None);
    }

    #[test]
    fn releasing_one_group_leaves_the_others_open() {
        let cfg = cfg();
        let mut w = Windows::default();
        w.observe_all(
            [("gpu", t(0)), ("general", t(0)), (UNLABELLED, t(0))],
            t(0),
            &cfg,
        );
        assert!(w.release_now(t(2), Some("gpu")));
        assert_eq!(w.held_until("gpu", t(3)), None);
        assert_eq!(w.held_until("general", t(3)), Some(t(10)));
        assert!(w.release_now(t(3), None));
        assert!(w.iter().all(|(_, w)| !w.is_open(t(3))));
        // The released nodes are consumed: seen again, they open nothing.
        let observed = w.observe_all([("gpu", t(0)), ("general", t(0))], t(4), &cfg);
        assert_eq!(observed, [Observed::Consumed, Observed::Consumed]);
    }

    #[test]
    fn groups_whose_hold_ends_close_and_idle_ones_are_forgotten() {
        let cfg = cfg();
        let mut w = Windows::default();
        w.observe_all([("gpu", t(0)), ("general", t(4))], t(4), &cfg);
        w.observe_all([("gpu", t(0)), ("general", t(4))], t(12), &cfg);
        assert!(w.window("gpu").is_some_and(|w| w.open().is_none()));
        assert!(w.window("general").is_some_and(|w| w.is_open(t(12))));
        // gpu's nodes are gone and its window closed: forgotten. general,
        // with no node left but still open, stays until it closes.
        w.observe_all([], t(13), &cfg);
        assert!(w.window("gpu").is_none());
        assert!(w.window("general").is_some_and(|w| w.is_open(t(13))));
        w.observe_all([], t(20), &cfg);
        assert_eq!(w.iter().count(), 1);
    }
}
