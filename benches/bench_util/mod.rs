//! What both benches read from /proc: a process's memory and CPU time, the
//! machine. Included by each bench as `mod bench_util;` (a file in a
//! subdirectory of `benches/` is no bench target of its own).
#![allow(dead_code)] // each bench uses a different part

use std::time::Duration;

use anyhow::{Context, Result};

/// The contents of `/proc/<pid>/status`.
pub fn proc_status(pid: u32) -> Result<String> {
    Ok(std::fs::read_to_string(format!("/proc/{pid}/status"))?)
}

/// The value of `field` in a `/proc/<pid>/status` text, trimmed.
pub fn status_field<'a>(status: &'a str, field: &str) -> Option<&'a str> {
    status.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// A process's resident memory now and at its peak, from `/proc/<pid>/status`.
/// (Each bench prints it its own way: its `Display` is the bench's.)
#[derive(Debug, Clone, Copy)]
pub struct ProcMemory {
    pub rss_kb: u64,
    pub hwm_kb: u64,
}

impl ProcMemory {
    pub fn read(pid: u32) -> Result<ProcMemory> {
        let status = proc_status(pid)?;
        let kb = |field| -> Result<u64> {
            status_field(&status, field)
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("{field} in /proc/{pid}/status"))
        };
        Ok(ProcMemory {
            rss_kb: kb("VmRSS")?,
            hwm_kb: kb("VmHWM")?,
        })
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

/// Clock ticks (`_SC_CLK_TCK`) as a duration.
pub fn from_ticks(ticks: u64) -> Duration {
    // SAFETY: sysconf reads a constant of the C library.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Duration::from_secs_f64(ticks as f64 / per_second)
}

/// User + system CPU time of a process, from its `/proc/<pid>/stat` at
/// `stat_path`.
pub fn process_cpu(stat_path: &str) -> Result<Duration> {
    let stat = std::fs::read_to_string(stat_path)?;
    // Fields after the parenthesised command name, which may hold spaces.
    let rest = &stat[stat.rfind(')').context("malformed stat")? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    Ok(from_ticks(ticks))
}

/// The machine the bench runs on.
pub struct Machine {
    pub cores: usize,
    pub cpu_model: String,
    pub loadavg: String,
}

impl Machine {
    pub fn read() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        Machine {
            // The machine's cores, not this thread's (perhaps pinned) share.
            cores: cpuinfo
                .lines()
                .filter(|l| l.starts_with("processor"))
                .count(),
            cpu_model: cpuinfo
                .lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
                .unwrap_or_else(|| "unknown CPU".to_string()),
            loadavg: std::fs::read_to_string("/proc/loadavg")
                .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
                .unwrap_or_default(),
        }
    }
}
