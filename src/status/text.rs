//! The readable form of `node-holder status`: the window, the manual hold, the
//! schedule, the release, the leader, then a table of the held nodes.

use jiff::{SignedDuration, Timestamp};

use super::{Orphaned, Release, Status};
use crate::core::holds::HELD_UNTIL_ANNOTATION;
use crate::core::kept::Nodes;

/// `3,001` for 3001.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// `14m 32s` for a duration, rounded to seconds.
fn human(d: SignedDuration) -> String {
    let secs = d.as_secs().unsigned_abs();
    humantime::format_duration(std::time::Duration::from_secs(secs)).to_string()
}

/// "in 4m 2s" or "3s ago".
pub fn relative(at: Timestamp, now: Timestamp) -> String {
    let d = at.duration_since(now);
    match d.is_negative() {
        true => format!("{} ago", human(d)),
        false => format!("in {}", human(d)),
    }
}

/// `at` and how far it is from now: "2026-11-22T12:45:00Z (in 35m)".
fn when(at: Timestamp, now: Timestamp) -> String {
    format!("{at} ({})", relative(at, now))
}

/// The readable form: the window, the release request, the leader, then a
/// table of at most `limit` rows of held nodes (0: all), the rest counted.
pub fn render_text_limited(status: &Status, now: Timestamp, limit: usize) -> String {
    let mut out = String::new();
    let mut line = |label: &str, value: String| {
        out.push_str(&format!("{label:<13}{value}\n"));
    };
    window_lines(&mut line, status, now);
    manual_lines(&mut line, status, now);
    scheduled_lines(&mut line, status, now);
    warm_lines(&mut line, status, now);
    if let Some(text) = release_text(status.release.as_ref(), now) {
        line("Release:", text);
    }
    line("Leader:", leader_text(status, now));
    if let Some(orphaned) = &status.orphaned {
        line("Orphaned:", orphaned_text(orphaned, now));
    }
    if !status.overdue.is_empty() {
        line("Overdue:", overdue_text(&status.overdue));
    }
    line("Held nodes:", status.held_nodes.len().to_string());
    out.push_str(&held_table(status, now, limit));
    out
}

/// The settings the leader recorded, in one phrase.
fn settings_text(status: &Status) -> String {
    let Some(s) = &status.settings else {
        return "no leader has run yet".to_string();
    };
    // The selector as the user wrote it: label values are case-sensitive.
    let nodes = match s.node_selector.as_str() {
        "" => "all nodes",
        selector => selector,
    };
    let cap = s.max_hold.map_or("no cap".to_string(), |m| {
        format!("max {}", humantime::format_duration(m))
    });
    let modes = s.launch_cost.map_or(String::new(), |cost| {
        let cost = humantime::format_duration(cost);
        format!(", holds for CronJob runs due within {cost}")
    });
    let hold = humantime::format_duration(s.hold_duration);
    format!("{nodes}, hold {hold}, {cap}{modes}")
}

/// The window's lines: open with its times, or closed with what it covered.
fn window_lines(line: &mut impl FnMut(&str, String), status: &Status, now: Timestamp) {
    let scope = settings_text(status);
    match (status.open, status.deadline) {
        (true, Some(deadline)) => {
            line("Window:", format!("open ({scope})"));
            if let Some(opened) = status.opened_at {
                line("Opened:", when(opened, now));
            }
            line("Deadline:", when(deadline, now));
            if let Some(cap) = status.cap {
                line("Cap:", when(cap, now));
            }
        }
        _ if status.window_opening => {
            line("Window:", format!("opening ({scope})"));
            let why = "a node was held at admission; the leader opens the window at its next pass";
            line("Opening:", why.to_string());
        }
        _ => {
            line("Window:", format!("closed ({scope})"));
            if let Some(deadline) = status.deadline {
                let ago = relative(deadline, now);
                let text = format!("{deadline} ({ago}; the leader closes it at its next pass)");
                line("Deadline:", text);
            }
            if let Some(through) = status.closed_through {
                let text = format!("covers nodes created up to {through}");
                line("Last closed:", text);
            }
        }
    }
}

/// The manual hold in force, and one asked for that waits for the leader.
fn manual_lines(line: &mut impl FnMut(&str, String), status: &Status, now: Timestamp) {
    if let Some(manual) = &status.manual {
        let (until, by, why) = (when(manual.until, now), &manual.by, &manual.reason);
        line("Manual hold:", format!("until {until}, by {by}: {why}"));
    }
    if let Some(asked) = &status.manual_requested {
        let (by, until, why) = (&asked.by, asked.until, &asked.reason);
        let text = format!("requested by {by} until {until} ({why}), waiting for the leader");
        line("Manual hold:", text);
    }
}

