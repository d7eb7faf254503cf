//! The keep-alive model's sweep (`benches/keepalive.rs`): every policy over
//! many seeds of each day, as a ratio to the day's clairvoyant optimum, and
//! the model set beside the real runs' traces. The policies are the
//! bench's to give (node-holder's learned hold is node-holder's code); the
//! knobs of `consolidateAfter`, the gaps a learner knows, and the tables are
//! here.

use std::path::Path;

use anyhow::{Context, Result};

use super::days::Day;
use super::model::{self, Gap, Levels};
use super::trace::{Outcome, Trace};
use super::{BOOT, Costs, optimum_at};

/// The days swept.
pub const DAYS: [&str; 4] = ["compressed", "cron", "poisson", "working"];
/// The churn bench's `consolidateAfter` knobs.
pub const KNOBS: [f64; 6] = [0.0, 30.0, 60.0, 120.0, 300.0, 600.0];

/// One policy: its name and the hold it picks for a gap from the gaps seen.
pub type Policy = (String, Box<dyn Fn(&Gap, &[Gap]) -> f64>);

/// `consolidateAfter` at each of [`KNOBS`], and the ski-rental hold (the
/// launch cost itself).
pub fn knob_policies(launch: f64) -> Vec<Policy> {
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
    policies
}

/// What a learner that matches launches to the nodes it let go knows at
/// `now` of `gaps` (in any order): each gap that has ended, and each that
/// has not ended within `ceiling` as as long as it has lasted; those at
/// least `floor`, in the order they became known, the last `kept` of them.
pub fn known_gaps(gaps: &[Gap], now: f64, ceiling: f64, floor: f64, kept: usize) -> Vec<f64> {
    let mut known: Vec<(f64, f64)> = gaps
        .iter()
        .filter_map(|g| {
            if g.start + g.length <= now {
                Some((g.start + g.length, g.length))
            } else {
                let waited = now - g.start;
                (waited > ceiling).then_some((g.start + ceiling, waited))
            }
        })
        .filter(|&(_, length)| length >= floor)
        .collect();
    known.sort_by(|a, b| a.0.total_cmp(&b.0));
    known[known.len().saturating_sub(kept)..]
        .iter()
        .map(|&(_, length)| length)
        .collect()
}

/// `yesterday`'s gaps a day earlier, then `today`'s: the history a learner
/// that ran the day before starts with.
pub fn after_yesterday(today: &[Gap], yesterday: &[Gap]) -> Vec<Gap> {
    let day_back = |g: &Gap| Gap {
        start: g.start - 86_400.0,
        length: g.length.min(86_400.0),
        ..*g
    };
    yesterday
        .iter()
        .map(day_back)
        .chain(today.iter().copied())
        .collect()
}

/// Prints the total ÷ optimum of each of `policies` (given the launch cost,
/// the day's levels and another day's like it), of the best fixed knob in
/// hindsight and of the best knob of another day, averaged over the seeds
/// of each day.
pub fn sweep(
    seeds: u64,
    reaction: f64,
    launch: f64,
    policies: impl Fn(f64, &Levels, &Levels) -> Vec<Policy>,
) -> Result<()> {
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
pub fn check(dir: &Path, reaction: f64) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn gap(start: f64, length: f64) -> Gap {
        Gap {
            level: 1,
            start,
            length,
        }
    }

    #[test]
    fn a_learner_knows_ended_gaps_and_those_past_the_ceiling_in_the_order_it_learned_them() {
        let gaps = [
            gap(0.0, 100.0),
            gap(10.0, f64::INFINITY),
            gap(50.0, 30.0),
            gap(60.0, 10.0),
            gap(300.0, 5.0),
        ];
        // At 250: the gaps ended by then (80, then 100), the open one past
        // the 200 s ceiling as long as it has lasted (known at 210); the
        // 10 s one is under the floor; the last has not started.
        assert_eq!(
            known_gaps(&gaps, 250.0, 200.0, 20.0, 10),
            [30.0, 100.0, 240.0]
        );
        assert_eq!(known_gaps(&gaps, 250.0, 200.0, 20.0, 2), [100.0, 240.0]);
        assert_eq!(known_gaps(&gaps, 150.0, 200.0, 20.0, 10), [30.0, 100.0]);
    }

    #[test]
    fn yesterdays_gaps_come_first_a_day_earlier() {
        let today = [gap(10.0, 5.0)];
        let yesterday = [gap(20.0, f64::INFINITY)];
        let all = after_yesterday(&today, &yesterday);
        assert_eq!(all, [gap(20.0 - 86_400.0, 86_400.0), gap(10.0, 5.0)]);
    }
}
