//! The scale benches' fleets: many Nodes named and labelled as a cloud's
//! nodes are (metadata only, no spec or status), created from the admin's
//! client several at a time.

use std::fmt::Debug;

use anyhow::{Context, Result};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::Resource;
use kube::api::{Api, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

const INSTANCE_TYPES: [&str; 4] = ["m6i.large", "m6i.2xlarge", "c6i.4xlarge", "r6i.xlarge"];
const ZONES: [&str; 3] = ["eu-west-1a", "eu-west-1b", "eu-west-1c"];

/// A Node as a cloud node would be named and labelled; no spec or status.
/// Its instance type, zone and capacity type follow from its name.
pub fn cloud_node(name: &str) -> Node {
    let hash = name
        .bytes()
        .fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b.into()));
    testsupport::node_with(
        name,
        &[
            ("kubernetes.io/hostname", name),
            ("kubernetes.io/os", "linux"),
            ("kubernetes.io/arch", "amd64"),
            ("node.kubernetes.io/instance-type", INSTANCE_TYPES[hash % 4]),
            ("topology.kubernetes.io/region", "eu-west-1"),
            ("topology.kubernetes.io/zone", ZONES[hash % 3]),
            ("karpenter.sh/nodepool", "batch"),
            (
                "karpenter.sh/capacity-type",
                if hash % 5 == 0 { "on-demand" } else { "spot" },
            ),
        ],
        &[],
    )
}

/// The `i`-th cloud node's name, as EC2 names them.
pub fn cloud_node_name(i: usize) -> String {
    format!(
        "ip-10-24-{}-{}.eu-west-1.compute.internal",
        i / 250,
        i % 250 + 1
    )
}

/// A spot Node of Karpenter's NodePool `pool`.
pub fn pool_node(name: &str, pool: &str) -> Node {
    testsupport::node_with(
        name,
        &[
            ("kubernetes.io/hostname", name),
            ("kubernetes.io/os", "linux"),
            ("karpenter.sh/nodepool", pool),
            ("karpenter.sh/capacity-type", "spot"),
            ("topology.kubernetes.io/zone", "eu-west-1a"),
        ],
        &[],
    )
}

/// Creates `object(i)` (a Node) for every `i` below `count`,
/// `in_flight` creates at a time.
pub async fn create<K>(
    api: &Api<K>,
    count: usize,
    in_flight: usize,
    object: impl Fn(usize) -> K,
) -> Result<()>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    let object = &object;
    let mut results = futures::stream::iter(0..count)
        .map(|i| async move { api.create(&PostParams::default(), &object(i)).await })
        .buffer_unordered(in_flight);
    while let Some(result) = results.next().await {
        result.context("creating one of the fleet's objects")?;
    }
    Ok(())
}
