//! What `release` and `hold` share: ask the leader through the record, then
//! wait for the record to say the request is done; with no live leader, take
//! the Lease and handle the request with the leader's own pass, so that no
//! replica starting meanwhile races it.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::wait::await_condition;

use crate::cli::RequestArgs;
use crate::controller::{self, PassReport, default_identity};
use crate::state::record::{self, RecordStore, Settings};
use crate::state::{Request, lease};

/// Who handled a request.
pub enum Handled {
    /// The leader, named, in the time shown.
    ByLeader { leader: String, took: Duration },
    /// This command, with the Lease, as the report says.
    Here(PassReport),
}

/// Waits for a live leader to handle `request` (until `done` says so of
/// the record) or handles it here when there is none; `leader_alive` is
/// what the caller saw before asking.
pub async fn handle(
    client: &kube::Client,
    args: &RequestArgs,
    request: Request,
    done: impl Fn(&ObjectMeta) -> bool + Clone + Send + 'static,
    mut leader_alive: bool,
    timeout: Duration,
) -> Result<Handled> {
    // The leader may die while we wait, or one may start while we take over:
    // each hands the job to the other, a few times at most.
    for _ in 0..crate::retry::REQUEST_HANDOFFS {
        let handled = if leader_alive {
            let namespace = &args.record.namespace;
            wait_for_leader(client, namespace, &request, done.clone(), timeout).await?
        } else {
            println!("no live leader: {} here", doing(&request));
            handle_here(client, args, request.clone()).await?
        };
        if let Some(handled) = handled {
            return Ok(handled);
        }
        leader_alive = !leader_alive;
    }
    bail!("leadership kept changing; run the command again")
}

/// Waits for the leader to handle the request: returns the moment the
/// record says it is done (a watch, not a poll); `None` when no live leader
/// is left to do it.
async fn wait_for_leader(
    client: &kube::Client,
    namespace: &str,
    request: &Request,
    done: impl Fn(&ObjectMeta) -> bool + Send + 'static,
    timeout: Duration,
) -> Result<Option<Handled>> {
    let started = Instant::now();
    let records: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let finished = await_condition(records, record::NAME, move |cm: Option<&ConfigMap>| {
        cm.is_some_and(|cm| done(&cm.metadata))
    });
    tokio::select! {
        finished = finished => {
            finished.context("watching the record")?;
        }
        lost = no_live_leader(client, namespace, command_name(request)) => {
            lost?;
            return Ok(None);
        }
        () = tokio::time::sleep(timeout) => bail!(
            "the leader has not handled the request after {}; see its log",
            humantime::format_duration(timeout)
        ),
    }
    let leader = lease::read_holder(client, namespace).await?;
    Ok(Some(Handled::ByLeader {
        leader: leader.map_or("the leader".into(), |l| l.identity),
        took: started.elapsed(),
    }))
}

/// Returns once the Lease has no live holder (the leader died, or handed
/// over to nobody); says who it waits for meanwhile. Polled: a leader's
/// death shows only as renewals that stop.
pub async fn no_live_leader(client: &kube::Client, namespace: &str, to: &str) -> Result<()> {
    let mut announced = None;
    loop {
        match lease::read_holder(client, namespace).await? {
            Some(leader) if !leader.expired => {
                if announced.as_ref() != Some(&leader.identity) {
                    println!("waiting for the leader {} to {to}…", leader.identity);
                    announced = Some(leader.identity);
                }
            }
            _ => return Ok(()),
        }
        tokio::time::sleep(crate::retry::LEADER_POLL).await;
    }
}

/// Takes the Lease and handles the request with the leader's own pass;
/// `None` when a leader took the Lease first.
async fn handle_here(
    client: &kube::Client,
    args: &RequestArgs,
    request: Request,
) -> Result<Option<Handled>> {
    let identity = format!("{}-{}", command_name(&request), default_identity());
    let manager = lease::lease_manager(
        client,
        &args.record.namespace,
        &identity,
        COMMAND_LEASE.as_secs(),
    )
    .await?;
    match tokio::time::timeout(crate::retry::LEASE_TAKE, manager.changed()).await {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) | Err(_) => {
            // Someone else took the lease meanwhile: it handles the request.
            return Ok(None);
        }
        Ok(Err(err)) => return Err(err).context("taking the lease"),
    }
    let result = handle_with_lease(client, args, request, identity).await;
    if let Err(err) = manager.release().await {
        eprintln!("warning: releasing the lease failed: {err}");
    }
    result.map(|report| Some(Handled::Here(report)))
}

async fn handle_with_lease(
    client: &kube::Client,
    args: &RequestArgs,
    request: Request,
    identity: String,
) -> Result<PassReport> {
    let record = RecordStore::new(client.clone(), &args.record.namespace)
        .load()
        .await?;
    let config = leader_config(args, record.settings, identity)?;
    controller::handle_once(client.clone(), config, request).await
}

/// The leader's configuration for a pass run here: the settings the last
/// leader recorded, or, when none has run, `serve`'s defaults; the bounds of
/// its patching are always `serve`'s defaults.
fn leader_config(
    args: &RequestArgs,
    settings: Option<Settings>,
    identity: String,
) -> Result<controller::Config> {
    let defaults = crate::cli::serve_defaults()?;
    let (window, holding, pools) = match settings {
        Some(settings) => (
            settings.window_config(),
            settings.holding()?,
            settings.pools()?,
        ),
        None => (
            defaults.window.window_config(),
            defaults.holding.holding()?,
            defaults.holding.pools()?,
        ),
    };
    Ok(controller::Config {
        window,
        holding,
        pools,
        namespace: args.record.namespace.clone(),
        identity,
        lease_duration: COMMAND_LEASE,
        // A release or a manual hold run by hand does not keep nodes for
        // scheduled runs: it ends or sets the windows outright.
        schedule: None,
        warm_lead: None,
        qps: defaults.patching.api_qps,
        // Run by hand, the pass publishes no Events (`EventSink::none`).
        node_events_per_pass: 0,
    })
}

/// The command that makes `request`, which names it in the Lease.
fn command_name(request: &Request) -> &'static str {
    match request {
        Request::Release(_) => "release",
        Request::Hold(_) => "hold",
    }
}

/// What this command does when no leader runs, as its output says.
fn doing(request: &Request) -> &'static str {
    match request {
        Request::Release(_) => "releasing",
        Request::Hold(_) => "holding",
    }
}

/// How long `release` or `hold` holds the Lease at a time while it works.
const COMMAND_LEASE: Duration = Duration::from_secs(15);
