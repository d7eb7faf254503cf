//! A gentle release: when a window closes by itself, node-holder's holds come
//! off in steps (`--release-pace 10%/1m`: a tenth of the held nodes a
//! minute), oldest nodes first, instead of all at once. Otherwise every held
//! node becomes Karpenter's candidate at the same instant, after a long window
//! with every `consolidateAfter` long run out.
//!
//! Oldest first: the newest nodes are the capacity of the latest scale-up,
//! which the next wave is the most likely to need; the oldest have been
//! spared the longest. The pace is a function of when the release started,
//! how many nodes it started with and `now`, kept in the window record, so a
//! restart or a new leader goes on at the same pace.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// How fast a closed window's holds come off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    pub step: Step,
    /// Time between two steps; the first step is at the close.
    pub every: Duration,
}

/// How many nodes one step releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Nodes(u32),
    /// A share of the nodes the release started with, rounded up: at least
    /// one node a step.
    Percent(u8),
}

/// A paced release under way: since when, and how many held nodes it
/// started with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pacing {
    pub since: Timestamp,
    pub of: u64,
}

impl Pace {
    /// Nodes one step releases, of a release that started with `of`.
    pub fn per_step(&self, of: u64) -> u64 {
        match self.step {
            Step::Nodes(n) => u64::from(n),
            Step::Percent(p) => (of.saturating_mul(u64::from(p))).div_ceil(100),
        }
        .max(1)
    }

    /// Steps taken by `now` (the first at `since`), and when the next one is.
    fn steps(&self, pacing: &Pacing, now: Timestamp) -> (u64, Timestamp) {
        let elapsed = Duration::try_from(now.duration_since(pacing.since)).unwrap_or_default();
        let every = self.every.as_nanos().max(1);
        let done = u64::try_from(elapsed.as_nanos() / every).unwrap_or(u64::MAX);
        let steps = done.saturating_add(1);
        let next = u32::try_from(steps)
            .ok()
            .and_then(|n| self.every.checked_mul(n))
            .and_then(|d| pacing.since.checked_add(d).ok())
            .unwrap_or(Timestamp::MAX);
        (steps, next)
    }

    /// How many of the release's nodes still keep their hold at `now`, and
    /// when that number next falls (`None` once it is 0).
    pub fn still_held(&self, pacing: &Pacing, now: Timestamp) -> (u64, Option<Timestamp>) {
        let (steps, next) = self.steps(pacing, now);
        let released = steps.saturating_mul(self.per_step(pacing.of));
        let held = pacing.of.saturating_sub(released);
        (held, (held > 0).then_some(next))
    }
}

impl FromStr for Pace {
    type Err = String;

    /// `N/interval` or `P%/interval`: `10%/1m`, `5/30s`.
    fn from_str(text: &str) -> Result<Self, String> {
        let (step, every) = text.split_once('/').ok_or_else(|| {
            format!("{text:?}: expected nodes/interval or percent%/interval, as 10%/1m or 5/30s")
        })?;
        let every = humantime::parse_duration(every.trim())
            .map_err(|e| format!("{text:?}: the interval: {e}"))?;
        if every.is_zero() {
            return Err(format!("{text:?}: the interval must be longer than 0s"));
        }
        let step = step.trim();
        let step = match step.strip_suffix('%') {
            Some(percent) => match percent.trim().parse::<u8>() {
                Ok(p) if (1..=100).contains(&p) => Step::Percent(p),
                _ => return Err(format!("{text:?}: a percentage from 1% to 100%")),
            },
            None => match step.parse::<u32>() {
                Ok(n) if n >= 1 => Step::Nodes(n),
                _ => return Err(format!("{text:?}: at least 1 node a step")),
            },
        };
        Ok(Pace { step, every })
    }
}

impl fmt::Display for Pace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.step {
            Step::Nodes(n) => write!(f, "{n}")?,
            Step::Percent(p) => write!(f, "{p}%")?,
        }
        write!(f, "/{}", humantime::format_duration(self.every))
    }
}

impl Serialize for Pace {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Pace {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn paces_parse_and_print_back() {
        for text in ["10%/1m", "5/30s", "100%/1s", "1/2h"] {
            let pace: Pace = text.parse().unwrap();
            assert_eq!(pace.to_string(), text);
        }
        for bad in [
            "10%", "0/1m", "0%/1m", "101%/1m", "5/0s", "x/1m", "5/soon", "-1/1m",
        ] {
            assert!(bad.parse::<Pace>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_percentage_rounds_up_to_at_least_one_node() {
        let pace: Pace = "10%/1m".parse().unwrap();
        assert_eq!(pace.per_step(100), 10);
        assert_eq!(pace.per_step(101), 11);
        assert_eq!(pace.per_step(3), 1);
        assert_eq!(pace.per_step(0), 1);
    }

    #[test]
    fn holds_come_off_a_step_at_a_time_the_first_at_the_close() {
        let pace: Pace = "2/60s".parse().unwrap();
        let pacing = Pacing { since: t(0), of: 5 };
        assert_eq!(pace.still_held(&pacing, t(0)), (3, Some(t(60))));
        assert_eq!(pace.still_held(&pacing, t(59)), (3, Some(t(60))));
        assert_eq!(pace.still_held(&pacing, t(60)), (1, Some(t(120))));
        assert_eq!(pace.still_held(&pacing, t(120)), (0, None));
        assert_eq!(pace.still_held(&pacing, t(10_000)), (0, None));
        // A clock that went back counts as the close.
        assert_eq!(pace.still_held(&pacing, t(-5)), (3, Some(t(60))));
    }

    #[test]
    fn huge_intervals_and_counts_saturate_instead_of_failing() {
        let pace = Pace {
            step: Step::Nodes(u32::MAX),
            every: Duration::from_secs(u64::MAX / 4),
        };
        let pacing = Pacing {
            since: t(0),
            of: u64::MAX,
        };
        let (held, next) = pace.still_held(&pacing, t(1));
        assert_eq!(held, u64::MAX - u64::from(u32::MAX));
        assert_eq!(next, Some(Timestamp::MAX));
    }
}
