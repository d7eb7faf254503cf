//! node-holder's alerts (chart/files/node-holder-rules.yaml) and dashboard
//! (chart/files/node-holder-dashboard.json). The alerts are checked as
//! Prometheus reads them with the pinned promtool (built from its Go module,
//! `testenv/tools/promtool`): the rules load, each alert fires on the series
//! that should fire it and stays quiet on a healthy pair of replicas
//! (tests/prometheus/node-holder-rules.test.yaml), the chart ships exactly
//! those rules. Every dashboard query parses as PromQL (promtool, with
//! Grafana's variables given values), and the chart ships the dashboard as a
//! ConfigMap for Grafana's sidecar. Every node-holder metric the alerts and
//! the panels name is on a running node-holder's `/metrics`, so a renamed
//! metric breaks this test and not a production alert. The rendered ServiceMonitor and PrometheusRule are
//! accepted by the API server with the pinned Prometheus Operator's CRDs.

use testsupport as common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use common::install::{self, install_prometheus_operator_crds, one, repo};
use serde_json::Value;
use testenv::ControlPlane;

/// `helm template` with `values` on a cluster that serves cert-manager and
/// the Prometheus Operator's ServiceMonitor and PrometheusRule: the chart
/// renders their objects only where they are served.
fn template(values: &[&str]) -> Vec<Value> {
    let served = [
        "--api-versions=cert-manager.io/v1/Certificate",
        "--api-versions=monitoring.coreos.com/v1/ServiceMonitor",
        "--api-versions=monitoring.coreos.com/v1/PrometheusRule",
    ];
    install::template(&[&served[..], values].concat())
}

fn rules_file() -> PathBuf {
    repo().join("chart/files/node-holder-rules.yaml")
}

fn promtool(args: &[&str]) -> String {
    let promtool = testenv::ensure_promtool_built().expect("promtool builds");
    let out = Command::new(promtool)
        .args(args)
        .current_dir(repo())
        .output()
        .expect("promtool runs");
    let text = testsupport::output_text(&out);
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn the_alert_rules_load_and_pass_their_unit_tests() {
    let checked = promtool(&["check", "rules", "chart/files/node-holder-rules.yaml"]);
    assert!(checked.contains("SUCCESS: 13 rules found"), "{checked}");
    let tested = promtool(&[
        "test",
        "rules",
        "tests/prometheus/node-holder-rules.test.yaml",
    ]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[tokio::test]
async fn the_chart_ships_exactly_the_tested_rules_and_scrapes_the_admin_port() {
    // Off by default: a cluster without the Prometheus Operator's CRDs would
    // refuse the objects.
    let objects = template(&[]);
    for kind in ["PrometheusRule", "ServiceMonitor"] {
        assert!(
            !objects.iter().any(|o| o["kind"] == kind),
            "{kind} rendered by default"
        );
    }
    let objects = template(&[
        "--set=metrics.prometheusRule.enabled=true",
        "--set=metrics.prometheusRule.labels.release=kube-prometheus",
        "--set=metrics.serviceMonitor.enabled=true",
    ]);
    let rule = one(&objects, "PrometheusRule");
    let file = std::fs::read_to_string(rules_file()).unwrap();
    let tested = testenv::parse_manifests(&file).unwrap().remove(0);
    assert_eq!(
        rule["spec"], tested,
        "the PrometheusRule's spec is the rules file"
    );
    assert_eq!(rule["metadata"]["labels"]["release"], "kube-prometheus");
    // The orphan alert's wait is the chart's to set.
    let longer = template(&[
        "--set=metrics.prometheusRule.enabled=true",
        "--set=metrics.prometheusRule.orphanedHoldsFor=45m",
    ]);
    let rules = &one(&longer, "PrometheusRule")["spec"]["groups"][0]["rules"];
    let orphaned = rules
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["alert"] == "NodeHolderOrphanedHolds")
        .unwrap();
    assert_eq!(orphaned["for"], "45m");

    // The ServiceMonitor scrapes the Service's port that leads to /metrics.
    let monitor = one(&objects, "ServiceMonitor");
    let service = one(&objects, "Service");
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["path"], "/metrics");
    let port = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == endpoint["port"])
        .unwrap_or_else(|| panic!("no Service port {}", endpoint["port"]));
    let deployment = one(&objects, "Deployment");
    let admin = deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "admin")
        .unwrap();
    assert_eq!(port["targetPort"], "admin", "{port}");
    assert!(admin["containerPort"].is_number());
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"],
        service["spec"]["selector"]
    );

    // The API server accepts both against the Prometheus Operator's CRDs.
    let cp = ControlPlane::start().await.unwrap();
    install_prometheus_operator_crds(&cp).await;
    let client = cp.admin_client().await.unwrap();
    let namespace = serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": rule["metadata"]["namespace"]},
    });
    testenv::apply_objects(&client, &[namespace]).await.unwrap();
    testenv::dry_run_objects(&client, &[rule.clone(), monitor.clone()])
        .await
        .unwrap();
}

