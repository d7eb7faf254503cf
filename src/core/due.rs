//! The hold that knows when work comes back (`--launch-cost`): of a group's
//! idle nodes, keep exactly those that scheduled runs due within the
//! break-even time will use, each until its run starts, and nothing else.
//!
//! Keeping an idle node until a run at `at` costs `at - now` node-seconds;
//! letting it go and launching one again for the run costs a launch (the
//! operator's `--launch-cost`, in node-time). So a node is worth keeping
//! exactly when its run comes within the launch cost: the clairvoyant
//! decision for the work whose time is known. Each CronJob counts with its
//! next run only (its later runs find the same nodes free again), and with
//! as many nodes as its last run occupied. Pure: the caller reads the
//! schedules ([`super::schedule`]) and the nodes.

use std::time::Duration;

use jiff::Timestamp;

use super::plus;

/// A CronJob's next run in a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// `namespace/name`.
    pub cronjob: String,
    /// When the CronJob controller starts it.
    pub at: Timestamp,
    /// How many nodes its last run occupied.
    pub nodes: usize,
}

/// An idle node kept for a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserved<'a> {
    pub node: &'a str,
    pub run: &'a Run,
    /// The run's start plus the grace its pods get to land.
    pub until: Timestamp,
}

/// What the operator says a launch costs, and how long after a run's start
/// its node stays kept while its pods land.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    /// A launch's cost beyond its node-seconds, as node-time: the
    /// break-even time of keeping an idle node.
    pub launch_cost: Duration,
    pub grace: Duration,
}

impl Terms {
    /// Whether keeping an idle node from `now` until a run at `at` costs no
    /// more than launching one again for it.
    pub fn pays(&self, now: Timestamp, at: Timestamp) -> bool {
        now < at && at <= plus(now, self.launch_cost)
    }
}

/// The idle nodes (in the order they should be kept: those already held
/// first) that the runs due within the break-even time will use, earliest
/// run first, each for as many nodes as it needs and as there are. The
/// nodes not listed are kept by nothing here.
pub fn reserve<'a>(
    idle: &[&'a str],
    runs: &'a [Run],
    now: Timestamp,
    terms: &Terms,
) -> Vec<Reserved<'a>> {
    let mut due: Vec<&Run> = runs.iter().filter(|r| terms.pays(now, r.at)).collect();
    due.sort_by(|a, b| (a.at, &a.cronjob).cmp(&(b.at, &b.cronjob)));
    let mut free = idle.iter().copied();
    let mut kept = Vec::new();
    for run in due {
        let until = plus(run.at, terms.grace);
        kept.extend(
            free.by_ref()
                .take(run.nodes)
                .map(|node| Reserved { node, run, until }),
        );
    }
    kept
}

/// Why a node is kept, as `status`, the log and its Event say it.
pub fn why_kept(reserved: &Reserved<'_>, terms: &Terms) -> String {
    format!(
        "cronjob {} runs at {}; letting the node go and launching one again then would cost a launch ({} of node-time)",
        reserved.run.cronjob,
        reserved.run.at,
        humantime::format_duration(terms.launch_cost)
    )
}

/// Why an idle node of a group with scheduled work is let go at once.
pub fn why_released(terms: &Terms) -> String {
    format!(
        "no scheduled run is due within the launch cost ({}): keeping the node idle would cost more than a launch",
        humantime::format_duration(terms.launch_cost)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(m: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + m * 60).unwrap()
    }

    fn run(cronjob: &str, at: i64, nodes: usize) -> Run {
        Run {
            cronjob: cronjob.into(),
            at: t(at),
            nodes,
        }
    }

    fn terms(launch_minutes: u64) -> Terms {
        Terms {
            launch_cost: Duration::from_secs(launch_minutes * 60),
            grace: Duration::from_secs(60),
        }
    }

    fn kept<'a>(reserved: &[Reserved<'a>]) -> Vec<(&'a str, &'a str)> {
        reserved
            .iter()
            .map(|r| (r.node, r.run.cronjob.as_str()))
            .collect()
    }

    #[test]
    fn a_run_within_the_launch_cost_keeps_its_nodes_until_it_starts() {
        let runs = [run("team-a/report", 4, 2)];
        let reserved = reserve(&["a", "b", "c"], &runs, t(0), &terms(5));
        assert_eq!(
            kept(&reserved),
            [("a", "team-a/report"), ("b", "team-a/report")]
        );
        assert!(reserved.iter().all(|r| r.until == t(5)), "start + grace");
    }

    #[test]
    fn a_run_past_the_launch_cost_keeps_nothing_until_it_comes_within_it() {
        let runs = [run("team-a/hourly", 60, 3)];
        assert!(reserve(&["a", "b", "c"], &runs, t(0), &terms(5)).is_empty());
        // The same idle nodes, still there 56 minutes later: keeping them
        // for the last 4 minutes now pays.
        assert_eq!(reserve(&["a", "b", "c"], &runs, t(56), &terms(5)).len(), 3);
        // A run that has started is no longer a reason to keep idle nodes.
        assert!(reserve(&["a"], &runs, t(60), &terms(5)).is_empty());
    }

    #[test]
    fn two_schedules_keep_only_what_the_due_run_needs_earliest_first() {
        let runs = [
            run("batch/every-3m", 3, 1),
            run("batch/nightly", 600, 4),
            run("batch/every-4m", 4, 2),
        ];
        let reserved = reserve(&["a", "b", "c", "d", "e"], &runs, t(0), &terms(5));
        assert_eq!(
            kept(&reserved),
            [
                ("a", "batch/every-3m"),
                ("b", "batch/every-4m"),
                ("c", "batch/every-4m")
            ]
        );
        // Fewer idle nodes than the runs need: each run in turn takes what
        // is left.
        let short = reserve(&["a", "b"], &runs, t(0), &terms(5));
        assert_eq!(
            kept(&short),
            [("a", "batch/every-3m"), ("b", "batch/every-4m")]
        );
    }

    #[test]
    fn no_launch_cost_keeps_nothing() {
        let runs = [run("a/b", 1, 1)];
        assert!(reserve(&["a"], &runs, t(0), &terms(0)).is_empty());
    }

    #[test]
    fn the_reasons_name_the_run_and_the_cost() {
        let runs = [run("team-a/report", 4, 1)];
        let terms = terms(5);
        let reserved = reserve(&["a"], &runs, t(0), &terms);
        let why = why_kept(&reserved[0], &terms);
        assert!(
            why.starts_with("cronjob team-a/report runs at 2027-01-15T08:04:00Z"),
            "{why}"
        );
        assert!(why.ends_with("(5m of node-time)"), "{why}");
        assert!(why_released(&terms).contains("(5m)"));
    }
}
