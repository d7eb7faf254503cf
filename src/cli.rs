//! The command line. Every flag also reads an environment variable
//! (`NODE_HOLDER_<FLAG>`), so a Deployment can configure node-holder either way.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::builder::TypedValueParser as _;
use clap::{Args, FromArgMatches as _, Parser, Subcommand, ValueEnum};
use tracing::level_filters::LevelFilter;

use crate::core::budget::Mechanism;
use crate::core::grouping::Grouping;
use crate::core::holds::Holding;
use crate::core::holds::{Hold, Holds, Preset};
use crate::core::names::{is_label_value, is_qualified_name};
use crate::core::selector::NodeScope;
use crate::core::window::WindowConfig;
use crate::telemetry::LogFormat;

/// Holds a Kubernetes cluster's nodes still after every scale-up, then lets the
/// autoscaler go on.
#[derive(Debug, Parser)]
#[command(name = "node-holder", version, propagate_version = true)]
pub struct Cli {
    /// Log line format.
    #[arg(long, env = "NODE_HOLDER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,

    /// Most verbose level of node-holder's own log lines (dependencies log
    /// warnings only); `RUST_LOG`, when set, replaces this filter.
    #[arg(long, env = "NODE_HOLDER_LOG_LEVEL", default_value_t = LevelFilter::INFO, global = true)]
    pub log_level: LevelFilter,

    #[command(subcommand)]
    pub command: Command,
}

/// Who holds a new Node at its CREATE (`--admission`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Admission {
    /// node-holder's admission webhook.
    Webhook,
    /// The API server's MutatingAdmissionPolicy.
    Policy,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the admission webhook and run the hold window.
    Serve(Box<ServeArgs>),
    /// Show the hold window, its leader and the held nodes.
    Status(StatusArgs),
    /// Say why one node is held, by whom, until when, and what was last
    /// said about it (node-holder's and Karpenter's Events).
    Explain(ExplainArgs),
    /// Close the hold window now and strip node-holder's holds.
    Release(ReleaseArgs),
    /// Hold every node in scope now, for a while, whatever the window does
    /// (a rollout, an incident); `release` ends it early.
    Hold(HoldArgs),
    /// Remove everything node-holder left in the cluster, as its chart's
    /// pre-delete hook does: stop new holds, stop its replicas, strip every
    /// hold and budget entry, delete the record and the Lease.
    Uninstall(UninstallArgs),
    /// Write a development CA and webhook serving certificate.
    Certs(CertsArgs),
    /// Check that node-holder works in the cluster, as the chart's `helm
    /// test` does: a Node created as a server-side dry run comes back with
    /// every hold, and a replica leads the hold window. Fails, saying which
    /// check did not pass, when one still fails at --timeout.
    SelfCheck(SelfCheckArgs),
}

/// `self-check` (`crate::selfcheck`).
#[derive(Debug, Args)]
pub struct SelfCheckArgs {
    #[command(flatten)]
    pub client: ClientArgs,

    #[command(flatten)]
    pub record: RecordArgs,

