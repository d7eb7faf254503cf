//! `node-holder status`: the hold window, its leader and the held nodes, read
//! from the cluster (the record, the Lease, the nodes' marker) and printed as
//! a readable summary (rendered by `text`) or as JSON or YAML.

mod text;
mod warms;

use text::render_text_limited;
pub use warms::WarmShown;

use anyhow::{Context, Result};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use serde::Serialize;

use crate::cli::{Output, StatusArgs};
use crate::core::holds::{MARKED, held_keys, held_until_stamp};
use crate::core::kept::KeptSummary;
use crate::core::window::ManualHold;
use crate::state::lease::{self, Holder};
use crate::state::record::{self, RecordStore, Settings};

/// Everything `status` shows.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub open: bool,
    pub opened_at: Option<Timestamp>,
    pub deadline: Option<Timestamp>,
    /// Where the cap closes the window (with a max hold).
    pub cap: Option<Timestamp>,
    /// Nodes created at or before this belong to a closed window.
    pub closed_through: Option<Timestamp>,
    pub release_requested_at: Option<Timestamp>,
    /// The last release request the leader (or `release`) finished.
    pub release_done_at: Option<Timestamp>,
    /// Nodes the release under way started with, as the leader recorded.
    pub releasing_from: Option<u64>,
    pub settings: Option<Settings>,
    pub leader: Option<Holder>,
    pub held_nodes: Vec<HeldNode>,
    /// Held at admission, created after every window the record knows: the
    /// leader has not counted them yet, and will open a window for them.
    pub window_opening: bool,
    /// A release that is not finished, if any.
    pub release: Option<Release>,
    /// The manual hold in force (`hold`), if any.
    pub manual: Option<ManualHold>,
    /// A manual hold asked for that no leader has put in the window yet.
    pub manual_requested: Option<ManualHold>,
    /// With `--launch-cost`: the nodes the schedule keeps, by name, and why.
    #[serde(skip_serializing_if = "KeptSummary::is_empty")]
    pub scheduled: KeptSummary,
    /// With `--launch-cost`: the warms under way (`--warm-before-runs`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warms: Vec<WarmShown>,
    /// node-holder's holds with no live leader for longer than
    /// `--orphaned-after` (set by [`Status::orphaned_after`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub orphaned: Option<Orphaned>,
    /// Held nodes whose `held-until` passed more than `--orphaned-after` ago while a leader is
    /// live: the leader is not keeping its holds (set by [`Status::orphaned_after`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub overdue: Vec<String>,
}

/// Holds nothing will release: no leader has been live for a while.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Orphaned {
    /// When the last leader's Lease ran out; `None`: no leader ever held it.
    pub since: Option<Timestamp>,
    pub held_nodes: usize,
}

impl Status {
    /// Marks the holds orphaned when nodes carry node-holder's and no leader
    /// has been live for `after` (at once when no leader ever held the Lease).
    pub fn orphaned_after(mut self, after: std::time::Duration, now: Timestamp) -> Self {
        let held_nodes = self.held_nodes.len();
        let live = self.leader.as_ref().is_some_and(|l| !l.expired);
        let since = self.leader.as_ref().and_then(|l| l.live_until);
        // `None`: longer than any time that has passed.
        let after = SignedDuration::try_from(after).ok();
        let long_enough =
            since.is_none_or(|since| after.is_some_and(|after| now.duration_since(since) >= after));
        self.orphaned =
            (held_nodes > 0 && !live && long_enough).then_some(Orphaned { since, held_nodes });
        // The held nodes whose `held-until` passed more than `after` ago.
        let overdue = |node: &HeldNode| {
            let until = node.held_until.zip(after);
            until.is_some_and(|(until, after)| now.duration_since(until) > after)
        };
        let overdue = self.held_nodes.iter().filter(|node| live && overdue(node));
        self.overdue = overdue.map(|node| node.name.clone()).collect();
        self
    }
}

/// A release that is not finished.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum Release {
    /// Requested; no leader has taken the request yet.
    Requested { requested_at: Timestamp },
    /// The holds of a closed window coming off: `left` nodes still carry
    /// them, of the `of` the release started with.
    Releasing { left: usize, of: u64 },
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldNode {
    pub name: String,
    /// The hold keys node-holder added.
    pub holds: Vec<String>,
    pub created: Option<Timestamp>,
    /// Its `node-holder.dev/held-until`: held at least until then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_until: Option<Timestamp>,
}

