//! `== summary ==`: each measure against its target (from the issue), with
//! a verdict.

use std::fmt::Write as _;
use std::time::Duration;

use crate::measure::audit::unique;
use crate::measure::observer::Observe;
use crate::measure::process::mib;

use super::{Phases, Run};

/// How long holding every node, and releasing them all, may take.
const TARGET_DIRECTION: Duration = Duration::from_secs(30);
/// `serve`'s peak RSS, in bytes.
const TARGET_RSS_BYTES: f64 = 40e6;

/// The summary table.
pub fn render(run: &Run) -> String {
    let mut table = Table(String::new());
    let _ = writeln!(
        table.0,
        "== summary: {} nodes, {} cores ({}), held count by {} ==",
        run.nodes,
        run.machine.cores,
        run.machine.cpu_model,
        match run.observe {
            Observe::Watch => "watch",
            Observe::List => "250 ms list",
        }
    );
    let _ = writeln!(
        table.0,
        "{:<52} {:>16}  {:<14} verdict",
        "measure", "value", "target"
    );
    timings(&mut table, run);
    patches(&mut table, run);
    requests(&mut table, run);
    table.0
}

/// Rows of the table.
struct Table(String);

impl Table {
    fn row(&mut self, what: &str, value: String, target: &str, verdict: &str) {
        let _ = writeln!(self.0, "{what:<52} {value:>16}  {target:<14} {verdict}");
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

/// The setup, the hold and the release, and `serve`'s memory.
fn timings(table: &mut Table, run: &Run) {
    let (hold, release) = (run.hold.time, run.release.time);
    table.row(
        &format!(
            "setup: create {} nodes ({} in flight)",
            run.nodes, run.create_in_flight
        ),
        format!("{:.1} s", run.create_secs),
        "-",
        "-",
    );
    table.row(
        &format!("hold: new node create -> all {} held", run.nodes + 1),
        hold.map_or("never".into(), |d| format!("{:.2} s", d.as_secs_f64())),
        "<= 30 s",
        verdict(hold.is_some_and(|d| d <= TARGET_DIRECTION)),
    );
    table.row(
        &format!("release: deadline -> none of {} held", run.release.target),
        release.map_or("never".into(), |s| format!("{s:.2} s")),
        "<= 30 s",
        verdict(release.is_some_and(|s| s <= TARGET_DIRECTION.as_secs_f64())),
    );
    let peak_kb = run.release.end_memory.hwm_kb;
    table.row(
        "serve peak RSS (VmHWM, whole run)",
        format!(
            "{:.1} MiB/{:.1} MB",
            mib(peak_kb),
            peak_kb as f64 * 1024.0 / 1e6
        ),
        "< 40 MB",
        verdict((peak_kb as f64) * 1024.0 < TARGET_RSS_BYTES),
    );
    table.row(
        "serve RSS idle, nodes watched, no window",
        format!("{:.1} MiB", mib(run.start.idle.rss_kb)),
        "-",
        "-",
    );
}

/// node-holder's node PATCHes in each phase and in the probes.
fn patches(table: &mut Table, run: &Run) {
    let phases = run.phases();
    let (hold, hold_unique) = (phases.hold.len(), unique(&phases.hold));
    let (release, release_unique) = (phases.release.len(), unique(&phases.release));
    let (all, released) = (run.nodes + 1, run.release.target);
    table.row(
        "node PATCHes, hold phase (distinct nodes)",
        format!("{hold} ({hold_unique})"),
        &format!("= {all}"),
        verdict(hold == all && hold_unique == all),
    );
    table.row(
        "node PATCHes, release phase (distinct nodes)",
        format!("{release} ({release_unique})"),
        &format!("= {released}"),
        verdict(release == released && release_unique == released),
    );
    if let Some(p) = &run.probes {
        let churn = run
            .patches_between(p.churn_window.0, p.churn_window.1)
            .len();
        let churn_reads = p.churn_api.nodes("LIST") + p.churn_api.nodes("WATCH");
        let extend = run
            .patches_between(p.extend_window.0, p.extend_window.1)
            .len();
        table.row(
            &format!(
                "{} unrelated node changes: PATCH / LIST+WATCH",
                run.churn_nodes
            ),
            format!("{churn} / {churn_reads}"),
            "0 / 0",
            verdict(churn == 0 && churn_reads == 0.0),
        );
        table.row(
            "one more new node in the open window: PATCH",
            extend.to_string(),
            "= 1",
            verdict(extend == 1),
        );
    }
    outside_phases(table, &phases, all);
}

/// node-holder's node PATCHes outside the hold and release phases: no hold
/// or release, and at most one `held-until` rewrite per held node.
fn outside_phases(table: &mut Table, phases: &Phases<'_>, all: usize) {
    let outside = || {
        [&phases.before, &phases.open, &phases.after]
            .into_iter()
            .flatten()
    };
    let stray = outside().filter(|p| !p.stamp).count();
    table.row(
        "node PATCHes outside those phases (holds, releases)",
        stray.to_string(),
        "0",
        verdict(stray == 0),
    );
    // The probe moves the window past the stamps the hold wrote: each held
    // node's stamp is rewritten once, when it passes.
    let stamps = outside().filter(|p| p.stamp).count();
    table.row(
        "held-until rewrites (a stamp passed in the open window)",
        stamps.to_string(),
        &format!("<= {all}"),
        verdict(stamps <= all),
    );
}

/// node-holder's node LISTs and WATCHes over the run, and its patch errors.
fn requests(table: &mut Table, run: &Run) {
    let (serve_api, whole_api) = (run.serve_api(), run.whole_api());
    let initial_lists = serve_api.nodes("LIST");
    let later_lists = whole_api.nodes("LIST") - serve_api.nodes("LIST");
    let rewatches = whole_api.nodes("WATCH");
    let terminated =
        run.release.settled.api.terminated_nodes() - run.start.before.api.terminated_nodes();
    let patch_errors = run.release.nh.sum("node_holder_patch_errors_total");
    table.row(
        "node LISTs: initial sync (500 a page) / after",
        format!("{initial_lists} / {later_lists}"),
        "1 relist / 0",
        verdict(later_lists == 0.0),
    );
    table.row(
        "node WATCHes ended (re-opened) / closed as too slow",
        format!("{rewatches} / {terminated}"),
        "0 / 0",
        verdict(rewatches == 0.0 && terminated == 0.0),
    );
    table.row(
        "node-holder patch_errors_total",
        patch_errors.to_string(),
        "0",
        verdict(patch_errors == 0.0),
    );
}
