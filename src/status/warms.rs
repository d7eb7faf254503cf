//! `status`'s warms (`--warm-before-runs`): the placeholder Jobs under way in node-holder's
//! namespace, the run each warms for, where its pods are and what their nodes have cost so far.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use serde::Serialize;

use crate::core::warm::{HandOver, WARM_SELECTOR, warmed_for};

/// One warm under way.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WarmShown {
    /// The placeholder Job.
    pub job: String,
    /// The CronJob (`namespace/name`) and the run it warms for.
    pub cronjob: Option<String>,
    pub run_at: Option<Timestamp>,
    /// When the Job was created.
    pub since: Option<Timestamp>,
    pub so_far: HandOver,
    /// The nodes its pods are on.
    pub nodes: Vec<String>,
}

/// The warms under way in `namespace`, soonest run first. Listing Jobs
/// there is refused (403): none shown, and a warning says why.
pub async fn read(
    client: &kube::Client,
    namespace: &str,
    now: Timestamp,
) -> Result<Vec<WarmShown>> {
    let params = ListParams::default().labels(WARM_SELECTOR);
    let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
    let jobs = match jobs.list(&params).await {
        Ok(jobs) => jobs.items,
        Err(kube::Error::Api(e)) if e.code == 403 => {
            let why = e.message;
            eprintln!("warning: may not list Jobs in {namespace}: warms not shown ({why})");
            return Ok(Vec::new());
        }
        Err(err) => return Err(err).context("listing the placeholder Jobs"),
    };
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&params)
        .await
        .context("listing the placeholder pods")?
        .items;
    let by_job = pods_by_job(&pods);
    let created = node_creation(client, by_job.values().flatten().flatten().copied()).await?;
    let show = |job| shown(job, &by_job, &created, now);
    let mut warms: Vec<WarmShown> = jobs.iter().map(show).collect();
    warms.sort_by(|a, b| (a.run_at, &a.job).cmp(&(b.run_at, &b.job)));
    Ok(warms)
}

/// A placeholder Job, with its pods' nodes (`None`: not bound yet) by Job.
fn shown(
    job: &Job,
    by_job: &BTreeMap<&str, Vec<Option<&str>>>,
    created: &BTreeMap<String, Timestamp>,
    now: Timestamp,
) -> WarmShown {
    let name = job.metadata.name.clone().unwrap_or_default();
    let (cronjob, run_at) = warmed_for(job.metadata.annotations.as_ref());
    let since = job.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let pods = by_job.get(name.as_str()).map_or(&[][..], Vec::as_slice);
    let created = |node: &str| created.get(node).copied();
    let so_far = HandOver::of(pods.iter().copied(), created, now, since.unwrap_or(now));
    let nodes: BTreeSet<&str> = pods.iter().flatten().copied().collect();
    WarmShown {
        job: name,
        cronjob,
        run_at,
        since,
        so_far,
        nodes: nodes.into_iter().map(String::from).collect(),
    }
}

/// The live placeholder pods (not finished, not going) by Job, each with its node.
fn pods_by_job(pods: &[Pod]) -> BTreeMap<&str, Vec<Option<&str>>> {
    let mut by_job: BTreeMap<&str, Vec<Option<&str>>> = BTreeMap::new();
    for pod in pods {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let over = matches!(phase, Some("Succeeded" | "Failed"));
        let labels = pod.metadata.labels.as_ref();
        let job = labels.and_then(|l| l.get("batch.kubernetes.io/job-name"));
        if let (Some(job), false, None) = (job, over, &pod.metadata.deletion_timestamp) {
            let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
            by_job.entry(job.as_str()).or_default().push(node);
        }
    }
    by_job
}

/// When each of `nodes` was created (a node gone is left out).
async fn node_creation(
    client: &kube::Client,
    nodes: impl Iterator<Item = &str>,
) -> Result<BTreeMap<String, Timestamp>> {
    let api: Api<Node> = Api::all(client.clone());
    let mut created = BTreeMap::new();
    let names: BTreeSet<&str> = nodes.collect();
    for name in names {
        let node = api
            .get_metadata_opt(name)
            .await
            .with_context(|| format!("reading node {name}"))?;
        if let Some(at) = node.and_then(|n| n.metadata.creation_timestamp) {
            created.insert(name.to_string(), at.0);
        }
    }
    Ok(created)
}
