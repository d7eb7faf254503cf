//! The hold window: when the nodes in scope are held, as small state that nodes' creation times
//! drive forward. Observing a node first closes a window that ended before its creation, then
//! counts it, so replaying the current nodes over the stored state reaches the state a live stream
//! did. Pure: the caller lists the nodes, keeps the state in the record and sleeps until
//! [`Window::next_wake`].

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::plus;

/// How long holds last: each new node's hold, and a window's cap from when it
/// opened (`None`: no cap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowConfig {
    pub hold: Duration,
    pub max_hold: Option<Duration>,
}

impl WindowConfig {
    /// One node's hold: `hold`, or `max_hold` when that is shorter.
    fn node_hold(&self) -> Duration {
        self.max_hold.map_or(self.hold, |max| max.min(self.hold))
    }

    /// Where a window opened at `opened_at` must end.
    pub fn cap(&self, opened_at: Timestamp) -> Option<Timestamp> {
        self.max_hold.map(|max| plus(opened_at, max))
    }
}

/// The hold window's state, stored in the record as JSON (camelCase) between
/// restarts and shown by `status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Window {
    /// The window, while it is open (until [`Window::tick`] closes it).
    #[serde(skip_serializing_if = "Option::is_none")]
    open: Option<OpenWindow>,
    /// Nodes created at or before this are consumed: they belong to a window
    /// that closed (or was released) and never open one again.
    #[serde(skip_serializing_if = "Option::is_none")]
    closed_through: Option<Timestamp>,
    /// Creation times that were in the future when first seen (clock skew), and when that was: such
    /// a node counts as created then, however often it is seen again, so it holds no longer than
    /// one that was not skewed. Dropped once consumed; empty when the clocks agree.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    future_creations: BTreeMap<Timestamp, Timestamp>,
    /// `node-holder hold`'s, until it or a release ends.
    #[serde(skip_serializing_if = "Option::is_none")]
    manual: Option<ManualHold>,
}

/// A hold an operator asked for: every node in scope is held until `until`,
/// whatever `--max-hold` says. It always has an end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManualHold {
    /// When it was asked for; names the request.
    pub requested_at: Timestamp,
    pub until: Timestamp,
    /// Who asked, as the API server knows them.
    pub by: String,
    pub reason: String,
}

/// What a manual hold request did: started, replaced one ending earlier, left
/// one lasting at least as long, or ended before it was handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManualHoldOutcome {
    Started,
    Extended,
    AlreadyLonger,
    Expired,
}

/// An open window. Its deadline may already be past until `tick` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpenWindow {
    /// Creation (clamped to now) of the node that opened it; the cap's start.
    pub opened_at: Timestamp,
    /// When it ends: the nodes it holds are held until then.
    pub deadline: Timestamp,
    /// What closing consumes: the latest creation counted, or the cap once reached (a node created
    /// before the cap would have been capped too). Not the deadline: a node created just before the
    /// deadline but seen after it still extends, as a new window.
    counted_through: Timestamp,
}

/// What observing one node did (its `Display`: the word the log says).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::Display)]
#[strum(serialize_all = "lowercase")]
pub enum Observed {
    /// Created at or before the end of a closed or released window.
    Consumed,
    /// Opened a new window.
    Opened,
    /// Moved the deadline later.
    Extended,
    /// Counted, but the window already lasts as long (seen before, or capped).
    Unchanged,
    /// Opened or extended a window that has already ended by `now`: there is
    /// nothing to hold (a node seen long after its creation).
    Expired,
}

impl Window {
    /// Catches the record up with every node in scope (each pass, or after a
    /// restart): replays them in the order they count as created, then closes
    /// what ended by `now`. Returns what each did, in the order given.
    pub fn observe_all(
        &mut self,
        creations: impl IntoIterator<Item = Timestamp>,
        now: Timestamp,
        cfg: &WindowConfig,
    ) -> Vec<Observed> {
        let creations: Vec<Timestamp> = creations.into_iter().collect();
        let mut order: Vec<usize> = (0..creations.len()).collect();
        order.sort_by_key(|&i| self.effective_creation(creations[i], now));
        let mut observed = vec![Observed::Unchanged; creations.len()];
        for i in order {
            observed[i] = self.observe(creations[i], now, cfg);
        }
        self.tick(now);
        observed
    }

