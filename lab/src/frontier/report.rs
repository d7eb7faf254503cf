//! The churn bench's report: per day, a table of every arm against the
//! clairvoyant optimum, paired per-seed differences with 95% confidence
//! intervals, the machine's load, and the frontier drawn as an SVG.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::arms::Arm;
use super::days::Day;
use super::trace::{Deployments, Outcome, Trace};
use super::{LAUNCH_COSTS, mean_ci95, optimum_at};

/// Karpenter's defaults, the first arm each is paired against.
const DEFAULT_ARM: &str = "ka-0s";

/// The launch cost the paired differences are priced at: 5 node-minutes.
const DEFAULT_LAUNCH: f64 = 300.0;

/// One day's runs that finished: for each seed, the day and each arm's
/// outcome.
struct DayRuns<'a> {
    name: &'a str,
    runs: Vec<(&'a Day, BTreeMap<String, Outcome>)>,
    load: Vec<f64>,
}

impl DayRuns<'_> {
    /// Over the seeds, `f` of each run's outcome of `arm`.
    fn per_seed(&self, arm: &str, f: impl Fn(&Day, &Outcome) -> f64) -> Vec<f64> {
        self.runs
            .iter()
            .filter_map(|(d, o)| Some(f(d, o.get(arm)?)))
            .collect()
    }

    /// Whether `arm` ran the day on every seed.
    fn played(&self, arm: &str) -> bool {
        self.runs
            .iter()
            .all(|(_, outcomes)| outcomes.contains_key(arm))
    }

    /// The clairvoyant optimum of each seed's day at the default launch cost.
    fn optimum(&self) -> Vec<super::Priced> {
        self.runs
            .iter()
            .map(|(d, _)| optimum_at(d, DEFAULT_LAUNCH))
            .collect()
    }
}

/// Writes `report.md` and the pictures into `out` and prints the report.
pub fn write(out: &Path, arms: &[Arm], results: &[(Day, Result<Trace>)]) -> Result<()> {
    let mut text = String::new();
    for failed in results
        .iter()
        .filter_map(|(d, r)| r.as_ref().err().map(|e| (d, e)))
    {
        writeln!(
            text,
            "- {} seed {} FAILED: {:#}",
            failed.0.name, failed.0.seed, failed.1
        )?;
    }
    for day in by_day(arms, results) {
        // Traces from before an arm was added have none of its pods.
        let arms: Vec<Arm> = arms
            .iter()
            .filter(|arm| day.played(&arm.name))
            .cloned()
            .collect();
        section(&mut text, &arms, &day)?;
        let svg = out.join(format!("frontier-{}.svg", day.name));
        plot(&svg, &arms, &day)?;
        writeln!(text, "\nThe frontier: `{}`\n", svg.display())?;
    }
    std::fs::write(out.join("report.md"), &text)?;
    println!("{text}");
    Ok(())
}

/// The runs that finished, by day. Runs of one seed of a day (the same
/// planned day) played by separate bench runs are one run: each arm's
/// outcome from the run that played it.
fn by_day<'a>(arms: &[Arm], results: &'a [(Day, Result<Trace>)]) -> Vec<DayRuns<'a>> {
    let mut days: Vec<DayRuns<'a>> = Vec::new();
    for (day, trace) in results {
        let Ok(trace) = trace else { continue };
        let outcomes: BTreeMap<String, Outcome> = arms
            .iter()
            .map(|arm| {
                let long_gaps = day.long_gaps(DEFAULT_LAUNCH);
                let deployments = Deployments {
                    created: day.deployment_pods(),
                    alone: day.waves.is_empty(),
                };
                let outcome = Outcome::of(trace, &arm.name, &long_gaps, deployments);
                (arm.name.clone(), outcome)
            })
            .filter(|(_, outcome)| outcome.pods > 0)
            .collect();
        let load = trace.load.iter().map(|l| l.1);
        let Some(found) = days.iter_mut().find(|d| d.name == day.name) else {
            days.push(DayRuns {
                name: day.name,
                runs: vec![(day, outcomes)],
                load: load.collect(),
            });
            continue;
        };
        found.load.extend(load);
        match found.runs.iter_mut().find(|(d, _)| d.seed == day.seed) {
            Some((_, seen)) => {
                for (arm, outcome) in outcomes {
                    seen.entry(arm).or_insert(outcome);
                }
            }
            None => found.runs.push((day, outcomes)),
        }
    }
    days
}