    /// The well-known holds the test Node must get, as `serve` takes them
    /// (karpenter-v1 when neither this nor --hold-annotation is given).
    #[arg(
        long,
        env = "NODE_HOLDER_HOLD_PRESETS",
        value_enum,
        value_delimiter = ','
    )]
    pub hold_preset: Vec<Preset>,

    /// More holds the test Node must get, as key=value, as `serve` takes
    /// them; repeat or comma-separate.
    #[arg(long, env = "NODE_HOLDER_HOLD_ANNOTATIONS", value_delimiter = ',')]
    pub hold_annotation: Vec<Hold>,

    /// Labels of the test Node, as key=value, so that it falls inside
    /// --node-selector and the webhook's objectSelector; repeat or
    /// comma-separate.
    #[arg(
        long,
        env = "NODE_HOLDER_SELF_CHECK_NODE_LABELS",
        value_delimiter = ','
    )]
    pub node_label: Vec<String>,

    /// How long the checks may take together, each tried again every 2 s
    /// while it fails.
    #[arg(long, env = "NODE_HOLDER_SELF_CHECK_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// How new Nodes are held at their CREATE: `webhook` (node-holder serves
    /// the admission webhook on --webhook-addr) or `policy` (a
    /// MutatingAdmissionPolicy holds them inside the API server, Kubernetes
    /// 1.36 and later: the chart's `admission.mode: policy` or
    /// webhook-config/admission-policy.yaml; node-holder then opens no
    /// webhook port and needs no certificate).
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

    /// PEM CA certificate(s): every webhook client must present a client
    /// certificate signed by one of them (the API server's for this webhook,
    /// set in its AdmissionConfiguration). Checked for rotation like the
    /// serving certificate. Unset or empty: no client certificate is asked for.
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

    #[command(flatten)]
    pub leader: LeaderArgs,

    #[command(flatten)]
    pub patching: PatchingArgs,

    /// The longest one webhook request may take, reading the body included;
    /// keep it well under the webhook configuration's timeoutSeconds. It
    /// also bounds the drain after the shutdown grace: no request in flight
    /// outlives it.
    #[arg(long, env = "NODE_HOLDER_REQUEST_TIMEOUT", default_value = "2s", value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,

    /// Webhook connections open at once; more wait in the listen backlog. A
    /// quarter of them at most from one source address: more are closed as
    /// soon as they are accepted (counted in
    /// node_holder_webhook_connections_source_limited_total), so that a
    /// flood from elsewhere cannot take every slot from the API server.
    #[arg(long, env = "NODE_HOLDER_MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,

    /// A webhook connection with no request in flight for this long is closed
    /// (h2 gets a GOAWAY; the API server opens a new one when it needs it), so
    /// idle or silent clients cannot keep every connection slot.
    #[arg(long, env = "NODE_HOLDER_IDLE_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,

    /// On SIGTERM, how long to keep serving while not ready, so that the API
    /// server stops sending requests before connections close; then the
    /// requests in flight have `--request-timeout` to finish.
    #[arg(long, env = "NODE_HOLDER_SHUTDOWN_GRACE", default_value = "5s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,
}

impl ServeArgs {
    /// `--client-ca-file`, unless empty: the chart always sets the variable
    /// and leaves it empty to turn client certificates off.
    pub fn client_ca_file(&self) -> Option<&Path> {
        self.client_ca_file
            .as_deref()
            .filter(|path| !path.as_os_str().is_empty())
    }
}

/// Which nodes are held, and with what.
#[derive(Debug, Clone, Args)]
pub struct HoldingArgs {
    /// Well-known holds to place (karpenter-v1 when neither this nor
    /// --hold-annotation is given).
    #[arg(
        long,
        env = "NODE_HOLDER_HOLD_PRESETS",
        value_enum,
        value_delimiter = ','
    )]
    pub hold_preset: Vec<Preset>,

    /// Hold annotations to place, as key=value; repeat or comma-separate.
    #[arg(long, env = "NODE_HOLDER_HOLD_ANNOTATIONS", value_delimiter = ',')]
    pub hold_annotation: Vec<Hold>,

    /// Label selector of the nodes in scope (kubectl syntax); empty means all.
    #[arg(long, env = "NODE_HOLDER_NODE_SELECTOR", default_value = "")]
    pub node_selector: String,

    /// `annotation`: hold every node in scope with the hold annotation (one
    /// PATCH a node; stops consolidation and drift). `budget`: while a window
    /// is open, add a disruption budget `{nodes: "0", reasons: [Underutilized,
    /// Empty]}` to every Karpenter NodePool in scope (one PATCH a pool; stops
    /// consolidation, lets drift go on) and take exactly that entry off when
    /// it closes; the webhook still holds each new node until its pool
    /// carries the budget.
    #[arg(long, env = "NODE_HOLDER_HOLD_MECHANISM", value_enum, default_value_t = Mechanism::Annotation)]
    pub hold_mechanism: Mechanism,

    /// With `--hold-mechanism budget`: label selector of the NodePools held
    /// by budget (kubectl syntax); empty means all.
    #[arg(long, env = "NODE_HOLDER_NODEPOOL_SELECTOR", default_value = "")]
    pub nodepool_selector: String,
}

/// How long holds last.
#[derive(Debug, Clone, Args)]
pub struct WindowArgs {
    /// How long each new node holds: the window lasts until the last new
    /// node's creation plus this (`90s`, `20m`, `2h`; at most a
    /// year).
    #[arg(long, env = "NODE_HOLDER_HOLD_DURATION", default_value = "20m", value_parser = humantime::parse_duration)]
    pub hold_duration: Duration,

    /// Longest a window stays open, counted from when it opened, however many
    /// nodes keep arriving; `0` for no cap (at most a year).
    #[arg(long, env = "NODE_HOLDER_MAX_HOLD", default_value = "2h", value_parser = humantime::parse_duration)]
    pub max_hold: Duration,