    /// Counts one node in scope created at `creation` (again: no change). A
    /// creation in the future (clock skew) counts as the `now` it was first
    /// seen, so no window opens later than now and the cap bounds it.
    pub fn observe(&mut self, creation: Timestamp, now: Timestamp, cfg: &WindowConfig) -> Observed {
        let raw = creation;
        let creation = self.effective_creation(raw, now);
        if raw > creation {
            self.future_creations.entry(raw).or_insert(creation);
        }
        // A window that ended before this node appeared is over, tick or not.
        self.tick(creation);
        if self.closed_through.is_some_and(|t| creation <= t) {
            return Observed::Consumed;
        }
        let opened = self.open.is_none();
        let open = self.open.get_or_insert(OpenWindow {
            opened_at: creation,
            deadline: creation,
            counted_through: creation,
        });
        let before = open.deadline;
        open.deadline = open.deadline.max(plus(creation, cfg.node_hold()));
        open.counted_through = open.counted_through.max(creation);
        if let Some(cap) = cfg.cap(open.opened_at)
            && open.deadline >= cap
        {
            open.deadline = cap;
            open.counted_through = cap;
        }
        let changed = opened || open.deadline > before;
        if changed && open.deadline <= now {
            Observed::Expired
        } else if opened {
            Observed::Opened
        } else if changed {
            Observed::Extended
        } else {
            Observed::Unchanged
        }
    }

    /// Closes the window if its deadline is at or before `now`; returns whether it did.
    pub fn tick(&mut self, now: Timestamp) -> bool {
        if self.manual.as_ref().is_some_and(|m| m.until <= now) {
            self.manual = None;
        }
        let Some(open) = self.open.filter(|open| open.deadline <= now) else {
            return false;
        };
        self.open = None;
        self.consume_through(open.counted_through);
        true
    }

    fn consume_through(&mut self, t: Timestamp) {
        self.closed_through = self.closed_through.max(Some(t));
        // A remembered creation at or before this is consumed as it is.
        self.future_creations.retain(|&raw, _| raw > t);
    }

    /// When a node created at `creation` counts as created: then, or when it
    /// was first seen if earlier (clock skew).
    fn effective_creation(&self, creation: Timestamp, now: Timestamp) -> Timestamp {
        let first_seen = self.future_creations.get(&creation).copied();
        first_seen.unwrap_or(creation).min(now)
    }

    /// Closes the window and ends a manual hold now (`release`): later nodes
    /// open a new window. Returns whether either was holding.
    pub fn release_now(&mut self, now: Timestamp) -> bool {
        let manual = self.manual.take().is_some_and(|m| now < m.until);
        self.consume_through(now);
        let window = self.open.take().is_some_and(|open| now < open.deadline);
        window || manual
    }

    /// Holds every node in scope until `hold.until` (`hold`), unless a manual
    /// hold lasts longer; the window goes on beside it.
    pub fn hold_manually(&mut self, hold: ManualHold, now: Timestamp) -> ManualHoldOutcome {
        self.tick(now);
        if hold.until <= now {
            return ManualHoldOutcome::Expired;
        }
        let outcome = match &self.manual {
            None => ManualHoldOutcome::Started,
            Some(current) if current.until >= hold.until => {
                return ManualHoldOutcome::AlreadyLonger;
            }
            Some(_) => ManualHoldOutcome::Extended,
        };
        self.manual = Some(hold);
        outcome
    }

    /// The manual hold, if any (it may have ended until `tick`).
    pub fn manual(&self) -> Option<&ManualHold> {
        self.manual.as_ref()
    }

    /// When the hold of the nodes in scope ends: the later of the window's
    /// deadline and the manual hold's end.
    pub fn deadline(&self) -> Option<Timestamp> {
        let manual = self.manual.as_ref().map(|m| m.until);
        self.open.map(|open| open.deadline).max(manual)
    }

    /// [`Window::deadline`], while it holds at `now`.
    pub fn held_until(&self, now: Timestamp) -> Option<Timestamp> {
        self.deadline().filter(|&end| now < end)
    }

    /// Whether the nodes in scope are held at `now` (a deadline may pass before a `tick`).
    pub fn holds(&self, now: Timestamp) -> bool {
        self.held_until(now).is_some()
    }

    /// Until when the manual hold holds, if it does at `now`.
    pub fn manual_held_until(&self, now: Timestamp) -> Option<Timestamp> {
        let until = self.manual.as_ref().map(|m| m.until);
        until.filter(|&end| now < end)
    }

    /// When the caller should call [`Window::tick`] next.
    pub fn next_wake(&self) -> Option<Timestamp> {
        let open = self.open.map(|open| open.deadline);
        let manual = self.manual.as_ref().map(|m| m.until);
        open.into_iter().chain(manual).min()
    }

