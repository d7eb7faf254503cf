//! node-holder's runtime image, built by a standard builder (buildah) from
//! the repository's `Dockerfile` with a node-holder binary built beforehand:
//! the Dockerfile's `prebuilt` stage (`--build-arg BINARY_FROM=prebuilt`)
//! takes the binary from the build context instead of compiling it, and its
//! runtime stage, the one the release ships, is built as it is. The image is
//! written as an OCI image layout. Reproducible: every time in it is the
//! epoch (or `SOURCE_DATE_EPOCH`), so the same binary gives the same digests.
//!
//! `cargo xtask image` builds the binary static (glibc's `crt-static`: the
//! image has no libraries to link against) and writes the layout;
//! `skopeo copy oci:target/image:0.1.0 docker://REGISTRY/node-holder:0.1.0`
//! (or `crane push`) pushes it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Where the binary is in the image.
pub const BINARY: &str = "usr/local/bin/node-holder";
/// The user the image runs as.
pub const USER: &str = "65532:65532";

/// The target the image's binary is built for.
pub const TARGET: &str = "x86_64-unknown-linux-gnu";

/// Builds node-holder for the image: release, static (glibc's `crt-static`:
/// the image has no libraries to link against), into `target/static/` of the
/// workspace; the binary's path. What `cargo xtask image` and the real-node
/// test (tests/real_node.rs) both run, so that the test runs the image a
/// release ships.
pub fn build_static() -> Result<PathBuf> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target_dir = workspace.join("target/static");
    let status = crate::cargo()
        .current_dir(&workspace)
        .args(["build", "--release", "--locked", "--bin", "node-holder"])
        .args(["--target", TARGET, "--target-dir"])
        .arg(&target_dir)
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .status()
        .context("running cargo build")?;
    if !status.success() {
        anyhow::bail!("the static build of node-holder failed: {status}");
    }
    Ok(target_dir.join(TARGET).join("release/node-holder"))
}

/// What was written: where, and the manifest's digest.
#[derive(Debug, Clone)]
pub struct Layout {
    pub dir: PathBuf,
    pub manifest_digest: String,
}

/// Builds the runtime image of `binary` with buildah from the repository's
/// `Dockerfile` and writes it as an OCI image layout into `dir` (replaced),
/// tagged `version`. buildah keeps its images in a directory of its own for
/// this one build, so that builds side by side share nothing.
pub fn build_image(binary: &Path, dir: &Path, version: &str) -> Result<Layout> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let scratch = tempfile::tempdir().context("a directory for buildah")?;
    let context = build_context(binary, &workspace, scratch.path())?;
    let storage = scratch.path().join("storage");
    let name = format!("localhost/node-holder:{version}");
    let mut bud = buildah(&storage);
    bud.arg("bud")
        .args(["--isolation", "chroot", "--quiet"])
        .arg(format!("--timestamp={}", epoch()))
        .args(["--build-arg", "BINARY_FROM=prebuilt"])
        .arg("--file")
        .arg(workspace.join("Dockerfile"))
        .args(["--tag", &name]);
    for (key, value) in labels(version) {
        bud.arg(format!("--label={key}={value}"))
            .arg(format!("--annotation={key}={value}"));
    }
    run(bud.arg(&context), "buildah bud")?;
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    let mut push = buildah(&storage);
    push.args(["push", "--quiet", &name])
        .arg(format!("oci:{}:{version}", dir.display()));
    run(&mut push, "buildah push")?;
    read_layout(dir)
}

/// The build context: the Dockerfile's `prebuilt` stage takes `node-holder`
/// from its root, the runtime stage `docker/etc/`.
fn build_context(binary: &Path, workspace: &Path, scratch: &Path) -> Result<PathBuf> {
    let context = scratch.join("context");
    let etc = context.join("docker/etc");
    std::fs::create_dir_all(&etc).with_context(|| format!("creating {}", etc.display()))?;
    for file in ["passwd", "group"] {
        let from = workspace.join("docker/etc").join(file);
        std::fs::copy(&from, etc.join(file))
            .with_context(|| format!("copying {}", from.display()))?;
    }
    std::fs::copy(binary, context.join("node-holder"))
        .with_context(|| format!("copying {}", binary.display()))?;
    Ok(context)
}

/// buildah (Debian's package) with its images under `storage`. vfs: no
/// overlay mount, which a container without privileges may not have.
fn buildah(storage: &Path) -> Command {
    let mut command = Command::new("buildah");
    command
        .arg("--root")
        .arg(storage.join("root"))
        .arg("--runroot")
        .arg(storage.join("run"))
        .args(["--storage-driver", "vfs"]);
    command
}

fn run(command: &mut Command, what: &str) -> Result<()> {
    let output = command.output().with_context(|| {
        format!("running {what} (is buildah installed? Debian's package `buildah`)")
    })?;
    if !output.status.success() {
        bail!(
            "{what} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// The manifest's digest, from the layout buildah wrote.
fn read_layout(dir: &Path) -> Result<Layout> {
    let path = dir.join("index.json");
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let index: Value =
        serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))?;
    let manifest_digest = index["manifests"][0]["digest"]
        .as_str()
        .context("index.json names no manifest")?
        .to_string();
    Ok(Layout {
        dir: dir.to_path_buf(),
        manifest_digest,
    })
}

/// Seconds since the epoch that every time in the image is.
fn epoch() -> u64 {
    std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The OCI labels of the image, also its manifest's annotations.
fn labels(version: &str) -> [(&'static str, String); 6] {
    let created = jiff::Timestamp::from_second(i64::try_from(epoch()).unwrap_or(0))
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    [
        ("org.opencontainers.image.title", "node-holder".into()),
        (
            "org.opencontainers.image.description",
            "Holds new Kubernetes nodes from the autoscaler's consolidation while work is due on them".into(),
        ),
        ("org.opencontainers.image.version", version.into()),
        ("org.opencontainers.image.licenses", "Apache-2.0".into()),
        ("org.opencontainers.image.url", "https://node-holder.dev".into()),
        ("org.opencontainers.image.created", created.to_string()),
    ]
}
