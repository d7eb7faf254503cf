//! A local OCI registry for the release tests: go-containerregistry's
//! `crane registry serve` (pinned by `testenv/tools/registry`), in memory, on
//! a port of loopback the kernel picks, with `crane` itself to push and read
//! images. Loopback registries speak plain HTTP: crane and helm both take
//! `127.0.0.1` as such (helm needs `--plain-http`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tempfile::TempDir;

use crate::binaries::ensure_crane_built;
use crate::process::ManagedChild;

/// How long the registry may take to say which port it serves on.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running in-memory registry. Dropping it stops it (and loses what was
/// pushed).
pub struct LocalRegistry {
    crane: PathBuf,
    host: String,
    _child: ManagedChild,
    _dir: TempDir,
}

impl LocalRegistry {
    /// Starts the registry and waits until it has told its port.
    pub fn start() -> Result<LocalRegistry> {
        let crane = ensure_crane_built()?;
        let dir = tempfile::Builder::new()
            .prefix("node-holder-registry-")
            .tempdir()?;
        let log = dir.path().join("registry.log");
        let mut command = Command::new(&crane);
        command.args(["registry", "serve", "--address", "127.0.0.1:0"]);
        let mut child = ManagedChild::spawn_command("registry", command, &log)?;
        let port = wait_for_port(&mut child, &log)?;
        Ok(LocalRegistry {
            crane,
            host: format!("127.0.0.1:{port}"),
            _child: child,
            _dir: dir,
        })
    }

    /// `127.0.0.1:PORT`, the registry part of a reference.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// `crane` with `args`, its standard output on success, or its error.
    pub fn crane(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(&self.crane)
            .args(args)
            .output()
            .with_context(|| format!("running {}", self.crane.display()))?;
        if !out.status.success() {
            bail!(
                "crane {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

/// The port in the registry's "serving on port N" line, once it is logged.
fn wait_for_port(child: &mut ManagedChild, log: &Path) -> Result<u16> {
    let started = Instant::now();
    loop {
        child.check_running()?;
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(port) = text
            .lines()
            .find_map(|line| line.split("serving on port ").nth(1))
        {
            return port
                .trim()
                .parse()
                .with_context(|| format!("the registry's port in {text:?}"));
        }
        if started.elapsed() > START_TIMEOUT {
            bail!("the registry told no port within {START_TIMEOUT:?}: {text}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
