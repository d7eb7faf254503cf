//! node-holder's runtime image as an OCI image layout, written without a
//! container engine or a base image: one layer holding the binary at
//! `/usr/local/bin/node-holder` and an `/etc/passwd` and `/etc/group` that
//! name the non-root user 65532; a config that runs `node-holder serve` as
//! that user; OCI annotations. Reproducible: every time in it is the epoch
//! (or `SOURCE_DATE_EPOCH`), so the same binary gives the same digests.
//!
//! `cargo xtask image` builds the binary static (glibc's `crt-static`: the
//! image has no libraries to link against) and writes the layout;
//! `skopeo copy oci:target/image:0.1.0 docker://REGISTRY/node-holder:0.1.0`
//! (or `crane push`) pushes it.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

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
    let mut cargo =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    // What Cargo set for the process that runs this (xtask's or a test's
    // package, manifest, OUT_DIR...) must not reach the build: build scripts
    // (ring's) rerun when such a variable changes, and every crate after
    // them rebuilds, at each switch between `cargo xtask image` and a test.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy().into_owned();
        if is_set_by_cargo(&name) {
            cargo.env_remove(name);
        }
    }
    let status = cargo
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

/// What was written: the manifest's digest and the layer's.
#[derive(Debug, Clone)]
pub struct Layout {
    pub dir: PathBuf,
    pub manifest_digest: String,
    pub layer_digest: String,
}

/// Writes the OCI image layout of `binary` into `dir` (created), tagged
/// `version`.
pub fn write_layout(binary: &Path, dir: &Path, version: &str) -> Result<Layout> {
    let epoch: u64 = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    std::fs::create_dir_all(dir.join("blobs/sha256"))
        .with_context(|| format!("creating {}", dir.display()))?;
    let tar = layer_tar(binary, epoch)?;
    let diff_id = sha256(&tar);
    let layer = gzip(&tar)?;
    let layer_digest = write_blob(dir, &layer)?;
    let config = serde_json::to_vec(&config(&diff_id, version, epoch))?;
    let config_digest = write_blob(dir, &config)?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.oci.image.config.v1+json", &config_digest, config.len()),
        "layers": [descriptor("application/vnd.oci.image.layer.v1.tar+gzip", &layer_digest, layer.len())],
        "annotations": annotations(version, epoch),
    }))?;
    let manifest_digest = write_blob(dir, &manifest)?;
    let mut index_entry = descriptor(
        "application/vnd.oci.image.manifest.v1+json",
        &manifest_digest,
        manifest.len(),
    );
    index_entry["annotations"] = json!({"org.opencontainers.image.ref.name": version});
    let index = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [index_entry]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index)?)?;
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    Ok(Layout {
        dir: dir.to_path_buf(),
        manifest_digest,
        layer_digest,
    })
}

/// The image's only layer, uncompressed.
fn layer_tar(binary: &Path, epoch: u64) -> Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    for dir in ["etc/", "usr/", "usr/local/", "usr/local/bin/"] {
        append(&mut tar, dir, &[], 0o755, tar::EntryType::Directory, epoch)?;
    }
    let passwd = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n";
    let group = "root:x:0:\nnonroot:x:65532:\n";
    append(
        &mut tar,
        "etc/passwd",
        passwd.as_bytes(),
        0o644,
        tar::EntryType::Regular,
        epoch,
    )?;
    append(
        &mut tar,
        "etc/group",
        group.as_bytes(),
        0o644,
        tar::EntryType::Regular,
        epoch,
    )?;
    let bytes = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    append(
        &mut tar,
        BINARY,
        &bytes,
        0o755,
        tar::EntryType::Regular,
        epoch,
    )?;
    Ok(tar.into_inner()?)
}

fn append(
    tar: &mut tar::Builder<Vec<u8>>,
    path: &str,
    data: &[u8],
    mode: u32,
    kind: tar::EntryType,
    epoch: u64,
) -> Result<()> {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(epoch);
    header.set_size(data.len() as u64);
    tar.append_data(&mut header, path, data)
        .with_context(|| format!("adding {path} to the layer"))
}

fn gzip(data: &[u8]) -> Result<Vec<u8>> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(data)?;
    Ok(encoder.finish()?)
}

fn sha256(data: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(data))
}

/// Writes `data` as a blob; its digest.
fn write_blob(dir: &Path, data: &[u8]) -> Result<String> {
    let digest = sha256(data);
    let hex = digest.trim_start_matches("sha256:");
    std::fs::write(dir.join("blobs/sha256").join(hex), data)?;
    Ok(digest)
}

fn descriptor(media_type: &str, digest: &str, size: usize) -> Value {
    json!({"mediaType": media_type, "digest": digest, "size": size})
}

/// The OCI annotations of the image (also its config's labels).
fn annotations(version: &str, epoch: u64) -> Value {
    let created = jiff::Timestamp::from_second(i64::try_from(epoch).unwrap_or(0))
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    json!({
        "org.opencontainers.image.title": "node-holder",
        "org.opencontainers.image.description": "Holds new Kubernetes nodes from the autoscaler's consolidation for a window after each scale-up",
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.url": "https://node-holder.dev",
        "org.opencontainers.image.created": created.to_string(),
    })
}

fn config(diff_id: &str, version: &str, epoch: u64) -> Value {
    let created = jiff::Timestamp::from_second(i64::try_from(epoch).unwrap_or(0))
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
        .to_string();
    json!({
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": USER,
            "Entrypoint": [format!("/{BINARY}")],
            "Cmd": ["serve"],
            // 8443: the HTTPS admission webhook; 8080: /healthz, /readyz, /metrics.
            "ExposedPorts": {"8443/tcp": {}, "8080/tcp": {}},
            "Labels": annotations(version, epoch),
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": "cargo xtask image"}],
    })
}
