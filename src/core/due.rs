//! The schedule hold (`--launch-cost`): of the idle nodes, keep exactly those that runs due within
//! the launch cost will use, each until its run starts (docs/architecture.md, "The schedule hold").
//! Pure: the caller reads the schedules ([`super::schedule`]) and the nodes.

use std::collections::BTreeMap;
use std::time::Duration;

use foldhash::{HashMap, HashSet};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::known::{KnownWork, Run};
use super::plus;

/// How long after a run's start its nodes stay kept while its pods land (the
/// Job starts within seconds, its pods bind within seconds more).
pub const RUN_GRACE: Duration = Duration::from_secs(60);

/// How long a new node is kept before its pods tell whether the schedule
/// explains it: a launched node's pods bind within seconds of its readiness.
pub const SETTLE: Duration = Duration::from_secs(60);

/// An idle node kept for a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Reserved<'a> {
    pub node: &'a str,
    pub run: &'a Run,
    /// The run's start plus the grace its pods get to land.
    pub until: Timestamp,
}

/// The schedule hold's terms: a launch's cost beyond its node-seconds, as node-time (the break-even
/// time of keeping an idle node), and [`RUN_GRACE`] and [`SETTLE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    pub launch_cost: Duration,
    pub grace: Duration,
    pub settle: Duration,
}

/// Why the schedule keeps a node.
#[derive(Debug, Clone, PartialEq)]
pub enum Keep<'a> {
    /// It runs a known CronJob's pod: kept until the run ends.
    Busy,
    /// New, and its pods have not said yet what it is for.
    Settling { until: Timestamp },
    /// Idle, and a run due within the launch cost will use it.
    ForRun(Reserved<'a>),
}

/// Why the schedule keeps a node, one word in the record, `status` and the metric's label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[derive(strum::EnumIter, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
pub enum Reason {
    Busy,
    Run,
    Settling,
}

/// One node the schedule keeps, as the leader records it for `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Kept {
    pub reason: Reason,
    /// Until when, if known (a busy node: until its run ends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Timestamp>,
    /// `reason: run`: the CronJob and when its run starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cronjob: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_at: Option<Timestamp>,
}

impl From<&Keep<'_>> for Kept {
    fn from(keep: &Keep<'_>) -> Kept {
        let (reason, until, run) = match keep {
            Keep::Busy => (Reason::Busy, None, None),
            Keep::Settling { until } => (Reason::Settling, Some(*until), None),
            Keep::ForRun(reserved) => (Reason::Run, Some(reserved.until), Some(reserved.run)),
        };
        Kept {
            reason,
            until,
            cronjob: run.map(|run| run.cronjob.clone()),
            run_at: run.map(|run| run.at),
        }
    }
}

/// A node in scope as the schedule hold reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeView<'a> {
    pub name: &'a str,
    pub created: Timestamp,
    /// It carries node-holder's hold now.
    pub marked: bool,
}

/// The nodes the schedule keeps at `now`, by name: busy ones, new ones not yet `explained`, and the
/// idle explained ones the runs due will use ([`reserve`]). A node no CronJob's pods ran on is
/// never kept for a run: it may run other work node-holder does not read; the window holds it.
pub fn keep<'a>(
    nodes: &[NodeView<'a>],
    known: &'a KnownWork,
    explained: &HashSet<String>,
    now: Timestamp,
    terms: &Terms,
) -> BTreeMap<&'a str, Keep<'a>> {
    let mut kept = BTreeMap::new();
    // Idle nodes are gathered only when a run is due (most passes have none).
    let any_due = known.runs.iter().any(|run| terms.pays(now, run.at));
    let mut idle: Vec<&NodeView<'a>> = Vec::new();
    for node in nodes {
        if known.busy.contains(node.name) {
            kept.insert(node.name, Keep::Busy);
        } else if explained.contains(node.name) {
            if any_due {
                idle.push(node);
            }
        } else {
            let settled = plus(node.created, terms.settle);
            if now < settled {
                kept.insert(node.name, Keep::Settling { until: settled });
            }
        }
    }
    idle.sort_by(|a, b| (b.marked, b.created, a.name).cmp(&(a.marked, a.created, b.name)));
    let names: Vec<&'a str> = idle.iter().map(|n| n.name).collect();
    for reserved in reserve(&names, &known.runs, now, terms) {
        kept.insert(reserved.node, Keep::ForRun(reserved));
    }
    kept
}

