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
    let stamp = kubernetes_stamp(&module)?;
    let out = build_once(
        "kube-apiserver and etcd",
        &target_dir().join("controlplane"),
        &module,
        &[
            GoTool {
                package: KUBE_APISERVER_PKG,
                binary: "kube-apiserver",
                ldflags: &stamp,
                tags: "",
            },
            GoTool {
                package: ETCD_PKG,
                binary: "etcd",
                ldflags: "",
                tags: "",
            },
        ],
    )?;
    Ok(Binaries {
        kube_apiserver: out.join("kube-apiserver"),
        etcd: out.join("etcd"),
    })
}

/// `go build` leaves the version stamp empty (`v0.0.0-master`); stamp the
/// pinned release as the upstream build does, so `/version` and
/// `--version` tell the truth.
fn kubernetes_stamp(module: &Path) -> Result<String> {
    let version = kubernetes_version(module)?;
    let minor = version.split('.').nth(1).unwrap_or_default();
    Ok(format!(
        "-X k8s.io/component-base/version.gitVersion={version} \
         -X k8s.io/component-base/version.gitMajor=1 \
         -X k8s.io/component-base/version.gitMinor={minor} \
         -X k8s.io/component-base/version.gitTreeState=clean"
    ))
}

/// The pinned `k8s.io/kubernetes` release, read from go.mod.
pub fn kubernetes_version(module: &Path) -> Result<String> {
    required_version(module, "k8s.io/kubernetes")
}

fn go_build(module: &Path, tool: &GoTool<'_>, output: &Path) -> Result<()> {
    let (package, ldflags) = (tool.package, tool.ldflags);
    let mut cmd = go_command(module);
    cmd.args(["build", "-trimpath"])
        // `-w` drops the DWARF at link; not generating it at all is 11% less CPU for a
        // cold build (helm: 236 -> 210 CPU-seconds) and the same program.
        .arg("-gcflags=all=-dwarf=false")
        .arg(format!("-ldflags=-s -w {ldflags}"))
        .arg(format!("-tags={}", tool.tags))
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

/// Digest of what decides the binaries: the pins, the module's own Go
/// sources (the cert-manager tool module has mains of its own), the build
/// tags and the Go toolchain. A module without sources of its own, or tools
/// without tags, digest as before.
fn pins_digest(module: &Path, tools: &[GoTool<'_>]) -> Result<String> {
    let mut hasher = Sha256::new();
    for tool in tools.iter().filter(|t| !t.tags.is_empty()) {
        hasher.update(format!("{} -tags={}\n", tool.package, tool.tags).as_bytes());
    }
    for file in ["go.mod", "go.sum"] {
        let path = module.join(file);
        let bytes = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        hasher.update(&bytes);
    }
    for source in go_sources(module)? {
        let bytes = fs::read(&source).with_context(|| format!("reading {}", source.display()))?;
        hasher.update(source.strip_prefix(module)?.to_string_lossy().as_bytes());
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

/// The `.go` files under `dir`, in a stable order.
fn go_sources(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "go") {
                found.push(path);
            }
        }
    }
    found.sort();
    Ok(found)
}

// ---------------------------------------------------------------------------
// Install tooling: helm and cert-manager (built from their Go modules) and
// cert-manager's source (its CRDs), pinned by the Go modules under
// `testenv/tools/`.

const HELM_MODULE: &str = "helm.sh/helm/v4";
const HELM_PKG: &str = "helm.sh/helm/v4/cmd/helm";
const CERT_MANAGER_MODULE: &str = "github.com/cert-manager/cert-manager";

/// One program to build from a tool module: its package, the file name of the
/// binary, extra `-ldflags` and build tags (comma-separated; empty for none).
#[derive(Debug, Clone, Copy)]
pub struct GoTool<'a> {
    pub package: &'a str,
    pub binary: &'a str,
    pub ldflags: &'a str,
    pub tags: &'a str,
}

/// The Go module under `testenv/tools/` named `name`.
pub fn tool_module_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tools")
        .join(name)
}

