//! The pure core: what a hold is, which nodes are in scope, the patches that
//! add and release holds, the admission decision, the hold window and the
//! plan that brings nodes to it. No I/O happens here.

pub mod admission;
pub mod budget;
pub mod groups;
pub mod holds;
pub mod learned;
pub mod names;
pub mod node;
pub mod pace;
pub mod patch;
pub mod plan;
pub mod requests;
pub mod selector;
pub mod window;
