//! What the benches measure, one thing a module: node-holder's PATCHes in
//! the API server's audit log, the API server's request counters between
//! two scrapes, node-holder's own `/metrics`, a process's memory and CPU
//! (and its RSS sampled over time), the machine, the held nodes as a watch
//! (or a poll) sees them, the size of the nodes' metadata, percentiles, and
//! oha's load runs.

pub mod apiserver;
pub mod audit;
pub mod machine;
pub mod metadata;
pub mod node_holder;
pub mod observer;
pub mod oha;
pub mod process;
pub mod rss;
pub mod stats;
