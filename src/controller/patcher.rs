//! Bulk node patching within bounds: `--api-qps` a second, [`MAX_IN_FLIGHT`] at once. A failure (a
//! 429 from API Priority and Fairness included: kube's retry layer is off) is reported, not
//! retried: the next pass, after [`crate::retry::pass_backoff`], re-plans from fresh state.

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use json_patch::Patch;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch as KubePatch, PatchParams};
use tokio::sync::Mutex;
use tokio::time::{Interval, MissedTickBehavior};

use crate::core::plan::NodePatch;
use crate::state::record::FIELD_MANAGER;

/// A progress line every this many nodes of a long run.
const PROGRESS_EVERY: usize = 500;

/// Node PATCHes in flight at once (why 16: `docs/architecture.md`). More would only queue in the
/// API server's priority level, and a throttled level refuses them with 429 the sooner.
pub const MAX_IN_FLIGHT: usize = 16;

/// How one node PATCH ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchResult {
    Applied,
    /// The node is gone (404): nothing to do.
    Gone,
    /// A precondition failed (409, or 422 from a JSON Patch `test`): the node
    /// changed since it was read; the next pass decides again.
    Changed(u16),
    /// Any other failure, with its HTTP status (0: no response).
    Failed(u16),
}

/// Sends node PATCHes within the configured bounds.
#[derive(Clone)]
pub struct Patcher {
    api: Api<Node>,
    // One shared pacer: each request waits for its tick, `qps` a second at
    // most (missed ticks are not made up, so there is no burst after idle).
    pacer: Arc<Mutex<Interval>>,
}

impl Patcher {
    pub fn new(client: kube::Client, qps: u32) -> Self {
        let period = Duration::from_secs(1) / qps.max(1);
        let mut pacer = tokio::time::interval(period);
        pacer.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Patcher {
            api: Api::all(client),
            pacer: Arc::new(Mutex::new(pacer)),
        }
    }

    /// Applies `patches` (`total` of them) as taken, at most [`MAX_IN_FLIGHT`] built and in
    /// flight; yields each with its result as it completes: a slow one holds only its slot.
    pub fn apply<'a>(
        &'a self,
        patches: impl IntoIterator<Item = NodePatch, IntoIter: Send + 'a>,
        total: usize,
    ) -> impl Stream<Item = (NodePatch, PatchResult)> + Send + 'a {
        let started = std::time::Instant::now();
        futures::stream::iter(patches)
            .map(move |mut patch| async move {
                self.pacer.lock().await.tick().await;
                let result = self.patch_one(&patch.name, &patch.patch).await;
                // Sent: the operations are not needed any more.
                patch.patch = Patch(Vec::new());
                (patch, result)
            })
            .buffer_unordered(MAX_IN_FLIGHT)
            .enumerate()
            .map(move |(done, result)| {
                let done = done + 1;
                if done % PROGRESS_EVERY == 0 && done < total {
                    tracing::info!(
                        done,
                        total,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "patching nodes: progress"
                    );
                }
                result
            })
    }

    async fn patch_one(&self, name: &str, patch: &Patch) -> PatchResult {
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PatchParams::default()
        };
        let patch = KubePatch::<()>::Json(patch.clone());
        match self.api.patch_metadata(name, &params, &patch).await {
            Ok(_) => PatchResult::Applied,
            Err(kube::Error::Api(status)) => match status.code {
                404 => PatchResult::Gone,
                409 | 422 => PatchResult::Changed(status.code),
                code => {
                    tracing::warn!(node = name, code, api_message = %status.message, "node patch failed");
                    PatchResult::Failed(code)
                }
            },
            Err(err) => {
                tracing::warn!(node = name, error = %err, "node patch failed");
                PatchResult::Failed(0)
            }
        }
    }
}
