//! Builds the pinned kube-apiserver and etcd from their Go modules, once per pin.
//!
//! The Go module in `testenv/controlplane/` pins the upstream releases. The
//! binaries land in `target/controlplane/<digest>/`, where the digest covers the
//! pins (go.mod, go.sum) and the Go toolchain: a changed pin builds again, an
//! unchanged one is reused. A file lock lets concurrent test processes share
//! one build.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

/// The two programs a control plane needs.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub kube_apiserver: PathBuf,
    pub etcd: PathBuf,
}

const KUBE_APISERVER_PKG: &str = "k8s.io/kubernetes/cmd/kube-apiserver";
const ETCD_PKG: &str = "go.etcd.io/etcd/server/v3";

/// The Go module holding the pins.
pub fn module_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("controlplane")
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
    }
}

/// Returns the binaries for the current pins, building them first if needed.
pub fn ensure_built() -> Result<Binaries> {
    let module = module_dir();
    let digest = pins_digest(&module)?;
    let root = target_dir().join("controlplane");
    let out = root.join(&digest);
    let binaries = Binaries {
        kube_apiserver: out.join("kube-apiserver"),
        etcd: out.join("etcd"),
    };
    let complete = out.join(".complete");
    if complete.exists() {
        return Ok(binaries);
    }

    fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let lock_path = root.join(".build.lock");
    let lock =
        File::create(&lock_path).with_context(|| format!("creating {}", lock_path.display()))?;
    lock.lock()
        .with_context(|| format!("locking {}", lock_path.display()))?;
    // Another process may have finished the build while this one waited.
    if complete.exists() {
        return Ok(binaries);
    }

    let started = Instant::now();
    eprintln!(
        "testenv: building kube-apiserver and etcd from {} (first build takes several minutes)",
        module.display()
    );
    let staging = root.join(format!("{digest}.partial"));
    if staging.exists() {
        fs::remove_dir_all(&staging).with_context(|| format!("removing {}", staging.display()))?;
    }
    fs::create_dir_all(&staging)?;
    // `go build` leaves the version stamp empty (`v0.0.0-master`); stamp the
    // pinned release as the upstream build does, so /version tells the truth.
    let version = kubernetes_version(&module)?;
    let minor = version.split('.').nth(1).unwrap_or_default();
    let stamp = format!(
        "-X k8s.io/component-base/version.gitVersion={version} \
         -X k8s.io/component-base/version.gitMajor=1 \
         -X k8s.io/component-base/version.gitMinor={minor} \
         -X k8s.io/component-base/version.gitTreeState=clean"
    );
    go_build(
        &module,
        KUBE_APISERVER_PKG,
        &stamp,
        &staging.join("kube-apiserver"),
    )?;
    go_build(&module, ETCD_PKG, "", &staging.join("etcd"))?;
    if out.exists() {
        fs::remove_dir_all(&out).with_context(|| format!("removing {}", out.display()))?;
    }
    fs::rename(&staging, &out).with_context(|| format!("moving build to {}", out.display()))?;
    File::create(&complete)?;
    eprintln!(
        "testenv: control plane built in {:.0?} into {}",
        started.elapsed(),
        out.display()
    );
    Ok(binaries)
}

/// The pinned `k8s.io/kubernetes` release, read from go.mod.
pub fn kubernetes_version(module: &Path) -> Result<String> {
    let path = module.join("go.mod");
    let go_mod =
        fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    go_mod
        .lines()
        .find_map(|line| line.trim().strip_prefix("k8s.io/kubernetes v"))
        .and_then(|rest| rest.split_whitespace().next())
        .map(|v| format!("v{v}"))
        .with_context(|| format!("no k8s.io/kubernetes requirement in {}", path.display()))
}

fn go_build(module: &Path, package: &str, ldflags: &str, output: &Path) -> Result<()> {
    let mut cmd = go_command(module);
    cmd.args(["build", "-trimpath"])
        .arg(format!("-ldflags=-s -w {ldflags}"))
        .arg("-o")
        .arg(output)
        .arg(package);
    let status = cmd
        .status()
        .context("running `go build` (is Go >= 1.26 on PATH?)")?;
    if !status.success() {
        bail!(
            "`go build {package}` in {} failed with {status}",
            module.display()
        );
    }
    Ok(())
}

fn go_command(module: &Path) -> Command {
    let mut cmd = Command::new("go");
    cmd.current_dir(module)
        // The pins say which Go they need; never fetch another toolchain.
        .env("GOTOOLCHAIN", "local")
        // go.sum is committed: a build must not rewrite the pins.
        .env("GOFLAGS", "-mod=readonly");
    cmd
}

/// Digest of what decides the binaries: the pins and the Go toolchain.
fn pins_digest(module: &Path) -> Result<String> {
    let mut hasher = Sha256::new();
    for file in ["go.mod", "go.sum"] {
        let path = module.join(file);
        let bytes = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        hasher.update(&bytes);
    }
    let version = go_command(module)
        .args(["env", "GOVERSION", "GOOS", "GOARCH"])
        .output()
        .context("running `go env` (is Go >= 1.26 on PATH?)")?;
    if !version.status.success() {
        bail!(
            "`go env` failed: {}",
            String::from_utf8_lossy(&version.stderr).trim()
        );
    }
    hasher.update(&version.stdout);
    let digest = hasher.finalize();
    Ok(digest[..8].iter().map(|b| format!("{b:02x}")).collect())
}
