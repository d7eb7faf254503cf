//! The real Karpenter beside node-holder: waves of pods that make it launch
//! nodes, and what it then decides about them (NodeClaims launched and
//! deleted, its `DisruptionBlocked` and `DisruptionTerminating` Events, its
//! disruption passes and eligible candidates from its own metrics).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use jiff::Timestamp;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use testenv::{Disruption, KarpenterCluster};

/// Karpenter's message when the hold annotation blocks a node.
pub const BLOCKED_BY_HOLD: &str =
    "Disruption is blocked through the \"karpenter.sh/do-not-disrupt\" annotation";
/// Karpenter's disruption loop polls every 10 s and validates a command for
/// 15 s before acting; a minute and a half covers a few rounds of both on a
/// loaded machine.
pub const KARPENTER_ROUND: Duration = Duration::from_secs(90);

/// How long an Event may take to be published after what it tells of.
const EVENT_WAIT: Duration = Duration::from_secs(30);

/// A Karpenter cluster and the admin's view of what the tests watch.
pub struct Autoscaled {
    pub cluster: KarpenterCluster,
    pub client: kube::Client,
    pub pods: Api<Pod>,
    pub nodes: Api<Node>,
    pub claims: Api<DynamicObject>,
    pub events: Api<Event>,
}

impl Autoscaled {
    pub async fn start(disruption: &Disruption) -> Autoscaled {
        Autoscaled::start_with(&testenv::ClusterOptions::default(), disruption).await
    }

    /// [`Autoscaled::start`] with `options` (a cloud's boot time, say).
    pub async fn start_with(
        options: &testenv::ClusterOptions,
        disruption: &Disruption,
    ) -> Autoscaled {
        let cluster = KarpenterCluster::start_with(options, disruption)
            .await
            .expect("the Karpenter cluster starts");
        let client = cluster.control_plane().admin_client().await.unwrap();
        Autoscaled {
            pods: Api::namespaced(client.clone(), "default"),
            nodes: Api::all(client.clone()),
            claims: testenv::node_claims(&client),
            events: Api::namespaced(client.clone(), "default"),
            client,
            cluster,
        }
    }

    pub fn cp(&self) -> &testenv::ControlPlane {
        self.cluster.control_plane()
    }

    /// Creates `count` pods named `{wave}-{n}` that each fill a node, and
    /// waits until every one runs; returns the nodes they run on.
    pub async fn wave(&mut self, wave: &str, count: usize) -> BTreeSet<String> {
        self.wave_of(wave, count, testenv::filler_pod).await
    }

    async fn wave_of(
        &mut self,
        wave: &str,
        count: usize,
        pod: impl Fn(&str) -> Pod,
    ) -> BTreeSet<String> {
        for n in 0..count {
            self.pods
                .create(&PostParams::default(), &pod(&format!("{wave}-{n}")))
                .await
                .unwrap();
        }
        self.until(
            &format!("every pod of {wave} runs"),
            KARPENTER_ROUND,
            async |a| a.running(wave).await.len() == count,
        )
        .await;
        self.running_nodes(wave).await
    }

