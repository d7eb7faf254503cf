//! The bench's cluster: a control plane with the admin's view of its nodes,
//! the bench's own node requests, the API server's counters at each step,
//! and node-holder's window record.

use std::sync::Arc;

use anyhow::{Context, Result};
use futures::{StreamExt as _, TryStreamExt as _};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::Value;
use testenv::ControlPlane;

use super::Checkpoint;
use crate::fleet::cloud_node;
use crate::measure::apiserver::ApiMetrics;
use crate::measure::observer::OwnRequests;

/// The ConfigMap of node-holder's window record.
const RECORD: &str = "node-holder-window";

/// The cluster, and what the bench keeps across its steps.
pub struct Cluster {
    pub cp: ControlPlane,
    pub admin: kube::Client,
    pub nodes: Api<Node>,
    pub own: Arc<OwnRequests>,
    /// The API server's node counters at each step, for the record.
    pub raw: Vec<String>,
}

impl Cluster {
    pub async fn start() -> Result<Cluster> {
        let cp = ControlPlane::start()
            .await
            .context("starting the control plane")?;
        let admin = cp.admin_client().await?;
        Ok(Cluster {
            nodes: Api::all(admin.clone()),
            own: Arc::default(),
            raw: Vec::new(),
            admin,
            cp,
        })
    }

    /// The API server's counters and the bench's own requests now, kept as
    /// `label`'s raw node counters.
    pub async fn checkpoint(&mut self, label: &str) -> Result<Checkpoint> {
        let api = ApiMetrics::scrape(&self.admin).await?;
        let own = self.own.snapshot();
        self.raw.push(api.raw_nodes(label, &own));
        Ok(Checkpoint { api, own })
    }

    /// Creates the cloud node `name`.
    pub async fn create_node(&self, name: &str) -> Result<Node> {
        let node = cloud_node(name);
        let created = self.nodes.create(&PostParams::default(), &node).await;
        created.with_context(|| format!("creating node {name}"))
    }

    /// Changes a label node-holder does not care about on the nodes
    /// `names`, 8 at a time.
    pub async fn change_unrelated_labels(&self, names: Vec<String>) -> Result<()> {
        let patch = Patch::Merge(serde_json::json!({
            "metadata": {"labels": {"bench.node-holder.dev/churn": "1"}}
        }));
        let (nodes, patch) = (&self.nodes, &patch);
        futures::stream::iter(names)
            .map(|name| async move {
                nodes
                    .patch_metadata(&name, &PatchParams::default(), patch)
                    .await
            })
            .buffer_unordered(8)
            .try_collect::<Vec<_>>()
            .await
            .context("changing unrelated labels")?;
        Ok(())
    }

    /// The window as the record holds it (`window.json`).
    pub async fn window_record(&self) -> Result<Value> {
        let api: Api<ConfigMap> =
            Api::namespaced(self.admin.clone(), testenv::NODE_HOLDER_NAMESPACE);
        let config_map = api.get(RECORD).await.context("reading the window record")?;
        let text = config_map
            .data
            .as_ref()
            .and_then(|d| d.get("window.json"))
            .context("no window.json in the record")?;
        Ok(serde_json::from_str(text)?)
    }

    /// The open window's deadline, from the record.
    pub async fn window_deadline(&self) -> Result<Timestamp> {
        let record = self.window_record().await?;
        let deadline = record["open"]["deadline"]
            .as_str()
            .with_context(|| format!("no open window in the record: {record}"))?;
        deadline.parse().context("the window's deadline")
    }
}

/// When `node` was created.
pub fn created(node: &Node) -> Result<Timestamp> {
    Ok(node
        .metadata
        .creation_timestamp
        .as_ref()
        .context("no creationTimestamp")?
        .0)
}
