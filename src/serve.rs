//! `node-holder serve`: the runtime that ties configuration, the webhook, the
//! admin port and shutdown together.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::cli::{Admission, LONGEST_HOLD, ServeArgs};
use crate::controller;
use crate::controller::WindowMetrics;
use crate::core::holds::Holding;
use crate::metrics::Exposition;
use crate::server::metrics::{TlsMetrics, WebhookMetrics};
use crate::server::tls::{RELOAD_INTERVAL, ReloadingTls};
use crate::server::{
    Readiness, TlsServing, WebhookState, admin_router, drain_time, per_source, serve_tls,
    webhook_router,
};

/// Every subsystem's metrics, in the one registry `/metrics` exposes.
fn process_metrics() -> (WebhookMetrics, TlsMetrics, WindowMetrics, Exposition) {
    let mut registry = crate::metrics::registry();
    let webhook = WebhookMetrics::register(&mut registry);
    let tls = TlsMetrics::register(&mut registry);
    let window = WindowMetrics::register(&mut registry);
    (webhook, tls, window, Exposition::from(registry))
}

/// The window task's configuration, refusing by name the flags a pass could not honour.
fn controller_config(args: &ServeArgs, holding: Holding) -> Result<controller::Config> {
    if !args.window.warm_before_runs.is_zero() && args.window.launch_cost.is_zero() {
        bail!(
            "--warm-before-runs needs --launch-cost: warms are for the runs the schedule hold lets go"
        );
    }
    if args.window.hold_duration.is_zero() {
        bail!("--hold-duration must be longer than 0");
    }
    for (flag, value) in [
        ("--hold-duration", args.window.hold_duration),
        ("--max-hold", args.window.max_hold),
        ("--launch-cost", args.window.launch_cost),
    ] {
        if value > LONGEST_HOLD {
            bail!(
                "{flag} {} is longer than a hold may last ({}): a hold that long is a typo, not a plan",
                humantime::format_duration(value),
                humantime::format_duration(LONGEST_HOLD)
            );
        }
    }
    if args.lease_duration < Duration::from_secs(2) {
        bail!("--lease-duration must be at least 2s");
    }
    Ok(controller::Config {
        window: args.window.window_config(),
        holding,
        namespace: args.record.namespace.clone(),
        identity: controller::default_identity(),
        lease_duration: args.lease_duration,
        schedule: args.window.schedule_terms(),
        warm_lead: args.window.warm_lead(),
        qps: args.api_qps,
    })
}

pub async fn run(args: ServeArgs) -> Result<()> {
    let holding = args.holding.holding()?;
    let controller_config = controller_config(&args, holding.clone())?;
    // `--admission webhook`: the webhook's TLS and its bound port.
    let webhook = match args.admission {
        Admission::Webhook => Some((
            ReloadingTls::load(
                &args.tls_cert_file,
                &args.tls_key_file,
                args.client_ca_file(),
            )?,
            listen(args.webhook_addr, WEBHOOK_BACKLOG)
                .with_context(|| format!("binding the webhook port {}", args.webhook_addr))?,
        )),
        Admission::Policy => None,
    };
    let client = crate::cluster::client().await?;
    let admin_listener = TcpListener::bind(args.admin_addr)
        .await
        .with_context(|| format!("binding the admin port {}", args.admin_addr))?;
    let readiness = Arc::new(Readiness::default());
    spawn_api_probe(client.clone(), Arc::clone(&readiness));
    let webhook_listener = webhook.as_ref().map(|(_, listener)| listener);
    log_start(&args, &holding, webhook_listener, &admin_listener)?;
    let (metrics, tls_metrics, window, exposition) = process_metrics();
    let state = Arc::new(WebhookState {
        holding,
        metrics,
        exposition,
    });
    let window = Task::spawn(|stop| controller::run(client, controller_config, window, stop));
    let closing = readiness.shutting_down.clone();
    let webhook = webhook.map(|w| serve_webhook(&args, w, &state, tls_metrics, closing));
    let admin_router = admin_router(Arc::clone(&readiness), state);
    let admin = Task::spawn(|stop| async move {
        axum::serve(admin_listener, admin_router)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
            .context("admin server")
    });

    shutdown_signal().await?;
    readiness.shutting_down.cancel();
    // The window task stops first and hands its lease over; the webhook keeps
    // serving through the grace period.
    if let Err(err) = window.stop("hold window task").await {
        tracing::error!(
            error = format!("{err:#}"),
            "hold window task ended with an error"
        );
    }
    if let Some(webhook) = webhook {
        tracing::info!(grace = ?args.shutdown_grace, "shutting down: not ready, still serving during the grace period");
        tokio::time::sleep(args.shutdown_grace).await;
        webhook.stop("webhook task").await?;
    }
    admin.stop("admin task").await?;
    tracing::info!("stopped");
    Ok(())
}

