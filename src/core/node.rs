//! A node's metadata as node-holder reads it, and the compact form the
//! window task keeps of every node.
//!
//! The patch builders read a node through [`NodeFields`]: the webhook's
//! admitted `ObjectMeta`, or the window task's stored [`NodeMeta`], which
//! keeps only what the plan and the patches read in a few allocations: about
//! 0.4 KiB a node, 0.8 KiB once held, where kube's `PartialObjectMeta` (a
//! B-tree node of ~540 bytes per map) cost 1.3 and 3.1 KiB (50,000 nodes).

use std::collections::BTreeMap;
use std::fmt;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// A node's labels; none is an empty map (what a selector sees).
pub fn labels(meta: &ObjectMeta) -> &BTreeMap<String, String> {
    meta.labels.as_ref().unwrap_or(&NO_LABELS)
}

/// What the patch builders read of a node's metadata.
pub trait NodeFields {
    fn label(&self, key: &str) -> Option<&str>;
    fn annotation(&self, key: &str) -> Option<&str>;
    /// Whether the node has a labels map at all (an `add` into a missing
    /// map fails; adding a whole map over an existing one wipes it).
    fn has_labels(&self) -> bool;
    fn has_annotations(&self) -> bool;
    fn resource_version(&self) -> Option<&str>;
}

impl NodeFields for ObjectMeta {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels.as_ref()?.get(key).map(String::as_str)
    }
    fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.as_ref()?.get(key).map(String::as_str)
    }
    fn has_labels(&self) -> bool {
        self.labels.is_some()
    }
    fn has_annotations(&self) -> bool {
        self.annotations.is_some()
    }
    fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }
}

/// One stored node: its identity, whether the node selector selects it, and
/// the labels and annotations the plan reads. Every stored node has a name
/// and a creation time (the API server never returns a Node without them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeMeta {
    name: Box<str>,
    uid: Option<Box<str>>,
    resource_version: Option<Box<str>>,
    created: Timestamp,
    in_scope: bool,
    /// `None`: the node has no such map (not even an empty one).
    labels: Option<Pairs>,
    annotations: Option<Pairs>,
}

impl NodeMeta {
    /// What to keep of `meta`: the labels and annotations whose keys the
    /// filters accept. `None` without a name or a creation time.
    pub fn read(
        meta: &ObjectMeta,
        in_scope: bool,
        keep_label: impl Fn(&str) -> bool,
        keep_annotation: impl Fn(&str) -> bool,
    ) -> Option<NodeMeta> {
        let kept = |map: &Option<BTreeMap<String, String>>, keep: &dyn Fn(&str) -> bool| {
            map.as_ref().map(|map| {
                Pairs::new(
                    map.iter()
                        .filter(|(k, _)| keep(k))
                        .map(|(k, v)| (k.as_str(), v.as_str())),
                )
            })
        };
        Some(NodeMeta {
            name: meta.name.as_deref()?.into(),
            uid: meta.uid.as_deref().map(Box::from),
            resource_version: meta.resource_version.as_deref().map(Box::from),
            created: meta.creation_timestamp.as_ref()?.0,
            in_scope,
            labels: kept(&meta.labels, &keep_label),
            annotations: kept(&meta.annotations, &keep_annotation),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn uid(&self) -> Option<&str> {
        self.uid.as_deref()
    }

    pub fn created(&self) -> Timestamp {
        self.created
    }

    /// Whether the node selector (`--node-selector`) selects the node.
    pub fn in_scope(&self) -> bool {
        self.in_scope
    }
}

impl NodeFields for NodeMeta {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels.as_ref()?.get(key)
    }
    fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.as_ref()?.get(key)
    }
    fn has_labels(&self) -> bool {
        self.labels.is_some()
    }
    fn has_annotations(&self) -> bool {
        self.annotations.is_some()
    }
    fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }
}