/// `--launch-cost`: what the schedule keeps: the nodes kept for a run, run
/// by run ("2 nodes until 14:06 (in 3m): cronjob team-a/report runs at
/// 14:05"), the runs past the soonest counted, then the busy and the new.
fn scheduled_lines(line: &mut impl FnMut(&str, String), status: &Status, now: Timestamp) {
    let kept = &status.scheduled;
    for run in &kept.runs {
        let (nodes, until) = (nodes_text(&run.nodes), when(run.until, now));
        let (cronjob, at) = (&run.cronjob, run.run_at);
        let text = format!("{nodes} until {until}: cronjob {cronjob} runs at {at}");
        line("Scheduled:", text);
    }
    if kept.more_runs > 0 {
        let (runs, nodes) = (kept.more_runs, kept.more_nodes);
        let text = format!("and {runs} more runs keep {nodes} nodes");
        line("Scheduled:", text);
    }
    for (nodes, why) in [
        (&kept.busy, "running a CronJob's pods"),
        (&kept.settling, "new, waiting for their pods"),
    ] {
        if nodes.count > 0 {
            line("Scheduled:", format!("{} {why}", nodes_text(nodes)));
        }
    }
}

/// `--warm-before-runs`: each warm under way ("cronjob team-a/report runs at 14:05 (in 1m): 2 of 2
/// placeholder pod(s) on 2 node(s) (a, b), 190 node-seconds so far (Job node-holder-warm-…)").
fn warm_lines(line: &mut impl FnMut(&str, String), status: &Status, now: Timestamp) {
    for warm in &status.warms {
        let run = match (&warm.cronjob, warm.run_at) {
            (Some(cronjob), Some(at)) => format!("cronjob {cronjob} runs at {}", when(at, now)),
            _ => "a run it does not name".to_string(),
        };
        let so_far = &warm.so_far;
        let on = match warm.nodes.as_slice() {
            [] => String::new(),
            nodes => format!(" ({})", nodes.join(", ")),
        };
        let (ready, all) = (so_far.ready, so_far.ready.saturating_add(so_far.late));
        let (nodes, seconds, job) = (so_far.nodes, so_far.node_seconds, &warm.job);
        let text = format!(
            "{run}: {ready} of {all} placeholder pod(s) on {nodes} node(s){on}, {seconds:.0} node-seconds so far (Job {job})"
        );
        line("Warming:", text);
    }
}

/// `1 node (a)`, `3 nodes (a, b, c)`, `5 nodes (a, b, c, …)`.
fn nodes_text(nodes: &Nodes) -> String {
    let count = match nodes.count {
        1 => "1 node".to_string(),
        n => format!("{n} nodes"),
    };
    let hidden = nodes.count > nodes.named.len();
    let more = if hidden { ", …" } else { "" };
    format!("{count} ({}{more})", nodes.named.join(", "))
}

/// A release that is not finished, in words.
fn release_text(release: Option<&Release>, now: Timestamp) -> Option<String> {
    Some(match release? {
        Release::Requested { requested_at } => {
            let requested = when(*requested_at, now);
            format!("requested {requested}, waiting for the leader")
        }
        Release::Releasing { left, of } => {
            let (left, of) = (thousands(*left as u64), thousands(*of));
            format!("releasing {left} of {of} node(s) still held")
        }
    })
}

/// Who leads, and how fresh its Lease is.
fn leader_text(status: &Status, now: Timestamp) -> String {
    match &status.leader {
        Some(leader) if !leader.expired => match leader.renewed_at {
            Some(renewed) => format!("{} (renewed {})", leader.identity, relative(renewed, now)),
            None => leader.identity.clone(),
        },
        Some(leader) => format!("none (lease of {} expired)", leader.identity),
        None => "none".to_string(),
    }
}

/// The held nodes past their `held-until` although a leader is live.
fn overdue_text(overdue: &[String]) -> String {
    let first: Vec<&str> = overdue.iter().take(3).map(String::as_str).collect();
    let more = match overdue.len().saturating_sub(first.len()) {
        0 => String::new(),
        more => format!(" and {more} more"),
    };
    format!(
        "{} node(s) held past their {HELD_UNTIL_ANNOTATION} by more than --orphaned-after \
         ({}{more}) although a leader is live: it is not keeping its holds (see its log)",
        overdue.len(),
        first.join(", ")
    )
}

/// What is orphaned, since when, and what to do.
fn orphaned_text(orphaned: &Orphaned, now: Timestamp) -> String {
    let since = orphaned.since.map_or_else(
        || "no leader has ever run".to_string(),
        |since| format!("no live leader since {since} ({})", relative(since, now)),
    );
    format!(
        "{} node(s) of node-holder's, {since}: nothing will release them; check node-holder's pods, or run `node-holder release`",
        thousands(orphaned.held_nodes as u64)
    )
}

