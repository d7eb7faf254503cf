//! A child process that cannot outlive its owner.

use std::fs::{self, File};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result, bail};

/// A started program whose output goes to a log file. Dropping it kills it.
pub struct ManagedChild {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl ManagedChild {
    pub(crate) fn spawn(
        name: &'static str,
        program: &Path,
        args: &[String],
        log: &Path,
    ) -> Result<Self> {
        let mut command = Command::new(program);
        command.args(args);
        Self::spawn_command(name, command, log)
    }

    /// Starts `command` (its program, arguments and environment as given),
    /// writing its output to `log`.
    pub fn spawn_command(name: &'static str, mut command: Command, log: &Path) -> Result<Self> {
        let program = command.get_program().to_owned();
        let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no
        // memory of the parent; it is the only call made between fork and exec.
        // The kernel then kills the child when the thread that spawned it ends,
        // so a test process that aborts or is SIGKILLed leaves no orphan.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", program.to_string_lossy()))?;
        Ok(ManagedChild {
            name,
            child,
            log: log.to_path_buf(),
        })
    }

    /// Fails with the end of the program's log if it has exited.
    pub fn check_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited early ({status}):\n{}",
                self.name,
                self.log_tail()
            );
        }
        Ok(())
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The last lines of the program's log.
    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl ManagedChild {
    /// SIGKILLs the program and reaps it; already gone is fine.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ManagedChild {
    fn drop(&mut self) {
        self.kill();
    }
}