    /// One window per value of this node label (`karpenter.sh/nodepool`): a
    /// new node opens and extends only the window of its value, which holds
    /// only the nodes with that value; nodes without the label share one
    /// more window. A manual hold holds them all.
    /// Unset: one window for every node.
    #[arg(long, env = "NODE_HOLDER_WINDOW_PER_LABEL", value_parser = parse_label_key)]
    pub window_per_label: Option<String>,

    /// With `--window-per-label`: a hold of its own for the nodes of some
    /// groups, as `VALUE=DURATION` (`gpu=45m,batch=5m`); the other groups
    /// hold for `--hold-duration`.
    #[arg(
        long,
        env = "NODE_HOLDER_GROUP_HOLD_DURATIONS",
        value_delimiter = ',',
        value_parser = parse_group_hold,
        requires = "window_per_label"
    )]
    pub group_hold_duration: Vec<(String, Duration)>,

    /// What a launch costs beyond its node-seconds (boot, image pulls,
    /// warm-up), as node-time (`5m`: a launch costs as much as five minutes
    /// of one idle node). Set, node-holder reads the cluster's CronJobs and
    /// their Jobs' pods: a node running a CronJob's pod is held while it
    /// runs, an idle one only when a run due within this time will use it
    /// (until the run starts), and such nodes open no window; other work
    /// keeps the window. `0`: off.
    #[arg(long, env = "NODE_HOLDER_LAUNCH_COST", default_value = "0s", value_parser = humantime::parse_duration)]
    pub launch_cost: Duration,

    /// With `--launch-cost`: this long before a scheduled run whose nodes
    /// were let go (its gap is longer than the launch cost), node-holder
    /// asks the autoscaler for the nodes the run will need, with placeholder
    /// pods shaped like the run's at a negative priority that any real pod
    /// preempts; they go just before the run starts. Set it to the pool's
    /// launch time plus a margin. `0`: off.
    #[arg(long, env = "NODE_HOLDER_WARM_BEFORE_RUNS", default_value = "0s", value_parser = humantime::parse_duration)]
    pub warm_before_runs: Duration,
}

/// `VALUE=DURATION`, as `--group-hold-duration` takes it: a label value
/// (`''` for the unlabelled group) and a hold of more than nothing, at most
/// a year.
fn parse_group_hold(text: &str) -> Result<(String, Duration), String> {
    let (group, hold) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected VALUE=DURATION (`gpu=45m`)"))?;
    let group = match group {
        "" | "''" | "\"\"" => String::new(),
        value => parse_label_value(value)?,
    };
    let hold = humantime::parse_duration(hold).map_err(|e| format!("{hold:?}: {e}"))?;
    if hold.is_zero() || hold > LONGEST_HOLD {
        return Err(format!(
            "{text:?}: a group's hold lasts longer than 0 and at most {}",
            humantime::format_duration(LONGEST_HOLD)
        ));
    }
    Ok((group, hold))
}

/// Which cluster a command run by hand talks to, chosen as kubectl chooses
/// it (so `kubectl node-holder` honours kubectl's flags).
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// Path of the kubeconfig to use (kubectl's `--kubeconfig`); else
    /// `KUBECONFIG`, `~/.kube/config` or the in-cluster ServiceAccount.
    #[arg(long, env = "NODE_HOLDER_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// The kubeconfig context to use (kubectl's `--context`); else its
    /// current context.
    #[arg(long, env = "NODE_HOLDER_CONTEXT")]
    pub context: Option<String>,
}

/// Where node-holder keeps its Lease and its window record.
#[derive(Debug, Clone, Args)]
pub struct RecordArgs {
    /// Namespace of node-holder's Lease and window record (its release namespace).
    #[arg(
        short,
        long,
        env = "NODE_HOLDER_NAMESPACE",
        default_value = "node-holder"
    )]
    pub namespace: String,
}

/// Leader election among the replicas. Each replica is named in the Lease by
/// its host name (`HOSTNAME`, which in a pod is the pod's name; see
/// `controller::default_identity`).
#[derive(Debug, Clone, Args)]
pub struct LeaderArgs {
    /// How long a leader's Lease lasts without renewal: a standby takes over
    /// at most this long after the leader died (whole seconds, at least 2s).
    #[arg(long, env = "NODE_HOLDER_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    pub lease_duration: Duration,
}

