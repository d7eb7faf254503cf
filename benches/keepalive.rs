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
use node_holder::core::learned::LearnedHold;

use common::frontier::days::Day;
use common::frontier::model::{self, Gap, Levels};
use common::frontier::trace::{Outcome, Trace};
use common::frontier::{BOOT, Costs, optimum_at};

const DAYS: [&str; 4] = ["compressed", "cron", "poisson", "working"];
/// The launch costs priced, in node-seconds: 1, 5 and 15 node-minutes.
const LAUNCHES: [f64; 3] = [60.0, 300.0, 900.0];
/// The churn bench's `consolidateAfter` knobs.
const KNOBS: [f64; 6] = [0.0, 30.0, 60.0, 120.0, 300.0, 600.0];

fn main() -> Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let seeds: u64 = env_or("NODE_HOLDER_MODEL_SEEDS", 20)?;
    let reaction: f64 = env_or("NODE_HOLDER_MODEL_REACTION", 25.0)?;
    for launch in LAUNCHES {
        sweep(seeds, reaction, launch)?;
    }
    if let Ok(dir) = std::env::var("NODE_HOLDER_BENCH_TRACES") {
        check(Path::new(&dir), reaction)?;
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

/// One policy: its name and the hold it picks from the gaps seen.
type Policy = (String, Box<dyn Fn(&Gap, &[Gap]) -> f64>);

/// node-holder's learned hold at `launch`, `fallback` until it has seen
/// enough gaps, fed the gaps as `History` keeps them (at least the floor,
/// the last 20).
fn learned(launch: f64, fallback: f64) -> impl Fn(&Gap, &[Gap]) -> f64 {
    let terms = LearnedHold {
        launch_cost: Duration::from_secs_f64(launch),
        floor: Duration::from_secs(60),
        ceiling: Duration::from_secs(1800),
        fallback: Duration::from_secs_f64(fallback),
    };
    move |_: &Gap, seen: &[Gap]| {
        let kept: Vec<Duration> = seen
            .iter()
            .filter(|g| g.length >= terms.floor.as_secs_f64())
            .map(|g| Duration::from_secs_f64(g.length))
            .collect();
        let last = &kept[kept
            .len()
            .saturating_sub(node_holder::core::learned::KEPT_GAPS)..];
        terms.choose_from(last).hold.as_secs_f64()
    }
}

fn policies(launch: f64) -> Vec<Policy> {
    let mut policies: Vec<Policy> = KNOBS
        .iter()
        .map(|&h| {
            (
                format!("ka-{h}s"),
                Box::new(move |_: &Gap, _: &[Gap]| h) as _,
            )
        })
        .collect();
    policies.push((
        format!("ski-rental {launch}s"),
        Box::new(move |_: &Gap, _: &[Gap]| launch),
    ));
    policies.push((
        "learned (fallback 10m)".into(),
        Box::new(learned(launch, 600.0)),
    ));
    policies.push((
        "learned (fallback = launch)".into(),
        Box::new(learned(launch, launch)),
    ));
    policies
}

/// Total ÷ optimum of each policy, and of the best fixed knob in hindsight,
/// averaged over the seeds of each day.
fn sweep(seeds: u64, reaction: f64, launch: f64) -> Result<()> {
    let policies = policies(launch);
    println!("\n## Model, launch = {launch} s, reaction = {reaction} s, seeds 1-{seeds}\n");
    let mut header = "| policy |".to_string();
    for day in DAYS {
        header.push_str(&format!(" {day} |"));
    }
    println!("{header}\n|---|---|---|---|---|");
    let mut rows: Vec<(String, Vec<f64>)> = policies
        .iter()
        .map(|(name, _)| (name.clone(), Vec::new()))
        .collect();
    rows.push(("best fixed knob in hindsight".into(), Vec::new()));
    rows.push(("the best knob of another day like it".into(), Vec::new()));
    for day_name in DAYS {
        let mut sums = vec![0.0; rows.len()];
        for seed in 1..=seeds {
            let day = Day::generate(day_name, seed)?;
            let (levels, costs, best) = priced_day(&day, reaction, launch);
            for (i, (_, policy)) in policies.iter().enumerate() {
                let priced = model::keep_alive(&levels, costs, |gap, seen| policy(gap, seen));
                sums[i] += priced.total(launch) / best;
            }
            let (hindsight, _) = best_knob(&levels, costs, launch);
            sums[policies.len()] += hindsight / best;
            // Learned on another day like it (seed + 1000): what a hold
            // learned over yesterday's gaps would be today.
            let other = Day::generate(day_name, seed + 1000)?;
            let (other_levels, other_costs, _) = priced_day(&other, reaction, launch);
            let (_, knob) = best_knob(&other_levels, other_costs, launch);
            let priced = model::keep_alive(&levels, costs, |_, _| knob);
            sums[policies.len() + 1] += priced.total(launch) / best;
        }
        for (row, sum) in rows.iter_mut().zip(sums) {
            row.1.push(sum / seeds as f64);
        }
    }
    for (name, ratios) in rows {
        let cells: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        println!("| {name} | {} |", cells.join(" | "));
    }
    Ok(())
}

/// The fixed knob (in steps of 15 s up to 30 minutes) that costs least on
/// the day, and its total.
fn best_knob(levels: &Levels, costs: Costs, launch: f64) -> (f64, f64) {
    (0..=120)
        .map(|k| {
            let h = f64::from(k) * 15.0;
            (model::keep_alive(levels, costs, |_, _| h).total(launch), h)
        })
        .fold((f64::INFINITY, 0.0), |a, b| if b.0 < a.0 { b } else { a })
}

/// The day's levels, the model's costs and the clairvoyant optimum's total.
fn priced_day(day: &Day, reaction: f64, launch: f64) -> (Levels, Costs, f64) {
    let levels = model::levels(&day.demand());
    let costs = Costs {
        launch,
        boot: BOOT.as_secs_f64(),
        release: reaction,
    };
    (levels, costs, optimum_at(day, launch).total(launch))
}

/// The model against the real runs: every `ka-*` and `ni-*` arm of the
/// traces in `dir`, at 5 node-minutes a launch.
fn check(dir: &Path, reaction: f64) -> Result<()> {
    let launch = 300.0;
    println!("\n## Model against the real runs (launch = {launch} s)\n");
    println!("| day | seed | arm | measured | model |\n|---|---|---|---|---|");
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| dir.display().to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    for path in paths {
        let trace: Trace = serde_json::from_str(&std::fs::read_to_string(&path)?)
            .with_context(|| path.display().to_string())?;
        let day = Day::generate(&trace.day, trace.seed)?;
        let (levels, costs, best) = priced_day(&day, reaction, launch);
        let mut arms: Vec<&str> = trace.claims.values().map(|c| c.pool.as_str()).collect();
        arms.sort();
        arms.dedup();
        for arm in arms {
            let Some(knob) = knob_seconds(arm) else {
                continue;
            };
            let measured = Outcome::of(&trace, arm).total(launch) / best;
            let modelled = model::keep_alive(&levels, costs, |_, _| knob).total(launch) / best;
            println!(
                "| {} | {} | {arm} | {measured:.2} | {modelled:.2} |",
                trace.day, trace.seed
            );
        }
    }
    Ok(())
}

/// The fixed knob of a `ka-*` or `ni-*` arm, in seconds.
fn knob_seconds(arm: &str) -> Option<f64> {
    let knob = arm
        .strip_prefix("ka-")
        .or_else(|| arm.strip_prefix("ni-"))?;
    let (number, unit) = knob.split_at(knob.len().checked_sub(1)?);
    let n: f64 = number.parse().ok()?;
    match unit {
        "s" => Some(n),
        "m" => Some(n * 60.0),
        _ => None,
    }
}
