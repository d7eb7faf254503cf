#![forbid(unsafe_code)]
//! node-holder: holds a Kubernetes cluster's nodes still after every scale-up.
//!
//! - [`cli`]: the command line (every flag also reads an environment variable).
//! - [`core`]: the pure core (holds, scope, patches, admission decisions).
//! - [`server`]: the HTTPS webhook and the admin port; [`serve`] runs them.
//! - [`cluster`]: the Kubernetes client.
//! - [`certs`]: development certificates for the webhook.
//! - [`telemetry`]: text or JSON logs.

pub mod certs;
pub mod cli;
pub mod cluster;
pub mod core;
pub mod serve;
pub mod server;
pub mod telemetry;

use anyhow::bail;

use crate::cli::{Cli, Command};

/// Runs the subcommand `cli` names.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Certs(args) => certs::run(&args),
        Command::Serve(args) => serve::run(args).await,
        Command::Status(_) => {
            bail!("`node-holder status` is not built yet: it arrives with the hold window")
        }
        Command::Release(_) => {
            bail!("`node-holder release` is not built yet: it arrives with the hold window")
        }
    }
}
