//! The command line. Every flag also reads an environment variable
//! (`NODE_HOLDER_<FLAG>`), so a Deployment can configure node-holder either way.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use tracing::level_filters::LevelFilter;

use crate::telemetry::LogFormat;

mod commands;
mod serve;

pub use commands::*;
pub use serve::*;

/// Holds a Kubernetes cluster's nodes still after every scale-up, then lets the autoscaler go on.
#[derive(Debug, Parser)]
#[command(name = "node-holder", version, propagate_version = true)]
pub struct Cli {
    /// Log line format.
    #[arg(long, env = "NODE_HOLDER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,

    /// Most verbose level of node-holder's own log lines (dependencies log
    /// warnings only); `RUST_LOG`, when set, replaces this filter.
    #[arg(long, env = "NODE_HOLDER_LOG_LEVEL", default_value_t = LevelFilter::INFO, global = true)]
    pub log_level: LevelFilter,

    #[command(subcommand)]
    pub command: Command,
}

/// Who holds a new Node at its CREATE (`--admission`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Admission {
    /// node-holder's admission webhook.
    Webhook,
    /// The API server's MutatingAdmissionPolicy.
    Policy,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the admission webhook and run the hold window.
    Serve(Box<ServeArgs>),
    /// Show the hold window, its leader and the held nodes.
    Status(StatusArgs),
    /// Ask the leader to close the hold window now and strip node-holder's
    /// holds (with no live leader: `uninstall` strips them).
    Release(ReleaseArgs),
    /// Ask the leader to hold every node in scope now, for a while, whatever
    /// the window does (a rollout, an incident); `release` ends it early.
    Hold(HoldArgs),
    /// Remove everything node-holder left in the cluster, as its chart's pre-delete hook does: stop
    /// new holds, stop its replicas, strip every hold, delete the record and the Lease.
    Uninstall(UninstallArgs),
    /// Check that node-holder works in the cluster, as the chart's `helm test` does: a Node created
    /// as a server-side dry run comes back with every hold, and a replica leads the hold window.
    /// Fails, saying which check did not pass, when one still fails at --timeout.
    SelfCheck(SelfCheckArgs),
}

/// Which cluster a command run by hand talks to, chosen as kubectl chooses
/// it (so `kubectl node-holder` honours kubectl's flags).
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// Path of the kubeconfig to use (kubectl's `--kubeconfig`); else
    /// `KUBECONFIG`, `~/.kube/config` or the in-cluster ServiceAccount.
    #[arg(long, env = "NODE_HOLDER_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// The kubeconfig context to use (kubectl's `--context`); else its current context.
    #[arg(long, env = "NODE_HOLDER_CONTEXT")]
    pub context: Option<String>,
}

/// Where node-holder keeps its Lease and its window record.
#[derive(Debug, Clone, Args)]
pub struct RecordArgs {
    /// Namespace of node-holder's Lease and window record (its release namespace).
    #[arg(
        short,
        long,
        env = "NODE_HOLDER_NAMESPACE",
        default_value = "node-holder"
    )]
    pub namespace: String,
}

/// How `status` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// A readable summary and table.
    Text,
    /// One JSON document.
    Json,
    /// The same document as YAML.
    Yaml,
}

/// A manual hold's length: more than nothing, at most a year.
fn parse_manual_hold(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if duration.is_zero() {
        return Err("a manual hold must last longer than 0s (`release` ends one)".to_string());
    }
    if duration > LONGEST_HOLD {
        return Err(format!(
            "at most {} (a manual hold always ends; hold again to extend it)",
            humantime::format_duration(LONGEST_HOLD)
        ));
    }
    Ok(duration)
}

/// The longest `--hold-duration`, `--max-hold` and manual hold: a year
/// (365.25 days, as humantime counts one). Longer ones would only push
/// deadlines towards the end of time (where they saturate).
pub const LONGEST_HOLD: Duration = Duration::from_secs(31_557_600);

/// A reason someone can read: not blank, one line, at most 256 characters.
fn parse_reason(text: &str) -> Result<String, String> {
    let reason = text.trim();
    if reason.is_empty() {
        return Err("say why (`--reason \"payments rollout\"`)".to_string());
    }
    if reason.contains(['\n', '\r']) || reason.chars().count() > 256 {
        return Err("one line of at most 256 characters".to_string());
    }
    Ok(reason.to_string())
}
