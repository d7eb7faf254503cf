//! What node-holder's watch carries and its store keeps: the metadata of
//! every node, as JSON, with and without managedFields.

use anyhow::Result;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

/// The size of every node's metadata, as JSON.
pub struct MetadataSize {
    nodes: usize,
    json_bytes: usize,
    managed_fields_bytes: usize,
}

impl MetadataSize {
    pub async fn measure(nodes: &Api<Node>) -> Result<MetadataSize> {
        let list = nodes.list_metadata(&ListParams::default()).await?;
        let mut size = MetadataSize {
            nodes: list.items.len(),
            json_bytes: 0,
            managed_fields_bytes: 0,
        };
        for item in &list.items {
            size.json_bytes += serde_json::to_vec(&item.metadata)?.len();
            if let Some(fields) = &item.metadata.managed_fields {
                size.managed_fields_bytes += serde_json::to_vec(fields)?.len();
            }
        }
        Ok(size)
    }
}

impl std::fmt::Display for MetadataSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "node metadata now (the watch's payload): {} nodes, {:.1} MB JSON ({:.0} B a node), \
             of which managedFields {:.1} MB",
            self.nodes,
            self.json_bytes as f64 / 1e6,
            self.json_bytes as f64 / self.nodes.max(1) as f64,
            self.managed_fields_bytes as f64 / 1e6
        )
    }
}
