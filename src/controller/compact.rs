//! A watched kind in a store of node-holder's own: of each object only what a pass reads, not the
//! whole object kube's reflector keeps (the memory it cost: `docs/benchmarks.md`). As the reflector
//! does, a (re)list replaces the store once complete; each change after it replaces or removes one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockWriteGuard};

use futures::TryStreamExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

/// An object's namespace (empty for a cluster-scoped one) and name.
pub type Key = (Box<str>, Box<str>);

/// What is kept, by key. Cloning shares it: the watch task writes, passes read.
#[derive(Debug, Clone)]
pub struct Compact<V>(Arc<RwLock<HashMap<Key, V>>>);

impl<V> Compact<V> {
    pub fn read<T>(&self, read: impl FnOnce(&HashMap<Key, V>) -> T) -> T {
        // A panic in a write leaves no half-changed map: each write is one insert, remove or swap.
        read(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }

    fn write(&self) -> RwLockWriteGuard<'_, HashMap<Key, V>> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A running watch: its store, whether it has listed (or was refused), and
/// its task (dropping it stops the watch).
pub struct Watched<S> {
    pub store: S,
    pub listed: Arc<AtomicBool>,
    pub task: AbortOnDropHandle<()>,
}

/// Starts a watch of `api` keeping each `Some(read(object))`; `tick` is bumped when that changes.
/// `report` says what a failure means and may set `listed` (a refused list counts as listed,
/// empty); the watcher retries either way.
pub fn watch_compact<K, V>(
    api: Api<K>,
    config: watcher::Config,
    backoff: watcher::ExponentialBackoff,
    tick: Arc<watch::Sender<u64>>,
    read: impl FnMut(&K) -> Option<V> + Send + 'static,
    report: fn(&watcher::Error, &AtomicBool),
) -> Watched<Compact<V>>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    V: Clone + PartialEq + Send + Sync + 'static,
{
    let (store, listed) = (Compact(Arc::default()), Arc::new(AtomicBool::new(false)));
    let mut follower = Follower {
        store: store.clone(),
        listing: HashMap::new(),
        read,
        listed: listed.clone(),
    };
    let task = tokio::spawn(async move {
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
                Err(err) => report(&err, &follower.listed),
            }
        }
    });
    Watched {
        store,
        listed,
        task: AbortOnDropHandle::new(task),
    }
}

/// The watch's side of the store.
struct Follower<V, F> {
    store: Compact<V>,
    /// What a (re)list under way has read.
    listing: HashMap<Key, V>,
    read: F,
    listed: Arc<AtomicBool>,
}

impl<V: PartialEq, F> Follower<V, F> {
    /// Takes in one watcher event; whether the store changed.
    fn take<K: Resource>(&mut self, event: Event<K>) -> bool
    where
        F: FnMut(&K) -> Option<V>,
    {
        match event {
            Event::Init => self.listing.clear(),
            Event::InitApply(object) => {
                if let Some(value) = (self.read)(&object) {
                    self.listing.insert(key(&object), value);
                }
            }
            Event::InitDone => {
                *self.store.write() = std::mem::take(&mut self.listing);
                self.listed.store(true, Ordering::Release);
                return true;
            }
            Event::Apply(object) => {
                let (key, read) = (key(&object), (self.read)(&object));
                let mut store = self.store.write();
                return match read {
                    Some(value) if store.get(&key) == Some(&value) => false,
                    Some(value) => {
                        store.insert(key, value);
                        true
                    }
                    None => store.remove(&key).is_some(),
                };
            }
            Event::Delete(object) => return self.store.write().remove(&key(&object)).is_some(),
        }
        false
    }
}

fn key<K: Resource>(object: &K) -> Key {
    let namespace = object.meta().namespace.as_deref().unwrap_or_default();
    (namespace.into(), object.name_any().into())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    use super::*;

    fn map(name: &str, value: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            data: Some([("v".to_string(), value.to_string())].into()),
            ..Default::default()
        }
    }

    fn follower() -> Follower<String, impl FnMut(&ConfigMap) -> Option<String>> {
        Follower {
            store: Compact(Arc::default()),
            listing: HashMap::new(),
            read: |m: &ConfigMap| m.data.as_ref()?.get("v").filter(|v| *v != "skip").cloned(),
            listed: Arc::default(),
        }
    }

    fn kept(follower: &Follower<String, impl FnMut(&ConfigMap) -> Option<String>>) -> Vec<String> {
        let mut values: Vec<String> = follower.store.read(|m| m.values().cloned().collect());
        values.sort();
        values
    }

    #[test]
    fn a_list_replaces_the_store_only_when_complete() {
        let mut f = follower();
        assert!(!f.take(Event::Init));
        assert!(!f.take(Event::InitApply(map("a", "1"))));
        assert!(!f.take(Event::InitApply(map("b", "skip"))));
        assert!(kept(&f).is_empty(), "nothing until the list is done");
        assert!(f.take(Event::<ConfigMap>::InitDone));
        assert_eq!(kept(&f), ["1"]);
        assert!(f.listed.load(Ordering::Acquire));
        f.take(Event::<ConfigMap>::Init);
        f.take(Event::InitApply(map("c", "3")));
        assert_eq!(kept(&f), ["1"], "a relist under way leaves the store");
        f.take(Event::<ConfigMap>::InitDone);
        assert_eq!(kept(&f), ["3"], "and replaces it whole");
    }

    #[test]
    fn a_change_counts_only_when_what_is_kept_moves() {
        let mut f = follower();
        assert!(f.take(Event::Apply(map("a", "1"))));
        assert!(!f.take(Event::Apply(map("a", "1"))), "the same value");
        assert!(f.take(Event::Apply(map("a", "2"))));
        assert!(!f.take(Event::Apply(map("b", "skip"))), "nothing kept");
        assert!(f.take(Event::Apply(map("a", "skip"))), "no longer kept");
        assert!(kept(&f).is_empty());
        assert!(f.take(Event::Apply(map("a", "1"))));
        assert!(f.take(Event::Delete(map("a", "1"))));
        assert!(!f.take(Event::Delete(map("a", "1"))));
    }
}
