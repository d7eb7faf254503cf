//! The command line. Every flag also reads an environment variable
//! (`NODE_HOLDER_<FLAG>`), so a Deployment can configure node-holder either way.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tracing::level_filters::LevelFilter;

use crate::core::holds::{Hold, Preset};
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
pub struct ServeArgs {
    /// Address of the HTTPS admission webhook.
    #[arg(long, env = "NODE_HOLDER_WEBHOOK_ADDR", default_value = "0.0.0.0:8443")]
    pub webhook_addr: SocketAddr,

    /// Address of the plain-HTTP admin port (/healthz, /readyz, /metrics).
    #[arg(long, env = "NODE_HOLDER_ADMIN_ADDR", default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,

    /// PEM serving certificate (chain) of the webhook.
    #[arg(
        long,
        env = "NODE_HOLDER_TLS_CERT_FILE",
        default_value = "/etc/node-holder/tls/tls.crt"
    )]
    pub tls_cert_file: PathBuf,

    /// PEM private key of the serving certificate.
    #[arg(
        long,
        env = "NODE_HOLDER_TLS_KEY_FILE",
        default_value = "/etc/node-holder/tls/tls.key"
    )]
    pub tls_key_file: PathBuf,

    /// How often the certificate files are checked for rotation.
    #[arg(long, env = "NODE_HOLDER_TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub tls_reload_interval: Duration,

    #[command(flatten)]
    pub policy: PolicyArgs,

    /// Budget of one webhook request, reading the body included; keep it well
    /// under the webhook configuration's timeoutSeconds.
    #[arg(long, env = "NODE_HOLDER_REQUEST_TIMEOUT", default_value = "2s", value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,

    /// Webhook requests handled at once; more wait their turn.
    #[arg(
        long,
        env = "NODE_HOLDER_MAX_CONCURRENT_REQUESTS",
        default_value_t = 256
    )]
    pub max_concurrent_requests: usize,

    /// On SIGTERM, how long to keep serving while not ready, so that the API
    /// server stops sending requests before connections close.
    #[arg(long, env = "NODE_HOLDER_SHUTDOWN_GRACE", default_value = "5s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,

    /// After the grace, how long in-flight requests may take to finish.
    #[arg(long, env = "NODE_HOLDER_DRAIN_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,
}

/// Which nodes are held, and with what.
#[derive(Debug, Args)]
pub struct PolicyArgs {
    /// Well-known holds to place (karpenter-v1 when neither this nor
    /// --hold-annotation is given).
    #[arg(
        long,
        env = "NODE_HOLDER_HOLD_PRESETS",
        value_enum,
        value_delimiter = ','
    )]
    pub hold_preset: Vec<Preset>,

    /// Hold annotations to place, as key=value; repeat or comma-separate.
    #[arg(long, env = "NODE_HOLDER_HOLD_ANNOTATIONS", value_delimiter = ',')]
    pub hold_annotation: Vec<Hold>,

    /// Label selector of the nodes in scope (kubectl syntax); empty means all.
    #[arg(long, env = "NODE_HOLDER_NODE_SELECTOR", default_value = "")]
    pub node_selector: String,
}

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
