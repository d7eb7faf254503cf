//! What `cargo xtask` does that tests check too: the runtime image.

pub mod image;