/// The line that says what this process serves and holds with.
fn log_start(
    args: &ServeArgs,
    holding: &Holding,
    webhook: Option<&TcpListener>,
    admin: &TcpListener,
) -> Result<()> {
    let holds: Vec<String> = holding.holds.iter().map(ToString::to_string).collect();
    let webhook_addr = webhook.map(TcpListener::local_addr).transpose()?;
    let webhook_addr = webhook_addr.map_or("none (admission policy)".into(), |a| a.to_string());
    let client_certificates = webhook.is_some() && args.client_ca_file().is_some();
    tracing::info!(
        admission = if webhook.is_some() { "webhook" } else { "policy" },
        webhook = %webhook_addr,
        admin = %admin.local_addr()?,
        holds = %holds.join(","),
        scope = %holding.scope,
        client_certificates = if client_certificates { "required" } else { "off" },
        "node-holder serving"
    );
    Ok(())
}

/// Serves the webhook, keeping its TLS configuration current; `closing` is cancelled at SIGTERM.
fn serve_webhook(
    args: &ServeArgs,
    (tls, listener): (ReloadingTls, TcpListener),
    state: &Arc<WebhookState>,
    metrics: TlsMetrics,
    closing: CancellationToken,
) -> Task {
    let tls = Arc::new(tls);
    tls.spawn_reloader(RELOAD_INTERVAL, metrics.not_after.clone());
    let serving = TlsServing {
        closing,
        drain: drain_time(args.request_timeout),
        max_connections: args.max_connections,
        max_per_source: per_source(args.max_connections),
        idle_timeout: args.idle_timeout,
        metrics,
    };
    let router = webhook_router(Arc::clone(state), args.request_timeout);
    Task::spawn(|stop| serve_tls(listener, tls, router, stop, serving))
}

/// A task of the process and the token that stops it.
struct Task {
    stop: CancellationToken,
    handle: tokio::task::JoinHandle<Result<()>>,
}

impl Task {
    fn spawn<Fut>(start: impl FnOnce(CancellationToken) -> Fut) -> Task
    where
        Fut: std::future::Future<Output = Result<()>> + Send + 'static,
    {
        let stop = CancellationToken::new();
        let handle = tokio::spawn(start(stop.clone()));
        Task { stop, handle }
    }

    /// Stops the task and waits for it; its error, if it ended with one.
    async fn stop(self, what: &str) -> Result<()> {
        self.stop.cancel();
        self.handle.await.with_context(|| what.to_string())?
    }
}

/// Keeps `api_reachable` current: readiness follows the API server.
fn spawn_api_probe(client: kube::Client, readiness: Arc<Readiness>) {
    tokio::spawn(async move {
        loop {
            let reachable = client.apiserver_version().await.is_ok();
            if readiness.api_reachable.swap(reachable, Ordering::Relaxed) != reachable {
                tracing::info!(reachable, "Kubernetes API reachability changed");
            }
            tokio::time::sleep(crate::retry::api_probe_interval(reachable)).await;
        }
    });
}

async fn shutdown_signal() -> Result<()> {
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
    Ok(())
}

/// Connections the kernel queues beyond `--max-connections` (capped by
/// `net.core.somaxconn`). tokio's default of 128 makes the kernel drop the SYNs
/// of a burst of new connections, and clients retry only after 1 s, 3 s, ...
const WEBHOOK_BACKLOG: u32 = 1024;

fn listen(addr: std::net::SocketAddr, backlog: u32) -> Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket.listen(backlog)?)
}

#[cfg(test)]
mod tests {
    use strum::IntoEnumIterator;

    use super::*;

    /// A rate over an absent series is no alert at all: every label value
    /// node-holder knows in advance is exposed at 0 before its first event.
    #[test]
    fn labelled_counters_show_their_known_label_values_at_zero_from_the_start() {
        let metrics = process_metrics().3.encode().unwrap();
        let mut zeros: Vec<String> = Vec::new();
        for code in [200, 400, 408, 413, 415, 500, 503] {
            zeros.push(format!(
                "node_holder_webhook_requests_total{{code=\"{code}\"}} 0"
            ));
        }
        for code in [0, 403, 409, 422, 429, 500, 503] {
            zeros.push(format!(
                "node_holder_patch_errors_total{{code=\"{code}\"}} 0"
            ));
        }
        for reason in [
            "plain-http",
            "timeout",
            "no-client-certificate",
            "client-certificate-rejected",
            "certificate-rejected",
            "incompatible-client",
            "not-tls",
            "other",
        ] {
            zeros.push(format!(
                "node_holder_tls_handshake_errors_total{{reason=\"{reason}\"}} 0"
            ));
        }
        for kind in crate::controller::FailureKind::iter() {
            zeros.push(format!(
                "node_holder_pass_failures_total{{kind=\"{}\"}} 0",
                kind.label()
            ));
        }
        for line in &zeros {
            assert!(
                metrics.lines().any(|l| l == line),
                "{line} missing from\n{metrics}"
            );
        }
    }
}