/// Bounds of the bulk node patching of the window task.
#[derive(Debug, Clone, Args)]
pub struct PatchingArgs {
    /// Node PATCH requests per second at most, 16 in flight: holding or
    /// releasing N nodes by annotation takes N / this (200 s for 50,000 nodes
    /// at 250).
    #[arg(long, env = "NODE_HOLDER_API_QPS", default_value_t = 250)]
    pub api_qps: u32,
}

/// How `status` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// A readable summary and table.
    Text,
    /// One JSON document.
    Json,
    /// The same document as YAML.
    Yaml,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub client: ClientArgs,

    #[command(flatten)]
    pub record: RecordArgs,

    /// Output format.
    #[arg(short, long, env = "NODE_HOLDER_OUTPUT", value_enum, default_value_t = Output::Text)]
    pub output: Output,

    /// Nodes the held-node table shows (the rest are counted); 0 for all.
    #[arg(long, env = "NODE_HOLDER_STATUS_LIMIT", default_value_t = 50)]
    pub limit: usize,

    /// Say that node-holder's holds are orphaned (an `Orphaned:` line, and
    /// `orphaned` in JSON) when nodes or NodePools carry them and no leader
    /// has been live for this long: nothing will release them. With a live
    /// leader, held nodes whose `node-holder.dev/held-until` passed longer
    /// ago than this are overdue (an `Overdue:` line, `overdue` in JSON):
    /// the leader is not keeping its holds.
    #[arg(long, env = "NODE_HOLDER_ORPHANED_AFTER", default_value = "5m", value_parser = humantime::parse_duration)]
    pub orphaned_after: Duration,
}

/// What `release` and `hold` need: the cluster, the record, and what to run
/// the leader's pass with when no leader runs.
#[derive(Debug, Args)]
pub struct RequestArgs {
    #[command(flatten)]
    pub client: ClientArgs,

    #[command(flatten)]
    pub record: RecordArgs,
}

/// What `serve` runs with when no flag is given: what a command run by hand
/// acts with when no leader has recorded its settings.
pub fn serve_defaults() -> anyhow::Result<ServeArgs> {
    let command = ServeArgs::augment_args(clap::Command::new("serve"));
    let matches = command
        .try_get_matches_from(["serve"])
        .map_err(|e| anyhow::anyhow!("serve's defaults: {e}"))?;
    ServeArgs::from_arg_matches(&matches).map_err(|e| anyhow::anyhow!("serve's defaults: {e}"))
}

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    #[command(flatten)]
    pub request: RequestArgs,

    /// With `--window-per-label`: close only the window of the nodes with
    /// this label value (`''`: the nodes without the label); a manual hold
    /// stays. Unset: close every window and end the manual hold.
    #[arg(long, env = "NODE_HOLDER_RELEASE_GROUP", value_parser = parse_label_value)]
    pub group: Option<String>,

    /// How long to wait for a running leader to finish the release.
    #[arg(long, env = "NODE_HOLDER_RELEASE_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub client: ClientArgs,

    #[command(flatten)]
    pub record: RecordArgs,

    /// The node.
    pub node: String,

    /// Output format.
    #[arg(short, long, env = "NODE_HOLDER_OUTPUT", value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct UninstallArgs {
    #[command(flatten)]
    pub request: RequestArgs,

    /// node-holder's Deployment in --namespace: scaled to 0 first, so that no
    /// replica holds a node again once the holds are off.
    #[arg(long, env = "NODE_HOLDER_UNINSTALL_DEPLOYMENT")]
    pub deployment: Option<String>,

    /// node-holder's MutatingWebhookConfiguration: deleted first, so that no
    /// new node is held at its CREATE.
    #[arg(long, env = "NODE_HOLDER_UNINSTALL_WEBHOOK_CONFIGURATION")]
    pub webhook_configuration: Option<String>,

    /// node-holder's MutatingAdmissionPolicy and its binding (policy mode,
    /// both of this name): deleted first, as the webhook configuration.
    #[arg(long, env = "NODE_HOLDER_UNINSTALL_ADMISSION_POLICY")]
    pub admission_policy: Option<String>,

    /// How long to wait for the replicas to give up the Lease, and for the
    /// release.
    #[arg(long, env = "NODE_HOLDER_UNINSTALL_TIMEOUT", default_value = "3m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

#[derive(Debug, Args)]
pub struct HoldArgs {
    #[command(flatten)]
    pub request: RequestArgs,

