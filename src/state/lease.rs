//! The Lease `node-holder-window` beside the record: who may act on the
//! window. One notion of a live holder for the leader before each pass,
//! `status`, and `release` deciding whether to wait for a leader.

use anyhow::{Context, Result};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use serde::Serialize;

use super::record::{FIELD_MANAGER, NAME};

/// This replica may not act: the Lease is not its own now.
#[derive(Debug, thiserror::Error)]
#[error("not acting: the Lease {lease} is held by {holder} (renewed {renewed}), not by {identity}")]
pub struct NotLeading {
    pub lease: String,
    pub holder: String,
    pub renewed: String,
    pub identity: String,
}

/// The Lease's holder, and whether its hold is live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    pub identity: String,
    pub renewed_at: Option<Timestamp>,
    /// The lease ran out without renewal: nobody may act on its behalf.
    pub expired: bool,
    /// Its renewal plus the lease duration; `None`: never renewed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live_until: Option<Timestamp>,
}

/// The holder of `lease` at `now`, if it names one. A hold is live from its
/// renewal up to, not including, the renewal plus the lease duration.
pub fn holder(lease: &Lease, now: Timestamp) -> Option<Holder> {
    let spec = lease.spec.as_ref()?;
    let identity = spec.holder_identity.clone().filter(|h| !h.is_empty())?;
    let renewed_at = spec.renew_time.as_ref().map(|t| t.0);
    let duration = SignedDuration::from_secs(spec.lease_duration_seconds.unwrap_or(0).into());
    let live_until =
        renewed_at.map(|renewed| renewed.saturating_add(duration).unwrap_or(Timestamp::MAX));
    let expired = live_until.is_none_or(|until| now >= until);
    Some(Holder {
        identity,
        renewed_at,
        expired,
        live_until,
    })
}

/// The Lease's holder now, as the API server has it.
pub async fn read_holder(client: &kube::Client, namespace: &str) -> Result<Option<Holder>> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let lease = leases
        .get_opt(NAME)
        .await
        .with_context(|| format!("reading the Lease {namespace}/{NAME}"))?;
    Ok(lease.and_then(|lease| holder(&lease, Timestamp::now())))
}

/// Fails unless `identity` holds the Lease now: what a leader checks before it acts, because
/// kube-lease-manager keeps reporting leadership while it cannot reach the API server, and after an
/// outage longer than the Lease a standby may have taken it over.
pub async fn ensure_leading(client: &kube::Client, namespace: &str, identity: &str) -> Result<()> {
    match read_holder(client, namespace).await? {
        Some(holder) if holder.identity == identity && !holder.expired => Ok(()),
        holder => {
            let (who, renewed) =
                holder.map_or(("nobody".to_string(), None), |h| (h.identity, h.renewed_at));
            Err(NotLeading {
                lease: format!("{namespace}/{NAME}"),
                holder: who,
                renewed: renewed.map_or_else(|| "never".to_string(), |t| t.to_string()),
                identity: identity.to_string(),
            }
            .into())
        }
    }
}

/// The Lease beside the record, competed for as `identity`: held for `duration` seconds (at
/// least 2), renewed a third of it before it ends. Each identity is a field manager of its own:
/// taking a free Lease is an apply without force, and only distinct managers make a concurrent
/// taker's apply conflict (with one shared manager both would lead).
pub async fn lease_manager(
    client: &kube::Client,
    namespace: &str,
    identity: &str,
    duration: u64,
) -> Result<LeaseManager> {
    let duration = duration.max(2);
    // Field managers are limited to 128 characters.
    let field_manager: String = format!("{FIELD_MANAGER}-lease-{identity}")
        .chars()
        .take(128)
        .collect();
    LeaseManagerBuilder::new(client.clone(), NAME)
        .with_namespace(namespace)
        .with_identity(identity)
        .with_duration(duration)
        .with_grace((duration / 3).max(1))
        .with_field_manager(field_manager)
        .build()
        .await
        .with_context(|| format!("setting up the Lease {namespace}/{NAME}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn a_hold_is_live_up_to_but_not_including_renewal_plus_duration() {
        let mut lease = Lease::default();
        assert!(holder(&lease, at("2026-11-22T12:00:00Z")).is_none());
        lease.spec = Some(LeaseSpec {
            holder_identity: Some("a".into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(at("2026-11-22T11:59:50Z"))),
            ..Default::default()
        });
        assert!(
            !holder(&lease, at("2026-11-22T12:00:04.999Z"))
                .unwrap()
                .expired
        );
        assert!(holder(&lease, at("2026-11-22T12:00:05Z")).unwrap().expired);
        assert!(holder(&lease, at("2026-11-22T12:00:06Z")).unwrap().expired);
        // A negative duration is no hold at all.
        lease.spec.as_mut().unwrap().lease_duration_seconds = Some(-1);
        assert!(holder(&lease, at("2026-11-22T11:59:50Z")).unwrap().expired);
    }

    #[test]
    fn a_lease_never_renewed_or_with_an_empty_holder_has_no_live_holder() {
        let mut lease = Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some("a".into()),
                lease_duration_seconds: Some(15),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(holder(&lease, at("2026-11-22T12:00:00Z")).unwrap().expired);
        lease.spec.as_mut().unwrap().holder_identity = Some(String::new());
        assert!(holder(&lease, at("2026-11-22T12:00:00Z")).is_none());
    }
}
