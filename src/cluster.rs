//! The one place a Kubernetes client is made.

use anyhow::{Context, Result};

/// A client from the usual sources: `KUBECONFIG` or `~/.kube/config`, else the
/// in-cluster ServiceAccount.
pub async fn client() -> Result<kube::Client> {
    let config = kube::Config::infer()
        .await
        .context("no Kubernetes client configuration (KUBECONFIG, ~/.kube/config or in-cluster)")?;
    kube::Client::try_from(config).context("building the Kubernetes client")
}