    /// How long to hold, from now (`45m`, `2h`); at most a year. A manual hold
    /// always ends; `--max-hold` does not cut it.
    #[arg(long = "for", env = "NODE_HOLDER_HOLD_FOR", value_parser = parse_manual_hold)]
    pub hold_for: Duration,

    /// Why, for `status`, the Event and the log ("payments rollout").
    #[arg(long, env = "NODE_HOLDER_HOLD_REASON", value_parser = parse_reason)]
    pub reason: String,

    /// How long to wait for a running leader to put the hold on every node.
    #[arg(long, env = "NODE_HOLDER_HOLD_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// A label key, as `--window-per-label` takes it.
fn parse_label_key(text: &str) -> Result<String, String> {
    if is_qualified_name(text) {
        Ok(text.to_string())
    } else {
        Err("not a label key: an optional DNS-subdomain prefix and `/`, then at most 63 letters, digits, `-`, `_` or `.`, beginning and ending with a letter or digit".to_string())
    }
}

/// A label value, as `release --group` takes it.
fn parse_label_value(text: &str) -> Result<String, String> {
    if is_label_value(text) {
        Ok(text.to_string())
    } else {
        Err("not a label value: at most 63 letters, digits, `-`, `_` or `.`, beginning and ending with a letter or digit (`''` for the nodes without the label)".to_string())
    }
}

/// A manual hold's length: more than nothing, at most a year.
fn parse_manual_hold(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if duration.is_zero() {
        return Err("a manual hold must last longer than 0s (`release` ends one)".to_string());
    }
    if duration > LONGEST_HOLD {
        return Err(format!(
            "at most {} (a manual hold always ends; hold again to extend it)",
            humantime::format_duration(LONGEST_HOLD)
        ));
    }
    Ok(duration)
}

/// The longest `--hold-duration`, `--max-hold` and manual hold: a year
/// (365.25 days, as humantime counts one). Longer ones would only push
/// deadlines towards the end of time (where they saturate).
pub const LONGEST_HOLD: Duration = Duration::from_secs(31_557_600);

/// A reason someone can read: not blank, one line, at most 256 characters.
fn parse_reason(text: &str) -> Result<String, String> {
    let reason = text.trim();
    if reason.is_empty() {
        return Err("say why (`--reason \"payments rollout\"`)".to_string());
    }
    if reason.contains(['\n', '\r']) || reason.chars().count() > 256 {
        return Err("one line of at most 256 characters".to_string());
    }
    Ok(reason.to_string())
}

#[derive(Debug, Args)]
pub struct CertsArgs {
    /// Directory to write ca.crt, ca.key, tls.crt and tls.key into (created if
    /// missing); existing certificates are not replaced without --renew or
    /// --force.
    #[arg(long, env = "NODE_HOLDER_CERTS_OUT_DIR", default_value = "certs/dev")]
    pub out_dir: PathBuf,

    /// DNS name the serving certificate is valid for, besides localhost and
    /// 127.0.0.1; repeat for several (the webhook Service's names).
    #[arg(
        long = "dns-name",
        env = "NODE_HOLDER_CERTS_DNS_NAMES",
        value_delimiter = ',',
        default_value = "node-holder.node-holder.svc"
    )]
    pub dns_names: Vec<String>,

    /// How long the certificates are valid (`90d`, `8760h`).
    #[arg(long, env = "NODE_HOLDER_CERTS_VALIDITY", default_value = "365d", value_parser = humantime::parse_duration)]
    pub validity: Duration,

    /// Issue a new serving certificate (tls.crt, tls.key) from the CA already
    /// in the directory (ca.crt, ca.key); registered caBundles keep matching.
    #[arg(long, env = "NODE_HOLDER_CERTS_RENEW", conflicts_with = "force")]
    pub renew: bool,

    /// Replace certificates already in the directory with a new CA; every
    /// caBundle registered for the old CA stops matching.
    #[arg(long, env = "NODE_HOLDER_CERTS_FORCE")]
    pub force: bool,
}

