//! node-holder's research harness, apart from the product: what the benches
//! of `lab/benches/` play and measure, and what their reports are made of
//! (`lab/REPORT.md`, the traces and pictures in `lab/results/`).
//!
//! - [`frontier`]: the churn frontier against Karpenter's own settings: the
//!   days of work, the arms, the recorder of what happened, the clairvoyant
//!   optimum and the report;
//! - [`scale`]: the hold window bench at scale, phase by phase;
//! - [`measure`]: what the benches measure, one thing a module;
//! - [`fleet`]: many Nodes (and their NodePools) at once;
//! - [`soak`]: the chaos soak and its checker.
//!
//! What the product's own tests use too (node-holder served against the test
//! cluster, the install, Karpenter beside it) is `testsupport`'s.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

pub mod fleet;
pub mod frontier;
pub mod measure;
pub mod scale;
pub mod soak;

/// A positive count from the environment variable `name`, else `default`.
pub fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

/// A bench's `main`: builds `node-holder` ([`build_node_holder`]), then runs
/// `bench` on a runtime of two workers (the machine's cores).
pub fn run_bench<F: std::future::Future<Output = Result<()>>>(
    bench: impl FnOnce() -> F,
) -> Result<()> {
    build_node_holder()?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(bench())
}

/// Builds the `node-holder` binary into the profile directory of the running
/// bench or test (`target/release` for `cargo bench`, `target/debug` for the
/// tests), where [`testsupport::node_holder_binary`] finds it: Cargo builds a
/// package's binaries only for that package's own benches and tests, and
/// these are the lab's. Quick when it is up to date.
pub fn build_node_holder() -> Result<PathBuf> {
    let (profile, target) = profile()?;
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the workspace root")?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args([
            "build",
            "--quiet",
            "-p",
            "node-holder",
            "--bin",
            "node-holder",
        ])
        .args(["--profile", &profile, "--target-dir"])
        .arg(target)
        .current_dir(workspace)
        .status()
        .with_context(|| format!("running {cargo} build"))?;
    if !status.success() {
        bail!("building node-holder failed: {status}");
    }
    Ok(testsupport::node_holder_binary())
}

/// The `node-holder` binary beside the running test, built only when it is
/// missing: a workspace build (the suite's) builds it for the product's own
/// tests, and building it alone would build it again with other features.
pub fn ensure_node_holder() -> Result<PathBuf> {
    let (profile, target) = profile()?;
    let dir = if profile == "dev" { "debug" } else { &profile };
    if target.join(dir).join("node-holder").exists() {
        return Ok(testsupport::node_holder_binary());
    }
    build_node_holder()
}

/// The Cargo profile the running executable was built with and its target
/// directory, from where it is: `<target>/<profile dir>/deps/<exe>`.
fn profile() -> Result<(String, PathBuf)> {
    let exe = std::env::current_exe().context("the running executable")?;
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .context("the executable is in target/<profile>/deps")?;
    let target = profile_dir
        .parent()
        .context("the profile directory is in the target directory")?;
    let profile = match profile_dir.file_name().and_then(|name| name.to_str()) {
        Some("debug") => "dev",
        Some(name) => name,
        None => bail!("{}: no profile directory", profile_dir.display()),
    };
    Ok((profile.to_string(), target.to_path_buf()))
}
