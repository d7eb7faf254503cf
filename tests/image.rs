//! The runtime image as the suite and `cargo xtask image` build it: buildah
//! builds the repository's `Dockerfile` (its runtime stage, with the test
//! build of node-holder as the prebuilt binary) into an OCI image layout,
//! read back here with other tools than the builder's (`sha256sum`, `tar`),
//! as a registry and a runtime would: the index names the manifest, every
//! blob's digest and size match, the config runs `node-holder serve` as the
//! non-root user 65532 with OCI labels, the layer holds the binary and that
//! user and nothing else. The binary taken out of the layer runs:
//! `--version`, and `serve --admission policy` against the test cluster
//! until it is ready. The layout pushed to a local OCI registry (crane's)
//! keeps its digest, and the image pulled back from there holds the same
//! binary. The same binary gives the same digests. (A container runs from
//! it on the real node: tests/real_node.rs and tests/real_install.rs.)

use testsupport as common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use testenv::ControlPlane;
use xtask::image::{BINARY, USER, build_image};

const NODE_HOLDER: &str = env!("CARGO_BIN_EXE_node-holder");

/// The blob of `digest` in the layout, its digest and size checked.
fn blob(dir: &Path, descriptor: &Value) -> Vec<u8> {
    let digest = descriptor["digest"].as_str().unwrap();
    let hex = digest.strip_prefix("sha256:").unwrap();
    let path = dir.join("blobs/sha256").join(hex);
    let out = Command::new("sha256sum").arg(&path).output().unwrap();
    let sum = String::from_utf8_lossy(&out.stdout);
    assert_eq!(sum.split_whitespace().next(), Some(hex), "{path:?}");
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(
        descriptor["size"].as_u64(),
        Some(bytes.len() as u64),
        "{digest}"
    );
    bytes
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

#[tokio::test]
async fn the_image_layout_reads_back_and_its_binary_serves_against_the_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("layout");
    let written = build_image(Path::new(NODE_HOLDER), &layout, "0.1.0").unwrap();
    assert_eq!(
        json(&std::fs::read(layout.join("oci-layout")).unwrap())["imageLayoutVersion"],
        "1.0.0"
    );
    let index = json(&std::fs::read(layout.join("index.json")).unwrap());
    let entry = &index["manifests"][0];
    assert_eq!(
        entry["annotations"]["org.opencontainers.image.ref.name"],
        "0.1.0"
    );
    assert_eq!(entry["digest"], written.manifest_digest.as_str());
    let manifest = json(&blob(&layout, entry));
    assert_eq!(
        manifest["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    assert_eq!(
        manifest["annotations"]["org.opencontainers.image.version"],
        "0.1.0"
    );
    assert_eq!(
        manifest["annotations"]["org.opencontainers.image.licenses"],
        "Apache-2.0"
    );
    let config = json(&blob(&layout, &manifest["config"]));
    assert_eq!(config["config"]["User"], USER);
    assert_eq!(config["config"]["Entrypoint"][0], format!("/{BINARY}"));
    assert_eq!(config["config"]["Cmd"][0], "serve");
    assert_eq!(config["os"], "linux");
    assert_eq!(
        config["config"]["Labels"]["org.opencontainers.image.title"],
        "node-holder"
    );

    // The layer, unpacked by tar: the binary (executable) and the user.
    let layer = &manifest["layers"][0];
    assert_eq!(
        layer["mediaType"],
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
    let gz = dir.path().join("layer.tar.gz");
    std::fs::write(&gz, blob(&layout, layer)).unwrap();
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir(&rootfs).unwrap();
    let untar = Command::new("tar")
        .args(["-xzf", gz.to_str().unwrap(), "-C", rootfs.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(untar.success());
    let listed = Command::new("tar")
        .args(["-tzf", gz.to_str().unwrap()])
        .output()
        .unwrap();
    let mut files: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter(|l| !l.ends_with('/'))
        .map(str::to_owned)
        .collect();
    files.sort();
    assert_eq!(
        files,
        ["etc/group", "etc/passwd", BINARY],
        "the layer's files"
    );
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    assert!(passwd.contains("nonroot:x:65532:65532:"), "{passwd}");
    let binary = rootfs.join(BINARY);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&binary).unwrap().permissions().mode() & 0o777,
        0o755
    );

    // The binary from the image runs.
    let version = Command::new(&binary).arg("--version").output().unwrap();
    assert!(
        String::from_utf8_lossy(&version.stdout).contains("0.1.0"),
        "{version:?}"
    );
    serve_until_ready(&binary).await;

    through_a_registry(&layout, &written.manifest_digest, &binary);

    // Reproducible: the same binary, the same digests.
    let again = build_image(Path::new(NODE_HOLDER), &dir.path().join("again"), "0.1.0").unwrap();
    assert_eq!(again.manifest_digest, written.manifest_digest);
}

/// `crane push` of the layout to a local registry, as a release publishes it:
/// the registry names the same manifest digest, serves the same config, and
/// the filesystem exported from the pulled image holds `binary` byte for byte.
fn through_a_registry(layout: &Path, manifest_digest: &str, binary: &Path) {
    let registry = testenv::LocalRegistry::start().unwrap();
    let reference = format!("{}/node-holder:0.1.0", registry.host());
    let pushed = registry
        .crane(&["push", layout.to_str().unwrap(), &reference])
        .unwrap();
    assert_eq!(
        pushed,
        format!("{}/node-holder@{manifest_digest}", registry.host())
    );
    assert_eq!(
        registry.crane(&["digest", &reference]).unwrap(),
        manifest_digest
    );
    let config = json(registry.crane(&["config", &reference]).unwrap().as_bytes());
    assert_eq!(config["config"]["User"], USER);

    let dir = tempfile::tempdir().unwrap();
    let exported = dir.path().join("rootfs.tar");
    registry
        .crane(&["export", &reference, exported.to_str().unwrap()])
        .unwrap();
    let untar = Command::new("tar")
        .args(["-xf", exported.to_str().unwrap(), "-C"])
        .arg(dir.path())
        .arg(BINARY)
        .status()
        .unwrap();
    assert!(untar.success());
    assert!(
        std::fs::read(dir.path().join(BINARY)).unwrap() == std::fs::read(binary).unwrap(),
        "the pulled image's binary differs from the layout's"
    );
}

/// `serve --admission policy` from `binary` against a real API server, as
/// node-holder's restricted identity, until `/readyz` answers 200.
async fn serve_until_ready(binary: &Path) {
    let cp = ControlPlane::start().await.unwrap();
    common::install_node_holder_rbac(&cp).await;
    let admin = common::free_port();
    let mut child = Command::new(binary)
        .args(["serve", "--admission", "policy", "--log-format", "json"])
        .arg(format!("--admin-addr=127.0.0.1:{admin}"))
        .arg(format!("--webhook-addr=127.0.0.1:{}", common::free_port()))
        .env("KUBECONFIG", cp.node_holder_kubeconfig())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok((200, _)) = common::http_get(admin, "/readyz").await {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the image's binary exited"
        );
        assert!(
            Instant::now() < deadline,
            "the image's binary never turned ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
}