pub async fn read(client: &kube::Client, namespace: &str, now: Timestamp) -> Result<Status> {
    let record = RecordStore::new(client.clone(), namespace).load().await?;
    let leader = lease::read_holder(client, namespace).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let marked = nodes
        .list_metadata(&ListParams::default().labels(MARKED))
        .await
        .context("listing held nodes")?;

    let cfg = record.settings.as_ref().map(Settings::window_config);
    let window = &record.window;
    let open = window.open().copied();
    let held_nodes = held_nodes(marked.items);
    let manual = window.manual().filter(|manual| now < manual.until).cloned();
    let manual_requested = record.pending_hold.filter(|hold| now < hold.until);
    let warms = match record.settings.as_ref().and_then(|s| s.launch_cost) {
        Some(_) => warms::read(client, namespace, now).await?,
        None => Vec::new(),
    };
    let cap = cfg
        .zip(open)
        .and_then(|(cfg, open)| cfg.cap(open.opened_at));
    let mut status = Status {
        open: window.holds(now),
        opened_at: open.map(|o| o.opened_at),
        deadline: window.deadline(),
        cap,
        closed_through: window.closed_through(),
        release_requested_at: record.release_request,
        scheduled: record.schedule,
        warms,
        release_done_at: record.release_done_at,
        releasing_from: record.releasing,
        settings: record.settings,
        leader,
        held_nodes,
        manual,
        manual_requested,
        ..Status::default()
    };
    status.window_opening = window_opening(&status);
    status.release = release(&status);
    Ok(status)
}

/// The held nodes, by name.
fn held_nodes(marked: Vec<PartialObjectMeta<Node>>) -> Vec<HeldNode> {
    let held_node = |node: PartialObjectMeta<Node>| HeldNode {
        holds: held_keys(&node.metadata)
            .iter()
            .map(|k| k.to_string())
            .collect(),
        held_until: held_until_stamp(&node.metadata),
        created: node.metadata.creation_timestamp.map(|t| t.0),
        name: node.metadata.name.unwrap_or_default(),
    };
    let mut held: Vec<HeldNode> = marked.into_iter().map(held_node).collect();
    held.sort_by(|a, b| a.name.cmp(&b.name));
    held
}

/// Whether a held node is newer than every window the record knows (after
/// the last closed one, and after the deadline of one not yet closed): the
/// webhook held it at admission and the leader has yet to count it.
fn window_opening(status: &Status) -> bool {
    !status.open
        && status.held_nodes.iter().any(|node| {
            node.created.is_some_and(|created| {
                status.closed_through.is_none_or(|t| created > t)
                    && status.deadline.is_none_or(|d| created >= d)
            })
        })
}

/// The release not yet finished, if any. A request that is done, or that a
/// window opened since has superseded, is not one.
fn release(status: &Status) -> Option<Release> {
    if let Some(of) = status.releasing_from {
        // The nodes of the closed windows that still carry the hold.
        let through = status.closed_through;
        let closed = |n: &&HeldNode| matches!((n.created, through), (Some(c), Some(t)) if c <= t);
        let left = status.held_nodes.iter().filter(closed).count();
        return Some(Release::Releasing { left, of });
    }
    let requested_at = status.release_requested_at?;
    let (closed_through, opened_at) = (status.closed_through, status.opened_at);
    let pending = record::release_pending(requested_at, status.release_done_at, closed_through);
    // A window opened since supersedes it: its nodes are held anew.
    let superseded = opened_at.is_some_and(|o| o > requested_at);
    (pending && !superseded).then_some(Release::Requested { requested_at })
}

