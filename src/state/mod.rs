//! The state node-holder keeps in the cluster, which the leader's loop and
//! the operator's commands (`status`, `release`, `hold`, `uninstall`,
//! `self-check`) share: the record (ConfigMap `node-holder-window`: the
//! window, the settings, the requests) and the Lease beside it. Neither
//! runs a loop; both are read and written through the API.

pub mod lease;
pub mod record;
