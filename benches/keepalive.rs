//! The per-node keep-alive in a model, beside the real runs it is checked
//! against: `cargo bench --bench keepalive` (a second; no cluster).
//!
//! For each day of the churn bench over many seeds, the model
//! (`testsupport::frontier::model`) prices a keep-alive policy on the day's
//! demand levels: Karpenter's `consolidateAfter` at the churn bench's knobs,
//! the ski-rental hold (the launch cost itself), node-holder's learned hold
//! (fed every level gap once it has ended, which it does not see in a
//! cluster: it sees its group's pod events) with its default fallback and
//! with the launch cost as its fallback, the best fixed knob in hindsight,
//! and the best knob in hindsight of another day of the same kind used on
//! this one. Each as a ratio to the day's clairvoyant optimum as the churn
//! bench prices it (with Karpenter's fastest release, 15 s, where the model's
//! policies pay the reaction below: a reaction under 15 s can price a policy
//! below the optimum).
//!
//! `NODE_HOLDER_BENCH_TRACES=DIR` (the churn bench's raw traces) adds the
//! model's check: for every `ka-*` and `ni-*` arm a trace played, the
//! measured total ÷ optimum beside the model's for the same day, seed and
//! knob. Environment: `NODE_HOLDER_MODEL_SEEDS` (default 20),
//! `NODE_HOLDER_MODEL_REACTION` (seconds from a hold's end to the node
//! gone; default 25: Karpenter's 10 s poll and 15 s validation).

use testsupport as common;

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use node_holder::core::learned::{KEPT_GAPS, LearnedHold};

use common::frontier::LAUNCH_COSTS;
use common::frontier::model::{Gap, Levels};
use common::frontier::sweep::{self, Policy};

fn main() -> Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let seeds: u64 = env_or("NODE_HOLDER_MODEL_SEEDS", 20)?;
    let reaction: f64 = env_or("NODE_HOLDER_MODEL_REACTION", 25.0)?;
    for launch in LAUNCH_COSTS {
        sweep::sweep(seeds, reaction, launch, policies)?;
    }
    if let Ok(dir) = std::env::var("NODE_HOLDER_BENCH_TRACES") {
        sweep::check(Path::new(&dir), reaction)?;
    }
    Ok(())
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    match std::env::var(name) {
        Ok(v) => v.parse().with_context(|| format!("{name}={v}")),
        Err(_) => Ok(default),
    }
}

/// node-holder's learned hold in `node` scope at `launch` (its default
/// floor and ceiling), `fallback` until it has seen enough gaps. It learns
/// what `NodeGaps` tells it (see [`sweep::known_gaps`]) of `gaps`.
fn learned(launch: f64, fallback: f64, gaps: Vec<Gap>) -> impl Fn(&Gap, &[Gap]) -> f64 + 'static {
    let terms = LearnedHold {
        launch_cost: Duration::from_secs_f64(launch),
        floor: Duration::from_secs(60),
        ceiling: Duration::from_secs(1800),
        fallback: Duration::from_secs_f64(fallback),
    };
    move |gap: &Gap, _: &[Gap]| {
        let (ceiling, floor) = (terms.ceiling.as_secs_f64(), terms.floor.as_secs_f64());
        let known: Vec<Duration> = sweep::known_gaps(&gaps, gap.start, ceiling, floor, KEPT_GAPS)
            .into_iter()
            .map(Duration::from_secs_f64)
            .collect();
        terms.choose_from(&known).hold.as_secs_f64()
    }
}

/// The policies priced on a day with `levels`, `yesterday` those of another
/// day like it: `consolidateAfter`'s knobs, the ski-rental hold, and the
/// learned hold from nothing or from yesterday's history.
fn policies(launch: f64, levels: &Levels, yesterday: &Levels) -> Vec<Policy> {
    let mut policies = sweep::knob_policies(launch);
    let today = &levels.gaps;
    let after = sweep::after_yesterday(today, &yesterday.gaps);
    for (name, fallback, gaps) in [
        ("learned (fallback 10m)", 600.0, today.clone()),
        ("learned (fallback = launch)", launch, today.clone()),
        ("learned, with yesterday's history", 600.0, after),
    ] {
        policies.push((name.into(), Box::new(learned(launch, fallback, gaps))));
    }
    policies
}
