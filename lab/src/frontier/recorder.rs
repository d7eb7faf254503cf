//! The churn bench's own watches, at receipt (sub-second): NodeClaims from
//! creation until gone, each arm's pods from creation until bound, and the
//! machine's load every 10 s, all in seconds since the day began.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject};
use kube::runtime::{WatchStreamExt as _, watcher};

use super::arms::ARM_LABEL;
use super::trace::{Claim, PodSeen, Trace};

/// The bench's watches: NodeClaims and pods as they change, and the load.
pub struct Recorder {
    trace: Arc<Mutex<Trace>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Recorder {
    pub fn start(client: kube::Client, started: Instant) -> Recorder {
        let trace = Arc::new(Mutex::new(Trace::default()));
        let tasks = vec![
            tokio::spawn(watch_claims(client.clone(), started, Arc::clone(&trace))),
            tokio::spawn(watch_pods(client, started, Arc::clone(&trace))),
            tokio::spawn(sample_load(started, Arc::clone(&trace))),
        ];
        Recorder { trace, tasks }
    }

    fn claims_left(&self) -> usize {
        let trace = self.trace.lock().unwrap_or_else(PoisonError::into_inner);
        trace.claims.values().filter(|c| c.gone.is_none()).count()
    }

    /// Until the watch has seen every NodeClaim go.
    pub async fn wait_claims_gone(&self, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let left = self.claims_left();
            if left == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{left} NodeClaims left {limit:?} after the day's work");
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    /// Stops the watches; what they recorded.
    pub fn stop(self) -> Trace {
        for task in &self.tasks {
            task.abort();
        }
        let mut trace = self.trace.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::take(&mut *trace)
    }
}

fn seconds(started: Instant) -> f64 {
    started.elapsed().as_secs_f64()
}

async fn watch_claims(client: kube::Client, started: Instant, trace: Arc<Mutex<Trace>>) {
    let claims = testenv::node_claims(&client);
    let stream = watcher(claims, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    // The claims a relist has shown: one it no longer shows went while the
    // watch was down, and is gone as of the relist.
    let mut listed = BTreeSet::new();
    while let Some(event) = stream.next().await {
        let Ok(event) = event else { continue };
        let at = seconds(started);
        let mut trace = trace.lock().unwrap_or_else(PoisonError::into_inner);
        match event {
            watcher::Event::Apply(claim) => saw_claim(&mut trace, &claim, at, false),
            watcher::Event::InitApply(claim) => {
                listed.extend(claim.metadata.name.clone());
                saw_claim(&mut trace, &claim, at, false);
            }
            watcher::Event::Delete(claim) => saw_claim(&mut trace, &claim, at, true),
            watcher::Event::Init => listed.clear(),
            watcher::Event::InitDone => {
                for (name, claim) in &mut trace.claims {
                    if !listed.contains(name) {
                        claim.gone.get_or_insert(at);
                    }
                }
            }
        }
    }
}

fn saw_claim(trace: &mut Trace, claim: &DynamicObject, at: f64, gone: bool) {
    let Some(name) = claim.metadata.name.clone() else {
        return;
    };
    let labels = claim.metadata.labels.as_ref();
    let pool = labels
        .and_then(|l| l.get("karpenter.sh/nodepool"))
        .cloned()
        .unwrap_or_default();
    let entry = trace.claims.entry(name).or_insert_with(|| Claim {
        pool,
        created: at,
        ..Claim::default()
    });
    if let Some(node) = claim.data["status"]["nodeName"].as_str() {
        entry.node = Some(node.to_string());
    }
    if gone {
        entry.gone.get_or_insert(at);
    }
}

async fn watch_pods(client: kube::Client, started: Instant, trace: Arc<Mutex<Trace>>) {
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let config = watcher::Config::default().labels(ARM_LABEL);
    let stream = watcher(pods, config).default_backoff().touched_objects();
    futures::pin_mut!(stream);
    loop {
        let pod = match stream.try_next().await {
            Ok(Some(pod)) => pod,
            Ok(None) => return,
            // The watch retries with its backoff; keep reading.
            Err(_) => continue,
        };
        let at = seconds(started);
        let mut trace = trace.lock().unwrap_or_else(PoisonError::into_inner);
        saw_pod(&mut trace, &pod, at);
    }
}

fn saw_pod(trace: &mut Trace, pod: &Pod, at: f64) {
    let (Some(uid), Some(arm)) = (
        pod.metadata.uid.clone(),
        pod.metadata.labels.as_ref().and_then(|l| l.get(ARM_LABEL)),
    ) else {
        return;
    };
    // A CronJob's pods carry `cronjob: <arm>-<name>`.
    let cronjob = pod.metadata.labels.as_ref().and_then(|l| l.get("cronjob"));
    let cronjob = cronjob.and_then(|c| c.strip_prefix(&format!("{arm}-")).map(str::to_string));
    // A Deployment's pods carry their ReplicaSet's template hash.
    let deployment = pod
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key("pod-template-hash"));
    let seen = trace.pods.entry(uid).or_insert_with(|| PodSeen {
        arm: arm.clone(),
        seen: at,
        cronjob,
        deployment,
        ..PodSeen::default()
    });
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    if seen.bound.is_none() && node.is_some() {
        seen.bound = Some(at);
        seen.node = node;
    }
}

async fn sample_load(started: Instant, trace: Arc<Mutex<Trace>>) {
    loop {
        if let Some(load) = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
        {
            let at = seconds(started);
            let mut trace = trace.lock().unwrap_or_else(PoisonError::into_inner);
            trace.load.push((at, load));
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
}
