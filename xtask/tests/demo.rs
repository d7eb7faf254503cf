//! The README's first command, run as a user runs it: the quick demo shows
//! Karpenter launching nodes that node-holder holds from their creation,
//! reusing them for a second wave, and consolidating them only after the
//! window closed; Ctrl-C stops everything.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The processes whose command line mentions `dir`.
fn processes_using(dir: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(dir) {
                found.push(cmdline);
            }
        }
    }
    found
}

/// The control plane's directory, from the line that names node-holder's log.
fn demo_dir(output: &str) -> String {
    let log = output
        .lines()
        .find_map(|l| l.split_once("its log: ").map(|(_, path)| path.trim()))
        .expect("the demo names node-holder's log");
    log.trim_end_matches("/node-holder.log").to_string()
}

/// The CronJobs: `rare`'s node is let go with node-holder's reason,
/// `often`'s second run launches nothing, and every node goes in the end.
fn the_second_act_keeps_only_the_node_due_again_soon(events: &[&str], stdout: &str) {
    let position = |what: &str| {
        events
            .iter()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("{what:?} missing from the second act of\n{stdout}"))
    };
    assert!(
        events
            .iter()
            .any(|l| l.contains("held until") && l.contains("cronjob default/often runs at")),
        "{stdout}"
    );
    assert!(
        events
            .iter()
            .any(|l| l.contains("no scheduled run is due within the launch cost (2m)")),
        "{stdout}"
    );
    position("cronjob often: run");
    position("cronjob rare: run");
    position("often's second run ran on the node kept for it: Karpenter launched no node");
    assert!(position("cronjob often suspended") < events.len());
    let launched = events
        .iter()
        .filter(|l| l.contains("Karpenter launched node"))
        .count();
    let gone = events.iter().filter(|l| l.contains("is gone")).count();
    assert_eq!((launched, gone), (2, 2), "{stdout}");
}

#[test]
fn the_quick_demo_shows_karpenter_nodes_held_from_creation_reused_and_consolidated_after_the_window()
 {
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["demo", "--quick"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all: Vec<&str> = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with('+'))
        .collect();
    // The first act, the waves; then the second, the CronJobs.
    let act_two = all
        .iter()
        .position(|l| l.contains("cronjob often runs every minute"))
        .unwrap_or_else(|| panic!("no second act in\n{stdout}"));
    let (events, schedules) = all.split_at(act_two);
    let position = |what: &str| {
        events
            .iter()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("{what:?} missing from\n{stdout}"))
    };
    // Karpenter launches a node for each pod of the first wave, each held
    // from its creation, and that opens node-holder's window.
    let launches: Vec<&&str> = events
        .iter()
        .filter(|l| l.contains("Karpenter launched node"))
        .collect();
    assert_eq!(launches.len(), 2, "{stdout}");
    assert!(
        launches
            .iter()
            .all(|l| l.ends_with("held by node-holder from its creation")),
        "{stdout}"
    );
    assert!(position("wave-1: 2 pods arrive") < position("Karpenter launched node"));
    assert!(position("Karpenter launched node") <= position("hold window opened"));
    // The second wave reuses the held nodes; Karpenter launches nothing.
    assert!(position("wave-2: 2 pods arrive") > position("hold window opened"));
    position("wave-2 runs on the held nodes");
    // Karpenter looked at the empty held nodes and found none it may remove.
    assert!(
        position("Karpenter looked: 0 of 2 empty nodes may go") < position("wave-2: 2 pods arrive")
    );
    // Nothing is removed while the window is open; afterwards Karpenter
    // consolidates every node as empty.
    let closed = position("window closed");
    assert!(closed < position("is gone"), "{stdout}");
    assert_eq!(
        events.iter().filter(|l| l.contains("is gone")).count(),
        2,
        "{stdout}"
    );
    assert!(
        events[closed..]
            .iter()
            .any(|l| l.contains("Karpenter on") && l.contains("Empty")),
        "Karpenter says why it removes the nodes:\n{stdout}"
    );
    the_second_act_keeps_only_the_node_due_again_soon(schedules, &stdout);
    assert!(stdout.contains("demo: done in "), "{stdout}");
    let dir = demo_dir(&stdout);
    assert!(
        processes_using(&dir).is_empty(),
        "{:?}",
        processes_using(&dir)
    );
    assert!(!std::path::Path::new(&dir).exists(), "{dir} removed");
}

#[test]
fn ctrl_c_stops_the_demo_and_leaves_no_process_behind() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["demo", "--hold-duration=10m"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = String::new();
    // The demo builds node-holder before the window opens: in the suite that
    // build can wait minutes for cargo's lock on the target directory while
    // another test builds (it ran past 300 s once under the suite's load).
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        let line = lines.next().expect("the demo keeps talking").unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("hold window opened") {
            break;
        }
        assert!(Instant::now() < deadline, "{seen}");
    }
    let dir = demo_dir(&seen);
    assert!(!processes_using(&dir).is_empty(), "node-holder is running");
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        assert!(Instant::now() < deadline, "the demo did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(exit.success(), "{exit:?}");
    assert!(
        rest.iter().any(|l| l.contains("interrupted; stopping")),
        "{rest:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while !processes_using(&dir).is_empty() {
        assert!(
            Instant::now() < deadline,
            "left behind: {:?}",
            processes_using(&dir)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
