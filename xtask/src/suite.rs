//! How `cargo xtask test` runs the tests: every test binary of the
//! workspace (and the doc tests), two binaries at once, the longest first,
//! each binary four tests at once; every `test result:` line counted.
//!
//! `cargo test` runs its binaries one after another, so while the
//! real-Karpenter tests wait out Karpenter's rounds for eight minutes the
//! rest of the suite waits behind them. Running the binaries themselves lets
//! the two cores work on two of them.

use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// The arguments every `cargo test` run shares: the whole workspace, the
/// locked dependencies, and no stop at the first failing package or binary
/// (the listing and the doc tests run through cargo; the binaries through
/// [`run`], which does not stop either).
const CARGO_TEST: [&str; 4] = ["test", "--workspace", "--locked", "--no-fail-fast"];

/// How many test binaries run at once. Most end-to-end tests wait (for real
/// holds to run out, for Karpenter's rounds) far more than they compute.
const BINARIES_AT_ONCE: usize = 2;

/// How many tests of one binary run at once, unless `RUST_TEST_THREADS` says
/// otherwise; every test waits for conditions, not for fixed times, so a
/// busier machine makes them slower, not wrong.
const TEST_THREADS: &str = "4";

/// Binaries started first, longest first (as timed on 2 cores, 2026-11-26:
/// 489, 190, 147, 99, 66 and 62 s; the rest take under a minute each and
/// fill the lanes after them). Only an order: a binary missing here runs
/// all the same.
const LONGEST_FIRST: &[&str] = &[
    "node-holder test karpenter",
    "node-holder test soak",
    "xtask test demo",
    "node-holder test image",
    "node-holder test window_faults",
];

/// Tests that passed, failed and were ignored, from every binary's
/// `test result: ok. N passed; M failed; K ignored; ...` line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
}

impl Counts {
    /// Adds one `test result:` summary (what follows the prefix).
    pub fn add(&mut self, summary: &str) {
        for part in summary.split(['.', ';']) {
            let mut words = part.split_whitespace();
            let (Some(Ok(n)), Some(what)) = (words.next().map(str::parse::<u64>), words.next())
            else {
                continue;
            };
            let slot = match what {
                "passed" => &mut self.passed,
                "failed" => &mut self.failed,
                "ignored" => &mut self.ignored,
                _ => continue,
            };
            *slot = slot.saturating_add(n);
        }
    }

    /// Adds every `test result:` line of a binary's output.
    fn add_output(&mut self, stdout: &str) {
        for line in stdout.lines() {
            if let Some(summary) = line.strip_prefix("test result: ") {
                self.add(summary);
            }
        }
    }
}

/// One thing to run: a test binary in its package's directory (as `cargo
/// test` runs it), or `cargo test --doc`.
#[derive(Debug, Clone)]
pub struct Job {
    pub name: String,
    program: PathBuf,
    args: Vec<String>,
    dir: PathBuf,
}

/// How many tests the workspace has, doc tests included: `cargo test --
/// --list` prints one `NAME: test` line each (benchmarks are `: benchmark`).
pub fn list() -> Result<u64> {
    let listed = cargo_test(&["--", "--list"])?
        .lines()
        .filter(|line| line.ends_with(": test"))
        .count();
    eprintln!("xtask: {listed} tests");
    Ok(u64::try_from(listed)?)
}

/// Builds every test binary and returns them with the doc tests, in the
/// order they start.
pub fn jobs() -> Result<Vec<Job>> {
    let messages = cargo_test(&["--no-run", "--message-format=json-render-diagnostics"])?;
    let mut jobs = binaries(&messages)?;
    order(&mut jobs);
    jobs.push(doc_tests());
    Ok(jobs)
}

/// `cargo test --doc`, which runs every package's doc tests.
fn doc_tests() -> Job {
    Job {
        name: "doc tests".into(),
        program: cargo().into(),
        args: CARGO_TEST
            .iter()
            .chain(&["--doc"])
            .map(|a| a.to_string())
            .collect(),
        dir: ".".into(),
    }
}