    /// The open window, if any (its deadline may be past until `tick`).
    pub fn open(&self) -> Option<&OpenWindow> {
        self.open.as_ref()
    }

    /// Creations at or before this are consumed.
    pub fn closed_through(&self) -> Option<Timestamp> {
        self.closed_through
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60;

    /// The window rebuilt from the creation times of the nodes alone, as
    /// when no record exists.
    fn derive(
        creations: impl IntoIterator<Item = Timestamp>,
        now: Timestamp,
        cfg: &WindowConfig,
    ) -> Window {
        let mut window = Window::default();
        window.observe_all(creations, now, cfg);
        window
    }

    /// Minute `m` of the test's timeline.
    fn t(m: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + m * MIN).unwrap()
    }

    fn cluster(hold: u64, max_hold: Option<u64>) -> WindowConfig {
        WindowConfig {
            hold: Duration::from_secs(hold * 60),
            max_hold: max_hold.map(|m| Duration::from_secs(m * 60)),
        }
    }

    fn deadline(w: &Window) -> Option<Timestamp> {
        w.open().map(|o| o.deadline)
    }

    #[test]
    fn the_first_node_opens_and_later_ones_extend() {
        let cfg = cluster(10, None);
        let mut w = Window::default();
        assert!(!w.holds(t(0)));
        assert_eq!(w.observe(t(0), t(0), &cfg), Observed::Opened);
        assert_eq!(w.open().unwrap().opened_at, t(0));
        assert_eq!(deadline(&w), Some(t(10)));
        assert_eq!(w.observe(t(4), t(4), &cfg), Observed::Extended);
        assert_eq!(deadline(&w), Some(t(14)));
        assert_eq!(w.open().unwrap().opened_at, t(0));
        assert!(w.holds(t(13)) && !w.holds(t(14)));
        assert_eq!(w.next_wake(), Some(t(14)));
    }

    #[test]
    fn observing_a_node_again_changes_nothing() {
        let cfg = cluster(10, Some(30));
        let mut w = Window::default();
        w.observe(t(0), t(0), &cfg);
        w.observe(t(5), t(5), &cfg);
        let before = w.clone();
        assert_eq!(w.observe(t(0), t(7), &cfg), Observed::Unchanged);
        assert_eq!(w.observe(t(5), t(8), &cfg), Observed::Unchanged);
        assert_eq!(w, before);
        assert!(w.tick(t(15)));
        let closed = w.clone();
        assert_eq!(w.observe(t(5), t(20), &cfg), Observed::Consumed);
        assert_eq!(w, closed);
    }

    #[test]
    fn an_earlier_node_seen_late_does_not_move_the_start() {
        let cfg = cluster(10, Some(30));
        let mut w = Window::default();
        w.observe(t(5), t(5), &cfg);
        assert_eq!(w.observe(t(3), t(6), &cfg), Observed::Unchanged);
        assert_eq!(w.open().unwrap().opened_at, t(5));
        assert_eq!(deadline(&w), Some(t(15)));
    }

    #[test]
    fn the_cap_ends_a_stream_of_nodes() {
        let cfg = cluster(10, Some(30));
        let mut w = Window::default();
        assert_eq!(w.observe(t(0), t(0), &cfg), Observed::Opened);
        for m in 1..=19 {
            assert_eq!(w.observe(t(m), t(m), &cfg), Observed::Extended, "{m}");
        }
        assert_eq!(deadline(&w), Some(t(29)));
        assert_eq!(w.observe(t(20), t(20), &cfg), Observed::Extended);
        assert_eq!(deadline(&w), Some(t(30)), "capped at opened + maxHold");
        for m in 21..30 {
            assert_eq!(w.observe(t(m), t(m), &cfg), Observed::Unchanged, "{m}");
        }
        assert!(w.holds(t(29)) && !w.holds(t(30)));
        assert!(w.tick(t(30)));
        assert_eq!(w.closed_through(), Some(t(30)));
    }

    #[test]
    fn nodes_created_before_a_capped_close_never_reopen() {
        let cfg = cluster(10, Some(15));
        let mut w = Window::default();
        w.observe(t(0), t(0), &cfg);
        w.observe(t(8), t(8), &cfg);
        assert!(w.tick(t(15)));
        // Seen again, or for the first time, after the close: consumed, even
        // though 12 + 10 is still ahead.
        assert_eq!(w.observe(t(8), t(16), &cfg), Observed::Consumed);
        assert_eq!(w.observe(t(12), t(16), &cfg), Observed::Consumed);
        assert_eq!(w.observe(t(15), t(16), &cfg), Observed::Consumed);
        assert!(!w.holds(t(16)));
    }

