//! `cargo xtask test` runs everything CI runs; `cargo xtask demo` runs the local demo.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

mod demo;
mod suite;

use suite::Counts;

#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build the control plane, check formatting and lints, run every test.
    Test,
    /// The local demo: a real control plane, node-holder, nodes held and released.
    Demo(demo::DemoArgs),
    /// Build node-holder static, then its runtime image from the Dockerfile
    /// with buildah, written as an OCI image layout.
    Image {
        /// Where to write the layout.
        #[arg(long, default_value = "target/image")]
        out: std::path::PathBuf,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let result = match Cli::parse().task {
        Task::Test => test(),
        Task::Demo(args) => demo::run(args).await,
        Task::Image { out } => image(&out),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// `cargo xtask image`: the static build, then the image (buildah).
fn image(out: &std::path::Path) -> Result<()> {
    let binary = xtask::image::build_static()?;
    let version = package_version()?;
    let version = version.as_str();
    let layout = xtask::image::build_image(&binary, out, version)?;
    println!(
        "wrote {} (node-holder {version}, manifest {})",
        layout.dir.display(),
        layout.manifest_digest
    );
    Ok(())
}

/// node-holder's version, from the root manifest's `[package]`.
fn package_version() -> Result<String> {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let text = std::fs::read_to_string(manifest).context("reading Cargo.toml")?;
    let package = text
        .split("[package]")
        .nth(1)
        .context("no [package] in Cargo.toml")?;
    package
        .lines()
        .find_map(|l| l.trim().strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .map(str::to_string)
        .context("no version in Cargo.toml's [package]")
}

fn test() -> Result<()> {
    let total = Instant::now();
    prepare()?;
    let mut counts = Counts::default();
    let result = step(
        "running every test (cargo nextest, then the doc tests)",
        || suite::run(&mut counts),
    );
    eprintln!("xtask: finished in {:.0?}", total.elapsed());
    close(&counts, result)
}

/// Everything before the tests, in three streams at once: the Go builds from the Kubernetes
/// pin, the Go builds of the other tools, and Rust (the image's binary, the test runner, fmt,
/// clippy, the test binaries). One stream alone leaves a core idle through its downloads,
/// links and single-crate stretches; on a fresh machine the three together end minutes sooner
/// (README). Each stream stops at its first failure; every failure is reported.
fn prepare() -> Result<()> {
    let errors: Vec<anyhow::Error> = std::thread::scope(|streams| {
        let streams = [
            streams.spawn(build_kubernetes),
            streams.spawn(build_tools),
            streams.spawn(build_and_check_rust),
        ];
        streams
            .into_iter()
            .filter_map(|stream| match stream.join() {
                Ok(result) => result.err(),
                Err(_) => Some(anyhow::anyhow!("a build stream panicked")),
            })
            .collect()
    });
    // The first is the run's error; the others are said here.
    for err in errors.iter().skip(1) {
        eprintln!("xtask: also: {err:#}");
    }
    match errors.into_iter().next() {
        Some(first) => Err(first),
        // Each tool is complete now; these only find them (and fetch the CRDs' sources).
        None => step("finding every tool built", || {
            testenv::ensure_install_tools()?;
            testenv::ensure_cluster_built()?;
            testenv::ensure_kubelet_built().map(|_| ())
        }),
    }
}

/// What the control plane's pin builds: one module, so its packages are compiled once.
fn build_kubernetes() -> Result<()> {
    step("building the control plane (kube-apiserver, etcd)", || {
        testenv::ensure_built().map(|_| ())
    })?;
    step(
        "building kube-scheduler and kube-controller-manager",
        || testenv::ensure_kube_components_built().map(|_| ()),
    )?;
    step("building kubectl", || {
        testenv::ensure_kubectl_built().map(|_| ())
    })?;
    step("building the real node's kubelet and kube-proxy", || {
        testenv::ensure_kubelet_built().map(|_| ())
    })
}

/// The other tools, each from its own pinned module; kwok and Karpenter last, after the
/// Kubernetes stream has (most likely) built the kube components that their step also wants.
fn build_tools() -> Result<()> {
    step("building helm", || testenv::ensure_helm_built().map(|_| ()))?;
    step("building cert-manager, fetching its CRDs", || {
        testenv::cert_manager_source()?;
        testenv::ensure_cert_manager_built().map(|_| ())
    })?;
    step("building promtool, crane and actionlint", || {
        testenv::ensure_promtool_built()?;
        testenv::ensure_crane_built()?;
        testenv::ensure_actionlint_built().map(|_| ())
    })?;
    step("building kwok and Karpenter", || {
        testenv::ensure_cluster_built().map(|_| ())
    })
}

/// The Rust side: the image's binary (its own target directory), the test runner, the checks,
/// then the test binaries, so that the suite starts with nothing left to compile.
fn build_and_check_rust() -> Result<()> {
    step(
        "building node-holder's image binary (release, static)",
        || xtask::image::build_static().map(|_| ()),
    )?;
    step(
        "cargo-nextest, the test runner (installed from crates.io if missing)",
        || {
            let installed = xtask::cargo()
                .args(["nextest", "--version"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if installed {
                return Ok(());
            }
            // Unoptimised: its work is starting tests and reading their output, and the
            // optimised build took 13.5 minutes of a fresh machine's two cores. Without
            // self-update (and its HTTP client), as nextest's book asks of CI builds.
            cargo(&[
                "install",
                "cargo-nextest",
                "--locked",
                "--debug",
                "--no-default-features",
                "--features",
                "default-no-update",
            ])
        },
    )?;
    step("cargo fmt --check", || {
        cargo(&["fmt", "--all", "--", "--check"])
    })?;
    step("cargo clippy", || {
        cargo(&[
            "clippy",
            "--workspace",
            "--all-targets",
            "--locked",
            "--",
            "-D",
            "warnings",
        ])
    })?;
    step("building the test binaries", || {
        cargo(&suite::NEXTEST_BUILD)
    })
}

/// The closing line CI reads, and the verdict.
fn close(counts: &Counts, result: Result<()>) -> Result<()> {
    println!("tests: {} passed, {} failed", counts.passed, counts.failed);
    result?;
    if counts.failed > 0 {
        bail!("{} tests failed", counts.failed);
    }
    if counts.passed == 0 {
        bail!("no test ran");
    }
    Ok(())
}

fn step<T>(name: &str, run: impl FnOnce() -> Result<T>) -> Result<T> {
    eprintln!("xtask: {name}");
    let started = Instant::now();
    let value = run().with_context(|| format!("{name} failed"))?;
    eprintln!("xtask: {name}: done in {:.0?}", started.elapsed());
    Ok(value)
}

fn cargo(args: &[&str]) -> Result<()> {
    let status = xtask::cargo()
        .args(args)
        .status()
        .context("running cargo")?;
    if !status.success() {
        bail!("`cargo {}` exited with {status}", args.join(" "));
    }
    Ok(())
}