/// Mean ± 95% half-width, as text.
fn ci(samples: &[f64], digits: usize) -> String {
    let (mean, half) = mean_ci95(samples);
    if half.is_nan() {
        format!("{mean:.digits$}")
    } else {
        format!("{mean:.digits$} ± {half:.digits$}")
    }
}

/// The mean of `samples`.
fn mean(samples: &[f64]) -> f64 {
    mean_ci95(samples).0
}

fn section(text: &mut String, arms: &[Arm], day: &DayRuns<'_>) -> Result<()> {
    let seeds: Vec<String> = day.runs.iter().map(|r| r.0.seed.to_string()).collect();
    let (load, _) = mean_ci95(&day.load);
    let peak = day.load.iter().copied().fold(0.0, f64::max);
    writeln!(
        text,
        "\n### The {} day (seeds {}; load average {load:.1}, peak {peak:.1})\n",
        day.name,
        seeds.join(", ")
    )?;
    writeln!(
        text,
        "| arm | launches | node-seconds | pods waited for a launch | pod wait p50 / p95 (s) | \
         wait p95 after a long gap (s) | Job pods interrupted | Deployment pods moved | \
         total / optimum at 1, 5, 15 node-min |"
    )?;
    writeln!(
        text,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    )?;
    for arm in arms {
        arm_row(text, &arm.name, day)?;
    }
    let optimum = day.optimum();
    writeln!(
        text,
        "| clairvoyant (at 5 node-min) | {} | {} | 0 | 0 / 0 | 0 | 0 | 0 | 1 |",
        ci(
            &optimum
                .iter()
                .map(|o| o.launches as f64)
                .collect::<Vec<_>>(),
            1
        ),
        ci(
            &optimum.iter().map(|o| o.node_seconds).collect::<Vec<_>>(),
            0
        ),
    )?;
    paired(text, arms, day)
}

/// One arm's row of the day's table.
fn arm_row(text: &mut String, arm: &str, day: &DayRuns<'_>) -> Result<()> {
    let ratios: Vec<String> = LAUNCH_COSTS
        .iter()
        .map(|&l| {
            let ratio = |d: &Day, o: &Outcome| o.total(l) / optimum_at(d, l).total(l);
            ci(&day.per_seed(arm, ratio), 2)
        })
        .collect();
    writeln!(
        text,
        "| {} | {} | {} | {} | {} / {} | {} | {} | {} | {} |",
        arm,
        ci(&day.per_seed(arm, |_, o| o.launches as f64), 1),
        ci(&day.per_seed(arm, |_, o| o.node_seconds), 0),
        ci(&day.per_seed(arm, |_, o| o.waited_for_launch as f64), 1),
        ci(&day.per_seed(arm, |_, o| o.wait_p50), 1),
        ci(&day.per_seed(arm, |_, o| o.wait_p95), 1),
        ci(&day.per_seed(arm, |_, o| o.long_gap_wait_p95), 1),
        ci(&day.per_seed(arm, |_, o| f64::from(o.interrupted)), 1),
        moved(day, arm),
        ratios.join(" / ")
    )?;
    Ok(())
}

/// The Deployment pods Karpenter moved, over the seeds; `n/a` when a
/// seed's trace did not keep them.
fn moved(day: &DayRuns<'_>, arm: &str) -> String {
    let moved: Option<Vec<f64>> = day
        .runs
        .iter()
        .filter_map(|(_, o)| o.get(arm))
        .map(|o| o.moved.map(|m| m as f64))
        .collect();
    moved.map_or_else(|| "n/a".to_string(), |m| ci(&m, 1))
}