/// `docs/configuration.md`: every flag of every subcommand with its
/// environment variable and default, generated from the definitions above
/// (a test keeps the file in step).
pub fn reference_markdown() -> String {
    use clap::CommandFactory;
    let cli = Cli::command();
    let mut out = String::from(
        "# Configuration reference\n\n\
         Generated from node-holder's command-line definitions (`src/cli.rs`);\n\
         `NODE_HOLDER_UPDATE_DOCS=1 cargo test --test cli` rewrites it.\n\
         Every flag also reads the environment variable beside it; a flag given\n\
         on the command line wins. Durations take units: `90s`, `20m`, `2h`.\n",
    );
    out.push_str("\n## Every subcommand\n\n");
    table(&mut out, cli.get_arguments().filter(|a| a.is_global_set()));
    for sub in cli.get_subcommands() {
        out.push_str(&format!("\n## `node-holder {}`\n\n", sub.get_name()));
        if let Some(about) = sub.get_about() {
            out.push_str(&format!("{about}\n\n"));
        }
        table(&mut out, sub.get_arguments().filter(|a| !a.is_global_set()));
    }
    out
}

fn table<'a>(out: &mut String, args: impl Iterator<Item = &'a clap::Arg>) {
    let rows: Vec<String> = args
        .filter(|arg| !matches!(arg.get_id().as_str(), "help" | "version"))
        .map(|arg| {
            let flag = match (arg.get_long(), arg.get_short()) {
                (Some(long), Some(short)) => format!("`-{short}`, `--{long}`"),
                (Some(long), None) => format!("`--{long}`"),
                _ => format!("`{}`", arg.get_id()),
            };
            let env = arg
                .get_env()
                .map_or(String::new(), |e| format!("`{}`", e.to_string_lossy()));
            let default = arg
                .get_default_values()
                .iter()
                .map(|v| format!("`{}`", v.to_string_lossy()))
                .collect::<Vec<_>>()
                .join(", ");
            let default = if default.is_empty() || default == "``" {
                "—".to_string()
            } else {
                default
            };
            let mut help = arg
                .get_long_help()
                .or(arg.get_help())
                .map(|h| h.to_string().replace('\n', " "))
                .unwrap_or_default();
            let values: Vec<String> = arg
                .get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| format!("`{}`", v.get_name()))
                .collect();
            if !help.is_empty() && !help.ends_with('.') {
                help.push('.');
            }
            if !values.is_empty() {
                help.push_str(&format!(" One of {}.", values.join(", ")));
            }
            format!("| {flag} | {env} | {default} | {help} |")
        })
        .collect();
    if rows.is_empty() {
        out.push_str("No flags of its own.\n");
        return;
    }
    out.push_str("| flag | environment | default | meaning |\n| --- | --- | --- | --- |\n");
    for row in rows {
        out.push_str(&row);
        out.push('\n');
    }
}

impl HoldingArgs {
    /// The NodePools held by budget (`--hold-mechanism budget`), or an
    /// error naming the flag; `None` for the annotation mechanism.
    pub fn pools(&self) -> anyhow::Result<Option<NodeScope>> {
        self.hold_mechanism
            .pools(&self.nodepool_selector)
            .map_err(|e| anyhow::anyhow!("--nodepool-selector: {e}"))
    }

    /// The admission policy the flags describe, or an error naming the flag.
    pub fn holding(&self) -> anyhow::Result<Holding> {
        Ok(Holding {
            holds: Holds::new(&self.hold_preset, &self.hold_annotation)
                .map_err(|e| anyhow::anyhow!("--hold-annotation: {e}"))?,
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
            groups: Grouping::per_label(self.window_per_label.clone()),
            group_holds: self.group_hold_duration.iter().cloned().collect(),
        }
    }
}

// The core's enums as flag values: their words and help live here, so that
// the pure core does not depend on clap.

impl ValueEnum for Mechanism {
    fn value_variants<'a>() -> &'a [Self] {
        &[Mechanism::Annotation, Mechanism::Budget]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        use clap::builder::PossibleValue;
        Some(match self {
            Mechanism::Annotation => PossibleValue::new("annotation")
                .help("The hold annotation on every node in scope (one PATCH a node)"),
            Mechanism::Budget => PossibleValue::new("budget").help(
                "A budget on every NodePool in scope that stops its consolidation (one PATCH a pool); drift goes on. The webhook still holds each new node until its pool carries the budget",
            ),
        })
    }
}

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
        assert_eq!(defaults.patching.api_qps, 250);
    }

    /// Each core enum's flag word parses back to it and is the word its
    /// `Display` and the record (serde) use.
    #[test]
    fn the_core_enums_flag_words_round_trip() {
        for mechanism in Mechanism::value_variants() {
            let word = mechanism
                .to_possible_value()
                .unwrap()
                .get_name()
                .to_string();
            assert_eq!(word, mechanism.to_string());
            assert_eq!(Mechanism::from_str(&word, false), Ok(*mechanism));
        }
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
