//! The pure core: what a hold is, which nodes are in scope, the patches that
//! add and release holds, the admission decision, the hold window and the
//! plan that brings nodes to it. No I/O happens here.

pub mod admission;
pub mod due;
pub mod holds;
pub mod kept;
pub mod known;
pub mod names;
pub mod node;
pub mod patch;
pub mod plan;
pub mod schedule;
pub mod selector;
pub mod warm;
pub mod window;

use std::time::Duration;

use jiff::Timestamp;

/// `t + d`, or the latest time there is: the core's one sum of a time and
/// a span (only spans with calendar units can fail; a `Duration` saturates).
pub(crate) fn plus(t: Timestamp, d: Duration) -> Timestamp {
    t.saturating_add(d).unwrap_or(Timestamp::MAX)
}
