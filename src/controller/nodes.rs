//! The leader's view of the nodes: Node metadata watched into a store of compact [`NodeMeta`]s, not
//! kube's reflector's whole objects. As there, a (re)list replaces the store only once complete.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

use crate::core::holds::Holding;
use crate::core::node::NodeMeta;
use crate::core::patch::keep_what_patches_read;
use crate::retry::watch_backoff;

/// Every node as last read, kept sorted by name so that no pass sorts them.
/// Cloning shares it: the watch task writes, passes read snapshots.
#[derive(Debug, Clone, Default)]
pub struct NodeStore(Arc<RwLock<Vec<Arc<NodeMeta>>>>);

impl NodeStore {
    /// Every node now, sorted by name; shared with the store, not copied (a
    /// later change replaces a node in the store, not in the snapshot).
    pub fn snapshot(&self) -> Vec<Arc<NodeMeta>> {
        self.read().clone()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<NodeMeta>>> {
        // A panic while writing cannot leave the nodes half-changed: each
        // write is one insert, remove, swap or replacement.
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Arc<NodeMeta>>> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Where the node named `name` is in `nodes` (sorted by name), or would go.
pub fn position(nodes: &[Arc<NodeMeta>], name: &str) -> Result<usize, usize> {
    nodes.binary_search_by(|node| node.name().cmp(name))
}

/// A list's nodes sorted by name, the last listed of each name kept.
fn sorted(mut listed: Vec<Arc<NodeMeta>>) -> Vec<Arc<NodeMeta>> {
    // Reversed, then a stable sort: of one name, the last listed comes first, which dedup keeps.
    listed.reverse();
    listed.sort_by(|a, b| a.name().cmp(b.name()));
    listed.dedup_by(|a, b| a.name() == b.name());
    listed
}

/// Applies watcher events to a store.
struct Writer {
    store: NodeStore,
    /// What the store keeps of each node (see [`keep_what_patches_read`]).
    holding: Holding,
    /// A list under way: the nodes listed so far.
    listing: Option<Vec<Arc<NodeMeta>>>,
}

impl Writer {
    fn new(store: NodeStore, holding: Holding) -> Self {
        Writer {
            store,
            holding,
            listing: None,
        }
    }

    fn keep(&self, node: &PartialObjectMeta<Node>) -> Option<Arc<NodeMeta>> {
        let Holding { holds, scope } = &self.holding;
        keep_what_patches_read(&node.metadata, holds, scope).map(Arc::new)
    }

    fn apply(&mut self, event: &Event<PartialObjectMeta<Node>>) {
        match event {
            Event::Init => self.listing = Some(Vec::new()),
            Event::InitApply(node) => {
                if let Some(node) = self.keep(node) {
                    self.listing.get_or_insert_default().push(node);
                }
            }
            Event::InitDone => {
                if let Some(listed) = self.listing.take() {
                    *self.store.write() = sorted(listed);
                }
            }
            Event::Apply(node) => {
                if let Some(node) = self.keep(node) {
                    let mut nodes = self.store.write();
                    match position(&nodes, node.name()) {
                        Ok(i) => nodes[i] = node,
                        Err(i) => nodes.insert(i, node),
                    }
                }
            }
            Event::Delete(node) => {
                let mut nodes = self.store.write();
                let name = node.metadata.name.as_deref();
                if let Some(i) = name.and_then(|name| position(&nodes, name).ok()) {
                    nodes.remove(i);
                }
            }
        }
    }
}

/// Every node's metadata from one list, kept as the watch keeps it.
pub async fn list_nodes(client: &kube::Client, holding: Holding) -> Result<NodeStore> {
    let api: Api<Node> = Api::all(client.clone());
    let listed = api
        .list_metadata(&kube::api::ListParams::default())
        .await
        .context("listing nodes")?;
    let mut writer = Writer::new(NodeStore::default(), holding);
    writer.apply(&Event::Init);
    for node in listed.items {
        writer.apply(&Event::InitApply(node));
    }
    writer.apply(&Event::InitDone);
    Ok(writer.store)
}

/// What the node watch has seen so far: complete lists, and changes since.
#[derive(Debug, Default, Clone, Copy)]
pub struct Feed {
    pub lists: u64,
    pub changes: u64,
    /// The watch failed and has not listed again since: the store may miss
    /// nodes (one created while the API server was down), so no pass runs.
    pub broken: bool,
}

/// Watches Node metadata into a store in a task of its own, read even during a long pass (the
/// API server closes watchers that fall behind). After any watch error the store is marked
/// broken and the watch starts over: only a complete list proves no node was missed meanwhile.
pub fn watch_nodes(
    client: kube::Client,
    holding: Holding,
) -> (NodeStore, watch::Receiver<Feed>, AbortOnDropHandle<()>) {
    let store = NodeStore::default();
    // Metadata only: kube asks for `PartialObjectMetadata` for this type, about
    // 1 KB a node on the wire instead of the ~25 KB of a whole Node.
    let api: Api<PartialObjectMeta<Node>> = Api::all(client);
    let (feed, receiver) = watch::channel(Feed::default());
    let mut writer = Writer::new(store.clone(), holding);
    let mut backoff = watch_backoff();
    let task = tokio::spawn(async move {
        loop {
            let error = follow(&api, &mut writer, &feed, &mut backoff).await;
            feed.send_modify(|f| f.broken = true);
            let pause = backoff.next().unwrap_or(Duration::from_secs(5));
            tracing::warn!(
                error,
                retry_in_ms = pause.as_millis() as u64,
                "node watch failed; no pass runs until it has listed every node again"
            );
            tokio::time::sleep(pause).await;
        }
    });
    (store, receiver, AbortOnDropHandle::new(task))
}

/// Applies one watch's events until it fails; returns why.
async fn follow(
    api: &Api<PartialObjectMeta<Node>>,
    writer: &mut Writer,
    feed: &watch::Sender<Feed>,
    backoff: &mut watcher::ExponentialBackoff,
) -> String {
    let stream = watcher::watcher(api.clone(), watcher::Config::default());
    futures::pin_mut!(stream);
    loop {
        let event = match stream.next().await {
            Some(Ok(event)) => event,
            Some(Err(err)) => return err.to_string(),
            None => return "the watch stream ended".to_string(),
        };
        writer.apply(&event);
        match event {
            Event::InitDone => {
                kube::runtime::utils::Backoff::reset(backoff);
                let was_broken = feed.borrow().broken;
                feed.send_modify(|f| {
                    f.lists += 1;
                    f.broken = false;
                });
                tracing::info!(
                    nodes = writer.store.read().len(),
                    after_a_failure = was_broken,
                    "node watch listed every node"
                );
            }
            Event::Apply(_) | Event::Delete(_) => feed.send_modify(|f| f.changes += 1),
            Event::Init | Event::InitApply(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::core::holds::{Holds, Preset};
    use crate::core::node::NodeFields;
    use crate::core::selector::NodeScope;

    fn node(name: &str, labels: serde_json::Value) -> PartialObjectMeta<Node> {
        serde_json::from_value(json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": name, "creationTimestamp": "2026-11-24T08:00:00Z",
                "labels": labels, "annotations": {"other": "x"}},
        }))
        .unwrap()
    }

    fn writer() -> Writer {
        let holding = Holding {
            holds: Holds::new(&[Preset::KarpenterV1], &[]).unwrap(),
            scope: NodeScope::parse("zone=a").unwrap(),
        };
        Writer::new(NodeStore::default(), holding)
    }

    fn names(store: &NodeStore) -> Vec<String> {
        let snapshot = store.snapshot();
        snapshot.iter().map(|n| n.name().to_string()).collect()
    }

    #[test]
    fn a_list_replaces_the_store_only_once_complete() {
        let mut w = writer();
        w.apply(&Event::Init);
        w.apply(&Event::InitApply(node("b", json!({}))));
        w.apply(&Event::InitApply(node("a", json!({}))));
        assert!(
            names(&w.store).is_empty(),
            "nothing before the list is done"
        );
        w.apply(&Event::InitDone);
        assert_eq!(names(&w.store), ["a", "b"]);
        // A relist after a failure: the old nodes stay until it is done,
        // then only the listed ones remain.
        w.apply(&Event::Init);
        w.apply(&Event::InitApply(node("c", json!({}))));
        assert_eq!(names(&w.store), ["a", "b"]);
        w.apply(&Event::InitDone);
        assert_eq!(names(&w.store), ["c"]);
    }

    #[test]
    fn changes_replace_or_remove_one_node_kept_as_the_plan_reads_it() {
        let mut w = writer();
        w.apply(&Event::Init);
        w.apply(&Event::InitDone);
        let labels = json!({"zone": "a", "pool": "gpu", "node-holder.dev/held": "true", "x": "y"});
        w.apply(&Event::Apply(node("a", labels)));
        w.apply(&Event::Apply(node("b", json!({"zone": "b"}))));
        let snapshot = w.store.snapshot();
        let a = &snapshot[0];
        assert!(a.in_scope() && !snapshot[1].in_scope());
        // Of the labels, only node-holder's marker is kept.
        assert_eq!((a.label("pool"), a.label("x")), (None, None));
        assert!(a.label("node-holder.dev/held").is_some());
        assert!(a.has_annotations() && a.annotation("other").is_none());
        w.apply(&Event::Apply(node("a", json!({"zone": "b"}))));
        assert!(!w.store.snapshot()[0].in_scope(), "replaced");
        assert!(snapshot[0].in_scope(), "a snapshot keeps what it read");
        w.apply(&Event::Delete(node("a", json!({}))));
        assert_eq!(names(&w.store), ["b"]);
        assert_eq!(w.store.snapshot().len(), 1);
    }

    #[test]
    fn the_store_stays_sorted_by_name_through_lists_adds_and_removals() {
        let mut w = writer();
        w.apply(&Event::Init);
        // A name listed twice: the later one is what the store keeps.
        for (name, zone) in [("n3", "b"), ("n1", "a"), ("n3", "a"), ("n2", "a")] {
            w.apply(&Event::InitApply(node(name, json!({"zone": zone}))));
        }
        w.apply(&Event::InitDone);
        assert_eq!(names(&w.store), ["n1", "n2", "n3"]);
        assert!(w.store.snapshot()[2].in_scope(), "the last n3 listed");
        for name in ["n0", "n9", "n25", "n4"] {
            w.apply(&Event::Apply(node(name, json!({}))));
        }
        w.apply(&Event::Delete(node("n2", json!({}))));
        w.apply(&Event::Delete(node("absent", json!({}))));
        assert_eq!(names(&w.store), ["n0", "n1", "n25", "n3", "n4", "n9"]);
    }
}
