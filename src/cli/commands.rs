//! The flags of the commands run by hand: `status`, `release`,
//! `hold`, `uninstall` and `self-check`.

use std::time::Duration;

use clap::Args;

use super::{ClientArgs, HoldKeysArgs, Output, RecordArgs, parse_manual_hold, parse_reason};

/// `self-check` (`crate::selfcheck`).
#[derive(Debug, Args)]
pub struct SelfCheckArgs {
    #[command(flatten)]
    pub client: ClientArgs,

    #[command(flatten)]
    pub record: RecordArgs,

    #[command(flatten)]
    pub holds: HoldKeysArgs,

    /// Labels of the test Node, as key=value, so that it falls inside
    /// --node-selector and the webhook's objectSelector; repeat or comma-separate.
    #[arg(
        long,
        env = "NODE_HOLDER_SELF_CHECK_NODE_LABELS",
        value_delimiter = ','
    )]
    pub node_label: Vec<String>,

    /// How long the checks may take together, each tried again every 2 s while it fails.
    #[arg(long, env = "NODE_HOLDER_SELF_CHECK_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
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

    /// Say that node-holder's holds are orphaned (an `Orphaned:` line, `orphaned` in JSON) when
    /// nodes carry them and no leader has been live for this long: nothing will release them. With
    /// a live leader, held nodes whose `node-holder.dev/held-until` passed longer ago are overdue
    /// (`Overdue:`, `overdue`): the leader is not keeping its holds.
    #[arg(long, env = "NODE_HOLDER_ORPHANED_AFTER", default_value = "5m", value_parser = humantime::parse_duration)]
    pub orphaned_after: Duration,
}

/// What `release`, `hold` and `uninstall` need: the cluster and the record.
#[derive(Debug, Args)]
pub struct RequestArgs {
    #[command(flatten)]
    pub client: ClientArgs,

    #[command(flatten)]
    pub record: RecordArgs,
}

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    #[command(flatten)]
    pub request: RequestArgs,

    /// How long to wait for the leader to finish the release.
    #[arg(long, env = "NODE_HOLDER_RELEASE_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
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

    /// How long to wait for the replicas to give up the Lease, and for the release.
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

    /// How long to wait for the leader to put the hold on every node.
    #[arg(long, env = "NODE_HOLDER_HOLD_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}
