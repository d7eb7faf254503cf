//! The command line. Every flag also reads an environment variable
//! (`NODE_HOLDER_<FLAG>`), so a Deployment can configure node-holder either way.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tracing::level_filters::LevelFilter;

use crate::telemetry::LogFormat;

/// Holds a Kubernetes cluster's nodes still after every scale-up, then lets the
/// autoscaler go on.
#[derive(Debug, Parser)]
#[command(name = "node-holder", version, propagate_version = true)]
pub struct Cli {
    /// Log line format.
    #[arg(long, env = "NODE_HOLDER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,

    /// Most verbose level of node-holder's own log lines (dependencies log warnings only).
    #[arg(long, env = "NODE_HOLDER_LOG_LEVEL", default_value_t = LevelFilter::INFO, global = true)]
    pub log_level: LevelFilter,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the admission webhook and run the hold window.
    Serve(ServeArgs),
    /// Show the hold window, its leader and the held nodes.
    Status(StatusArgs),
    /// Close the hold window now and strip node-holder's holds.
    Release(ReleaseArgs),
    /// Write a development CA and webhook serving certificate.
    Certs(CertsArgs),
}

#[derive(Debug, Args)]
pub struct ServeArgs {}

#[derive(Debug, Args)]
pub struct StatusArgs {}

#[derive(Debug, Args)]
pub struct ReleaseArgs {}

#[derive(Debug, Args)]
pub struct CertsArgs {
    /// Directory to write ca.crt, tls.crt and tls.key into (created if missing).
    #[arg(long, env = "NODE_HOLDER_CERTS_OUT_DIR", default_value = "certs/dev")]
    pub out_dir: PathBuf,

    /// DNS name the serving certificate is valid for, besides localhost and
    /// 127.0.0.1; repeat for several (the webhook Service's names).
    #[arg(
        long = "dns-name",
        env = "NODE_HOLDER_CERTS_DNS_NAMES",
        value_delimiter = ',',
        default_value = "node-holder.node-holder.svc"
    )]
    pub dns_names: Vec<String>,

    /// How long the certificates are valid (`90d`, `8760h`).
    #[arg(long, env = "NODE_HOLDER_CERTS_VALIDITY", default_value = "365d", value_parser = humantime::parse_duration)]
    pub validity: Duration,
}
