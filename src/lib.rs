#![forbid(unsafe_code)]
//! node-holder: holds a Kubernetes cluster's nodes still after every scale-up.
//!
//! - [`cli`]: the command line (every flag also reads an environment variable).
//! - [`core`]: the pure core (holds, scope, patches, admission decisions).
//! - [`server`]: the HTTPS webhook and the admin port; [`serve`] runs them.
//! - [`controller`]: the hold window task (leader only).
//! - [`cluster`]: the Kubernetes client.
//! - [`selfcheck`]: what the chart's `helm test` runs.
//! - [`telemetry`]: text or JSON logs.

pub mod cli;
pub mod cluster;
pub mod controller;
pub mod core;
pub mod hold;
pub mod metrics;
pub mod release;
pub mod request;
pub mod retry;
pub mod selfcheck;
pub mod serve;
pub mod server;
pub mod state;
pub mod status;
pub mod telemetry;
pub mod uninstall;

use crate::cli::{Cli, Command};

/// A binary's whole run: logging set up as `cli` says, the subcommand run,
/// and its error printed with its whole context chain on one line.
pub async fn main(cli: Cli) -> std::process::ExitCode {
    telemetry::init(cli.log_format, cli.log_level);
    match run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs the subcommand `cli` names.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => serve::run(*args).await,
        Command::Status(args) => status::run(&args).await,
        Command::Release(args) => release::run(&args).await,
        Command::Hold(args) => hold::run(&args).await,
        Command::Uninstall(args) => uninstall::run(&args).await,
        Command::SelfCheck(args) => selfcheck::run(&args).await,
    }
}
