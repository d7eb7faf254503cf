//! The one place a Kubernetes client is made.

use anyhow::{Context, Result};
use axum::http::header::{HeaderValue, USER_AGENT};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::cli::ClientArgs;

/// `serve`'s client: `KUBECONFIG` or `~/.kube/config`, else the in-cluster ServiceAccount.
pub async fn client() -> Result<kube::Client> {
    build(infer().await?, None)
}

/// A command's client, from its `--kubeconfig` and `--context` (as kubectl
/// chooses), else as [`client`] does.
pub async fn command_client(command: &str, args: &ClientArgs) -> Result<kube::Client> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match (&args.kubeconfig, &args.context) {
        (Some(path), _) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options).await
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&options).await,
        (None, None) => return build(infer().await?, Some(command)),
    }
    .context("the kubeconfig's context")?;
    build(config, Some(command))
}

async fn infer() -> Result<kube::Config> {
    kube::Config::infer()
        .await
        .context("no Kubernetes client configuration (KUBECONFIG, ~/.kube/config or in-cluster)")
}

/// The client of `config`, saying who sends (the audit log's `userAgent`).
/// kube's retry layer is off: it would retry a 429, 503 or 504 for minutes,
/// unseen by node-holder's logs and metrics. Every retry is [`crate::retry`]'s.
fn build(mut config: kube::Config, command: Option<&str>) -> Result<kube::Client> {
    let agent = HeaderValue::from_str(&user_agent(command)).context("the User-Agent header")?;
    config.headers.push((USER_AGENT, agent));
    config.default_retry = false;
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
