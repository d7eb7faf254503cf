//! `node-holder release`: closes the hold window now and strips node-holder's
//! holds. It asks through the record; a live leader does the work (the
//! command waits and reports); with no live leader the command takes the Lease
//! itself, so that no replica starting meanwhile races it, and does the same.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::wait::await_condition;

use crate::cli::ReleaseArgs;
use crate::controller::record::{self, RecordStore, Settings};
use crate::controller::{self, default_identity, lease};
use crate::status;

/// The `release` subcommand.
pub async fn run(args: &ReleaseArgs) -> Result<()> {
    let client = crate::cluster::command_client("release", &args.client).await?;
    let namespace = &args.record.namespace;
    let store = RecordStore::new(client.clone(), namespace);
    let now = Timestamp::now();
    let before = status::read(&client, namespace, now).await?;
    let requested = store.request_release(now).await?;
    println!(
        "release requested at {requested}: window {}, {} node(s) carry node-holder's hold",
        if before.open { "open" } else { "closed" },
        before.held_nodes.len()
    );
    let mut leader_alive = before.leader.is_some_and(|leader| !leader.expired);
    // The leader may die while we wait, or one may start while we take over:
    // each hands the job to the other, a few times at most.
    for _ in 0..3 {
        let finished = if leader_alive {
            wait_for_leader(&client, namespace, requested, args.timeout).await?
        } else {
            println!("no live leader: releasing here");
            release_here(&client, args, requested).await?
        };
        if finished {
            return Ok(());
        }
        leader_alive = !leader_alive;
    }
    bail!("leadership kept changing during the release; run release again")
}

/// Waits for the leader to handle the request: returns the moment the
/// record says it is done (a watch, not a poll); `false` when no live leader
/// is left to do it.
async fn wait_for_leader(
    client: &kube::Client,
    namespace: &str,
    requested: Timestamp,
    timeout: Duration,
) -> Result<bool> {
    let started = Instant::now();
    let records: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let done = await_condition(records, record::NAME, move |cm: Option<&ConfigMap>| {
        cm.and_then(|cm| record::release_done_at(&cm.metadata))
            .is_some_and(|done| done >= requested)
    });
    tokio::select! {
        done = done => {
            done.context("watching the record for the release")?;
        }
        lost = no_live_leader(client, namespace) => {
            lost?;
            return Ok(false);
        }
        () = tokio::time::sleep(timeout) => {
            let status = status::read(client, namespace, Timestamp::now()).await?;
            bail!(
                "the leader has not finished the release after {}: {} node(s) still held; see its log",
                humantime::format_duration(timeout),
                status.held_nodes.len()
            );
        }
    }
    let status = status::read(client, namespace, Timestamp::now()).await?;
    println!(
        "released by {} in {:.1?}; {} node(s) still held{}",
        status.leader.map_or("the leader".into(), |l| l.identity),
        started.elapsed(),
        status.held_nodes.len(),
        if status.open {
            " by a window opened since"
        } else {
            ""
        }
    );
    Ok(true)
}

/// Returns once the Lease has no live holder (the leader died, or handed
/// over to nobody); says who it waits for meanwhile. Polled: a leader's
/// death shows only as renewals that stop.
async fn no_live_leader(client: &kube::Client, namespace: &str) -> Result<()> {
    let mut announced = None;
    loop {
        match lease::read_holder(client, namespace).await? {
            Some(leader) if !leader.expired => {
                if announced.as_ref() != Some(&leader.identity) {
                    println!("waiting for the leader {} to release…", leader.identity);
                    announced = Some(leader.identity);
                }
            }
            _ => return Ok(()),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Takes the lease and releases with the leader's own pass; `false` when a
/// leader took the lease first.
async fn release_here(
    client: &kube::Client,
    args: &ReleaseArgs,
    requested: Timestamp,
) -> Result<bool> {
    let identity = format!("release-{}", default_identity());
    let manager = lease::lease_manager(
        client,
        &args.record.namespace,
        &identity,
        RELEASE_LEASE.as_secs(),
    )
    .await?;
    match tokio::time::timeout(Duration::from_secs(20), manager.changed()).await {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) | Err(_) => {
            // Someone else took the lease meanwhile: it handles the request.
            return Ok(false);
        }
        Ok(Err(err)) => return Err(err).context("taking the lease"),
    }
    let result = release_with_lease(client, args, requested, identity).await;
    if let Err(err) = manager.release().await {
        eprintln!("warning: releasing the lease failed: {err}");
    }
    result.map(|()| true)
}

async fn release_with_lease(
    client: &kube::Client,
    args: &ReleaseArgs,
    requested: Timestamp,
    identity: String,
) -> Result<()> {
    let record = RecordStore::new(client.clone(), &args.record.namespace)
        .load()
        .await?;
    let config = release_config(args, record.settings, identity)?;
    let report = controller::release_once(client.clone(), config, requested).await?;
    println!("released {} node(s)", report.released.len());
    for name in &report.released {
        println!("  {name}");
    }
    for key in &report.left {
        println!("  left in place (changed by someone else): {key}");
    }
    Ok(())
}

/// The leader's configuration for a release run here: the settings the last
/// leader recorded, or, when none has run, the flags.
fn release_config(
    args: &ReleaseArgs,
    settings: Option<Settings>,
    identity: String,
) -> Result<controller::Config> {
    let (window, policy) = match settings {
        Some(settings) => (settings.window_config(), settings.policy()?),
        None => (args.window.window_config(), args.policy.policy()?),
    };
    Ok(controller::Config {
        window,
        policy,
        namespace: args.record.namespace.clone(),
        identity,
        lease_duration: RELEASE_LEASE,
        qps: args.patching.api_qps,
        max_in_flight: args.patching.api_max_in_flight,
        coalesce_idle: args.patching.coalesce_idle,
        coalesce_max: args.patching.coalesce_max,
    })
}

/// How long `release` holds the Lease at a time while it works.
const RELEASE_LEASE: Duration = Duration::from_secs(15);