/// Builds `tools` from the pinned Go module at `module` into
/// `target/tools/<name>/<digest>/` (returned), once per pin: the digest covers
/// go.mod, go.sum, the module's own `.go` files and the Go toolchain, as for
/// the control plane, and a file lock lets concurrent test processes share one
/// build.
pub fn ensure_tools_built(name: &str, module: &Path, tools: &[GoTool<'_>]) -> Result<PathBuf> {
    build_once(name, &target_dir().join("tools").join(name), module, tools)
}

/// Builds `tools` from the Go module at `module` into `root/<digest>/`
/// (returned) unless that build is complete already. The digest covers
/// go.mod, go.sum, the module's `.go` files and the Go toolchain; a file lock
/// in `root` lets concurrent processes share one build, and a build lands
/// whole or not at all.
fn build_once(what: &str, root: &Path, module: &Path, tools: &[GoTool<'_>]) -> Result<PathBuf> {
    let digest = pins_digest(module, tools)?;
    let out = root.join(&digest);
    let complete = out.join(".complete");
    if complete.exists() {
        return Ok(out);
    }

    fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    let lock_path = root.join(".build.lock");
    let lock =
        File::create(&lock_path).with_context(|| format!("creating {}", lock_path.display()))?;
    lock.lock()
        .with_context(|| format!("locking {}", lock_path.display()))?;
    // Another process may have finished the build while this one waited.
    if complete.exists() {
        return Ok(out);
    }

    let started = Instant::now();
    eprintln!(
        "testenv: building {what} from {} (a first build takes minutes)",
        module.display()
    );
    let staging = root.join(format!("{digest}.partial"));
    if staging.exists() {
        fs::remove_dir_all(&staging).with_context(|| format!("removing {}", staging.display()))?;
    }
    fs::create_dir_all(&staging)?;
    for tool in tools {
        go_build(module, tool, &staging.join(tool.binary))?;
    }
    if out.exists() {
        fs::remove_dir_all(&out).with_context(|| format!("removing {}", out.display()))?;
    }
    fs::rename(&staging, &out).with_context(|| format!("moving build to {}", out.display()))?;
    File::create(&complete)?;
    eprintln!(
        "testenv: {what} built in {:.0?} into {}",
        started.elapsed(),
        out.display()
    );
    Ok(out)
}

/// The version of `module_path` that the Go module at `module` requires,
/// read from its go.mod.
pub fn required_version(module: &Path, module_path: &str) -> Result<String> {
    let path = module.join("go.mod");
    let go_mod =
        fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let prefix = format!("{module_path} ");
    go_mod
        .lines()
        .map(|line| line.trim().trim_start_matches("require").trim())
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_string)
        .with_context(|| format!("no {module_path} requirement in {}", path.display()))
}

/// The Go module pinning helm (`testenv/tools/helm`).
pub fn helm_module_dir() -> PathBuf {
    tool_module_dir("helm")
}

/// Returns the path of the pinned helm, building it first if needed.
pub fn ensure_helm_built() -> Result<PathBuf> {
    let module = helm_module_dir();
    let version = required_version(&module, HELM_MODULE)?;
    // As helm's own Makefile stamps it, so `helm version` tells the pin.
    let stamp = format!("-X {HELM_MODULE}/internal/version.version={version}");
    let out = ensure_tools_built(
        "helm",
        &module,
        &[GoTool {
            package: HELM_PKG,
            binary: "helm",
            ldflags: &stamp,
            tags: "",
        }],
    )?;
    Ok(out.join("helm"))
}

/// The Go module pinning cert-manager (`testenv/tools/cert-manager`).
pub fn cert_manager_module_dir() -> PathBuf {
    tool_module_dir("cert-manager")
}

/// The pinned cert-manager module's source in the Go module cache,
/// downloaded (and checked against go.sum) if needed.
pub fn cert_manager_source() -> Result<PathBuf> {
    module_source(&cert_manager_module_dir(), CERT_MANAGER_MODULE)
}

/// The source of `module_path`, at the version the Go module at `module`
/// pins, in the Go module cache: downloaded (and checked against go.sum) if
/// needed. Read-only, as the module cache is.
pub fn module_source(module: &Path, module_path: &str) -> Result<PathBuf> {
    let output = go_command(module)
        .args(["mod", "download", "-json", module_path])
        .output()
        .context("running `go mod download` (is Go >= 1.26 on PATH?)")?;
    let info: serde_json::Value = serde_json::from_slice(&output.stdout).with_context(|| {
        format!(
            "`go mod download {module_path}` printed no JSON: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )
    })?;
    if let Some(error) = info["Error"].as_str() {
        bail!("`go mod download {module_path}` failed: {error}");
    }
    if !output.status.success() {
        bail!(
            "`go mod download {module_path}` failed with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let dir = info["Dir"]
        .as_str()
        .context("`go mod download -json` gave no Dir")?;
    Ok(PathBuf::from(dir))
}

/// cert-manager's CustomResourceDefinitions (`deploy/crds/*.yaml` of the
/// pinned module), as one multi-document YAML manifest.
pub fn cert_manager_crds() -> Result<String> {
    let dir = cert_manager_source()?.join("deploy/crds");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    if files.is_empty() {
        bail!("no CRDs in {}", dir.display());
    }
    let mut manifest = String::new();
    for file in files {
        let text =
            fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        manifest.push_str("\n---\n");
        manifest.push_str(&text);
    }
    Ok(manifest)
}

/// cert-manager's controller and CA injector, built from the pinned module.
#[derive(Debug, Clone)]
pub struct CertManagerBinaries {
    /// The Issuer, Certificate and CertificateRequest controllers of the
    /// SelfSigned and CA issuers (`testenv/tools/cert-manager/controller`).
    pub controller: PathBuf,
    /// The CA injector, for webhook configurations
    /// (`testenv/tools/cert-manager/cainjector`).
    pub cainjector: PathBuf,
}

/// Returns cert-manager's controller and CA injector for the pinned module,
/// building them first if needed. The mains are the tool module's own
/// (`controller/`, `cainjector/`): cert-manager's `cmd/*` modules are not on
/// the module proxy, its root module's controllers are.
pub fn ensure_cert_manager_built() -> Result<CertManagerBinaries> {
    const MAIN: &str = "node-holder.dev/testenv/tools/cert-manager";
    let out = ensure_tools_built(
        "cert-manager",
        &cert_manager_module_dir(),
        &[
            GoTool {
                package: &format!("{MAIN}/controller"),
                binary: "cert-manager-controller",
                ldflags: "",
                tags: "",
            },
            GoTool {
                package: &format!("{MAIN}/cainjector"),
                binary: "cert-manager-cainjector",
                ldflags: "",
                tags: "",
            },
        ],
    )?;
    Ok(CertManagerBinaries {
        controller: out.join("cert-manager-controller"),
        cainjector: out.join("cert-manager-cainjector"),
    })
}

/// What the install tests need besides the control plane.
#[derive(Debug, Clone)]
pub struct InstallTools {
    /// The pinned helm.
    pub helm: PathBuf,
    /// The pinned cert-manager module's source (its CRDs).
    pub cert_manager_source: PathBuf,
    /// cert-manager's controller and CA injector.
    pub cert_manager: CertManagerBinaries,
    /// kubectl, from the control plane's own pin (for `kubectl node-holder`).
    pub kubectl: PathBuf,
    /// promtool, from the pinned Prometheus module (the chart's alert rules).
    pub promtool: PathBuf,
    /// crane, from the pinned go-containerregistry module (the local OCI
    /// registry the chart and the image are pushed to).
    pub crane: PathBuf,
    /// actionlint, from its pinned module (the release workflow's lint).
    pub actionlint: PathBuf,
}

/// Builds helm and cert-manager and fetches cert-manager's source if needed:
/// what `cargo xtask test` prepares before the tests run.
pub fn ensure_install_tools() -> Result<InstallTools> {
    Ok(InstallTools {
        helm: ensure_helm_built()?,
        cert_manager_source: cert_manager_source()?,
        cert_manager: ensure_cert_manager_built()?,
        kubectl: ensure_kubectl_built()?,
        promtool: ensure_promtool_built()?,
        crane: ensure_crane_built()?,
        actionlint: ensure_actionlint_built()?,
    })
}

/// Returns the path of kubectl from the control plane's pin (the same
/// Kubernetes release), building it first if needed.
pub fn ensure_kubectl_built() -> Result<PathBuf> {
    let module = module_dir();
    let stamp = kubernetes_stamp(&module)?;
    let out = build_once(
        "kubectl",
        &target_dir().join("kubectl"),
        &module,
        &[GoTool {
            package: "k8s.io/kubernetes/cmd/kubectl",
            binary: "kubectl",
            ldflags: &stamp,
            tags: "",
        }],
    )?;
    Ok(out.join("kubectl"))
}

// ---------------------------------------------------------------------------
// The autoscaler's cluster: kube-scheduler and kube-controller-manager from
// the control plane's own pin, kwok (the kubelets) and Karpenter's KWOK
// provider from their Go modules under `testenv/tools/`.

const KUBE_SCHEDULER_PKG: &str = "k8s.io/kubernetes/cmd/kube-scheduler";
const KUBE_CONTROLLER_MANAGER_PKG: &str = "k8s.io/kubernetes/cmd/kube-controller-manager";
const KWOK_MODULE: &str = "sigs.k8s.io/kwok";
const KWOK_PKG: &str = "sigs.k8s.io/kwok/cmd/kwok";
const KARPENTER_MODULE: &str = "sigs.k8s.io/karpenter";
const KARPENTER_PKG: &str = "sigs.k8s.io/karpenter/kwok";

/// What runs beside the control plane so that Karpenter decides for real.
#[derive(Debug, Clone)]
pub struct ClusterBinaries {
    pub kube_scheduler: PathBuf,
    pub kube_controller_manager: PathBuf,
    /// kwok, playing every kubelet: nodes Ready, pods Running, Jobs done.
    pub kwok: PathBuf,
    /// Karpenter with its KWOK cloud provider (`sigs.k8s.io/karpenter/kwok`).
    pub karpenter: PathBuf,
    /// The pinned kwok module's source (its stage configurations).
    pub kwok_source: PathBuf,
    /// The pinned Karpenter module's source (its CRDs).
    pub karpenter_source: PathBuf,
}

/// The Go module pinning kwok (`testenv/tools/kwok`).
pub fn kwok_module_dir() -> PathBuf {
    tool_module_dir("kwok")
}

/// The Go module pinning Karpenter (`testenv/tools/karpenter`).
pub fn karpenter_module_dir() -> PathBuf {
    tool_module_dir("karpenter")
}

/// The pinned Karpenter release (`v1.14.1`), read from its tool module.
pub fn karpenter_version() -> Result<String> {
    required_version(&karpenter_module_dir(), KARPENTER_MODULE)
}

/// kube-scheduler and kube-controller-manager from the control plane's own
/// pin.
#[derive(Debug, Clone)]
pub struct KubeComponents {
    pub kube_scheduler: PathBuf,
    pub kube_controller_manager: PathBuf,
}

/// Builds kube-scheduler and kube-controller-manager from the control
/// plane's pin into `target/kube-components/<digest>/` if needed: what a
/// Karpenter cluster runs, and what runs beside a real node with Services
/// (its controllers and scheduler).
pub fn ensure_kube_components_built() -> Result<KubeComponents> {
    let module = module_dir();
    let stamp = kubernetes_stamp(&module)?;
    let out = build_once(
        "kube-scheduler and kube-controller-manager",
        &target_dir().join("kube-components"),
        &module,
        &[
            GoTool {
                package: KUBE_SCHEDULER_PKG,
                binary: "kube-scheduler",
                ldflags: &stamp,
                tags: "",
            },
            GoTool {
                package: KUBE_CONTROLLER_MANAGER_PKG,
                binary: "kube-controller-manager",
                ldflags: &stamp,
                tags: "",
            },
        ],
    )?;
    Ok(KubeComponents {
        kube_scheduler: out.join("kube-scheduler"),
        kube_controller_manager: out.join("kube-controller-manager"),
    })
}

/// Builds kube-scheduler, kube-controller-manager, kwok and Karpenter if
/// needed (each group once per pin) and fetches kwok's and Karpenter's
/// sources.
pub fn ensure_cluster_built() -> Result<ClusterBinaries> {
    let kube = ensure_kube_components_built()?;
    // kwok's version is a constant of its source; Karpenter's is stamped.
    let kwok_module = kwok_module_dir();
    let kwok = ensure_tools_built(
        "kwok",
        &kwok_module,
        &[GoTool {
            package: KWOK_PKG,
            binary: "kwok",
            ldflags: "",
            tags: "",
        }],
    )?;
    let karpenter_module = karpenter_module_dir();
    let karpenter = ensure_tools_built(
        "karpenter",
        &karpenter_module,
        &[GoTool {
            package: KARPENTER_PKG,
            binary: "karpenter",
            ldflags: &format!(
                "-X sigs.k8s.io/karpenter/pkg/operator.Version={}",
                karpenter_version()?
            ),
            tags: "",
        }],
    )?;
    Ok(ClusterBinaries {
        kube_scheduler: kube.kube_scheduler,
        kube_controller_manager: kube.kube_controller_manager,
        kwok: kwok.join("kwok"),
        karpenter: karpenter.join("karpenter"),
        kwok_source: module_source(&kwok_module, KWOK_MODULE)?,
        karpenter_source: module_source(&karpenter_module, KARPENTER_MODULE)?,
    })
}

// ---------------------------------------------------------------------------
// The HTTP load generator of `cargo bench -p node-holder-lab --bench webhook`.

/// oha's pinned release: a crate's version, installed with its own lock file.
pub const OHA_VERSION: &str = "1.16.0";

/// Returns the path of oha (the HTTP load generator, from crates.io),
/// installing it first with `cargo install --locked` into
/// `target/tools/oha/<version>/` if needed (about 7 minutes on 2 cores).
pub fn ensure_oha_installed() -> Result<PathBuf> {
    let root = target_dir().join("tools").join("oha").join(OHA_VERSION);
    let oha = root.join("bin").join("oha");
    if oha.exists() {
        return Ok(oha);
    }
    eprintln!(
        "testenv: installing oha {OHA_VERSION} into {} (minutes)",
        root.display()
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "install",
            "--locked",
            "--quiet",
            "--version",
            OHA_VERSION,
            "oha",
            "--root",
        ])
        .arg(&root)
        .status()
        .context("running cargo install oha")?;
    if !status.success() || !oha.exists() {
        bail!("cargo install oha {OHA_VERSION} failed: {status}");
    }
    Ok(oha)
}

// ---------------------------------------------------------------------------
// promtool: the chart's alert rules checked and unit-tested as Prometheus
// itself reads them.

const PROMETHEUS_MODULE: &str = "github.com/prometheus/prometheus";
const PROMTOOL_PKG: &str = "github.com/prometheus/prometheus/cmd/promtool";

/// Returns the path of promtool from the pinned Prometheus module
/// (`testenv/tools/promtool`), building it first if needed.
pub fn ensure_promtool_built() -> Result<PathBuf> {
    let module = tool_module_dir("promtool");
    let version = required_version(&module, PROMETHEUS_MODULE)?;
    // As Prometheus's own build stamps it, so `promtool --version` tells the pin.
    let stamp = format!("-X github.com/prometheus/common/version.Version={version}");
    let out = ensure_tools_built(
        "promtool",
        &module,
        &[GoTool {
            package: PROMTOOL_PKG,
            binary: "promtool",
            ldflags: &stamp,
            // Prometheus's own tag for builds without its service discoveries (the clouds'
            // SDKs, client-go): promtool checks and tests rules, it discovers nothing.
            tags: "remove_all_sd",
        }],
    )?;
    Ok(out.join("promtool"))
}

/// The Go module pinning the Prometheus Operator (`testenv/tools/prometheus-operator`).
const PROMETHEUS_OPERATOR_MODULE: &str = "github.com/prometheus-operator/prometheus-operator";

/// The Prometheus Operator's ServiceMonitor and PrometheusRule CRDs, from the
/// pinned module's source (downloaded and checked against go.sum if needed),
/// as one manifest.
pub fn prometheus_operator_crds() -> Result<String> {
    let source = module_source(
        &tool_module_dir("prometheus-operator"),
        PROMETHEUS_OPERATOR_MODULE,
    )?;
    let dir = source.join("example/prometheus-operator-crd");
    let mut manifest = String::new();
    for kind in ["servicemonitors", "prometheusrules"] {
        let file = dir.join(format!("monitoring.coreos.com_{kind}.yaml"));
        let text =
            fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        manifest.push_str("\n---\n");
        manifest.push_str(&text);
    }
    Ok(manifest)
}

const CRANE_MODULE: &str = "github.com/google/go-containerregistry";
const CRANE_PKG: &str = "github.com/google/go-containerregistry/cmd/crane";

/// Returns the path of crane from the pinned go-containerregistry module
/// (`testenv/tools/registry`), building it first if needed.
pub fn ensure_crane_built() -> Result<PathBuf> {
    let module = tool_module_dir("registry");
    let version = required_version(&module, CRANE_MODULE)?;
    // As crane's release build stamps it, so `crane version` tells the pin.
    let stamp = format!("-X {CRANE_MODULE}/cmd/crane/cmd.Version={version}");
    let out = ensure_tools_built(
        "registry",
        &module,
        &[GoTool {
            package: CRANE_PKG,
            binary: "crane",
            ldflags: &stamp,
            tags: "",
        }],
    )?;
    Ok(out.join("crane"))
}

// ---------------------------------------------------------------------------
// actionlint: the GitHub Actions workflows (`.github/workflows/`) checked as
// GitHub reads them, their `run:` scripts by shellcheck.

const ACTIONLINT_MODULE: &str = "github.com/rhysd/actionlint";
const ACTIONLINT_PKG: &str = "github.com/rhysd/actionlint/cmd/actionlint";

/// Returns the path of actionlint from its pinned module
/// (`testenv/tools/actionlint`), building it first if needed (about 20 s).
pub fn ensure_actionlint_built() -> Result<PathBuf> {
    let module = tool_module_dir("actionlint");
    let version = required_version(&module, ACTIONLINT_MODULE)?;
    // As actionlint's release build stamps it, so `actionlint -version`
    // tells the pin.
    let stamp = format!("-X {ACTIONLINT_MODULE}.version={version}");
    let out = ensure_tools_built(
        "actionlint",
        &module,
        &[GoTool {
            package: ACTIONLINT_PKG,
            binary: "actionlint",
            ldflags: &stamp,
            tags: "",
        }],
    )?;
    Ok(out.join("actionlint"))
}

// ---------------------------------------------------------------------------
// The real node: the kubelet and kube-proxy from `testenv/tools/kubelet`, a
// module of its own that pins the control plane's `k8s.io/kubernetes` release.

const KUBELET_PKG: &str = "k8s.io/kubernetes/cmd/kubelet";
const KUBE_PROXY_PKG: &str = "k8s.io/kubernetes/cmd/kube-proxy";

/// The Go module pinning the real node's kubelet and kube-proxy
/// (`testenv/tools/kubelet`).
pub fn kubelet_module_dir() -> PathBuf {
    tool_module_dir("kubelet")
}

/// What runs on the real node: the kubelet and kube-proxy.
#[derive(Debug, Clone)]
pub struct RealNodeBinaries {
    pub kubelet: PathBuf,
    pub kube_proxy: PathBuf,
}

/// Returns the real node's kubelet and kube-proxy, built from
/// `testenv/tools/kubelet` (the control plane's `k8s.io/kubernetes` release,
/// which this checks) if needed: the kubelet into
/// `target/tools/kubelet/<digest>/` (about 80 s with a warm Go build cache,
/// minutes cold), kube-proxy into `target/tools/kube-proxy/<digest>/` (about
/// 40 s once the kubelet is built: they share most packages). Two groups, so
/// that a kubelet built before kube-proxy joined it is kept.
pub fn ensure_real_node_built() -> Result<RealNodeBinaries> {
    let module = kubelet_module_dir();
    let pinned = kubernetes_version(&module)?;
    let control_plane = kubernetes_version(&module_dir())?;
    if pinned != control_plane {
        bail!(
            "testenv/tools/kubelet pins k8s.io/kubernetes {pinned}, the control plane {control_plane}: move both"
        );
    }
    let stamp = kubernetes_stamp(&module)?;
    let kubelet = ensure_tools_built(
        "kubelet",
        &module,
        &[GoTool {
            package: KUBELET_PKG,
            binary: "kubelet",
            ldflags: &stamp,
            tags: "",
        }],
    )?;
    let kube_proxy = ensure_tools_built(
        "kube-proxy",
        &module,
        &[GoTool {
            package: KUBE_PROXY_PKG,
            binary: "kube-proxy",
            ldflags: &stamp,
            tags: "",
        }],
    )?;
    Ok(RealNodeBinaries {
        kubelet: kubelet.join("kubelet"),
        kube_proxy: kube_proxy.join("kube-proxy"),
    })
}

/// The kubelet's path, once both of the real node's programs are built
/// ([`ensure_real_node_built`]).
pub fn ensure_kubelet_built() -> Result<PathBuf> {
    ensure_real_node_built().map(|binaries| binaries.kubelet)
}
