//! A control plane leaves nothing behind: not when its owner drops it, not when
//! a test panics, not when the owning process is killed outright.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testenv::ControlPlane;

fn running(pid: u32) -> bool {
    // A zombie has exited; only its exit status waits to be collected.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn assert_gone_soon(pids: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|&pid| running(pid)) {
        assert!(
            Instant::now() < deadline,
            "still running after 10 s: {pids:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_panicking_test_stops_the_control_plane_and_removes_its_files() {
    let (tx, rx) = std::sync::mpsc::channel::<([u32; 2], PathBuf)>();
    let outcome = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let cp = ControlPlane::start().await.expect("control plane starts");
            tx.send((cp.pids(), cp.dir().to_path_buf())).unwrap();
            panic!("a failing test");
        })
    })
    .join();
    assert!(outcome.is_err(), "the thread panicked");
    let (pids, dir) = rx.recv().expect("the control plane had started");
    assert_gone_soon(&pids);
    assert!(!Path::new(&dir).exists(), "{} removed", dir.display());
}

#[test]
fn a_killed_owner_takes_etcd_and_kube_apiserver_with_it() {
    let mut owner = Command::new(env!("CARGO_BIN_EXE_testenv"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("testenv starts");
    let mut line = String::new();
    BufReader::new(owner.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("testenv prints its control plane");
    let info: serde_json::Value = serde_json::from_str(&line).expect("one JSON line");
    let pids = [
        info["etcd_pid"].as_u64().unwrap() as u32,
        info["apiserver_pid"].as_u64().unwrap() as u32,
    ];
    assert!(
        pids.iter().all(|&pid| running(pid)),
        "both run while the owner lives"
    );

    owner.kill().expect("SIGKILL the owner");
    owner.wait().unwrap();
    assert_gone_soon(&pids);
}
