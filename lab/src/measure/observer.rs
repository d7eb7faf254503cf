//! The nodes that carry node-holder's marker, followed by the bench: by a
//! label-selector metadata WATCH (only held nodes travel, and the instant the
//! count reaches its target is exact), or polled with a metadata LIST; and
//! the bench's own node LISTs and WATCHes, to subtract from the API server's
//! counters.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};

/// The nodes node-holder holds.
pub const MARKER_SELECTOR: &str = "node-holder.dev/held=true";
/// How often the poller lists, in `list` observation mode.
const POLL: Duration = Duration::from_millis(250);

/// The benchmark's own node LIST and WATCH requests, to subtract from the API
/// server's counters.
#[derive(Default)]
pub struct OwnRequests {
    lists: AtomicU64,
    watches: AtomicU64,
    open_watches: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct OwnSnapshot {
    pub lists: u64,
    /// Watches ended (what `apiserver_request_total` counts).
    pub watches_ended: u64,
    pub open_watches: u64,
}

impl OwnRequests {
    pub fn snapshot(&self) -> OwnSnapshot {
        let watches = self.watches.load(Ordering::SeqCst);
        let open = self.open_watches.load(Ordering::SeqCst);
        OwnSnapshot {
            lists: self.lists.load(Ordering::SeqCst),
            watches_ended: watches - open,
            open_watches: open,
        }
    }

    fn watch_opened(&self) {
        self.watches.fetch_add(1, Ordering::SeqCst);
        self.open_watches.fetch_add(1, Ordering::SeqCst);
    }
}

impl OwnSnapshot {
    pub fn since(&self, earlier: &OwnSnapshot) -> OwnSnapshot {
        OwnSnapshot {
            lists: self.lists - earlier.lists,
            watches_ended: self.watches_ended - earlier.watches_ended,
            open_watches: self.open_watches,
        }
    }
}

/// How many nodes carry the marker now, by one metadata LIST.
pub async fn count_held(nodes: &Api<Node>, own: &OwnRequests) -> Result<usize> {
    own.lists.fetch_add(1, Ordering::SeqCst);
    Ok(nodes
        .list_metadata(&ListParams::default().labels(MARKER_SELECTOR))
        .await?
        .items
        .len())
}

/// How the held count is followed.
#[derive(Debug, Clone, Copy)]
pub enum Observe {
    Watch,
    List,
}

impl Observe {
    pub fn describe(self) -> &'static str {
        match self {
            Observe::Watch => {
                "a label-selector metadata WATCH (NODE_HOLDER_BENCH_OBSERVE=list to poll)"
            }
            Observe::List => "a label-selector metadata LIST every 250 ms",
        }
    }
}

type NodeMeta = kube::core::PartialObjectMeta<Node>;
type Events = futures::stream::BoxStream<'static, kube::Result<WatchEvent<NodeMeta>>>;

/// The number of nodes carrying the marker, kept current by a task.
pub struct Observer {
    count: tokio::sync::watch::Receiver<usize>,
    max: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<Result<()>>,
}

impl Observer {
    /// Starts following; the initial LIST (and, watching, the WATCH) are
    /// made before it returns, so that they count before the next scrape.
    pub async fn start(mode: Observe, nodes: Api<Node>, own: Arc<OwnRequests>) -> Result<Observer> {
        own.lists.fetch_add(1, Ordering::SeqCst);
        let list = nodes
            .list_metadata(&ListParams::default().labels(MARKER_SELECTOR))
            .await?;
        let held: HashSet<String> = list
            .items
            .iter()
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        let version = list.metadata.resource_version.unwrap_or_default();
        let (tx, count) = tokio::sync::watch::channel(held.len());
        let max = Arc::new(AtomicU64::new(held.len() as u64));
        let max_task = max.clone();
        let publish = move |n: usize| {
            max_task.fetch_max(n as u64, Ordering::SeqCst);
            tx.send_replace(n);
        };
        let task = match mode {
            Observe::List => tokio::spawn(poll(nodes, own, publish)),
            Observe::Watch => {
                let params = WatchParams::default().labels(MARKER_SELECTOR).timeout(290);
                own.watch_opened();
                let first = nodes.watch_metadata(&params, &version).await?.boxed();
                let watching = Watching {
                    nodes,
                    own,
                    params,
                    held,
                    version,
                };
                tokio::spawn(watching.run(first, publish))
            }
        };
        Ok(Observer { count, max, task })
    }

    /// Waits until exactly `target` nodes are held; the instant it saw that.
    pub async fn wait_for(&self, target: usize, limit: Duration) -> Option<Instant> {
        let mut count = self.count.clone();
        match tokio::time::timeout(limit, count.wait_for(|&n| n == target)).await {
            Ok(Ok(_)) => Some(Instant::now()),
            _ => None,
        }
    }

    pub fn current(&self) -> usize {
        *self.count.borrow()
    }

    pub fn max_seen(&self) -> u64 {
        self.max.load(Ordering::SeqCst)
    }

    pub fn stop(self) {
        self.task.abort();
    }
}

/// Lists the held nodes every [`POLL`].
async fn poll(nodes: Api<Node>, own: Arc<OwnRequests>, publish: impl Fn(usize)) -> Result<()> {
    loop {
        tokio::time::sleep(POLL).await;
        publish(count_held(&nodes, &own).await?);
    }
}

/// The held set as one watch after another shows it.
struct Watching {
    nodes: Api<Node>,
    own: Arc<OwnRequests>,
    params: WatchParams,
    held: HashSet<String>,
    version: String,
}

impl Watching {
    /// Follows `first`, then a new watch from the last version each time one
    /// ends.
    async fn run(mut self, first: Events, publish: impl Fn(usize)) -> Result<()> {
        let mut next = Some(first);
        loop {
            let stream = match next.take() {
                Some(stream) => stream,
                None => {
                    self.own.watch_opened();
                    let watch = self.nodes.watch_metadata(&self.params, &self.version);
                    watch.await?.boxed()
                }
            };
            let result = self.follow(stream, &publish).await;
            self.own.open_watches.fetch_sub(1, Ordering::SeqCst);
            result?;
        }
    }

    /// Applies one watch's events to the held set until the watch ends.
    async fn follow(&mut self, mut stream: Events, publish: &impl Fn(usize)) -> Result<()> {
        while let Some(event) = stream.try_next().await? {
            match event {
                WatchEvent::Added(n) | WatchEvent::Modified(n) => {
                    if let Some(rv) = n.metadata.resource_version {
                        self.version = rv;
                    }
                    self.held.extend(n.metadata.name);
                }
                WatchEvent::Deleted(n) => {
                    if let Some(rv) = n.metadata.resource_version {
                        self.version = rv;
                    }
                    if let Some(name) = n.metadata.name {
                        self.held.remove(&name);
                    }
                }
                WatchEvent::Bookmark(b) => self.version = b.metadata.resource_version,
                WatchEvent::Error(e) => bail!("watch error: {e:?}"),
            }
            publish(self.held.len());
        }
        Ok(())
    }
}