/// The rules' expressions.
fn alert_expressions() -> Vec<String> {
    let file = std::fs::read_to_string(rules_file()).unwrap();
    let rules = testenv::parse_manifests(&file).unwrap().remove(0);
    rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_array().unwrap())
        .map(|rule| rule["expr"].as_str().unwrap().to_string())
        .collect()
}

fn dashboard() -> serde_json::Value {
    let path = repo().join("chart/files/node-holder-dashboard.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Every panel's queries, as Prometheus sees them once Grafana has put in its
/// variables (`$job`: every job; `$__rate_interval`: 5m).
fn panel_expressions() -> Vec<String> {
    dashboard()["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|panel| panel["targets"].as_array().unwrap())
        .map(|target| {
            target["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "5m")
                .replace("$job", ".*")
        })
        .collect()
}

/// The `node_holder_…` names in `expressions` (whole words: not another
/// metric's label such as kube-state-metrics' `label_node_holder_dev_held`).
fn node_holder_metrics(expressions: &[String]) -> BTreeSet<String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut names = BTreeSet::new();
    for expr in expressions {
        let mut rest = expr.as_str();
        while let Some(at) = rest.find("node_holder_") {
            let name: String = rest[at..].chars().take_while(|&c| word(c)).collect();
            let whole = !rest[..at].ends_with(word);
            rest = &rest[at + name.len()..];
            if whole {
                names.insert(name);
            }
        }
    }
    names
}

#[test]
fn every_dashboard_query_parses_and_the_chart_ships_the_dashboard() {
    let panels = dashboard()["panels"].as_array().unwrap().len();
    let expressions = panel_expressions();
    assert!(
        panels >= 10 && expressions.len() >= panels,
        "{expressions:?}"
    );
    // promtool parses each query as the expression of a recording rule.
    let rules: Vec<serde_json::Value> = expressions
        .iter()
        .enumerate()
        .map(|(i, expr)| serde_json::json!({"record": format!("node_holder_dashboard_query_{i}"), "expr": expr}))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard-queries.json");
    let groups = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    std::fs::write(&file, groups.to_string()).unwrap();
    let checked = promtool(&["check", "rules", file.to_str().unwrap()]);
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", expressions.len())),
        "{checked}"
    );

    assert!(!template(&[]).iter().any(|o| o["kind"] == "ConfigMap"));
    let objects = template(&["--set=metrics.dashboard.enabled=true"]);
    let config_map = one(&objects, "ConfigMap");
    assert_eq!(config_map["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped: serde_json::Value =
        serde_json::from_str(config_map["data"]["node-holder.json"].as_str().unwrap()).unwrap();
    assert_eq!(shipped, dashboard());
}

#[tokio::test]
async fn every_metric_the_alerts_and_the_dashboard_name_is_on_a_running_node_holder() {
    let mut expressions = alert_expressions();
    expressions.extend(panel_expressions());
    let names = node_holder_metrics(&expressions);
    assert!(names.len() >= 10, "{names:?}");
    let served = common::serve_offline(&[]).await;
    let (status, text) = common::http_get(served.admin_port, "/metrics")
        .await
        .unwrap();
    assert_eq!(status, 200);
    let exposed: BTreeSet<&str> = testenv::metrics::samples(&text).map(|s| s.name).collect();
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !exposed.contains(n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "the alerts or the dashboard name metrics node-holder does not expose: {missing:?}\n{text}"
    );
}

/// GitHub's anchor of a Markdown heading: lower case, spaces as `-`, other
/// punctuation but `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn every_alert_has_a_runbook_url_to_a_section_of_the_operations_guide() {
    let guide = std::fs::read_to_string(repo().join("docs/operations.md")).unwrap();
    let anchors: BTreeSet<String> = guide
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect();
    let file = std::fs::read_to_string(rules_file()).unwrap();
    let rules = testenv::parse_manifests(&file).unwrap().remove(0);
    let rules = rules["groups"][0]["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 13);
    for rule in rules {
        let url = rule["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_default();
        let section = url
            .strip_prefix("https://node-holder.dev/docs/operations#")
            .unwrap_or_else(|| panic!("{}: runbook_url {url:?}", rule["alert"]));
        assert!(
            anchors.contains(section),
            "{}: no section #{section}",
            rule["alert"]
        );
    }
}
