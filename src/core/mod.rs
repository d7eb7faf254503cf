//! The pure core: what a hold is, which nodes are in scope, the patches that
//! add a hold, and the admission decision. No I/O happens here.

pub mod admission;
pub mod holds;
pub mod patch;
pub mod selector;