/// When the window counts a node as created: once it settled (it was held
/// while it settled), so its whole hold runs after it could be told apart,
/// and a restart that replays the nodes counts each at the same time.
pub fn counted_at(created: Timestamp, terms: &Terms) -> Timestamp {
    plus(created, terms.settle)
}

/// Whether the window counts a node: not while it settles, never once a
/// known CronJob's pods explained it.
pub fn counts_in_window(
    name: &str,
    created: Timestamp,
    explained: &HashSet<String>,
    now: Timestamp,
    terms: &Terms,
) -> bool {
    !explained.contains(name) && now >= counted_at(created, terms)
}

impl Terms {
    /// Whether keeping an idle node from `now` until a run at `at` costs no
    /// more than launching one again for it (a run that started less than
    /// the grace ago still counts: its pods are landing).
    fn pays(&self, now: Timestamp, at: Timestamp) -> bool {
        now < plus(at, self.grace) && at <= plus(now, self.launch_cost)
    }
}

/// The idle nodes the runs due within the break-even time will use, earliest run first, each as
/// many as it needs and there are: its last run's nodes first, then the others in the order given
/// (held ones first). Linear in the nodes and the runs' own nodes: at 50,000 nodes and thousands of
/// runs, a pass over the free nodes per run took most of a second.
fn reserve<'a>(
    idle: &[&'a str],
    runs: &'a [Run],
    now: Timestamp,
    terms: &Terms,
) -> Vec<Reserved<'a>> {
    let mut due: Vec<&Run> = runs.iter().filter(|r| terms.pays(now, r.at)).collect();
    due.sort_by(|a, b| (a.at, &a.cronjob).cmp(&(b.at, &b.cronjob)));
    let place: HashMap<&str, usize> = idle.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let mut taken = vec![false; idle.len()];
    // Every node before `next` in `idle` is taken.
    let mut next = 0;
    let mut kept = Vec::new();
    for run in due {
        let until = plus(run.at, terms.grace);
        let mut mine: Vec<usize> = run
            .on
            .iter()
            .filter_map(|node| place.get(node.as_str()).copied())
            .filter(|&i| !taken[i])
            .collect();
        mine.sort_unstable();
        mine.dedup();
        mine.truncate(run.nodes);
        for &i in &mine {
            taken[i] = true;
        }
        while mine.len() < run.nodes && next < idle.len() {
            if !taken[next] {
                taken[next] = true;
                mine.push(next);
            }
            next += 1;
        }
        mine.sort_unstable();
        kept.extend(mine.into_iter().map(|i| Reserved {
            node: idle[i],
            run,
            until,
        }));
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

/// Why an idle node the schedule explains is let go at once.
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
            uid: None,
            at: t(at),
            nodes,
            pods: nodes,
            on: Vec::new(),
            shape: None,
        }
    }

    fn terms(launch_minutes: u64) -> Terms {
        Terms {
            launch_cost: Duration::from_secs(launch_minutes * 60),
            grace: Duration::from_secs(60),
            settle: Duration::from_secs(60),
        }
    }

    fn view(name: &'static str, created: i64, marked: bool) -> NodeView<'static> {
        NodeView {
            name,
            created: t(created),
            marked,
        }
    }

    /// A report runs every 4 minutes on 2 nodes, a nightly job far later:
    /// three idle nodes, of which the report's run keeps two.
    #[test]
    fn the_schedule_keeps_busy_new_and_due_nodes_only() {
        let known = KnownWork {
            runs: vec![run("team/report", 4, 2), run("team/nightly", 600, 1)],
            busy: HashSet::from_iter(["b-busy".to_string()]),
            ..KnownWork::default()
        };
        let explained: HashSet<String> = ["b-old", "b-held", "b-busy", "w-old"]
            .map(String::from)
            .into_iter()
            .collect();
        let nodes = [
            view("b-busy", -30, true),
            view("b-old", -30, false),
            view("b-held", -20, true),
            view("b-other", -40, false),
            view("b-new", 0, true),
            view("w-old", -50, false),
        ];
        let kept = keep(&nodes, &known, &explained, t(0), &terms(5));
        assert_eq!(kept["b-busy"], Keep::Busy);
        assert_eq!(kept["b-new"], Keep::Settling { until: t(1) });
        // The report wants two of the three idle nodes: the held one first,
        // then the newest; `b-other` ran no CronJob's pods (it may run a
        // service's), so it is no free node for the run.
        let for_run: Vec<&str> = kept
            .iter()
            .filter(|(_, k)| matches!(k, Keep::ForRun(_)))
            .map(|(n, _)| *n)
            .collect();
        assert_eq!(for_run, ["b-held", "b-old"]);
        assert_eq!(Kept::from(&kept["b-held"]).until, Some(t(5)));
        assert!(!kept.contains_key("w-old") && !kept.contains_key("b-other"));
        // The window counts neither explained nor settling nodes.
        assert!(!counts_in_window(
            "b-old",
            t(-30),
            &explained,
            t(0),
            &terms(5)
        ));
        assert!(!counts_in_window(
            "b-new",
            t(0),
            &explained,
            t(0),
            &terms(5)
        ));
        assert!(counts_in_window("b-new", t(0), &explained, t(1), &terms(5)));
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
        // A run that has started keeps them while its pods land (the
        // grace), and no longer.
        assert_eq!(reserve(&["a"], &runs, t(60), &terms(5)).len(), 1);
        assert!(reserve(&["a"], &runs, t(61), &terms(5)).is_empty());
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
    fn a_run_keeps_the_nodes_its_last_run_occupied_first() {
        let mut often = run("batch/often", 1, 1);
        often.on = vec!["b".into(), "gone".into()];
        let runs = [often];
        let reserved = reserve(&["a", "b", "c"], &runs, t(0), &terms(5));
        assert_eq!(kept(&reserved), [("b", "batch/often")]);
    }

    /// The reservation as first written (each run partitions the free
    /// nodes again): what `reserve` must still give, node for node.
    fn reserve_by_partitions<'a>(idle: &[&'a str], runs: &'a [Run]) -> Vec<(&'a str, &'a str)> {
        let mut due: Vec<&Run> = runs.iter().collect();
        due.sort_by(|a, b| (a.at, &a.cronjob).cmp(&(b.at, &b.cronjob)));
        let mut free: Vec<&'a str> = idle.to_vec();
        let mut kept = Vec::new();
        for run in due {
            let on: HashSet<&str> = run.on.iter().map(String::as_str).collect();
            let (own, others): (Vec<&'a str>, Vec<&'a str>) =
                free.iter().partition(|n| on.contains(**n));
            let taken: HashSet<&'a str> = own.into_iter().chain(others).take(run.nodes).collect();
            let (mine, rest): (Vec<&'a str>, Vec<&'a str>) =
                free.into_iter().partition(|n| taken.contains(n));
            free = rest;
            kept.extend(mine.into_iter().map(|node| (node, run.cronjob.as_str())));
        }
        kept
    }

    /// Runs that share nodes, own nodes late in the order, taken twice,
    /// gone or more than there are: the linear reservation takes what the
    /// one by partitions took, node for node and in the same order.
    #[test]
    fn the_linear_reservation_takes_what_partitioning_took() {
        let idle = ["a", "b", "c", "d", "e", "f", "g"];
        let on = |nodes: &[&str]| nodes.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let cases: [Vec<(i64, usize, &[&str])>; 5] = [
            vec![(1, 2, &["f", "b"]), (2, 3, &["b", "gone"]), (3, 9, &[])],
            vec![(1, 1, &["g"]), (1, 2, &["g", "a"]), (4, 2, &["a", "c"])],
            vec![(2, 0, &["a"]), (1, 7, &[]), (3, 1, &["a"])],
            vec![(1, 3, &["e", "e", "d"]), (2, 2, &["d", "c"])],
            vec![],
        ];
        for case in cases {
            let runs: Vec<Run> = case
                .iter()
                .enumerate()
                .map(|(i, &(at, nodes, own))| Run {
                    on: on(own),
                    ..run(&format!("ns/job-{i}"), at, nodes)
                })
                .collect();
            let linear = reserve(&idle, &runs, t(0), &terms(5));
            assert_eq!(
                kept(&linear),
                reserve_by_partitions(&idle, &runs),
                "{case:?}"
            );
        }
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
