//! `cargo xtask test` runs everything CI runs; `cargo xtask demo` runs the local demo.

use std::io::{BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

mod demo;

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
}

#[tokio::main]
async fn main() -> ExitCode {
    let result = match Cli::parse().task {
        Task::Test => test(),
        Task::Demo(args) => demo::run(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn test() -> Result<()> {
    let total = Instant::now();
    step("building the control plane (kube-apiserver, etcd)", || {
        testenv::ensure_built().map(|_| ())
    })?;
    step(
        "building helm and cert-manager, fetching cert-manager's CRDs",
        || testenv::ensure_install_tools().map(|_| ()),
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
    let mut counts = Counts::default();
    let result = step("cargo test", || cargo_test(&mut counts));
    eprintln!("xtask: finished in {:.0?}", total.elapsed());
    // The closing line CI reads: every test binary's results added up.
    println!("tests: {} passed, {} failed", counts.passed, counts.failed);
    result
}

#[derive(Default)]
struct Counts {
    passed: u64,
    failed: u64,
}

/// Runs `cargo test`, echoing its output and adding up each binary's
/// `test result: ok. N passed; M failed; ...` line.
fn cargo_test(counts: &mut Counts) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut child = Command::new(&cargo)
        .args(["test", "--workspace", "--locked"])
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {cargo}"))?;
    let stdout = child.stdout.take().context("cargo test's stdout")?;
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        if let Some(summary) = line.strip_prefix("test result: ") {
            for part in summary.split(['.', ';']) {
                let mut words = part.split_whitespace();
                match (words.next().map(str::parse::<u64>), words.next()) {
                    (Some(Ok(n)), Some("passed")) => counts.passed += n,
                    (Some(Ok(n)), Some("failed")) => counts.failed += n,
                    _ => {}
                }
            }
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("`cargo test` exited with {status}");
    }
    Ok(())
}

fn step(name: &str, run: impl FnOnce() -> Result<()>) -> Result<()> {
    eprintln!("xtask: {name}");
    let started = Instant::now();
    run().with_context(|| format!("{name} failed"))?;
    eprintln!("xtask: {name}: done in {:.0?}", started.elapsed());
    Ok(())
}

fn cargo(args: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args(args)
        .status()
        .with_context(|| format!("running {cargo}"))?;
    if !status.success() {
        bail!("`cargo {}` exited with {status}", args.join(" "));
    }
    Ok(())
}