pub async fn run(args: &StatusArgs) -> Result<()> {
    let client = crate::cluster::command_client("status", &args.client).await?;
    let now = Timestamp::now();
    let status = read(&client, &args.record.namespace, now)
        .await?
        .orphaned_after(args.orphaned_after, now);
    let text = match args.output {
        Output::Text => render_text_limited(&status, now, args.limit),
        Output::Json => {
            serde_json::to_string_pretty(&status).context("serialising the status")? + "\n"
        }
        Output::Yaml => serde_saphyr::to_string(&status).context("serialising as YAML")?,
    };
    print!("{text}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The readable form with every held node.
    pub(super) fn render_text(status: &Status, now: Timestamp) -> String {
        render_text_limited(status, now, 0)
    }

    pub(super) fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    pub(super) fn settings() -> Settings {
        Settings {
            hold_duration: Duration::from_secs(1200),
            max_hold: Some(Duration::from_secs(7200)),
            holds: vec!["karpenter.sh/do-not-disrupt=true".into()],
            node_selector: String::new(),
            launch_cost: None,
        }
    }

    /// A status as `read` derives it, from the record's and the nodes' facts.
    fn derived(mut status: Status) -> Status {
        status.window_opening = window_opening(&status);
        status.release = release(&status);
        status
    }

    pub(super) fn closed(closed_through: &str) -> Status {
        Status {
            open: false,
            opened_at: None,
            deadline: None,
            cap: None,
            closed_through: Some(at(closed_through)),
            release_requested_at: None,
            release_done_at: None,
            releasing_from: None,
            settings: Some(settings()),
            leader: None,
            held_nodes: vec![],
            window_opening: false,
            release: None,
            manual: None,
            manual_requested: None,
            scheduled: KeptSummary::default(),
            warms: Vec::new(),
            orphaned: None,
            overdue: Vec::new(),
        }
    }

    pub(super) fn held(name: &str, created: &str) -> HeldNode {
        HeldNode {
            name: name.into(),
            holds: vec!["karpenter.sh/do-not-disrupt".into()],
            created: Some(at(created)),
            held_until: None,
        }
    }

    #[test]
    fn a_node_held_at_admission_before_the_leader_counted_it_is_a_window_opening() {
        let mut status = closed("2026-11-22T11:00:00Z");
        status.held_nodes = vec![held("new", "2026-11-22T12:00:00Z")];
        let status = derived(status);
        assert!(status.window_opening);
        let text = render_text(&status, at("2026-11-22T12:00:01Z"));
        assert!(text.starts_with("Window:      opening ("), "{text}");
        // A node of the closed window still held is being released, not new.
        let mut status = closed("2026-11-22T11:00:00Z");
        status.held_nodes = vec![held("old", "2026-11-22T10:59:00Z")];
        assert!(!derived(status).window_opening);
    }

    #[test]
    fn a_release_request_is_shown_until_it_is_handled_done_or_superseded() {
        let requested = "2026-11-22T11:30:00Z";
        let mut pending = closed("2026-11-22T11:00:00Z");
        pending.release_requested_at = Some(at(requested));
        assert_eq!(
            derived(pending.clone()).release,
            Some(Release::Requested {
                requested_at: at(requested)
            })
        );
        let mut done = pending.clone();
        done.closed_through = Some(at(requested));
        done.release_done_at = Some(at(requested));
        assert_eq!(derived(done).release, None);
        // A window opened after the request: the request is history.
        let mut superseded = pending.clone();
        superseded.closed_through = Some(at(requested));
        superseded.open = true;
        superseded.opened_at = Some(at("2026-11-22T11:40:00Z"));
        superseded.deadline = Some(at("2026-11-22T12:00:00Z"));
        let superseded = derived(superseded);
        assert_eq!(superseded.release, None);
        let text = render_text(&superseded, at("2026-11-22T11:41:00Z"));
        assert!(!text.contains("Release:"), "{text}");
    }

    #[test]
    fn a_release_under_way_shows_how_many_nodes_are_left_of_how_many() {
        let mut status = closed("2026-11-22T11:00:00Z");
        status.releasing_from = Some(3001);
        status.held_nodes = (0..1840)
            .map(|n| held(&format!("n{n}"), "2026-11-22T10:00:00Z"))
            .chain([held("new", "2026-11-22T11:00:01Z")])
            .collect();
        let status = derived(status);
        assert_eq!(
            status.release,
            Some(Release::Releasing {
                left: 1840,
                of: 3001
            })
        );
        let text = render_text(&status, at("2026-11-22T11:00:05Z"));
        assert!(
            text.contains("Release:     releasing 1,840 of 3,001 node(s) still held\n"),
            "{text}"
        );
    }

    /// A status whose leader's Lease ran out at `lease_ended` (`None`: no
    /// Lease ever), with `nodes` held nodes.
    fn leaderless(lease_ended: Option<&str>, nodes: usize) -> Status {
        let mut status = closed("2026-11-22T10:00:00Z");
        status.leader = lease_ended.map(|ended| Holder {
            identity: "gone".into(),
            renewed_at: Some(at(ended) - SignedDuration::from_secs(15)),
            expired: true,
            live_until: Some(at(ended)),
        });
        status.held_nodes = (0..nodes)
            .map(|i| held(&format!("n{i}"), "2026-11-22T09:00:00Z"))
            .collect();
        status
    }

    #[test]
    fn holds_with_no_live_leader_for_longer_than_orphaned_after_are_called_orphaned() {
        let now = at("2026-11-22T12:10:00Z");
        let five = Duration::from_secs(300);
        let status = leaderless(Some("2026-11-22T11:45:00Z"), 3).orphaned_after(five, now);
        assert_eq!(
            status.orphaned,
            Some(Orphaned {
                since: Some(at("2026-11-22T11:45:00Z")),
                held_nodes: 3,
            })
        );
        let text = render_text(&status, now);
        assert!(
            text.contains(
                "Orphaned:    3 node(s) of node-holder's, no live leader since 2026-11-22T11:45:00Z (25m ago): nothing will release them"
            ),
            "{text}"
        );
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["orphaned"]["heldNodes"], 3, "{json}");

        // No Lease at all: orphaned at once.
        let never = leaderless(None, 1).orphaned_after(five, now);
        assert!(render_text(&never, now).contains("no leader has ever run"));
        assert_eq!(never.orphaned.map(|o| o.since), Some(None));
    }

    /// With a live leader, held nodes whose `held-until` passed longer
    /// than `--orphaned-after` ago are overdue: the leader is not keeping
    /// them. A stamp passed for less is not.
    #[test]
    fn held_nodes_long_past_their_held_until_under_a_live_leader_are_overdue() {
        let now = at("2026-11-22T12:10:00Z");
        let five = Duration::from_secs(300);
        let mut status = leaderless(Some("2026-11-22T12:20:00Z"), 0);
        if let Some(leader) = status.leader.as_mut() {
            leader.expired = false;
        }
        let stamped = |name: &str, until: &str| HeldNode {
            held_until: Some(at(until)),
            ..held(name, "2026-11-22T09:00:00Z")
        };
        status.held_nodes = vec![
            stamped("late", "2026-11-22T12:00:00Z"),
            stamped("just-passed", "2026-11-22T12:08:00Z"),
            stamped("ahead", "2026-11-22T12:30:00Z"),
            held("unstamped", "2026-11-22T09:00:00Z"),
        ];
        let checked = status.clone().orphaned_after(five, now);
        assert_eq!(checked.overdue, ["late"]);
        assert!(checked.orphaned.is_none());
        let text = render_text(&checked, now);
        assert!(
            text.contains("Overdue:     1 node(s) held past their node-holder.dev/held-until by more than --orphaned-after (late) although a leader is live"),
            "{text}"
        );
        let json = serde_json::to_value(&checked).unwrap();
        assert_eq!(json["overdue"], serde_json::json!(["late"]), "{json}");
        assert_eq!(
            json["heldNodes"][0]["heldUntil"], "2026-11-22T12:00:00Z",
            "{json}"
        );
    }

    #[test]
    fn a_short_gap_a_live_leader_or_nothing_held_is_not_orphaned() {
        let now = at("2026-11-22T12:10:00Z");
        let five = Duration::from_secs(300);
        let recent = leaderless(Some("2026-11-22T12:06:00Z"), 3).orphaned_after(five, now);
        assert_eq!(recent.orphaned, None, "lease ran out 4m ago");
        let nothing = leaderless(Some("2026-11-22T11:00:00Z"), 0).orphaned_after(five, now);
        assert_eq!(nothing.orphaned, None, "nothing held");
        let mut live = leaderless(Some("2026-11-22T11:00:00Z"), 3);
        if let Some(leader) = live.leader.as_mut() {
            leader.expired = false;
        }
        assert_eq!(
            live.orphaned_after(five, now).orphaned,
            None,
            "a live leader"
        );
        assert!(!render_text(&leaderless(None, 0), now).contains("Orphaned"));
    }
}
