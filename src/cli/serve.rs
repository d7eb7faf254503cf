//! `serve`'s flags: how nodes are held, how long, the leader and the
//! patching bounds; the core's enums as flag values.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::builder::TypedValueParser as _;
use clap::{Args, FromArgMatches as _, ValueEnum};

use crate::core::holds::{Hold, Holding, Holds, Preset};
use crate::core::selector::NodeScope;
use crate::core::window::WindowConfig;

use super::{Admission, RecordArgs};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// How new Nodes are held at their CREATE: `webhook` (node-holder's, on
    /// --webhook-addr) or `policy` (a MutatingAdmissionPolicy, Kubernetes 1.36
    /// and later: the chart's `admission.mode: policy` or
    /// webhook-config/admission-policy.yaml; no webhook port nor certificate).
    #[arg(long, env = "NODE_HOLDER_ADMISSION", value_enum, default_value_t = Admission::Webhook)]
    pub admission: Admission,

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

    /// PEM CA certificate(s): every webhook client must present a client certificate signed by one
    /// of them (the API server's for this webhook, set in its AdmissionConfiguration). Checked for
    /// rotation like the serving certificate. Unset or empty: no client certificate is asked for.
    #[arg(
        long,
        env = "NODE_HOLDER_CLIENT_CA_FILE",
        value_parser = clap::builder::OsStringValueParser::new().map(PathBuf::from)
    )]
    pub client_ca_file: Option<PathBuf>,

    #[command(flatten)]
    pub holding: HoldingArgs,

    #[command(flatten)]
    pub window: WindowArgs,

    #[command(flatten)]
    pub record: RecordArgs,

    /// How long a leader's Lease lasts without renewal: a standby takes over at most this long
    /// after the leader died (whole seconds, at least 2s). Each replica is named in the Lease by
    /// its host name (in a pod, the pod's name).
    #[arg(long, env = "NODE_HOLDER_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    pub lease_duration: Duration,

    /// Node PATCH requests per second at most, 16 in flight: holding or
    /// releasing N nodes takes N / this (200 s for 50,000 nodes at 250).
    #[arg(long, env = "NODE_HOLDER_API_QPS", default_value_t = 250)]
    pub api_qps: u32,

    /// The longest one webhook request may take, reading the body included; keep it well under the
    /// webhook configuration's timeoutSeconds. It also bounds the drain after the shutdown grace:
    /// no request in flight outlives it.
    #[arg(long, env = "NODE_HOLDER_REQUEST_TIMEOUT", default_value = "2s", value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,

    /// Webhook connections open at once; more wait in the listen backlog. A quarter of them at most
    /// from one source address: more are closed as soon as they are accepted (counted in
    /// node_holder_webhook_connections_source_limited_total), so that a flood from elsewhere cannot
    /// take every slot from the API server.
    #[arg(long, env = "NODE_HOLDER_MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,

    /// A webhook connection with no request in flight for this long is closed
    /// (h2 gets a GOAWAY), so idle or silent clients cannot keep every
    /// connection slot. Keep it over the API server's own 90 s: it then closes
    /// an idle connection first, and never writes a call into this side's close.
    #[arg(long, env = "NODE_HOLDER_IDLE_TIMEOUT", default_value = "120s", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,

    /// On SIGTERM, how long to keep serving while not ready, so that the API server stops sending
    /// requests before connections close (the Service's routes change seconds after the pod's
    /// deletion, longer on a busy cluster); then the requests in flight have `--request-timeout` to
    /// finish.
    #[arg(long, env = "NODE_HOLDER_SHUTDOWN_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,
}

impl ServeArgs {
    /// `--client-ca-file`, unless empty (how the chart turns it off).
    pub fn client_ca_file(&self) -> Option<&Path> {
        self.client_ca_file
            .as_deref()
            .filter(|path| !path.as_os_str().is_empty())
    }
}

/// The holds node-holder places: `serve`'s, and those `self-check` expects on its test Node.
#[derive(Debug, Clone, Args)]
pub struct HoldKeysArgs {
    /// Well-known holds node-holder places (karpenter-v1 when neither this
    /// nor --hold-annotation is given).
    #[arg(
        long,
        env = "NODE_HOLDER_HOLD_PRESETS",
        value_enum,
        value_delimiter = ','
    )]
    pub hold_preset: Vec<Preset>,

    /// Hold annotations node-holder places, as key=value; repeat or comma-separate.
    #[arg(long, env = "NODE_HOLDER_HOLD_ANNOTATIONS", value_delimiter = ',')]
    pub hold_annotation: Vec<Hold>,
}

impl HoldKeysArgs {
    /// The holds the flags name, or an error naming the flag.
    pub fn holds(&self) -> anyhow::Result<Holds> {
        let holds = Holds::new(&self.hold_preset, &self.hold_annotation);
        holds.map_err(|e| anyhow::anyhow!("--hold-annotation: {e}"))
    }
}

/// Which nodes are held, and with what.
#[derive(Debug, Clone, Args)]
pub struct HoldingArgs {
    #[command(flatten)]
    pub holds: HoldKeysArgs,

    /// Label selector of the nodes in scope (kubectl syntax); empty means all.
    #[arg(long, env = "NODE_HOLDER_NODE_SELECTOR", default_value = "")]
    pub node_selector: String,
}