/// A few string pairs in one allocation: each string as its length (4 bytes, little-endian), then
/// its bytes. Lookups scan; a node keeps at most a handful of pairs.
#[derive(Clone, Default, PartialEq, Eq)]
struct Pairs(Box<[u8]>);

impl Pairs {
    /// The pairs, in order. A string longer than 4 GiB, which no API server stores (a node's
    /// annotations are at most 256 KiB in all), is cut at that length.
    fn new<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Pairs {
        let mut bytes = Vec::new();
        for (key, value) in pairs {
            for text in [key, value] {
                let len = u32::try_from(text.len()).unwrap_or(u32::MAX);
                bytes.extend_from_slice(&len.to_le_bytes());
                bytes.extend_from_slice(text.as_bytes().get(..len as usize).unwrap_or_default());
            }
        }
        Pairs(bytes.into_boxed_slice())
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        let mut rest: &[u8] = &self.0;
        std::iter::from_fn(move || {
            let key = next_text(&mut rest)?;
            let value = next_text(&mut rest)?;
            Some((key, value))
        })
    }
}

/// The next string of a [`Pairs`] buffer; `None` at its end. A string cut
/// inside a character (only by the 4 GiB cut) reads as empty.
fn next_text<'a>(rest: &mut &'a [u8]) -> Option<&'a str> {
    let (len, tail) = rest.split_first_chunk::<4>()?;
    let len = usize::try_from(u32::from_le_bytes(*len)).ok()?;
    let (text, tail) = tail.split_at_checked(len)?;
    *rest = tail;
    Some(std::str::from_utf8(text).unwrap_or_default())
}

impl fmt::Debug for Pairs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn meta(value: serde_json::Value) -> ObjectMeta {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn pairs_read_back_what_was_put_in() {
        let pairs = Pairs::new([("a/b", "1"), ("", ""), ("ключ", "значение"), ("c", "")]);
        assert_eq!(
            pairs.iter().collect::<Vec<_>>(),
            [("a/b", "1"), ("", ""), ("ключ", "значение"), ("c", "")]
        );
        assert_eq!(pairs.get("ключ"), Some("значение"));
        assert_eq!(pairs.get("c"), Some(""));
        assert_eq!(pairs.get("d"), None);
        assert_eq!(Pairs::new([]).iter().count(), 0);
        assert_eq!(format!("{pairs:?}").matches(':').count(), 4);
    }

    #[test]
    fn a_stored_node_keeps_what_the_filters_accept_and_whether_a_map_exists() {
        let whole = meta(json!({
            "name": "n1", "uid": "u1", "resourceVersion": "7",
            "creationTimestamp": "2026-11-24T08:00:00Z",
            "labels": {"keep": "a", "drop": "b"},
            "annotations": {"drop": "c"},
        }));
        let node = NodeMeta::read(&whole, true, |k| k == "keep", |k| k == "keep").unwrap();
        assert_eq!((node.name(), node.uid()), ("n1", Some("u1")));
        assert_eq!(NodeFields::resource_version(&node), Some("7"));
        assert_eq!(node.created().to_string(), "2026-11-24T08:00:00Z");
        assert!(node.in_scope());
        assert_eq!((node.label("keep"), node.label("drop")), (Some("a"), None));
        assert!(node.has_annotations() && node.annotation("drop").is_none());
        let bare = meta(json!({"name": "n1", "creationTimestamp": "2026-11-24T08:00:00Z"}));
        let node = NodeMeta::read(&bare, false, |_| true, |_| true).unwrap();
        assert!(!node.has_labels() && !node.has_annotations() && !node.in_scope());
    }

    #[test]
    fn metadata_without_a_name_or_creation_is_no_node() {
        let nameless = meta(json!({"creationTimestamp": "2026-11-24T08:00:00Z"}));
        let unborn = meta(json!({"name": "n1"}));
        for meta in [nameless, unborn] {
            assert!(NodeMeta::read(&meta, true, |_| true, |_| true).is_none());
        }
    }
}
