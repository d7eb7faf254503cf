//! `node-holder release`: asks the leader to close the hold window now (and
//! end a manual hold) and strip node-holder's holds (see
//! [`crate::request`]).

use anyhow::Result;
use jiff::Timestamp;

use crate::cli::ReleaseArgs;
use crate::request::{self, Handled, Request};
use crate::state::record::{self, RecordStore};
use crate::status;

/// The `release` subcommand.
pub async fn run(args: &ReleaseArgs) -> Result<()> {
    let client = crate::cluster::command_client("release", &args.request.client).await?;
    let namespace = &args.request.record.namespace;
    let store = RecordStore::new(client.clone(), namespace);
    let now = Timestamp::now();
    let before = status::read(&client, namespace, now).await?;
    store.request_release(now).await?;
    println!(
        "release requested at {now}: window {}, {} node(s) carry node-holder's hold",
        if before.open { "open" } else { "closed" },
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
