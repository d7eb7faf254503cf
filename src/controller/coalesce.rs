//! When the leader's next pass runs. A burst of node changes is handled in
//! one pass once [`IDLE`] passes without another change, or [`MAX`] after
//! its first change; a fresh list of the nodes and a release request run a
//! pass at once.

use std::time::{Duration, Instant};

/// A burst of node changes is handled in one pass once this long passes
/// without another change: half of Karpenter's batch idle time (1 s). Why
/// it only delays the pass that holds the rest of the cluster once a window
/// opens is in `docs/architecture.md`.
const IDLE: Duration = Duration::from_millis(500);

/// ...or this long after the burst's first change, whichever comes first:
/// half of Karpenter's batch limit (10 s).
const MAX: Duration = Duration::from_secs(5);

/// What is waiting for a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Pending {
    #[default]
    Nothing,
    /// Run a pass at once.
    Now,
    /// Changes since `first`, the latest at `last`.
    Burst { first: Instant, last: Instant },
}

/// When the next pass is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    Now,
    At(Instant),
    Never,
}

impl Due {
    /// The earlier of this and a pass wanted `at` (a deadline, a retry).
    pub fn or_at(self, at: Option<Instant>) -> Due {
        match (self, at) {
            (Due::Now, _) => Due::Now,
            (Due::At(a), Some(b)) => Due::At(a.min(b)),
            (Due::Never, Some(b)) => Due::At(b),
            (due, None) => due,
        }
    }
}

/// What is pending, under the coalescing rule.
#[derive(Debug, Clone, Default)]
pub struct Coalesce {
    pending: Pending,
}

impl Coalesce {
    /// A node changed at `at`.
    pub fn change(&mut self, at: Instant) {
        self.pending = match self.pending {
            Pending::Now => Pending::Now,
            Pending::Burst { first, .. } => Pending::Burst { first, last: at },
            Pending::Nothing => Pending::Burst {
                first: at,
                last: at,
            },
        };
    }

    /// Something that cannot wait: a fresh list, a release request.
    pub fn run_now(&mut self) {
        self.pending = Pending::Now;
    }

    /// A pass ran: nothing is pending.
    pub fn ran(&mut self) {
        self.pending = Pending::Nothing;
    }

    pub fn due(&self) -> Due {
        match self.pending {
            Pending::Nothing => Due::Never,
            Pending::Now => Due::Now,
            Pending::Burst { first, last } => Due::At((last + IDLE).min(first + MAX)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_runs_after_idle_or_max_whichever_is_first() {
        let t0 = Instant::now();
        let mut c = Coalesce::default();
        assert_eq!(c.due(), Due::Never);
        c.change(t0);
        assert_eq!(c.due(), Due::At(t0 + IDLE));
        c.change(t0 + MAX - IDLE / 2);
        assert_eq!(c.due(), Due::At(t0 + MAX), "max from the first change");
        c.ran();
        assert_eq!(c.due(), Due::Never);
    }

    #[test]
    fn run_now_wins_over_a_burst_and_stays_until_the_pass() {
        let t0 = Instant::now();
        let mut c = Coalesce::default();
        c.change(t0);
        c.run_now();
        c.change(t0 + IDLE);
        assert_eq!(c.due(), Due::Now);
        assert_eq!(c.due().or_at(Some(t0)), Due::Now);
    }
}
