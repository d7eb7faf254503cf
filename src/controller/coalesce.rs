//! When the leader's next pass runs: a burst of node changes coalesced into
//! one pass; a fresh list of the nodes or a request runs one at once.

use std::time::{Duration, Instant};

/// A burst is handled once this long passes without another change: half of
/// Karpenter's batch idle time (1 s; why it is enough: `docs/architecture.md`).
const IDLE: Duration = Duration::from_millis(500);

/// ...or this long after its first change, if sooner: half of Karpenter's batch limit (10 s).
const MAX: Duration = Duration::from_secs(5);

/// What is waiting for a pass, under the coalescing rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Coalesce {
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

impl Coalesce {
    /// A node changed at `at`.
    pub fn change(&mut self, at: Instant) {
        *self = match *self {
            Coalesce::Now => Coalesce::Now,
            Coalesce::Burst { first, .. } => Coalesce::Burst { first, last: at },
            Coalesce::Nothing => Coalesce::Burst {
                first: at,
                last: at,
            },
        };
    }

    /// Something that cannot wait: a fresh list, a release request.
    pub fn run_now(&mut self) {
        *self = Coalesce::Now;
    }

    /// A pass ran: nothing is pending.
    pub fn ran(&mut self) {
        *self = Coalesce::Nothing;
    }

    pub fn due(&self) -> Due {
        match *self {
            Coalesce::Nothing => Due::Never,
            Coalesce::Now => Due::Now,
            Coalesce::Burst { first, last } => Due::At((last + IDLE).min(first + MAX)),
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