    #[test]
    fn a_node_created_after_the_close_reopens() {
        let cfg = cluster(10, None);
        let mut w = Window::default();
        w.observe(t(0), t(0), &cfg);
        assert!(!w.tick(t(9)));
        assert!(w.tick(t(10)));
        assert!(!w.tick(t(11)), "closing happens once");
        assert_eq!(w.observe(t(12), t(12), &cfg), Observed::Opened);
        assert_eq!(w.open().unwrap().opened_at, t(12));
        assert_eq!(deadline(&w), Some(t(22)));
    }

    #[test]
    fn a_node_created_after_the_deadline_closes_the_old_window_without_a_tick() {
        let cfg = cluster(10, Some(30));
        let mut w = Window::default();
        w.observe(t(0), t(0), &cfg);
        assert_eq!(w.observe(t(25), t(25), &cfg), Observed::Opened);
        assert_eq!(w.open().unwrap().opened_at, t(25), "a new cap");
        assert_eq!(w.closed_through(), Some(t(0)));
    }

    #[test]
    fn a_node_created_just_before_the_deadline_but_seen_after_it_still_holds() {
        let cfg = cluster(10, None);
        let mut w = Window::default();
        w.observe(t(0), t(0), &cfg);
        assert!(w.tick(t(10)));
        // Created at 9 (before the deadline), its watch event came late.
        assert_eq!(w.observe(t(9), t(11), &cfg), Observed::Opened);
        assert_eq!(deadline(&w), Some(t(19)));
    }

    #[test]
    fn a_node_seen_after_its_hold_ended_opens_nothing_that_holds() {
        let cfg = cluster(10, None);
        let mut w = Window::default();
        assert_eq!(w.observe(t(0), t(30), &cfg), Observed::Expired);
        assert!(!w.holds(t(30)));
        assert!(w.tick(t(30)));
        assert_eq!(w.observe(t(0), t(31), &cfg), Observed::Consumed);
    }

    #[test]
    fn a_future_creation_counts_as_when_it_was_first_seen() {
        let cfg = cluster(10, Some(20));
        let mut w = Window::default();
        // The API server's clock runs an hour ahead.
        assert_eq!(w.observe(t(60), t(0), &cfg), Observed::Opened);
        assert_eq!(w.open().unwrap().opened_at, t(0));
        assert_eq!(deadline(&w), Some(t(10)));
        // Seen again later, even once its creation is past: no longer a hold.
        assert_eq!(w.observe(t(60), t(5), &cfg), Observed::Unchanged);
        assert_eq!(deadline(&w), Some(t(10)));
        assert!(w.tick(t(10)));
        assert_eq!(w.observe(t(60), t(19), &cfg), Observed::Consumed);
        assert_eq!(w.observe(t(60), t(65), &cfg), Observed::Consumed);
        assert_eq!(w.held_until(t(65)), None);
        // Another skewed node, created later, opens a window when it is seen.
        assert_eq!(w.observe(t(80), t(20), &cfg), Observed::Opened);
        assert_eq!(w.open().unwrap().opened_at, t(20));
    }

    #[test]
    fn a_future_creation_is_forgotten_once_consumed() {
        let cfg = cluster(10, None);
        let mut w = Window::default();
        w.observe(t(12), t(0), &cfg);
        w.observe(t(30), t(1), &cfg);
        let json = serde_json::to_value(&w).unwrap();
        assert_eq!(
            json["futureCreations"].as_object().map(|m| m.len()),
            Some(2)
        );
        assert_eq!(serde_json::from_value::<Window>(json).unwrap(), w);
        w.release_now(t(20));
        assert_eq!(w.future_creations.keys().collect::<Vec<_>>(), [&t(30)]);
        assert_eq!(w.observe(t(30), t(40), &cfg), Observed::Consumed);
    }

    #[test]
    fn release_closes_now_and_consumes_every_node_so_far() {
        let cfg = cluster(10, None);
        let mut w = Window::default();
        w.observe(t(0), t(0), &cfg);
        w.observe(t(3), t(3), &cfg);
        assert!(w.release_now(t(4)));
        assert!(!w.holds(t(4)));
        assert_eq!(w.next_wake(), None);
        assert_eq!(w.closed_through(), Some(t(4)));
        assert_eq!(w.observe(t(3), t(5), &cfg), Observed::Consumed);
        assert_eq!(w.observe(t(5), t(5), &cfg), Observed::Opened);
        assert!(!Window::default().release_now(t(0)), "nothing was open");
    }

