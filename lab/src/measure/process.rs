//! A process as `/proc` shows it (read by procfs, the crate that knows its
//! formats): its resident memory now and at its peak (VmRSS, VmHWM), its CPU
//! time; and its threads pinned to cores.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};

/// A process's resident memory now and at its peak, in KiB.
#[derive(Debug, Clone, Copy)]
pub struct ProcMemory {
    pub rss_kb: u64,
    pub hwm_kb: u64,
}

impl ProcMemory {
    pub fn read(pid: u32) -> Result<ProcMemory> {
        let status = process(pid)?
            .status()
            .with_context(|| format!("/proc/{pid}/status"))?;
        Ok(ProcMemory {
            rss_kb: status.vmrss.context("VmRSS")?,
            hwm_kb: status.vmhwm.context("VmHWM")?,
        })
    }
}

impl std::fmt::Display for ProcMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "VmRSS {:.1} MiB (peak VmHWM {:.1} MiB = {:.1} MB)",
            mib(self.rss_kb),
            mib(self.hwm_kb),
            decimal_mb(self.hwm_kb)
        )
    }
}

/// Kibibytes in mebibytes.
pub fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// Kibibytes in decimal megabytes, the unit of the targets.
pub fn decimal_mb(kb: u64) -> f64 {
    kb as f64 * 1024.0 / 1e6
}

/// User + system CPU time of a process.
pub fn cpu(pid: u32) -> Result<Duration> {
    let stat = process(pid)?
        .stat()
        .with_context(|| format!("/proc/{pid}/stat"))?;
    let ticks = stat.utime.saturating_add(stat.stime);
    Ok(Duration::from_secs_f64(
        ticks as f64 / procfs::ticks_per_second() as f64,
    ))
}

fn process(pid: u32) -> Result<procfs::process::Process> {
    procfs::process::Process::new(i32::try_from(pid)?).with_context(|| format!("/proc/{pid}"))
}

/// Pins every thread of process `pid` to `cores` (a `taskset` CPU list).
pub fn pin(pid: u32, cores: &str) -> Result<()> {
    let pinned = Command::new("taskset")
        .args([
            "--all-tasks",
            "--cpu-list",
            "--pid",
            cores,
            &pid.to_string(),
        ])
        .output()
        .context("running taskset")?;
    ensure!(
        pinned.status.success(),
        "taskset: {}",
        String::from_utf8_lossy(&pinned.stderr)
    );
    Ok(())
}
