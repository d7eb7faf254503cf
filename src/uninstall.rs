//! `node-holder uninstall`: what the chart's pre-delete hook runs, so that
//! nothing of node-holder's outlives it; each step (see [`run`]) is safe to
//! repeat, and stripping the holds is the one release without a leader.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use jiff::Timestamp;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::cli::UninstallArgs;
use crate::controller::{self, PassReport};
use crate::core::holds::MARKED;
use crate::core::warm::{PRIORITY_CLASS, WARM_SELECTOR};
use crate::request;
use crate::state::lease;
use crate::state::record::{self, RecordStore};

/// The `uninstall` subcommand. The order matters: admission goes first, so
/// no new node is held at its CREATE; the replicas stop next, so none holds
/// a node late; then the holds come off, and the record and Lease go last.
pub async fn run(args: &UninstallArgs) -> Result<()> {
    let client = crate::cluster::command_client("uninstall", &args.request.client).await?;
    let namespace = &args.request.record.namespace;
    stop_admission(&client, args).await?;
    if let Some(deployment) = &args.deployment {
        stop_replicas(&client, namespace, deployment, args.timeout).await?;
    }
    release_everything(&client, args).await?;
    let marked = Api::<Node>::all(client.clone())
        .list_metadata(&ListParams::default().labels(MARKED))
        .await
        .context("listing the nodes node-holder marked")?;
    let left = marked.items.len();
    ensure!(
        left == 0,
        "{left} node(s) still carry node-holder's marker after the release; run uninstall again"
    );
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    delete(&config_maps, record::NAME).await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    delete(&leases, record::NAME).await?;
    delete_placeholders(&client, namespace).await?;
    println!("uninstalled: no hold, record, Lease or placeholder of node-holder's is left");
    Ok(())
}

/// Deletes the admission registration the flags name.
async fn stop_admission(client: &kube::Client, args: &UninstallArgs) -> Result<()> {
    if let Some(name) = &args.webhook_configuration {
        let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
        delete(&webhooks, name).await?;
    }
    if let Some(name) = &args.admission_policy {
        for (kind, plural) in [
            (
                "MutatingAdmissionPolicyBinding",
                "mutatingadmissionpolicybindings",
            ),
            ("MutatingAdmissionPolicy", "mutatingadmissionpolicies"),
        ] {
            let gvk = GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
            let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            delete(&api, name).await?;
        }
    }
    Ok(())
}

/// Scales `deployment` to 0 and waits until no replica leads any more.
async fn stop_replicas(
    client: &kube::Client,
    namespace: &str,
    deployment: &str,
    timeout: Duration,
) -> Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let scale = Patch::Merge(json!({"spec": {"replicas": 0}}));
    match deployments
        .patch_scale(deployment, &PatchParams::default(), &scale)
        .await
    {
        Ok(_) => println!("scaled deployment {namespace}/{deployment} to 0"),
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(err) => {
            return Err(err)
                .with_context(|| format!("scaling deployment {namespace}/{deployment} to 0"));
        }
    }
    tokio::time::timeout(timeout, request::no_live_leader(client, namespace, "stop"))
        .await
        .with_context(|| {
            format!(
                "a replica still leads after {}: is node-holder still running?",
                humantime::format_duration(timeout)
            )
        })?
}

/// Closes every window, ends a manual hold and strips every hold: the
/// leader's own pass, run once here under the Lease so that no replica
/// starting meanwhile races it (`release` and `hold` only ask a leader).
async fn release_everything(client: &kube::Client, args: &UninstallArgs) -> Result<()> {
    let namespace = &args.request.record.namespace;
    let identity = format!("uninstall-{}", controller::default_identity());
    let manager =
        lease::lease_manager(client, namespace, &identity, COMMAND_LEASE.as_secs()).await?;
    match tokio::time::timeout(args.timeout, manager.changed()).await {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) | Err(_) => bail!(
            "a replica took the Lease: node-holder still runs; scale it down (--deployment) first"
        ),
        Ok(Err(err)) => return Err(err).context("taking the lease"),
    }
    let released = release_under_lease(client, namespace, identity).await;
    if let Err(err) = manager.release().await {
        eprintln!("warning: releasing the lease failed: {err}");
    }
    let report = released?;
    println!("released {} node(s)", report.released.len());
    for key in &report.left {
        println!("  left in place (changed by someone else): {key}");
    }
    Ok(())
}

/// The pass run here, with the settings the last leader recorded or, when
/// none has run, `serve`'s defaults; its patching bounds are always `serve`'s.
async fn release_under_lease(
    client: &kube::Client,
    namespace: &str,
    identity: String,
) -> Result<PassReport> {
    let record = RecordStore::new(client.clone(), namespace).load().await?;
    let defaults = crate::cli::serve_defaults()?;
    let (window, holding) = match record.settings {
        Some(settings) => (settings.window_config(), settings.holding()?),
        None => (defaults.window.window_config(), defaults.holding.holding()?),
    };
    let config = controller::Config {
        window,
        holding,
        namespace: namespace.to_string(),
        identity,
        lease_duration: COMMAND_LEASE,
        // The release ends the window outright: nothing is kept for runs.
        schedule: None,
        warm_lead: None,
        qps: defaults.api_qps,
    };
    controller::release_once(client.clone(), config, Timestamp::now()).await
}

/// How long `uninstall` holds the Lease at a time while it releases.
const COMMAND_LEASE: Duration = Duration::from_secs(15);

/// Deletes every placeholder Job in `namespace` (their pods with them) and
/// the PriorityClass they run at.
async fn delete_placeholders(client: &kube::Client, namespace: &str) -> Result<()> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().labels(WARM_SELECTOR);
    match jobs
        .delete_collection(&DeleteParams::background(), &params)
        .await
    {
        Ok(_) => println!("deleted the placeholder Jobs in {namespace}"),
        Err(kube::Error::Api(status)) if status.code == 403 => {
            println!("no placeholder Jobs to delete: warms were never allowed here (403)");
            return Ok(());
        }
        Err(err) => return Err(err).context("deleting the placeholder Jobs"),
    }
    delete(&Api::<PriorityClass>::all(client.clone()), PRIORITY_CLASS).await
}

/// Deletes `name`; gone already is fine.
async fn delete<K>(api: &Api<K>, name: &str) -> Result<()>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {
            println!("deleted {} {name}", api.resource_url());
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(err) => Err(err).with_context(|| format!("deleting {} {name}", api.resource_url())),
    }
}
