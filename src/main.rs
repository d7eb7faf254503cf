#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use node_holder::cli::Cli;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // One crypto provider (ring) for every TLS configuration of the process.
    node_holder::server::tls::crypto_provider();
    node_holder::main(cli).await
}
