//! The README's first command, run as a user runs it: the quick demo shows
//! the window opening, extending and closing; Ctrl-C stops everything.

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

#[test]
fn the_quick_demo_shows_holds_from_creation_a_window_that_extends_and_a_full_release() {
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
    let events: Vec<&str> = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with('+'))
        .collect();
    let position = |what: &str| {
        events
            .iter()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("{what:?} missing from\n{stdout}"))
    };
    assert!(position("burst 1") < position("hold window opened"));
    assert!(position("burst 2") < position("window extended"));
    assert!(position("window extended") < position("window closed"));
    // The release is a process, not an instant: the "window closed" line may
    // still count a few holds, and a later line shows all five gone.
    assert!(
        events[position("window closed")..]
            .iter()
            .any(|l| l.ends_with(" 0/5")),
        "all five released after the window closed:\n{stdout}"
    );
    assert!(
        events.iter().any(|l| l.ends_with(" 6/6")),
        "the late node holds all six:\n{stdout}"
    );
    assert!(events.last().unwrap().ends_with(" 0/6"), "{stdout}");
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
    let deadline = Instant::now() + Duration::from_secs(120);
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
