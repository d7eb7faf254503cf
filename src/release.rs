//! `node-holder release`: asks the leader to close the hold window now (and
//! end a manual hold) and strip node-holder's holds (see
//! [`crate::request`]).

use anyhow::{Result, bail};
use jiff::Timestamp;

use crate::cli::ReleaseArgs;
use crate::core::grouping;
use crate::request::{self, Handled, Request};
use crate::state::record::{self, RecordStore, ReleaseRequest};
use crate::status;

/// The `release` subcommand.
pub async fn run(args: &ReleaseArgs) -> Result<()> {
    let client = crate::cluster::command_client("release", &args.request.client).await?;
    let namespace = &args.request.record.namespace;
    let store = RecordStore::new(client.clone(), namespace);
    let now = Timestamp::now();
    let before = status::read(&client, namespace, now).await?;
    check_group(args, &before)?;
    let request = ReleaseRequest {
        at: now,
        group: args.group.clone(),
    };
    store.request_release(&request).await?;
    println!(
        "release requested at {now}{}: {}, {} node(s) carry node-holder's hold",
        args.group.as_deref().map_or_else(String::new, |g| format!(
            " for group {}",
            grouping::display(g)
        )),
        windows_text(&before, args.group.as_deref()),
        before.held_nodes.len()
    );
    let done = move |meta: &_| record::release_done_at(meta).is_some_and(|done| done >= now);
    let leader_alive = before.leader.is_some_and(|leader| !leader.expired);
    let Handled { leader, took } = request::await_leader(
        &client,
        namespace,
        Request::Release,
        done,
        leader_alive,
        args.timeout,
    )
    .await?;
    let status = status::read(&client, namespace, Timestamp::now()).await?;
    println!(
        "released by {leader} in {took:.1?}; {} node(s) still held{}",
        status.held_nodes.len(),
        if status.open {
            " by a window opened since"
        } else {
            ""
        }
    );
    Ok(())
}

/// `--group` needs windows grouped by a label, as the last leader recorded
/// (with none, `serve`'s default is one window for every node).
fn check_group(args: &ReleaseArgs, status: &status::Status) -> Result<()> {
    let grouped = status
        .settings
        .as_ref()
        .is_some_and(|settings| settings.window_per_label.is_some());
    if args.group.is_some() && !grouped {
        bail!(
            "--group needs windows grouped by a label (serve --window-per-label); the leader runs one window for every node: release without --group"
        );
    }
    Ok(())
}

/// Which windows were open before the release: the one window, or how many
/// groups' (the group's, with `--group`).
fn windows_text(status: &status::Status, group: Option<&str>) -> String {
    let state = |open: bool| if open { "open" } else { "closed" };
    let grouped = status
        .settings
        .as_ref()
        .is_some_and(|s| s.window_per_label.is_some());
    match group {
        None if !grouped => format!("window {}", state(status.open)),
        None => {
            let open = status.groups.iter().filter(|g| g.open).count() + usize::from(status.open);
            format!("{open} group window(s) open")
        }
        Some(group) => {
            let open = match status.groups.iter().find(|g| g.group == group) {
                _ if group.is_empty() => status.open,
                found => found.is_some_and(|g| g.open),
            };
            let manual = status.manual.as_ref().map_or_else(String::new, |m| {
                format!("; the manual hold until {} holds it still", m.until)
            });
            format!("its window {}{manual}", state(open))
        }
    }
}
