//! `node-holder release`: closes the hold window now (and ends a manual
//! hold) and strips node-holder's holds, through the leader or, with none,
//! by itself (see [`crate::request`]).

use anyhow::Result;
use jiff::Timestamp;

use crate::cli::ReleaseArgs;
use crate::controller::Request;
use crate::controller::record::{self, RecordStore};
use crate::request::{self, Handled};
use crate::status;

/// The `release` subcommand.
pub async fn run(args: &ReleaseArgs) -> Result<()> {
    let client = crate::cluster::command_client("release", &args.request.client).await?;
    let namespace = &args.request.record.namespace;
    let store = RecordStore::new(client.clone(), namespace);
    let now = Timestamp::now();
    let before = status::read(&client, namespace, now).await?;
    let requested = store.request_release(now).await?;
    println!(
        "release requested at {requested}: window {}, {} node(s) carry node-holder's hold",
        if before.open { "open" } else { "closed" },
        before.held_nodes.len()
    );
    let done = move |meta: &_| record::release_done_at(meta).is_some_and(|done| done >= requested);
    let leader_alive = before.leader.is_some_and(|leader| !leader.expired);
    let handled = request::handle(
        &client,
        &args.request,
        Request::Release(requested),
        done,
        leader_alive,
        args.timeout,
    )
    .await?;
    match handled {
        Handled::ByLeader { leader, took } => {
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
        }
        Handled::Here(report) => {
            println!("released {} node(s)", report.released.len());
            for name in &report.released {
                println!("  {name}");
            }
            for key in &report.left {
                println!("  left in place (changed by someone else): {key}");
            }
        }
    }
    Ok(())
}