    #[test]
    fn release_does_not_consume_nodes_created_later_even_in_a_capped_window() {
        let cfg = cluster(10, Some(5));
        let mut w = Window::default();
        w.observe(t(0), t(0), &cfg);
        assert_eq!(w.open().unwrap().counted_through, t(5));
        w.release_now(t(1));
        assert_eq!(w.closed_through(), Some(t(1)));
        assert_eq!(w.observe(t(2), t(2), &cfg), Observed::Opened);
    }

    /// The record after a live history up to minute `until`: each node seen
    /// when created, a tick every minute.
    fn live(creations: &[i64], until: i64, cfg: &WindowConfig) -> Window {
        let mut w = Window::default();
        for m in 0..=until {
            for &c in creations.iter().filter(|&&c| c == m) {
                w.observe(t(c), t(m), cfg);
            }
            w.tick(t(m));
        }
        w
    }

    #[test]
    fn a_restart_replaying_the_nodes_over_the_record_changes_nothing() {
        let cfg = cluster(10, Some(25));
        let creations = [0, 3, 9, 14, 22, 27, 31, 40, 41, 58, 60, 66];
        for stop in [5, 20, 24, 30, 45, 62, 70, 90] {
            let record = live(&creations, stop, &cfg);
            let stored: Window =
                serde_json::from_str(&serde_json::to_string(&record).unwrap()).unwrap();
            let existing = creations.iter().filter(|&&c| c <= stop).map(|&c| t(c));
            let mut restarted = stored;
            restarted.observe_all(existing.clone(), t(stop), &cfg);
            assert_eq!(restarted, record, "restart at {stop}");
            // Even with some nodes deleted since.
            let mut restarted = record.clone();
            restarted.observe_all(existing.clone().step_by(2), t(stop), &cfg);
            assert_eq!(restarted, record, "restart at {stop} after deletions");
            // Without a record, the window is rebuilt from the nodes alone.
            assert_eq!(derive(existing, t(stop), &cfg), record, "derive at {stop}");
        }
    }

    #[test]
    fn observe_all_reports_each_node_in_the_order_given() {
        let cfg = cluster(10, None);
        let mut w = Window::default();
        let observed = w.observe_all([t(4), t(0), t(2), t(30)], t(5), &cfg);
        assert_eq!(
            observed,
            [
                Observed::Extended,
                Observed::Opened,
                Observed::Extended,
                Observed::Extended
            ]
        );
        assert_eq!(deadline(&w), Some(t(15)));
        assert_eq!(
            w.observe_all([t(0), t(4)], t(6), &cfg),
            [Observed::Unchanged; 2]
        );
    }

    #[test]
    fn derivation_ignores_the_order_of_the_nodes() {
        let cfg = cluster(10, Some(25));
        let mut shuffled = [31, 0, 66, 9, 41, 3].map(t);
        let a = derive(shuffled, t(70), &cfg);
        shuffled.reverse();
        assert_eq!(derive(shuffled, t(70), &cfg), a);
        assert_eq!(a, live(&[0, 3, 9, 31, 41, 66], 70, &cfg));
    }

    #[test]
    fn derivation_without_nodes_is_closed_and_empty() {
        let w = derive([], t(0), &cluster(10, None));
        assert_eq!(w, Window::default());
        assert_eq!(serde_json::to_string(&w).unwrap(), "{}");
    }

    #[test]
    fn the_record_is_small_camel_case_json() {
        let cfg = cluster(10, Some(30));
        let mut w = Window::default();
        w.observe(t(0), t(0), &cfg);
        w.tick(t(10));
        w.observe(t(12), t(12), &cfg);
        assert_eq!(
            serde_json::to_value(&w).unwrap(),
            serde_json::json!({
                "open": {
                    "openedAt": "2027-01-15T08:12:00Z",
                    "deadline": "2027-01-15T08:22:00Z",
                    "countedThrough": "2027-01-15T08:12:00Z",
                },
                "closedThrough": "2027-01-15T08:00:00Z",
            })
        );
    }

    fn manual(requested: i64, until: i64) -> ManualHold {
        ManualHold {
            requested_at: t(requested),
            until: t(until),
            by: "alice".to_string(),
            reason: "payments rollout".to_string(),
        }
    }

