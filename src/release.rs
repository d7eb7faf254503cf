//! `node-holder release`: asks the leader to close the hold window now (and end a manual hold) and
//! strip node-holder's holds (see [`crate::request`]).

use anyhow::Result;
use jiff::Timestamp;

use crate::cli::ReleaseArgs;
use crate::request::{self, Request};
use crate::status::Status;

/// The `release` subcommand.
pub async fn run(args: &ReleaseArgs) -> Result<()> {
    let client = crate::cluster::command_client("release", &args.request.client).await?;
    let namespace = &args.request.record.namespace;
    let now = Timestamp::now();
    let requested = |before: &Status| {
        println!(
            "release requested at {now}: window {}, {} node(s) carry node-holder's hold",
            if before.open { "open" } else { "closed" },
            before.held_nodes.len()
        )
    };
    let asked = Request::Release(now);
    let handled = request::ask(&client, namespace, asked, args.timeout, requested).await?;
    let since = handled.status.open.then_some(" by a window opened since");
    println!(
        "released by {} in {:.1?}; {} node(s) still held{}",
        handled.leader,
        handled.took,
        handled.status.held_nodes.len(),
        since.unwrap_or_default()
    );
    Ok(())
}
