#![forbid(unsafe_code)]
//! node-holder: holds a Kubernetes cluster's nodes still after every scale-up.
//! docs/architecture.md maps its source files.

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

/// A binary's whole run; an error is printed with its context on one line.
pub async fn main(cli: Cli) -> std::process::ExitCode {
    telemetry::init(cli.log_format, cli.log_level);
    let ran = match cli.command {
        Command::Serve(args) => serve::run(*args).await,
        Command::Status(args) => status::run(&args).await,
        Command::Release(args) => release::run(&args).await,
        Command::Hold(args) => hold::run(&args).await,
        Command::Uninstall(args) => uninstall::run(&args).await,
        Command::SelfCheck(args) => selfcheck::run(&args).await,
    };
    if let Err(err) = ran {
        eprintln!("error: {err:#}");
        return std::process::ExitCode::FAILURE;
    }
    std::process::ExitCode::SUCCESS
}