/// The held nodes as a table (nothing when there are none).
fn held_table(status: &Status, now: Timestamp, limit: usize) -> String {
    if status.held_nodes.is_empty() {
        return String::new();
    }
    let names = status.held_nodes.iter().map(|n| n.name.len());
    let width = names.fold("NODE".len(), usize::max);
    let mut out = format!("\n{:<width$}  {:<9}  HOLDS\n", "NODE", "AGE");
    let shown = if limit == 0 { usize::MAX } else { limit };
    for node in status.held_nodes.iter().take(shown) {
        let age = node.created.map_or("-".to_string(), |c| {
            human(now.duration_since(c)).replace(' ', "")
        });
        let (name, holds) = (&node.name, node.holds.join(","));
        out.push_str(&format!("{name:<width$}  {age:<9}  {holds}\n"));
    }
    let rest = status.held_nodes.len().saturating_sub(shown);
    if rest > 0 {
        let rest = thousands(rest as u64);
        out.push_str(&format!("… and {rest} more (--limit 0 shows all)\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use crate::core::due::{Kept, Reason};
    use crate::core::kept::KeptSummary;
    use crate::core::window::ManualHold;
    use crate::state::lease::Holder;
    use crate::status::HeldNode;
    use crate::status::tests::{at, closed, render_text, settings};

    /// `--warm-before-runs`: a line per warm under way, with its run, its
    /// pods' nodes and their node-seconds so far.
    #[test]
    fn each_warm_under_way_reads_as_a_line_with_its_run_and_cost() {
        let now = at("2026-11-22T12:04:00Z");
        let warm = |job: &str, ready, late, nodes: &[&str]| crate::status::WarmShown {
            job: job.into(),
            cronjob: Some("team-a/report".into()),
            run_at: Some(at("2026-11-22T12:05:00Z")),
            since: Some(at("2026-11-22T12:03:00Z")),
            so_far: crate::core::warm::HandOver {
                ready,
                late,
                nodes: nodes.len(),
                node_seconds: 95.4,
            },
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
        };
        let mut unnamed = warm("node-holder-warm-2-x", 0, 1, &[]);
        unnamed.cronjob = None;
        let status = Status {
            warms: vec![warm("node-holder-warm-1-x", 2, 0, &["a", "b"]), unnamed],
            ..Status::default()
        };
        let text = render_text(&status, now);
        assert!(
            text.contains("Warming:     cronjob team-a/report runs at 2026-11-22T12:05:00Z (in 1m): 2 of 2 placeholder pod(s) on 2 node(s) (a, b), 95 node-seconds so far (Job node-holder-warm-1-x)\n"),
            "{text}"
        );
        assert!(
            text.contains("Warming:     a run it does not name: 0 of 1 placeholder pod(s) on 0 node(s), 95 node-seconds so far (Job node-holder-warm-2-x)\n"),
            "{text}"
        );
    }

    /// `--launch-cost`: the nodes kept for a run, by run, and the busy ones.
    #[test]
    fn the_schedules_nodes_read_as_a_line_per_run_and_reason() {
        let now = at("2026-11-22T12:10:00Z");
        let run = |until: &str| Kept {
            reason: Reason::Run,
            until: Some(at(until)),
            cronjob: Some("team-a/report".into()),
            run_at: Some(at("2026-11-22T12:13:00Z")),
        };
        let busy = Kept {
            reason: Reason::Busy,
            until: None,
            cronjob: None,
            run_at: None,
        };
        let status = Status {
            settings: Some(settings()),
            scheduled: KeptSummary::of(&BTreeMap::from([
                ("a".to_string(), run("2026-11-22T12:14:00Z")),
                ("b".to_string(), run("2026-11-22T12:14:00Z")),
                ("c".to_string(), busy),
            ])),
            ..Status::default()
        };
        let text = render_text(&status, now);
        assert!(
            text.contains("Scheduled:   2 nodes (a, b) until 2026-11-22T12:14:00Z (in 4m): cronjob team-a/report runs at 2026-11-22T12:13:00Z\n"),
            "{text}"
        );
        assert!(
            text.contains("Scheduled:   1 node (c) running a CronJob's pods\n"),
            "{text}"
        );
    }

    #[test]
    fn an_open_window_reads_as_a_summary_and_a_table() {
        let now = at("2026-11-22T12:10:00Z");
        let status = Status {
            open: true,
            opened_at: Some(at("2026-11-22T12:00:00Z")),
            deadline: Some(at("2026-11-22T12:24:30Z")),
            cap: Some(at("2026-11-22T14:00:00Z")),
            closed_through: None,
            release_requested_at: None,
            release_done_at: None,
            releasing_from: None,
            window_opening: false,
            release: None,
            manual: None,
            manual_requested: None,
            scheduled: KeptSummary::default(),
            warms: Vec::new(),
            settings: Some(settings()),
            leader: Some(Holder {
                identity: "node-holder-abc".into(),
                renewed_at: Some(at("2026-11-22T12:09:57Z")),
                expired: false,
                live_until: Some(at("2026-11-22T12:10:12Z")),
            }),
            orphaned: None,
            overdue: Vec::new(),
            held_nodes: vec![
                HeldNode {
                    name: "ip-10-0-1-7".into(),
                    holds: vec!["karpenter.sh/do-not-disrupt".into()],
                    created: Some(at("2026-11-22T12:04:30Z")),
                    held_until: None,
                },
                HeldNode {
                    name: "n2".into(),
                    holds: vec![],
                    created: None,
                    held_until: None,
                },
            ],
        };
        assert_eq!(
            render_text(&status, now),
            "Window:      open (all nodes, hold 20m, max 2h)\n\
             Opened:      2026-11-22T12:00:00Z (10m ago)\n\
             Deadline:    2026-11-22T12:24:30Z (in 14m 30s)\n\
             Cap:         2026-11-22T14:00:00Z (in 1h 50m)\n\
             Leader:      node-holder-abc (renewed 3s ago)\n\
             Held nodes:  2\n\
             \n\
             NODE         AGE        HOLDS\n\
             ip-10-0-1-7  5m30s      karpenter.sh/do-not-disrupt\n\
             n2           -          \n"
        );
    }

    #[test]
    fn a_closed_window_without_a_leader_says_so() {
        let now = at("2026-11-22T12:10:00Z");
        let status = Status {
            open: false,
            opened_at: None,
            deadline: None,
            cap: None,
            closed_through: Some(at("2026-11-22T10:00:00Z")),
            release_requested_at: Some(at("2026-11-22T11:00:00Z")),
            release_done_at: None,
            releasing_from: None,
            window_opening: false,
            release: Some(Release::Requested {
                requested_at: at("2026-11-22T11:00:00Z"),
            }),
            manual: None,
            manual_requested: None,
            scheduled: KeptSummary::default(),
            warms: Vec::new(),
            settings: None,
            leader: Some(Holder {
                identity: "gone".into(),
                renewed_at: Some(at("2026-11-22T11:00:00Z")),
                expired: true,
                live_until: Some(at("2026-11-22T11:00:15Z")),
            }),
            held_nodes: vec![],
            orphaned: None,
            overdue: Vec::new(),
        };
        let text = render_text(&status, now);
        assert!(
            text.starts_with("Window:      closed (no leader has run yet)\n"),
            "{text}"
        );
        assert!(
            text.contains("Last closed: covers nodes created up to 2026-11-22T10:00:00Z\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "Release:     requested 2026-11-22T11:00:00Z (1h 10m ago), waiting for the leader\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("Leader:      none (lease of gone expired)\n"),
            "{text}"
        );
        assert!(text.ends_with("Held nodes:  0\n"), "{text}");
    }

    #[test]
    fn a_manual_hold_shows_who_asked_why_and_until_when() {
        let now = at("2026-11-22T12:10:00Z");
        let hold = ManualHold {
            requested_at: at("2026-11-22T12:00:00Z"),
            until: at("2026-11-22T12:45:00Z"),
            by: "alice".into(),
            reason: "payments rollout".into(),
        };
        let mut status = closed("2026-11-22T10:00:00Z");
        status.open = true;
        status.deadline = Some(hold.until);
        status.manual = Some(hold.clone());
        status.manual_requested = Some(ManualHold {
            requested_at: at("2026-11-22T12:09:00Z"),
            until: at("2026-11-22T13:09:00Z"),
            by: "bob".into(),
            reason: "db failover".into(),
        });
        let text = render_text(&status, now);
        assert!(
            text.starts_with(
                "Window:      open (all nodes, hold 20m, max 2h)\n\
                 Deadline:    2026-11-22T12:45:00Z (in 35m)\n\
                 Manual hold: until 2026-11-22T12:45:00Z (in 35m), by alice: payments rollout\n\
                 Manual hold: requested by bob until 2026-11-22T13:09:00Z (db failover), waiting for the leader\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn the_node_selector_is_shown_as_written() {
        let mut status = closed("2026-11-22T11:00:00Z");
        status.settings.as_mut().unwrap().node_selector = "team=GPU,Tier!=Batch".into();
        let text = render_text(&status, at("2026-11-22T12:00:00Z"));
        assert!(
            text.starts_with("Window:      closed (team=GPU,Tier!=Batch, hold 20m, max 2h)\n"),
            "{text}"
        );
    }

    #[test]
    fn thousands_are_grouped() {
        for (n, text) in [
            (0, "0"),
            (999, "999"),
            (1000, "1,000"),
            (3001, "3,001"),
            (1234567, "1,234,567"),
        ] {
            assert_eq!(thousands(n), text);
        }
    }
}
