//! `node-holder hold --for 45m --reason "payments rollout"`: holds every node
//! in scope until then, whatever the window does, asking the leader through
//! the record like `release`; it survives restarts and failover.

use anyhow::{Context, Result};
use jiff::Timestamp;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Api, PostParams};

use crate::cli::HoldArgs;
use crate::core::window::ManualHold;
use crate::request::{self, Request};

/// The `hold` subcommand.
pub async fn run(args: &HoldArgs) -> Result<()> {
    let client = crate::cluster::command_client("hold", &args.request.client).await?;
    let namespace = &args.request.record.namespace;
    let now = Timestamp::now();
    let hold = ManualHold {
        requested_at: now,
        until: now
            .checked_add(args.hold_for)
            .context("--for reaches past the end of time")?,
        by: who_am_i(&client).await,
        reason: args.reason.clone(),
    };
    let requested = |_: &_| {
        println!(
            "manual hold requested by {}: every node in scope held until {} ({})",
            hold.by, hold.until, hold.reason
        )
    };
    let asked = Request::Hold(&hold);
    let handled = request::ask(&client, namespace, asked, args.timeout, requested).await?;
    println!("handled by {} in {:.1?}", handled.leader, handled.took);
    // The manual hold in force now: a longer one asked for before stays.
    let manual = handled.status.manual;
    if let Some(current) = manual.filter(|m| m.requested_at != hold.requested_at) {
        println!(
            "a manual hold asked for earlier lasts longer and stays: until {} by {} ({})",
            current.until, current.by, current.reason
        );
    }
    let held = handled.status.held_nodes.len();
    println!("{held} node(s) carry node-holder's hold");
    Ok(())
}

/// Who the API server knows this command as (a SelfSubjectReview, which any
/// authenticated user may make); `unknown` when it cannot say.
async fn who_am_i(client: &kube::Client) -> String {
    let reviews: Api<SelfSubjectReview> = Api::all(client.clone());
    let (params, review) = (PostParams::default(), SelfSubjectReview::default());
    match reviews.create(&params, &review).await {
        Ok(review) => review.status.and_then(|s| s.user_info?.username),
        Err(err) => {
            eprintln!(
                "warning: could not tell who you are (SelfSubjectReview: {err}); recorded as unknown"
            );
            None
        }
    }
    .unwrap_or_else(|| "unknown".to_string())
}