/// `cargo test` with [`CARGO_TEST`] and `args`: its standard output, or an
/// error when it fails (its standard error goes to ours).
fn cargo_test(args: &[&str]) -> Result<String> {
    let cargo = cargo();
    let output = Command::new(&cargo)
        .args(CARGO_TEST)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {cargo}"))?;
    if !output.status.success() {
        bail!(
            "`cargo test {}` exited with {}",
            args.join(" "),
            output.status
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The test binaries in cargo's JSON messages: each compiled artifact with
/// the test profile and an executable.
fn binaries(messages: &str) -> Result<Vec<Job>> {
    let mut jobs = Vec::new();
    for line in messages.lines().filter(|l| l.starts_with('{')) {
        let message: Value = serde_json::from_str(line).context("a cargo JSON message")?;
        if message["reason"] != "compiler-artifact" || message["profile"]["test"] != true {
            continue;
        }
        let Some(executable) = message["executable"].as_str() else {
            continue;
        };
        let manifest = message["manifest_path"]
            .as_str()
            .context("an artifact without its manifest_path")?;
        let dir = PathBuf::from(manifest)
            .parent()
            .context("a manifest_path without a directory")?
            .to_path_buf();
        let target = message["target"]["name"].as_str().unwrap_or("?");
        let kind = message["target"]["kind"][0].as_str().unwrap_or("?");
        let package = package_name(message["package_id"].as_str().unwrap_or("?"));
        jobs.push(Job {
            name: format!("{package} {kind} {target}"),
            program: executable.into(),
            args: Vec::new(),
            dir,
        });
    }
    Ok(jobs)
}

/// A package's name in its cargo id: `path+file:///w/p#name@0.1.0` (or
/// `path+file:///w/p#0.1.0` when the name is the directory's), or the older
/// `name 0.1.0 (path+file:///w/p)`.
fn package_name(id: &str) -> &str {
    match id.rsplit_once('#') {
        Some((path, tail)) => match tail.split_once('@') {
            Some((name, _)) => name,
            None => path.rsplit('/').next().unwrap_or(path),
        },
        None => id.split(' ').next().unwrap_or(id),
    }
}

/// The binaries [`LONGEST_FIRST`] names go first, in its order; the rest
/// keep cargo's.
fn order(jobs: &mut [Job]) {
    let rank = |job: &Job| {
        LONGEST_FIRST
            .iter()
            .position(|name| job.name == *name)
            .unwrap_or(LONGEST_FIRST.len())
    };
    jobs.sort_by_key(rank);
}

/// Runs every job, [`BINARIES_AT_ONCE`] at a time; a failing one does not
/// stop the rest. Each binary's output is printed whole when it ends, with
/// its time. Errs when any exited unsuccessfully.
pub fn run(jobs: Vec<Job>, counts: &mut Counts) -> Result<()> {
    let threads = std::env::var("RUST_TEST_THREADS").unwrap_or_else(|_| TEST_THREADS.into());
    let queue = Mutex::new(VecDeque::from(jobs));
    let results = Mutex::new((Counts::default(), Vec::<String>::new()));
    std::thread::scope(|scope| {
        for _ in 0..BINARIES_AT_ONCE {
            scope.spawn(|| {
                while let Some(job) = next(&queue) {
                    let outcome = run_one(&job, &threads);
                    let mut results = results.lock().unwrap_or_else(|e| e.into_inner());
                    match outcome {
                        Ok(output) => {
                            results
                                .0
                                .add_output(&String::from_utf8_lossy(&output.stdout));
                            if !output.status.success() {
                                results
                                    .1
                                    .push(format!("{} exited with {}", job.name, output.status));
                            }
                        }
                        Err(err) => results.1.push(format!("{}: {err:#}", job.name)),
                    }
                }
            });
        }
    });
    let (ran, failures) = results.into_inner().unwrap_or_else(|e| e.into_inner());
    *counts = ran;
    if !failures.is_empty() {
        bail!("{}", failures.join("; "));
    }
    Ok(())
}

fn next(queue: &Mutex<VecDeque<Job>>) -> Option<Job> {
    queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front()
}

/// Runs one job to its end and prints its output whole, with its time.
fn run_one(job: &Job, threads: &str) -> Result<Output> {
    let started = Instant::now();
    let output = Command::new(&job.program)
        .args(&job.args)
        .current_dir(&job.dir)
        .env("RUST_TEST_THREADS", threads)
        .env("CARGO_MANIFEST_DIR", &job.dir)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", job.program.display()))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "xtask: {} ({:.0?})", job.name, started.elapsed())?;
    out.write_all(&output.stdout)?;
    std::io::stderr().lock().write_all(&output.stderr)?;
    Ok(output)
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_names_are_read_from_both_id_forms() {
        assert_eq!(
            package_name("path+file:///w/p#node-holder@0.1.0"),
            "node-holder"
        );
        assert_eq!(package_name("path+file:///w/p/testenv#0.0.0"), "testenv");
        assert_eq!(
            package_name("xtask 0.0.0 (path+file:///w/p/xtask)"),
            "xtask"
        );
    }

    #[test]
    fn a_failing_package_stops_neither_the_listing_nor_the_doc_tests() {
        assert!(CARGO_TEST.contains(&"--no-fail-fast"));
        assert_eq!(
            doc_tests().args,
            ["test", "--workspace", "--locked", "--no-fail-fast", "--doc"]
        );
    }

    #[test]
    fn summaries_add_up() {
        let mut counts = Counts::default();
        counts.add_output(
            "running 3 tests\ntest a ... ok\n\
             test result: ok. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out\n\
             test result: FAILED. 0 passed; 0 failed; 4 ignored; 0 measured\n",
        );
        assert_eq!(
            counts,
            Counts {
                passed: 2,
                failed: 1,
                ignored: 4
            }
        );
    }

    #[test]
    fn test_binaries_are_read_from_cargo_messages_the_longest_first() {
        let artifact = |kind: &str, name: &str, test: bool, exe: Option<&str>| {
            serde_json::json!({
                "reason": "compiler-artifact",
                "package_id": "path+file:///w/p#node-holder@0.1.0",
                "manifest_path": "/w/p/Cargo.toml",
                "target": {"kind": [kind], "name": name},
                "profile": {"test": test},
                "executable": exe,
            })
            .to_string()
        };
        let messages = [
            artifact("lib", "p", true, Some("/w/t/p-1")),
            artifact("lib", "p", false, None),
            artifact("test", "window", true, Some("/w/t/window-2")),
            artifact("test", "karpenter", true, Some("/w/t/karpenter-3")),
            r#"{"reason":"compiler-artifact","package_id":"path+file:///w/p/testenv#0.0.0","manifest_path":"/w/p/testenv/Cargo.toml","target":{"kind":["test"],"name":"karpenter"},"profile":{"test":true},"executable":"/w/t/karpenter-4"}"#.into(),
            artifact("bin", "p", false, Some("/w/t/p")),
            r#"{"reason":"build-finished","success":true}"#.into(),
        ]
        .join("\n");
        let mut jobs = binaries(&messages).expect("the messages parse");
        order(&mut jobs);
        let names: Vec<_> = jobs.iter().map(|j| j.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "node-holder test karpenter",
                "node-holder lib p",
                "node-holder test window",
                "testenv test karpenter"
            ]
        );
        let dir = |j: &Job| j.dir.to_string_lossy().into_owned();
        let dirs: Vec<_> = jobs.iter().map(dir).collect();
        assert_eq!(dirs, ["/w/p", "/w/p", "/w/p", "/w/p/testenv"]);
    }
}
