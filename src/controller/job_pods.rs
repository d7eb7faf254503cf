//! `--launch-cost`: the Jobs' pods as the schedule hold reads them, in a [`Compact`] store: of each
//! pod its namespace, Job, node and whether it is finished, so that 50,000 of them take a few MiB.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher;

use super::compact::{Compact, Watched, watch_compact};
use super::watches::watch_refused;
use crate::core::known::JobPod;
use crate::core::warm::{WARM_LABEL, is_placeholder};

/// The label the Job controller puts on each of its pods.
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";

/// One Job's pod, as kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPod {
    namespace: Box<str>,
    job: Box<str>,
    node: Option<Box<str>>,
    running: bool,
    placeholder: bool,
}

impl StoredPod {
    /// What the store keeps of `pod`; `None` for a pod of no Job.
    fn read(pod: &Pod, namespace: &str) -> Option<StoredPod> {
        let labels = pod.metadata.labels.as_ref()?;
        let job = labels.get(JOB_NAME_LABEL)?;
        let pod_namespace = pod.metadata.namespace.as_deref()?;
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        let placeholder = pod_namespace == namespace
            && labels.get(WARM_LABEL.0).map(String::as_str) == Some(WARM_LABEL.1)
            && is_placeholder(job);
        Some(StoredPod {
            namespace: pod_namespace.into(),
            job: job.as_str().into(),
            node: node.map(Box::from),
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

/// The Jobs' pods as last read.
pub type JobPods = Compact<StoredPod>;

impl JobPods {
    /// Calls `read` with every pod now.
    pub fn pods<T>(&self, read: impl FnOnce(&mut dyn Iterator<Item = JobPod<'_>>) -> T) -> T {
        self.read(|pods| read(&mut pods.values().map(StoredPod::view)))
    }
}

/// Starts the watch of the pods labelled [`JOB_NAME_LABEL`]; `namespace` is
/// node-holder's own, where its placeholders run.
pub fn watch_job_pods(
    api: Api<Pod>,
    namespace: &str,
    backoff: watcher::ExponentialBackoff,
    tick: Arc<tokio::sync::watch::Sender<u64>>,
) -> Watched<JobPods> {
    let namespace = namespace.to_string();
    let config = watcher::Config::default().labels(JOB_NAME_LABEL);
    let read = move |pod: &Pod| StoredPod::read(pod, &namespace);
    watch_compact(api, config, backoff, tick, read, |err, listed| {
        watch_failed(err, "Pod", listed)
    })
}

/// What a failed watch of the scheduled work says: once, that it may not
/// list `kind`s (403; it then counts as listed, empty); else each failure.
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
