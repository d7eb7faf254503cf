//! The hold keys and node-holder's own keys on a node. A *hold* is an annotation that tells an
//! autoscaler to leave a node alone. node-holder marks the nodes it holds with its own label (to
//! list them with a selector) and lists the hold keys it added (so a release strips exactly those).

use std::fmt;
use std::str::FromStr;

use super::names::is_qualified_name;
use super::node::NodeFields;
use super::selector::NodeScope;

pub const PREFIX: &str = "node-holder.dev";
/// Label, and its value, on every node that carries a hold node-holder placed.
pub const MARKER_LABEL: &str = "node-holder.dev/held";
pub const MARKER_VALUE: &str = "true";
/// Annotation listing, comma-separated, the hold keys node-holder added.
pub const HELD_KEYS_ANNOTATION: &str = "node-holder.dev/hold-keys";
/// The label selector of the nodes carrying node-holder's marker.
pub const MARKED: &str = "node-holder.dev/held=true";
/// Annotation with the time (RFC 3339, whole seconds) until which, at least,
/// node-holder holds the node: written on every node it holds, rewritten once
/// passed while the hold goes on ([`needs_stamp`](super::plan)).
pub const HELD_UNTIL_ANNOTATION: &str = "node-holder.dev/held-until";

/// Whether the node carries node-holder's marker label.
pub fn is_marked(meta: &(impl NodeFields + ?Sized)) -> bool {
    meta.label(MARKER_LABEL) == Some(MARKER_VALUE)
}

/// The node's [`HELD_UNTIL_ANNOTATION`], if it holds a time.
pub fn held_until_stamp(meta: &(impl NodeFields + ?Sized)) -> Option<jiff::Timestamp> {
    meta.annotation(HELD_UNTIL_ANNOTATION)?.parse().ok()
}

/// The hold keys node-holder listed on the node (`hold-keys`), each once, trimmed; its own keys
/// skipped (removing the list twice would make a release patch fail forever).
pub fn held_keys(meta: &(impl NodeFields + ?Sized)) -> Vec<&str> {
    listed_keys(meta.annotation(HELD_KEYS_ANNOTATION).unwrap_or_default())
}

/// The keys of a `hold-keys` list (see [`held_keys`]).
pub fn listed_keys(list: &str) -> Vec<&str> {
    let mut keys: Vec<&str> = Vec::new();
    for key in list.split(',').map(str::trim) {
        if !key.is_empty() && !is_own(key) && !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys
}

/// Whether `key` is under node-holder's own prefix.
fn is_own(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(prefix, _)| prefix == PREFIX)
}

/// Which nodes node-holder holds (the node selector) and with what (the hold
/// annotations): what the webhook, the window task and `release` hold by.
#[derive(Debug, Clone)]
pub struct Holding {
    pub holds: Holds,
    pub scope: NodeScope,
}

/// One hold annotation: `key: value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub key: String,
    pub value: String,
}

impl fmt::Display for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key, self.value)
    }
}

impl FromStr for Hold {
    type Err = String;

    /// Parses `key=value`, the form of `--hold-annotation`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (key, value) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?}: expected key=value"))?;
        if !is_qualified_name(key) {
            return Err(format!(
                "{key:?} is not a valid annotation key ([prefix/]name, name of letters, digits, '-', '_', '.')"
            ));
        }
        if is_own(key) {
            return Err(format!(
                "{key:?}: keys under {PREFIX}/ are node-holder's own"
            ));
        }
        Ok(Hold {
            key: key.to_string(),
            value: value.to_string(),
        })
    }
}

/// Well-known holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// Karpenter v1 and later: `karpenter.sh/do-not-disrupt: "true"`.
    KarpenterV1,
    /// Karpenter before v1.0: `karpenter.sh/do-not-consolidate: "true"`.
    KarpenterV0,
    /// Cluster Autoscaler: `cluster-autoscaler.kubernetes.io/scale-down-disabled: "true"`.
    ClusterAutoscaler,
}

impl Preset {
    pub const ALL: [Preset; 3] = [
        Preset::KarpenterV1,
        Preset::KarpenterV0,
        Preset::ClusterAutoscaler,
    ];

    pub fn hold(self) -> Hold {
        let key = match self {
            Preset::KarpenterV1 => "karpenter.sh/do-not-disrupt",
            Preset::KarpenterV0 => "karpenter.sh/do-not-consolidate",
            Preset::ClusterAutoscaler => "cluster-autoscaler.kubernetes.io/scale-down-disabled",
        };
        Hold {
            key: key.to_string(),
            value: "true".to_string(),
        }
    }
}

/// The configured holds: at least one, each key once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holds(Vec<Hold>);

impl Holds {
    /// Presets first, then explicit holds; Karpenter v1's when both are empty.
    pub fn new(presets: &[Preset], explicit: &[Hold]) -> Result<Self, String> {
        let mut holds: Vec<Hold> = presets.iter().map(|p| p.hold()).collect();
        holds.extend(explicit.iter().cloned());
        if holds.is_empty() {
            holds.push(Preset::KarpenterV1.hold());
        }
        let mut unique: Vec<Hold> = Vec::new();
        for hold in holds {
            match unique.iter().find(|h| h.key == hold.key) {
                None => unique.push(hold),
                Some(other) if other.value != hold.value => {
                    let key = &hold.key;
                    return Err(format!(
                        "hold key {key} configured twice, as {other} and {hold}"
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(Holds(unique))
    }

    pub fn iter(&self) -> impl Iterator<Item = &Hold> {
        self.0.iter()
    }

    /// Whether the preset's hold is one of them.
    pub fn includes(&self, preset: Preset) -> bool {
        self.0.contains(&preset.hold())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn karpenter_v1_is_the_default_hold() {
        let holds = Holds::new(&[], &[]).unwrap();
        assert_eq!(
            holds.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["karpenter.sh/do-not-disrupt=true"]
        );
    }

    #[test]
    fn presets_and_explicit_holds_combine_without_duplicates() {
        let holds = Holds::new(
            &[Preset::KarpenterV1, Preset::ClusterAutoscaler],
            &[
                "karpenter.sh/do-not-disrupt=true".parse().unwrap(),
                "example.com/freeze=yes".parse().unwrap(),
            ],
        )
        .unwrap();
        let keys: Vec<&str> = holds.iter().map(|h| h.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "karpenter.sh/do-not-disrupt",
                "cluster-autoscaler.kubernetes.io/scale-down-disabled",
                "example.com/freeze"
            ]
        );
    }

    #[test]
    fn a_key_with_two_values_is_refused() {
        let err = Holds::new(
            &[Preset::KarpenterV1],
            &["karpenter.sh/do-not-disrupt=false".parse().unwrap()],
        )
        .unwrap_err();
        assert!(err.contains("configured twice"), "{err}");
    }

    #[test]
    fn malformed_and_reserved_keys_are_refused() {
        for bad in [
            "no-equals",
            "=v",
            "Bad Key=v",
            "a/b/c=v",
            "node-holder.dev/held=true",
            "-x=v",
        ] {
            assert!(bad.parse::<Hold>().is_err(), "{bad}");
        }
        assert!(
            "x~y.example/k_1=".parse::<Hold>().is_err(),
            "~ is not allowed in a prefix"
        );
        assert!("example.com/k_1.v=".parse::<Hold>().is_ok());
    }
}
