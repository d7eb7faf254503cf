//! What the logs say: the API server's lines about watchers it closed for
//! not keeping up, and node-holder's bulk patching and its warnings.

use serde_json::Value;
use testenv::ControlPlane;
use testsupport::Served;

/// The kube-apiserver log's lines about watchers closed for not keeping up
/// (the first four of them, cut at 300 characters).
pub fn print_apiserver(cp: &ControlPlane) {
    let slow = cp.apiserver_log_lines(|l| {
        l.contains("unresponsive") || l.contains("Forcing") || l.contains("too slow")
    });
    println!(
        "kube-apiserver log: {} line(s) about watchers closed for not keeping up",
        slow.len()
    );
    for line in slow.iter().take(4) {
        println!("  {}", truncate(line, 300));
    }
}

/// `== node-holder's log: bulk patching ==`: each "nodes patched" line, and
/// the warnings and errors (the first five).
pub fn print_node_holder(served: &Served) {
    println!("\n== node-holder's log: bulk patching ==");
    let log = served.log_lines();
    for line in log.iter().filter(|l| l["message"] == "nodes patched") {
        println!(
            "{} {:<7} nodes {:>5} applied {:>5} changed meanwhile {} failed {} in {:.2} s",
            line["timestamp"].as_str().unwrap_or("?"),
            line["action"].as_str().unwrap_or("?"),
            line["nodes"],
            line["applied"],
            line["changed_meanwhile"],
            line["failed"],
            line["elapsed_ms"].as_f64().unwrap_or(0.0) / 1000.0
        );
    }
    let warnings: Vec<&Value> = log
        .iter()
        .filter(|l| l["level"] == "WARN" || l["level"] == "ERROR")
        .collect();
    println!("warnings and errors in the log: {}", warnings.len());
    for line in warnings.iter().take(5) {
        println!("  {line}");
    }
}

fn truncate(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}
