//! NodePools carrying node-holder's budget (`--hold-mechanism budget`):
//! counted by one LIST, and polled until a count is reached.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use kube::api::{Api, DynamicObject, ListParams};

/// Pools whose last budget is node-holder's self-ending entry
/// ([`testsupport::is_node_holders_budget`]).
pub async fn carrying(pools: &Api<DynamicObject>) -> Result<usize> {
    Ok(pools
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|p| {
            p.data["spec"]["disruption"]["budgets"]
                .as_array()
                .and_then(|b| b.last())
                .is_some_and(testsupport::is_node_holders_budget)
        })
        .count())
}

/// When `count` pools carry node-holder's budget, within `limit`, looking
/// every `poll`.
pub async fn until_carrying(
    pools: &Api<DynamicObject>,
    count: usize,
    limit: Duration,
    poll: Duration,
) -> Result<Instant> {
    let give_up = Instant::now() + limit;
    loop {
        if carrying(pools).await? == count {
            return Ok(Instant::now());
        }
        ensure!(
            Instant::now() < give_up,
            "not {count} pools held within {limit:?}"
        );
        tokio::time::sleep(poll).await;
    }
}