    /// Creates a Deployment `name` of `replicas` pods that each fill a node,
    /// and waits until every one runs; returns the nodes they run on.
    pub async fn deployment(&mut self, name: &str, replicas: usize) -> BTreeSet<String> {
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), "default");
        let count = i32::try_from(replicas).unwrap();
        deployments
            .create(
                &PostParams::default(),
                &testenv::filler_deployment(name, count),
            )
            .await
            .unwrap();
        self.until(
            &format!("every pod of {name} runs"),
            KARPENTER_ROUND,
            async |a| a.running(name).await.len() == replicas,
        )
        .await;
        self.running_nodes(name).await
    }

    /// The running pods of `wave` (by name), with the node each runs on.
    async fn running(&self, wave: &str) -> BTreeMap<String, String> {
        self.wave_pods(wave)
            .await
            .into_iter()
            .filter(|p| {
                p.status
                    .as_ref()
                    .is_some_and(|s| s.phase.as_deref() == Some("Running"))
            })
            .filter_map(|p| Some((p.metadata.name?, p.spec?.node_name?)))
            .collect()
    }

    /// The nodes the running pods of `wave` are bound to.
    pub async fn running_nodes(&self, wave: &str) -> BTreeSet<String> {
        self.running(wave).await.into_values().collect()
    }

    async fn wave_pods(&self, wave: &str) -> Vec<Pod> {
        let prefix = format!("{wave}-");
        self.pods
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|p| {
                p.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(&prefix))
            })
            .collect()
    }

    /// Deletes the pods of `wave` (the batch is done) and waits until they are
    /// gone.
    pub async fn end_wave(&mut self, wave: &str) {
        for pod in self.wave_pods(wave).await {
            let name = pod.metadata.name.unwrap();
            let _ = self.pods.delete(&name, &DeleteParams::default()).await;
        }
        self.until(
            &format!("the pods of {wave} gone"),
            KARPENTER_ROUND,
            async |a| a.wave_pods(wave).await.is_empty(),
        )
        .await;
    }

    /// The NodeClaims that exist.
    async fn claims(&self) -> Vec<DynamicObject> {
        self.claims
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
    }

    /// The NodeClaims that exist, by name.
    pub async fn claim_names(&self) -> BTreeSet<String> {
        self.claims()
            .await
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect()
    }

    /// The nodes of Karpenter's NodePool that exist, by name.
    pub async fn karpenter_nodes(&self) -> BTreeSet<String> {
        self.nodes
            .list(&ListParams::default().labels("karpenter.sh/nodepool"))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect()
    }

    /// The Nodes Karpenter's identity created, with when, from the API
    /// server's audit log (a node that is gone again still counts).
    pub fn nodes_launched(&self) -> BTreeMap<String, Timestamp> {
        self.cluster
            .karpenter_node_requests("create")
            .unwrap()
            .into_iter()
            .collect()
    }

    /// The Nodes Karpenter's identity deleted, with when (audit log).
    pub fn nodes_deleted(&self) -> BTreeMap<String, Timestamp> {
        self.cluster
            .karpenter_node_requests("delete")
            .unwrap()
            .into_iter()
            .collect()
    }

    /// Whether every NodeClaim whose node is in `nodes` is gone or Karpenter
    /// has set its `Consolidatable` condition (its `consolidateAfter` ran out).
    pub async fn consolidatable_or_gone(&self, nodes: &BTreeSet<String>) -> bool {
        self.claims()
            .await
            .iter()
            .filter(|c| {
                c.data["status"]["nodeName"]
                    .as_str()
                    .is_some_and(|n| nodes.contains(n))
            })
            .all(|c| condition_true(c, "Consolidatable"))
    }

    /// How many times Karpenter has evaluated empty nodes for disruption.
    pub async fn emptiness_passes(&self) -> f64 {
        self.cluster.disruption_passes("empty").await.unwrap()
    }

    /// Karpenter's last count of nodes it may disrupt because they are empty.
    pub async fn eligible_empty_nodes(&self) -> f64 {
        self.cluster.eligible_nodes("empty").await.unwrap()
    }

    /// Waits until Karpenter has made `passes` more disruption passes over
    /// empty nodes than it had when called.
    pub async fn karpenter_passes(&mut self, passes: f64) {
        let start = self.emptiness_passes().await;
        self.until(
            "Karpenter's disruption passes",
            KARPENTER_ROUND * 2,
            async |a| a.emptiness_passes().await >= start + passes,
        )
        .await;
    }

    /// The messages of the Events of `reason` about Node `node`
    /// (Karpenter's or node-holder's).
    pub async fn node_events(&self, node: &str, reason: &str) -> Vec<String> {
        self.events_about("Node", node, reason).await
    }

    /// Waits for an Event of `reason` on `node` whose message contains `says`: Events are
    /// published beside the work they tell of (node-holder's from a paced queue, Karpenter's
    /// through client-go's broadcaster), so one may arrive after the change the test saw.
    pub async fn until_node_said(&mut self, node: &str, reason: &str, says: &str) {
        let what = format!("{node}: an Event {reason} that says {says:?}");
        self.until(&what, EVENT_WAIT, async |a| {
            let said = a.node_events(node, reason).await;
            said.iter().any(|m| m.contains(says))
        })
        .await;
    }

    /// The messages of the Events of `reason` about the object of `kind`
    /// named `name` (in `default`, or cluster-scoped).
    pub async fn events_about(&self, kind: &str, name: &str, reason: &str) -> Vec<String> {
        self.events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.involved_object.kind.as_deref() == Some(kind)
                    && e.involved_object.name.as_deref() == Some(name)
                    && e.reason.as_deref() == Some(reason)
            })
            .filter_map(|e| e.message)
            .collect()
    }

    /// Polls `check` every 200 ms until it holds; fails after `limit` with
    /// what Karpenter and the cluster look like, or at once if a component
    /// of the cluster has exited.
    pub async fn until<F>(&mut self, what: &str, limit: Duration, mut check: F)
    where
        F: AsyncFnMut(&Autoscaled) -> bool,
    {
        let deadline = Instant::now() + limit;
        loop {
            if check(self).await {
                return;
            }
            self.cluster.check_running().unwrap();
            assert!(
                Instant::now() < deadline,
                "{what}: not within {limit:?}; NodeClaims {:?}, Karpenter nodes {:?}",
                self.claim_names().await,
                self.karpenter_nodes().await
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Whether `object`'s status condition `kind` is `True`.
pub fn condition_true(object: &DynamicObject, kind: &str) -> bool {
    object.data["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == kind && c["status"] == "True")
        })
}
