//! node-holder's retry policy, in one place: how long each loop waits before
//! it tries again, and how often. kube's own retry layer is off (`cluster`).

use std::time::Duration;

use kube::runtime::watcher;

/// Retry delays of node-holder's watches. kube's default (up to 30 s) would
/// leave the window task blind that long after an API server restart.
pub fn watch_backoff() -> watcher::ExponentialBackoff {
    backoff_up_to(Duration::from_secs(5))
}

/// Retry delays of a watch of an API the cluster may not serve at all
/// (Karpenter's NodeClaims): a cluster without it is asked once a minute.
pub fn optional_api_backoff() -> watcher::ExponentialBackoff {
    backoff_up_to(Duration::from_secs(60))
}

/// From half a second, doubling, to at most `max`, for ever.
fn backoff_up_to(max: Duration) -> watcher::ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(max)
        .with_factor(2.0)
        .without_max_times()
        .into()
}

/// The wait before the next pass after `failures` failed passes in a row.
pub fn pass_backoff(failures: u32) -> Duration {
    Duration::from_millis(500 * 2u64.pow(failures.min(6))).min(Duration::from_secs(30))
}

/// The wait before the window task starts again after it failed as a whole (its leadership kept).
pub const TASK_RESTART: Duration = Duration::from_secs(2);

/// How long a replica that stops waits for its Lease to be given back.
pub const LEASE_HANDOVER: Duration = Duration::from_secs(5);

/// Passes `uninstall` runs at most while node patches fail (each after [`pass_backoff`]).
pub const ONCE_ATTEMPTS: u32 = 5;

/// How often a command waiting for the leader checks the Lease is still held.
pub const LEADER_POLL: Duration = Duration::from_secs(1);

/// How often `serve` checks the API server for its readiness: often while it
/// is unreachable, seldom while it answers.
pub fn api_probe_interval(reachable: bool) -> Duration {
    Duration::from_secs(if reachable { 10 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pass_backoff_doubles_to_thirty_seconds() {
        assert_eq!(pass_backoff(0), Duration::from_millis(500));
        assert_eq!(pass_backoff(1), Duration::from_secs(1));
        assert_eq!(pass_backoff(6), Duration::from_secs(30));
        assert_eq!(pass_backoff(u32::MAX), Duration::from_secs(30));
    }
}