/// How long holds last.
#[derive(Debug, Clone, Args)]
pub struct WindowArgs {
    /// How long each new node holds: the window lasts until the last new node's creation plus this
    /// (`90s`, `20m`, `2h`; at most a year).
    #[arg(long, env = "NODE_HOLDER_HOLD_DURATION", default_value = "20m", value_parser = humantime::parse_duration)]
    pub hold_duration: Duration,

    /// Longest a window stays open, counted from when it opened, however many
    /// nodes keep arriving; `0` for no cap (at most a year).
    #[arg(long, env = "NODE_HOLDER_MAX_HOLD", default_value = "2h", value_parser = humantime::parse_duration)]
    pub max_hold: Duration,

    /// What a launch costs beyond its node-seconds (boot, image pulls, warm-up), as node-time
    /// (`5m`: a launch costs as much as five minutes of one idle node). Set, node-holder reads the
    /// cluster's CronJobs and their Jobs' pods: a node running a CronJob's pod is held while it
    /// runs, an idle one only when a run due within this time will use it (until the run starts),
    /// and such nodes open no window; other work keeps the window. `0`: off.
    #[arg(long, env = "NODE_HOLDER_LAUNCH_COST", default_value = "0s", value_parser = humantime::parse_duration)]
    pub launch_cost: Duration,

    /// With `--launch-cost`: this long before a scheduled run whose nodes were let go (its gap is
    /// longer than the launch cost), node-holder asks the autoscaler for the nodes the run will
    /// need, with placeholder pods shaped like the run's at a negative priority that any real pod
    /// preempts; they go just before the run starts. Set it to the pool's launch time plus a
    /// margin. `0`: off.
    #[arg(long, env = "NODE_HOLDER_WARM_BEFORE_RUNS", default_value = "0s", value_parser = humantime::parse_duration)]
    pub warm_before_runs: Duration,
}

/// What `serve` runs with when no flag is given: what a command run by hand
/// acts with when no leader has recorded its settings.
pub fn serve_defaults() -> anyhow::Result<ServeArgs> {
    let command = ServeArgs::augment_args(clap::Command::new("serve"));
    let matches = command.try_get_matches_from(["serve"]);
    let defaults = matches.and_then(|matches| ServeArgs::from_arg_matches(&matches));
    defaults.map_err(|e| anyhow::anyhow!("serve's defaults: {e}"))
}

impl HoldingArgs {
    /// The admission policy the flags describe, or an error naming the flag.
    pub fn holding(&self) -> anyhow::Result<Holding> {
        Ok(Holding {
            holds: self.holds.holds()?,
            scope: NodeScope::parse(&self.node_selector)
                .map_err(|e| anyhow::anyhow!("--node-selector: {e}"))?,
        })
    }
}

impl WindowArgs {
    /// The schedule hold's terms (`--launch-cost`), `None` when it is off.
    pub fn schedule_terms(&self) -> Option<crate::core::due::Terms> {
        (!self.launch_cost.is_zero()).then_some(crate::core::due::Terms {
            launch_cost: self.launch_cost,
            grace: crate::core::due::RUN_GRACE,
            settle: crate::core::due::SETTLE,
        })
    }

    /// `--warm-before-runs`, `None` when it is off.
    pub fn warm_lead(&self) -> Option<Duration> {
        (!self.warm_before_runs.is_zero()).then_some(self.warm_before_runs)
    }

    /// The window's arithmetic the flags describe (`--max-hold 0`: no cap).
    pub fn window_config(&self) -> WindowConfig {
        WindowConfig {
            hold: self.hold_duration,
            max_hold: (!self.max_hold.is_zero()).then_some(self.max_hold),
        }
    }
}

// The core's presets as flag values, here so that the core needs no clap.

impl ValueEnum for Preset {
    fn value_variants<'a>() -> &'a [Self] {
        &Preset::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        use clap::builder::PossibleValue;
        Some(match self {
            Preset::KarpenterV1 => PossibleValue::new("karpenter-v1")
                .help("Karpenter v1 and later: `karpenter.sh/do-not-disrupt: \"true\"`"),
            Preset::KarpenterV0 => PossibleValue::new("karpenter-v0")
                .help("Karpenter before v1.0: `karpenter.sh/do-not-consolidate: \"true\"`"),
            Preset::ClusterAutoscaler => PossibleValue::new("cluster-autoscaler").help(
                "Cluster Autoscaler: `cluster-autoscaler.kubernetes.io/scale-down-disabled: \"true\"`",
            ),
        })
    }
}

#[cfg(test)]
mod value_tests {
    use super::*;

    /// A command run by hand with no leader's settings acts as `serve`
    /// does with no flag: every flag of `serve` has a default.
    #[test]
    fn serve_has_a_default_for_every_flag() {
        let defaults = serve_defaults().unwrap();
        assert_eq!(defaults.window.hold_duration, Duration::from_secs(20 * 60));
        assert!(defaults.window.schedule_terms().is_none());
        assert_eq!(defaults.api_qps, 250);
    }

    /// Each preset's flag word parses back to it.
    #[test]
    fn the_preset_flag_words_round_trip() {
        for preset in Preset::value_variants() {
            let word = preset.to_possible_value().unwrap().get_name().to_string();
            assert_eq!(Preset::from_str(&word, false), Ok(*preset));
        }
        assert_eq!(
            Preset::from_str("cluster-autoscaler", false).map(|p| p.hold().key),
            Ok("cluster-autoscaler.kubernetes.io/scale-down-disabled".to_string())
        );
    }
}
