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

/// node-holder's learned hold in `node` scope at `launch` (its default
/// floor and ceiling), `fallback` until it has seen enough gaps. It learns
/// what `NodeGaps` tells it: every level gap of `day` once it has ended (the
/// work came back to the node, or a launch matched it), and one that has
/// not ended within the ceiling as longer than it, after `yesterday`'s
/// (shifted a day back): the history a node-holder that ran the day before
/// keeps in its record.
fn learned(
    launch: f64,
    fallback: f64,
    day: &[Gap],
    yesterday: &[Gap],
) -> impl Fn(&Gap, &[Gap]) -> f64 + 'static {
    let terms = LearnedHold {
        launch_cost: Duration::from_secs_f64(launch),
        floor: Duration::from_secs(60),
        ceiling: Duration::from_secs(1800),
        fallback: Duration::from_secs_f64(fallback),
    };
    let ceiling = terms.ceiling.as_secs_f64();
    let day_back = |g: &Gap| Gap {
        start: g.start - 86_400.0,
        length: g.length.min(86_400.0),
        ..*g
    };
    let gaps: Vec<Gap> = yesterday
        .iter()
        .map(day_back)
        .chain(day.iter().copied())
        .collect();
    move |gap: &Gap, _: &[Gap]| {
        // (when it was known, how long) of every gap known by now.
        let mut known: Vec<(f64, f64)> = gaps
            .iter()
            .filter_map(|g| {
                if g.start + g.length <= gap.start {
                    Some((g.start + g.length, g.length))
                } else {
                    let waited = gap.start - g.start;
                    (waited > ceiling).then_some((g.start + ceiling, waited))
                }
            })
            .filter(|&(_, length)| length >= terms.floor.as_secs_f64())
            .collect();
        known.sort_by(|a, b| a.0.total_cmp(&b.0));
        let last: Vec<Duration> = known[known.len().saturating_sub(KEPT_GAPS)..]
            .iter()
            .map(|&(_, length)| Duration::from_secs_f64(length))
            .collect();
        terms.choose_from(&last).hold.as_secs_f64()
    }
}

/// The policies priced on a day with `levels`, `yesterday` those of another
/// day like it.
fn policies(launch: f64, levels: &Levels, yesterday: &Levels) -> Vec<Policy> {
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
    let today = &levels.gaps;
    for (name, fallback, before) in [
        ("learned (fallback 10m)", 600.0, &[][..]),
        ("learned (fallback = launch)", launch, &[][..]),
        (
            "learned, with yesterday's history",
            600.0,
            &yesterday.gaps[..],
        ),
    ] {
        policies.push((
            name.into(),
            Box::new(learned(launch, fallback, today, before)),
        ));
    }
    policies
}

/// Total ÷ optimum of each policy, and of the best fixed knob in hindsight,
/// averaged over the seeds of each day.
fn sweep(seeds: u64, reaction: f64, launch: f64) -> Result<()> {
    println!("\n## Model, launch = {launch} s, reaction = {reaction} s, seeds 1-{seeds}\n");
    let mut header = "| policy |".to_string();
    for day in DAYS {
        header.push_str(&format!(" {day} |"));
    }
    println!("{header}\n|---|---|---|---|---|");
    let mut rows: Vec<(String, Vec<f64>)> = Vec::new();
    for day_name in DAYS {
        let mut sums: Vec<(String, f64)> = Vec::new();
        for seed in 1..=seeds {
            let day = Day::generate(day_name, seed)?;
            let (levels, costs, best) = priced_day(&day, reaction, launch);
            // Another day like it (seed + 1000): yesterday.
            let other = Day::generate(day_name, seed + 1000)?;
            let (other_levels, other_costs, _) = priced_day(&other, reaction, launch);
            let mut ratios: Vec<(String, f64)> = policies(launch, &levels, &other_levels)
                .iter()
                .map(|(name, policy)| {
                    let priced = model::keep_alive(&levels, costs, |gap, seen| policy(gap, seen));
                    (name.clone(), priced.total(launch) / best)
                })
                .collect();
            let (hindsight, _) = best_knob(&levels, costs, launch);
            ratios.push(("best fixed knob in hindsight".into(), hindsight / best));
            // What the best knob of yesterday costs today.
            let (_, knob) = best_knob(&other_levels, other_costs, launch);
            let priced = model::keep_alive(&levels, costs, |_, _| knob);
            ratios.push((
                "the best knob of another day like it".into(),
                priced.total(launch) / best,
            ));
            if sums.is_empty() {
                sums = ratios.iter().map(|(name, _)| (name.clone(), 0.0)).collect();
            }
            for (sum, (_, ratio)) in sums.iter_mut().zip(ratios) {
                sum.1 += ratio;
            }
        }
        if rows.is_empty() {
            rows = sums
                .iter()
                .map(|(name, _)| (name.clone(), Vec::new()))
                .collect();
        }
        for (row, (_, sum)) in rows.iter_mut().zip(sums) {
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
