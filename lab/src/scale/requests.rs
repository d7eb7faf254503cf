//! `== node-holder's requests ==`: node-holder's node PATCHes (audit log) and
//! node LISTs, WATCHes and other writes (the API server's counters less the
//! bench's own) in each phase and over the whole run, its own `/metrics`,
//! and the API server's raw node counters at each step.

use crate::measure::audit::describe;

use super::{Checkpoint, Probes, Run};

/// Prints the section.
pub fn print(run: &Run) {
    println!("\n== node-holder's requests ==");
    print_start_and_hold(run);
    if let Some(probes) = &run.probes {
        print_probes(run, probes);
    }
    print_release(run);
    print_whole_run(run);
    println!("\nAPI server counters for nodes (all clients) at each step:");
    for line in &run.raw {
        println!("  {line}");
    }
}

fn print_start_and_hold(run: &Run) {
    let (start, hold) = (&run.start, &run.hold);
    let phases = run.phases();
    let serve_api = run.serve_api();
    println!(
        "start-up and first pass (serve start .. before the new node): node LIST {} (pages of 500), \
         node WATCH ended / open {} / {}; node PATCH {}",
        serve_api.nodes("LIST"),
        serve_api.nodes("WATCH"),
        start.ready.api.open_watches("nodes")
            - start.before.api.open_watches("nodes")
            - start.ready.own.open_watches as f64,
        phases.before.len()
    );
    println!(
        "hold phase (new node .. settled):   {}",
        describe(&phases.hold)
    );
    print_reads(&hold.settled, &start.ready);
}

/// A phase's node LISTs, WATCHes ended (and closed as too slow) and Event
/// writes, from `before` until `after`.
fn print_reads(after: &Checkpoint, before: &Checkpoint) {
    let api = after.since(before);
    println!(
        "                                   node LIST {}, WATCH ended {} (closed as too slow: {}); \
         Event writes {}",
        api.nodes("LIST"),
        api.nodes("WATCH"),
        after.api.terminated_nodes() - before.api.terminated_nodes(),
        api.event_writes()
    );
}

fn print_probes(run: &Run, p: &Probes) {
    let churn_patches = run.patches_between(p.churn_window.0, p.churn_window.1);
    let extend_patches = run.patches_between(p.extend_window.0, p.extend_window.1);
    println!(
        "churn probe ({} unrelated label changes, {:.1} s, {} pass(es) ran): \
         node PATCH {}, LIST {}, WATCH ended {}",
        run.churn_nodes,
        p.churn_secs,
        p.churn_passes,
        churn_patches.len(),
        p.churn_api.nodes("LIST"),
        p.churn_api.nodes("WATCH")
    );
    println!(
        "extend probe (one more new node, created {}): node PATCH {} ({}; holds_applied +{}), LIST {}; held {}",
        p.extender_created,
        extend_patches.len(),
        extend_patches
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        p.extend_applied,
        p.extend_api.nodes("LIST"),
        p.extend_time
            .map_or("NOT within 15 s".to_string(), |d| format!(
                "{:.2} s after its create",
                d.as_secs_f64()
            ))
    );
}

fn print_release(run: &Run) {
    let release = &run.release;
    let phases = run.phases();
    let stamps = phases.open.iter().filter(|p| p.stamp).count();
    println!(
        "rest of the open window:           node PATCH {} ({stamps} held-until rewrites)",
        phases.open.len()
    );
    println!(
        "release phase (deadline .. settled): {}",
        describe(&phases.release)
    );
    print_reads(&release.settled, &release.before);
    println!(
        "after the release settled:         node PATCH {}",
        phases.after.len()
    );
}

fn print_whole_run(run: &Run) {
    let (start, hold, settled) = (&run.start, &run.hold, &run.release.settled);
    let whole_api = run.whole_api();
    println!(
        "whole run, node-holder: node LIST {}, WATCH ended {}, open now {}; node PATCH {}; \
         Event writes {}; lease writes {}; ConfigMap writes {}",
        whole_api.nodes("LIST"),
        whole_api.nodes("WATCH"),
        settled.api.open_watches("nodes")
            - start.before.api.open_watches("nodes")
            - settled.own.open_watches as f64,
        run.patches.len(),
        whole_api.event_writes(),
        whole_api.writes("leases"),
        whole_api.writes("configmaps")
    );
    let (nh1, nh2, nh6) = (&start.nh, &hold.nh, &run.release.nh);
    let passes = &format!("{}_count", crate::measure::node_holder::PASS_SECONDS);
    let applied = "node_holder_holds_applied_total";
    println!(
        "node-holder /metrics: holds_applied {} (+{} in the hold phase), holds_released {}, \
         patch_errors {}, passes {} ({} in the hold phase), held_nodes {}",
        nh6.get(applied),
        nh2.get(applied) - nh1.get(applied),
        nh6.get("node_holder_holds_released_total"),
        nh6.sum("node_holder_patch_errors_total"),
        nh6.get(passes),
        nh2.get(passes) - nh1.get(passes),
        nh6.get("node_holder_held_nodes")
    );
}
