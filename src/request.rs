//! What `release` and `hold` share: each writes its request into the record and waits for the live
//! leader to mark it done there. With no live leader they say so and stop, the request recorded for
//! the next leader (only [`crate::uninstall`] acts without a leader).

use std::pin::pin;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::wait::await_condition;

use crate::core::window::ManualHold;
use crate::state::lease::{self, Holder};
use crate::state::record::{self, NAME, RecordStore};
use crate::status::{self, Status};

/// What an operator asks of the leader through the record.
#[derive(Debug, Clone, Copy)]
pub enum Request<'a> {
    /// `release`, asked at this time: close the window and any manual hold.
    Release(Timestamp),
    /// `hold`: hold every node in scope until the hold's end.
    Hold(&'a ManualHold),
}

/// Who carried out a request, how long it took, and the status after.
pub struct Handled {
    pub leader: String,
    pub took: Duration,
    pub status: Status,
}

/// Writes `request` into the record, says so (`requested`, given the status before) and waits
/// for the live leader to mark it done. An error, saying what to do, when no leader lives (nor
/// a standby takes over) or it is not done within `timeout`.
pub async fn ask(
    client: &kube::Client,
    namespace: &str,
    request: Request<'_>,
    timeout: Duration,
    requested: impl FnOnce(&Status),
) -> Result<Handled> {
    let store = RecordStore::new(client.clone(), namespace);
    let (at, done_at): (_, fn(&_) -> _) = match request {
        Request::Release(at) => (at, record::release_done_at),
        Request::Hold(hold) => (hold.requested_at, record::hold_done_at),
    };
    let before = status::read(client, namespace, at).await?;
    match request {
        Request::Release(at) => store.request_release(at).await?,
        Request::Hold(hold) => store.request_hold(hold).await?,
    }
    requested(&before);
    let leader_alive = before.leader.is_some_and(|leader| !leader.expired);
    if !leader_alive && !leader_after_failover(client, namespace).await? {
        bail!("{}", no_leader(request));
    }
    let started = Instant::now();
    let records: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let done = move |cm: Option<&ConfigMap>| cm.and_then(|cm| done_at(&cm.metadata)) >= Some(at);
    let mut finished = pin!(await_condition(records, NAME, done));
    let mut deadline = pin!(tokio::time::sleep(timeout));
    loop {
        tokio::select! {
            finished = &mut finished => {
                finished.context("watching the record")?;
                break;
            }
            lost = no_live_leader(client, namespace, "carry it out") => {
                lost?;
                if !leader_after_failover(client, namespace).await? {
                    bail!("the leader stopped before it was done; {}", no_leader(request));
                }
            }
            () = &mut deadline => bail!(
                "the leader has not carried out the request after {}; see its log",
                humantime::format_duration(timeout)
            ),
        }
    }
    let leader = lease::read_holder(client, namespace).await?;
    Ok(Handled {
        leader: leader.map_or("the leader".into(), |l| l.identity),
        took: started.elapsed(),
        status: status::read(client, namespace, Timestamp::now()).await?,
    })
}

/// Whether a live leader holds the Lease now or within three Lease durations
/// plus [`FAILOVER_SLACK`]: a failover is not "no leader".
async fn leader_after_failover(client: &kube::Client, namespace: &str) -> Result<bool> {
    let holder = lease::read_holder(client, namespace).await?;
    let lease = |h: &Holder| h.live_until?.duration_since(h.renewed_at?).try_into().ok();
    let lease: Duration = holder.as_ref().and_then(lease).unwrap_or_default();
    let grace = lease.saturating_mul(3).saturating_add(FAILOVER_SLACK);
    let deadline = Instant::now() + grace;
    let mut live = holder.as_ref().is_some_and(|h| !h.expired);
    if !live {
        println!(
            "no live leader: waiting up to {} for one to take the Lease…",
            humantime::format_duration(grace)
        );
    }
    while !live && Instant::now() < deadline {
        tokio::time::sleep(crate::retry::LEADER_POLL).await;
        live = lease::read_holder(client, namespace)
            .await?
            .is_some_and(|h| !h.expired);
    }
    Ok(live)
}

/// How long beyond three Lease durations a command waits for a standby.
const FAILOVER_SLACK: Duration = Duration::from_secs(10);

/// What a command says when no leader lives to carry out `request`.
fn no_leader(request: Request) -> String {
    let recorded = "no live leader: the request is recorded, and the next leader carries it out when it starts";
    match request {
        Request::Release(_) => format!(
            "{recorded}. To strip every hold of node-holder's now, without a leader, run `node-holder uninstall` (without --deployment and --webhook-configuration it leaves the installation in place)"
        ),
        Request::Hold(_) => format!("{recorded}; until then no node is held by it"),
    }
}

/// Returns once the Lease has no live holder, saying who it waits for
/// meanwhile. Polled: a leader's death shows only as renewals that stop.
pub async fn no_live_leader(client: &kube::Client, namespace: &str, to: &str) -> Result<()> {
    let mut announced = None;
    loop {
        let leader = lease::read_holder(client, namespace).await?;
        let Some(leader) = leader.filter(|l| !l.expired) else {
            return Ok(());
        };
        if announced.as_ref() != Some(&leader.identity) {
            println!("waiting for the leader {} to {to}…", leader.identity);
            announced = Some(leader.identity);
        }
        tokio::time::sleep(crate::retry::LEADER_POLL).await;
    }
}
