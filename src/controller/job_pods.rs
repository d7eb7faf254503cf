//! `--launch-cost`: the Jobs' pods as the schedule hold reads them, in a
//! store of node-holder's own: of each pod its namespace, Job, node and
//! whether it is finished, not kube's whole `Pod` (2.4 KiB a pod before its
//! strings), so that 50,000 of them take a few MiB.
//!
//! The store follows kube's watcher events as its reflector does: a
//! (re)list fills a new map that replaces the old one once complete, and
//! each change after it replaces or removes one pod.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio_util::task::AbortOnDropHandle;

use super::budgets::watch_refused;
use crate::core::known::JobPod;
use crate::core::warm::{WARM_LABEL, is_placeholder};

/// The label the Job controller puts on each of its pods.
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";

/// One Job's pod, as kept.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StoredPod {
    namespace: Box<str>,
    job: Box<str>,
    node: Option<Box<str>>,
    running: bool,
    placeholder: bool,
}

impl StoredPod {
    /// What the store keeps of `pod`; `None` for a pod of no Job.
    /// `namespace` is node-holder's own, where its placeholders run.
    fn read(pod: &Pod, namespace: &str) -> Option<StoredPod> {
        let labels = pod.metadata.labels.as_ref()?;
        let job = labels.get(JOB_NAME_LABEL)?;
        let pod_namespace = pod.metadata.namespace.as_deref()?;
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let placeholder = pod_namespace == namespace
            && labels.get(WARM_LABEL.0).map(String::as_str) == Some(WARM_LABEL.1)
            && is_placeholder(job);
        Some(StoredPod {
            namespace: pod_namespace.into(),
            job: job.as_str().into(),
            node: pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .map(Box::from),
            running: !matches!(phase, Some("Succeeded" | "Failed")),
            placeholder,
        })
    }

    fn view(&self) -> JobPod<'_> {
        JobPod {
            namespace: &self.namespace,
            job: &self.job,
            node: self.node.as_deref(),
            running: self.running,
            placeholder: self.placeholder,
        }
    }
}

/// Pods by namespace and name.
type Pods = HashMap<(Box<str>, Box<str>), StoredPod>;

/// The Jobs' pods as last read. Cloning shares it: the watch task writes,
/// passes read.
#[derive(Debug, Clone, Default)]
pub struct JobPods(Arc<RwLock<Pods>>);

impl JobPods {
    /// Calls `read` with every pod now.
    pub fn read<T>(&self, read: impl FnOnce(&mut dyn Iterator<Item = JobPod<'_>>) -> T) -> T {
        // A panic while writing cannot leave the map half-changed: each
        // write is one insert, remove or swap.
        let pods = self.0.read().unwrap_or_else(PoisonError::into_inner);
        read(&mut pods.values().map(StoredPod::view))
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Pods> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

fn key(pod: &Pod) -> Option<(Box<str>, Box<str>)> {
    let meta = &pod.metadata;
    Some((
        meta.namespace.as_deref()?.into(),
        meta.name.as_deref()?.into(),
    ))
}

/// Starts the watch of the Jobs' pods (only pods labelled
/// [`JOB_NAME_LABEL`]): the store, the task, and whether it has listed (or
/// was refused). `tick` is bumped at each change.
pub fn watch_job_pods(
    api: Api<Pod>,
    namespace: &str,
    backoff: watcher::ExponentialBackoff,
    tick: Arc<tokio::sync::watch::Sender<u64>>,
) -> (JobPods, AbortOnDropHandle<()>, Arc<AtomicBool>) {
    let listed = Arc::new(AtomicBool::new(false));
    let mut follower = Follower {
        store: JobPods::default(),
        listing: Pods::new(),
        namespace: namespace.to_string(),
        listed: listed.clone(),
    };
    let store = follower.store.clone();
    let task = tokio::spawn(async move {
        let config = watcher::Config::default().labels(JOB_NAME_LABEL);
        let events = watcher::watcher(api, config).backoff(backoff);
        futures::pin_mut!(events);
        loop {
            match events.try_next().await {
                Ok(Some(event)) => {
                    if follower.take(event) {
                        tick.send_modify(|n| *n = n.wrapping_add(1));
                    }
                }
                Ok(None) => return,
                Err(err) => watch_failed(&err, "Pod", &follower.listed),
            }
        }
    });
    (store, AbortOnDropHandle::new(task), listed)
}

/// The watch's side of the store: the list under way and where it goes.
struct Follower {
    store: JobPods,
    /// The pods of a (re)list under way.
    listing: Pods,
    namespace: String,
    listed: Arc<AtomicBool>,
}

impl Follower {
    /// Takes in one watcher event; whether the store changed.
    fn take(&mut self, event: Event<Pod>) -> bool {
        match event {
            Event::Init => self.listing.clear(),
            Event::InitApply(pod) => {
                if let (Some(key), Some(stored)) =
                    (key(&pod), StoredPod::read(&pod, &self.namespace))
                {
                    self.listing.insert(key, stored);
                }
            }
            Event::InitDone => {
                *self.store.write() = std::mem::take(&mut self.listing);
                self.listed.store(true, Ordering::Release);
                return true;
            }
            Event::Apply(pod) => {
                let Some(key) = key(&pod) else { return false };
                match StoredPod::read(&pod, &self.namespace) {
                    Some(stored) => self.store.write().insert(key, stored),
                    None => self.store.write().remove(&key),
                };
                return true;
            }
            Event::Delete(pod) => {
                let Some(key) = key(&pod) else { return false };
                return self.store.write().remove(&key).is_some();
            }
        }
        false
    }
}

/// What a failed watch of the scheduled work says: once, that it may not
/// list `kind`s (403; it then counts as listed, empty); each time, any
/// other failure. The watcher retries either way.
pub fn watch_failed(err: &watcher::Error, kind: &str, listed: &AtomicBool) {
    if watch_refused(err) != Some(403) {
        tracing::warn!(error = %err, "{kind} watch failed; retrying");
    } else if !listed.swap(true, Ordering::AcqRel) {
        tracing::warn!(
            error = %err,
            "may not list {kind}s: nodes are held as if nothing were scheduled \
             (grant webhook-config/rbac.yaml's schedule rules); retrying"
        );
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(namespace: &str, job: &str, phase: &str, labels: serde_json::Value) -> Pod {
        let mut labels = labels;
        labels[JOB_NAME_LABEL] = json!(job);
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": namespace, "labels": labels},
            "spec": {"nodeName": "n1", "containers": []},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn a_job_pod_keeps_its_job_node_and_whether_it_runs() {
        let stored = StoredPod::read(&pod("team", "report-1", "Running", json!({})), "nh").unwrap();
        let view = stored.view();
        assert_eq!(
            (view.namespace, view.job, view.node),
            ("team", "report-1", Some("n1"))
        );
        assert!(view.running && !view.placeholder);
        let done = StoredPod::read(&pod("team", "report-1", "Succeeded", json!({})), "nh").unwrap();
        assert!(!done.running);
        let mut other: Pod = pod("team", "x", "Running", json!({}));
        other.metadata.labels = None;
        assert_eq!(StoredPod::read(&other, "nh"), None);
    }
}
