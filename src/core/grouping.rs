//! Which group of nodes a node belongs to (`--window-per-label KEY`): the
//! value of one label, or one group for every node. Each group has a window
//! of its own (`super::groups`).

use super::node::NodeFields;

/// The unlabelled group's name: nodes without the label (or with an empty
/// value), and every node when windows are not grouped.
pub const UNLABELLED: &str = "";

/// Which window a node counts in: the value of one label, or one window for
/// every node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grouping {
    key: Option<String>,
}

impl Grouping {
    /// One window per value of `key`; `None`: one window for every node.
    pub fn per_label(key: Option<String>) -> Grouping {
        Grouping { key }
    }

    /// The label whose values name the groups, if windows are grouped.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The group of a node.
    pub fn group_of<'a>(&self, node: &'a (impl NodeFields + ?Sized)) -> &'a str {
        self.key
            .as_ref()
            .and_then(|key| node.label(key))
            .unwrap_or(UNLABELLED)
    }
}

/// A group's name as people read it: the label value, or `(no label)`.
pub fn display(group: &str) -> &str {
    if group == UNLABELLED {
        "(no label)"
    } else {
        group
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn a_node_is_in_the_group_of_its_label_value() {
        let labels = |pairs: &[(&str, &str)]| ObjectMeta {
            labels: Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        };
        let grouped = Grouping::per_label(Some("pool".into()));
        assert_eq!(grouped.group_of(&labels(&[("pool", "gpu")])), "gpu");
        assert_eq!(grouped.group_of(&labels(&[("other", "gpu")])), UNLABELLED);
        assert_eq!(grouped.group_of(&labels(&[("pool", "")])), UNLABELLED);
        let one = Grouping::default();
        assert_eq!(one.group_of(&labels(&[("pool", "gpu")])), UNLABELLED);
        assert_eq!(display(UNLABELLED), "(no label)");
    }
}
