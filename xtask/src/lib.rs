//! What `cargo xtask` does that tests check too: the runtime image.

pub mod image;

/// Cargo, as the process that runs this was run with (`CARGO`), without what
/// Cargo set for this process (xtask's or a test's package, manifest,
/// OUT_DIR...): build scripts (ring's) rerun when such a variable changes,
/// and every crate after them rebuilds, at each switch between a build from
/// xtask or a test and one from the shell.
pub fn cargo() -> std::process::Command {
    let mut cargo =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy().into_owned();
        if is_set_by_cargo(&name) {
            cargo.env_remove(name);
        }
    }
    cargo
}

/// A variable Cargo sets for the program it runs (a build script, a test,
/// `cargo run`), of the package that program belongs to.
fn is_set_by_cargo(name: &str) -> bool {
    const PREFIXES: [&str; 5] = [
        "CARGO_PKG_",
        "CARGO_MANIFEST_",
        "CARGO_CFG_",
        "CARGO_CRATE_",
        "CARGO_BIN_",
    ];
    const NAMES: [&str; 4] = [
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
        "OUT_DIR",
    ];
    PREFIXES.iter().any(|prefix| name.starts_with(prefix)) || NAMES.contains(&name)
}
