//! The one place a Kubernetes client is made.

use anyhow::{Context, Result};
use axum::http::header::{HeaderValue, USER_AGENT};

/// A client from the usual sources: `KUBECONFIG` or `~/.kube/config`, else the
/// in-cluster ServiceAccount. Its requests say who sends them (the
/// audit log's `userAgent`): `node-holder/<version>`, and for a command run
/// by hand its name, `node-holder/<version> (release)`.
pub async fn client(command: Option<&str>) -> Result<kube::Client> {
    let mut config = kube::Config::infer()
        .await
        .context("no Kubernetes client configuration (KUBECONFIG, ~/.kube/config or in-cluster)")?;
    let agent = user_agent(command);
    let agent = HeaderValue::from_str(&agent).context("the User-Agent header")?;
    config.headers.push((USER_AGENT, agent));
    kube::Client::try_from(config).context("building the Kubernetes client")
}

/// `node-holder/0.1.0`, or `node-holder/0.1.0 (status)` for a command.
pub fn user_agent(command: Option<&str>) -> String {
    let version = env!("CARGO_PKG_VERSION");
    match command {
        Some(command) => format!("node-holder/{version} ({command})"),
        None => format!("node-holder/{version}"),
    }
}
