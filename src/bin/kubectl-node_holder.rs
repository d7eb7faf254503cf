#![forbid(unsafe_code)]
//! `kubectl node-holder status|release|hold`: kubectl runs the first
//! `kubectl-node_holder` on `PATH` with the arguments after `node-holder`;
//! `--kubeconfig`, `--context` and `KUBECONFIG` work as they do for kubectl.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use node_holder::cli::{Cli, Command};

#[tokio::main]
async fn main() -> ExitCode {
    let matches = Cli::command()
        .name("kubectl node-holder")
        .bin_name("kubectl node-holder")
        .get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|err| err.exit());
    if !matches!(
        cli.command,
        Command::Status(_) | Command::Release(_) | Command::Hold(_)
    ) {
        eprintln!(
            "error: kubectl node-holder runs `status`, `release` and `hold`; run node-holder itself for the rest"
        );
        return ExitCode::from(2);
    }
    node_holder::main(cli).await
}