/// Each arm's total cost at the default launch cost against Karpenter's
/// default and against the day's best arm of Karpenter alone (any
/// `consolidateAfter`, either policy), per seed:
/// against those of the two that played (a run of some arms may have
/// neither), once when the default is the best.
fn paired(text: &mut String, arms: &[Arm], day: &DayRuns<'_>) -> Result<()> {
    let total = |arm: &str| day.per_seed(arm, |_, o| o.total(DEFAULT_LAUNCH));
    let best = arms
        .iter()
        .filter(|a| a.hold.is_none())
        .min_by(|a, b| mean(&total(&a.name)).total_cmp(&mean(&total(&b.name))))
        .map(|a| a.name.as_str());
    let mut bases = Vec::new();
    if arms.iter().any(|a| a.name == DEFAULT_ARM) {
        bases.push((
            format!("Karpenter's default (`{DEFAULT_ARM}`)"),
            DEFAULT_ARM,
        ));
    }
    if let Some(best) = best.filter(|&best| best != DEFAULT_ARM) {
        bases.push((
            format!("the day's best Karpenter-alone arm (`{best}`)"),
            best,
        ));
    }
    if bases.is_empty() {
        return Ok(());
    }
    let (said, names): (Vec<String>, Vec<&str>) = bases.into_iter().unzip();
    writeln!(
        text,
        "\nTotal cost at 5 node-minutes a launch, paired per seed, in % (mean ± 95% CI): \
         against {}.\n",
        said.join(" and ")
    )?;
    let columns: Vec<String> = names.iter().map(|n| format!("vs {n}")).collect();
    writeln!(text, "| arm | {} |", columns.join(" | "))?;
    writeln!(text, "|{}", " --- |".repeat(names.len() + 1))?;
    for arm in arms {
        let against = |base: &str| -> String {
            let differences: Vec<f64> = total(&arm.name)
                .iter()
                .zip(total(base))
                .map(|(a, b)| 100.0 * (a - b) / b)
                .collect();
            ci(&differences, 1)
        };
        let cells: Vec<String> = names.iter().map(|base| against(base)).collect();
        writeln!(text, "| {} | {} |", arm.name, cells.join(" | "))?;
    }
    Ok(())
}

/// One arm on the frontier: its name, mean launches and node-seconds, and
/// its colour: red for Karpenter alone, blue for node-holder.
type Point = (String, f64, f64, RGBColor);

/// Each arm's point, its mean over the seeds.
fn points(arms: &[Arm], day: &DayRuns<'_>) -> Vec<Point> {
    arms.iter()
        .map(|a| {
            let launches = mean(&day.per_seed(&a.name, |_, o| o.launches as f64));
            let seconds = mean(&day.per_seed(&a.name, |_, o| o.node_seconds));
            let color = if a.hold.is_some() { BLUE } else { RED };
            (a.name.clone(), launches, seconds, color)
        })
        .collect()
}

/// Launches against node-seconds, one point per arm (its mean over the
/// seeds), the clairvoyant optimum marked.
fn plot(path: &Path, arms: &[Arm], day: &DayRuns<'_>) -> Result<()> {
    let points = points(arms, day);
    let optimum = day.optimum();
    let opt_launches = mean(
        &optimum
            .iter()
            .map(|o| o.launches as f64)
            .collect::<Vec<_>>(),
    );
    let opt_seconds = mean(&optimum.iter().map(|o| o.node_seconds).collect::<Vec<_>>());
    let max_x = points.iter().map(|p| p.1).fold(opt_launches, f64::max) * 1.15 + 1.0;
    let max_y = points.iter().map(|p| p.2).fold(opt_seconds, f64::max) * 1.15 + 1.0;
    let root = SVGBackend::new(path, (820, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("The {} day: launches against node-seconds", day.name),
            ("sans-serif", 20),
        )
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..max_x, 0.0..max_y)?;
    chart
        .configure_mesh()
        .x_desc("NodeClaims launched (mean over seeds)")
        .y_desc("node-seconds")
        .draw()?;
    draw_points(&mut chart, &points, (opt_launches, opt_seconds))?;
    root.present()?;
    Ok(())
}

