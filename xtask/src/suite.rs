//! How `cargo xtask test` runs the tests: cargo-nextest runs every test of
//! the workspace, each in a process of its own, as `.config/nextest.toml`
//! says (the tests that start a Karpenter cluster first and at most four at
//! once, eight tests at once in all, no stop at a failure, no retry); then
//! `cargo test --doc` runs the doc tests, which nextest does not. The
//! closing line counts both, from nextest's JUnit report and the doc tests'
//! `test result:` lines.

use std::path::Path;
use std::process::Stdio;

use anyhow::{Context, Result, bail};

/// Tests that passed and failed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub passed: u64,
    pub failed: u64,
}

impl Counts {
    /// Adds every `test result: ok. N passed; M failed; ...` line of a
    /// `cargo test` output; an ignored test counts as failed (every test
    /// runs on every run).
    fn add_cargo_test(&mut self, stdout: &str) {
        for summary in stdout
            .lines()
            .filter_map(|l| l.strip_prefix("test result: "))
        {
            for part in summary.split(['.', ';']) {
                let mut words = part.split_whitespace();
                let (Some(Ok(n)), Some(what)) = (words.next().map(str::parse::<u64>), words.next())
                else {
                    continue;
                };
                let slot = match what {
                    "passed" => &mut self.passed,
                    "failed" | "ignored" => &mut self.failed,
                    _ => continue,
                };
                *slot = slot.saturating_add(n);
            }
        }
    }

    /// Adds nextest's JUnit report: its `<testsuites tests= failures=
    /// errors=>` totals.
    fn add_junit(&mut self, xml: &str) -> Result<()> {
        let head = xml
            .split("<testsuites")
            .nth(1)
            .and_then(|rest| rest.split('>').next())
            .context("no <testsuites> in nextest's JUnit report")?;
        let attribute = |name: &str| -> u64 {
            head.split(&format!(" {name}=\""))
                .nth(1)
                .and_then(|v| v.split('"').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let failed = attribute("failures").saturating_add(attribute("errors"));
        self.passed = self
            .passed
            .saturating_add(attribute("tests").saturating_sub(failed));
        self.failed = self.failed.saturating_add(failed);
        Ok(())
    }
}

/// What nextest runs; the same with `--no-run` builds exactly the binaries it will run.
const NEXTEST: [&str; 4] = ["nextest", "run", "--workspace", "--locked"];

/// `cargo nextest run --no-run`: the test binaries, built before the suite starts.
pub const NEXTEST_BUILD: [&str; 5] = [NEXTEST[0], NEXTEST[1], NEXTEST[2], NEXTEST[3], "--no-run"];

/// Runs nextest, then the doc tests; both run to their end whatever fails.
/// Errs when either failed.
pub fn run(counts: &mut Counts) -> Result<()> {
    let nextest = xtask::cargo()
        .args(NEXTEST)
        .arg("--no-fail-fast")
        // A test marked ignored runs too: every test runs on every run.
        .args(["--run-ignored", "all"])
        .stdin(Stdio::null())
        .status()
        .context("running cargo nextest (`cargo install cargo-nextest --locked`)")?;
    let report = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/nextest/default/junit.xml");
    let xml = std::fs::read_to_string(&report)
        .with_context(|| format!("reading {}", report.display()))?;
    counts.add_junit(&xml)?;
    let doc = xtask::cargo()
        .args(["test", "--workspace", "--locked", "--no-fail-fast", "--doc"])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo test --doc")?;
    counts.add_cargo_test(&String::from_utf8_lossy(&doc.stdout));
    match (nextest.success(), doc.status.success()) {
        (true, true) => Ok(()),
        (false, _) => bail!("cargo nextest run exited with {nextest}"),
        (_, false) => bail!("cargo test --doc exited with {}", doc.status),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doc_test_summaries_add_up_and_an_ignored_test_counts_as_failed() {
        let mut counts = Counts::default();
        counts.add_cargo_test(
            "running 3 tests\ntest a ... ok\n\
             test result: ok. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out\n\
             test result: FAILED. 0 passed; 0 failed; 4 ignored; 0 measured\n",
        );
        assert_eq!(
            counts,
            Counts {
                passed: 2,
                failed: 5
            }
        );
    }

    #[test]
    fn the_junit_report_totals_count_failures_and_errors_as_failed() {
        let mut counts = Counts {
            passed: 1,
            failed: 0,
        };
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuites name="nextest-run" tests="330" failures="2" errors="1" uuid="x" timestamp="t" time="600.1">
<testsuite name="node-holder" tests="1" disabled="0" errors="0" failures="0">"#;
        counts.add_junit(xml).unwrap();
        assert_eq!(
            counts,
            Counts {
                passed: 328,
                failed: 3
            }
        );
        assert!(Counts::default().add_junit("<testsuite>").is_err());
    }
}
