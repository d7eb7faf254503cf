//! `testenv`: starts a control plane, prints how to reach it as one JSON line,
//! and runs until SIGTERM or Ctrl-C.

use anyhow::Result;
use tokio::signal::unix::{SignalKind, signal};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let cp = testenv::ControlPlane::start().await?;
    let [etcd_pid, apiserver_pid] = cp.pids();
    println!(
        "{}",
        serde_json::json!({
            "url": cp.url(),
            "kubeconfig": cp.admin_kubeconfig(),
            "dir": cp.dir(),
            "etcd_pid": etcd_pid,
            "apiserver_pid": apiserver_pid,
        })
    );
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}