    #[test]
    fn a_manual_hold_holds_every_node_until_its_end() {
        let cfg = cluster(10, Some(15));
        let mut w = Window::default();
        assert_eq!(
            w.hold_manually(manual(0, 45), t(0)),
            ManualHoldOutcome::Started
        );
        assert!(w.holds(t(44)) && !w.holds(t(45)));
        // The cap does not cut it.
        assert_eq!(w.held_until(t(30)), Some(t(45)));
        assert_eq!(w.observe(t(1), t(1), &cfg), Observed::Opened);
        assert_eq!(w.held_until(t(40)), Some(t(45)));
        assert_eq!(w.next_wake(), Some(t(11)));
        assert!(w.tick(t(15)), "the node window closes by itself");
        assert_eq!(w.held_until(t(20)), Some(t(45)));
        assert_eq!(w.next_wake(), Some(t(45)));
        assert!(!w.tick(t(45)));
        assert_eq!(w.manual(), None);
        assert_eq!(w.held_until(t(45)), None);
    }

    #[test]
    fn a_manual_hold_extends_past_the_node_window_but_never_shortens_anything() {
        let cfg = cluster(10, None);
        let mut w = Window::default();
        w.observe(t(0), t(0), &cfg);
        assert_eq!(
            w.hold_manually(manual(1, 5), t(1)),
            ManualHoldOutcome::Started
        );
        assert_eq!(w.deadline(), Some(t(10)), "the node window lasts longer");
        assert_eq!(
            w.hold_manually(manual(2, 30), t(2)),
            ManualHoldOutcome::Extended
        );
        assert_eq!(w.deadline(), Some(t(30)));
        assert_eq!(
            w.hold_manually(manual(3, 20), t(3)),
            ManualHoldOutcome::AlreadyLonger
        );
        assert_eq!(w.manual(), Some(&manual(2, 30)));
        assert_eq!(
            w.hold_manually(manual(4, 4), t(5)),
            ManualHoldOutcome::Expired
        );
    }

    #[test]
    fn release_ends_a_manual_hold() {
        let cfg = cluster(10, None);
        let mut w = Window::default();
        w.hold_manually(manual(0, 45), t(0));
        assert!(w.release_now(t(5)));
        assert!(!w.holds(t(5)));
        assert_eq!(w.held_until(t(6)), None);
        assert_eq!(w.next_wake(), None);
        // A node created after the release opens a window of its own.
        assert_eq!(w.observe(t(7), t(7), &cfg), Observed::Opened);
    }

    #[test]
    fn a_manual_hold_survives_the_record() {
        let mut w = Window::default();
        w.hold_manually(manual(0, 45), t(0));
        let json = serde_json::to_string(&w).unwrap();
        assert!(json.contains(r#""manual":{"requestedAt":"#), "{json}");
        assert_eq!(serde_json::from_str::<Window>(&json).unwrap(), w);
    }

    /// A record written during a paced release (`--release-pace`,
    /// removed) still loads, and the next save leaves the field out.
    #[test]
    fn a_window_record_with_a_paced_release_still_loads() {
        let mut w = Window::default();
        w.observe(t(0), t(0), &cluster(10, None));
        assert!(w.tick(t(10)));
        let kept = serde_json::to_string(&w).unwrap();
        let old = kept.replace(
            '}',
            &format!(r#","pacing":{{"since":"{}","of":7}}}}"#, t(10)),
        );
        let loaded: Window = serde_json::from_str(&old).unwrap();
        assert_eq!(loaded, w);
        assert_eq!(serde_json::to_string(&loaded).unwrap(), kept);
    }

    /// A window record written with `--window-per-label` (removed) loads as
    /// its top-level window, the nodes without the label's; the labelled
    /// groups' windows are dropped, and the next save leaves them out.
    #[test]
    fn a_window_record_of_per_label_windows_loads_as_its_top_window() {
        let mut w = Window::default();
        w.observe(t(0), t(0), &cluster(10, None));
        let kept = serde_json::to_string(&w).unwrap();
        let group = r#"{"open":{"openedAt":"2027-01-15T08:00:00Z","deadline":"2027-01-15T08:45:00Z","countedThrough":"2027-01-15T08:00:00Z"}}"#;
        let old = kept.replacen('{', &format!(r#"{{"groups":{{"gpu":{group}}},"#), 1);
        let loaded: Window = serde_json::from_str(&old).unwrap();
        assert_eq!(loaded, w);
        assert_eq!(serde_json::to_string(&loaded).unwrap(), kept);
    }
}
