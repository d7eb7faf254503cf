//! The state node-holder keeps in the cluster, shared by the leader and the
//! operator's commands: the record (ConfigMap `node-holder-window`: the
//! window, the settings, the requests) and the Lease beside it.

pub mod lease;
pub mod record;