/// The arms' points with their names, and the optimum's triangle.
fn draw_points(
    chart: &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    points: &[Point],
    optimum: (f64, f64),
) -> Result<()> {
    for (name, x, y, color) in points {
        chart.draw_series([Circle::new((*x, *y), 5, color.filled())])?;
        chart.draw_series([Text::new(
            name.clone(),
            (*x, *y),
            ("sans-serif", 13).into_font(),
        )])?;
    }
    chart.draw_series([TriangleMarker::new(optimum, 8, BLACK.filled())])?;
    chart.draw_series([Text::new(
        "clairvoyant (5 node-min)".to_string(),
        optimum,
        ("sans-serif", 13).into_font(),
    )])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kept traces of the cron day, seed 2: Karpenter's arms, then
    /// node-holder's fixed holds.
    fn kept_traces() -> [(Day, Result<Trace>); 2] {
        [
            kept("cron-seed2-node-gaps.json"),
            kept("cron-seed2-nh.json"),
        ]
    }

    fn kept(name: &str) -> (Day, Result<Trace>) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("results/frontier-traces")
            .join(name);
        let text = std::fs::read_to_string(path).expect("the kept trace");
        let trace: Trace = serde_json::from_str(&text).expect("a trace");
        (Day::generate(&trace.day, trace.seed).unwrap(), Ok(trace))
    }

    fn report(arms: &[&str]) -> String {
        let arms: Vec<Arm> = Arm::all()
            .into_iter()
            .filter(|a| arms.contains(&a.name.as_str()))
            .collect();
        let out = tempfile::tempdir().unwrap();
        write(out.path(), &arms, &kept_traces()).unwrap();
        std::fs::read_to_string(out.path().join("report.md")).unwrap()
    }

    #[test]
    fn arms_are_paired_against_the_default_and_the_best_knob_that_played() {
        let all = report(&["ka-0s", "ka-5m", "nh-5m"]);
        assert!(all.contains("| arm | vs ka-0s | vs ka-5m |"), "{all}");
        let no_default = report(&["ka-5m", "nh-5m"]);
        assert!(no_default.contains("| arm | vs ka-5m |"), "{no_default}");
        assert!(no_default.contains("| nh-5m |"), "{no_default}");
        let default_best = report(&["ka-0s", "ka-10m", "nh-5m"]);
        assert!(
            default_best.contains("| arm | vs ka-0s |\n"),
            "{default_best}"
        );
        let no_knob = report(&["nh-5m", "nh-2m"]);
        assert!(!no_knob.contains("paired per seed"), "{no_knob}");
        assert!(no_knob.contains("| nh-2m |"), "{no_knob}");
    }

    #[test]
    fn runs_of_one_seed_are_one_run_with_the_arms_of_each() {
        let played = ["ka-0s", "kaw-5m", "nh-5m"];
        let arms: Vec<Arm> = Arm::all()
            .into_iter()
            .filter(|a| played.contains(&a.name.as_str()))
            .collect();
        let [karpenter, node_holder] = kept_traces();
        let results = [karpenter, kept("cron-seed2-kaw.json"), node_holder];
        let days = by_day(&arms, &results);
        assert_eq!(days.len(), 1);
        assert_eq!(days[0].runs.len(), 1, "one seed, one run");
        for arm in played {
            assert!(days[0].played(arm), "{arm}");
        }
        let deployments = Deployments {
            created: 12,
            alone: false,
        };
        let first = Outcome::of(results[0].1.as_ref().unwrap(), "ka-0s", &[], deployments);
        let kept = &days[0].runs[0].1["ka-0s"];
        assert_eq!(kept.launches, first.launches, "the first run's ka-0s");
    }
}
