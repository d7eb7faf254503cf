//! `kubectl node-holder`: node-holder's commands through a real kubectl
//! (built from the control plane's own pin) and its plugin mechanism, with
//! kubectl's kubeconfig and context flags honoured.

use testsupport as common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{node, register_webhook, serve};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use testenv::ControlPlane;

/// kubectl with only the plugin's directory on `PATH` and no kubeconfig of
/// its own but what `args` say.
fn kubectl(args: &[&str]) -> Output {
    let kubectl =
        testenv::ensure_kubectl_built().expect("kubectl builds from the control plane's pin");
    let plugin = Path::new(env!("CARGO_BIN_EXE_kubectl-node_holder"));
    Command::new(kubectl)
        .args(args)
        .env("PATH", plugin.parent().unwrap())
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env("HOME", "/nonexistent")
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    testsupport::output_report(out)
}

/// A kubeconfig whose current context points nowhere and whose context
/// `good` is the admin's of `cp`.
fn two_contexts(cp: &ControlPlane, dir: &Path) -> PathBuf {
    let admin = std::fs::read_to_string(cp.admin_kubeconfig()).unwrap();
    let mut config: serde_json::Value = testenv::parse_manifests(&admin).unwrap().remove(0);
    let good_context = config["contexts"][0]["context"].clone();
    config["clusters"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "nowhere", "cluster": {"server": "https://127.0.0.1:1"}}));
    config["contexts"] = serde_json::json!([
        {"name": "good", "context": good_context},
        {"name": "bad", "context": {"cluster": "nowhere", "user": good_context["user"]}},
    ]);
    config["current-context"] = "bad".into();
    let path = dir.join("two-contexts.kubeconfig");
    std::fs::write(&path, serde_json::to_string(&config).unwrap()).unwrap();
    path
}

#[tokio::test]
async fn kubectl_runs_status_release_and_hold_as_a_plugin_with_its_kubeconfig_and_context() {
    let list = kubectl(&["plugin", "list"]);
    assert!(
        String::from_utf8_lossy(&list.stdout).contains("kubectl-node_holder"),
        "{}",
        text(&list)
    );

    let cp = ControlPlane::start().await.unwrap();
    let served = serve(&cp, &["--hold-duration=1h"]).await;
    register_webhook(&cp, &served).await;
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());
    nodes
        .create(&PostParams::default(), &node("plugged"))
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = two_contexts(&cp, dir.path());
    let kubeconfig = kubeconfig.to_str().unwrap();
    // The current context points nowhere: the command fails, naming it.
    let nowhere = kubectl(&["node-holder", "status", "--kubeconfig", kubeconfig]);
    assert!(!nowhere.status.success(), "{}", text(&nowhere));
    // kubectl's --context picks the good one.
    let status = kubectl(&[
        "node-holder",
        "status",
        "--kubeconfig",
        kubeconfig,
        "--context",
        "good",
        "-o",
        "json",
    ]);
    assert!(status.status.success(), "{}", text(&status));
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(json["heldNodes"][0]["name"], "plugged", "{json}");

    let release = kubectl(&[
        "node-holder",
        "release",
        "--kubeconfig",
        kubeconfig,
        "--context",
        "good",
    ]);
    assert!(release.status.success(), "{}", text(&release));
    assert!(
        String::from_utf8_lossy(&release.stdout).contains("released by"),
        "{}",
        text(&release)
    );
    // A manual hold through the plugin holds the node again.
    let hold = kubectl(&[
        "node-holder",
        "hold",
        "--for",
        "10m",
        "--reason",
        "plugin test",
        "--kubeconfig",
        kubeconfig,
        "--context",
        "good",
    ]);
    assert!(hold.status.success(), "{}", text(&hold));
    assert!(
        String::from_utf8_lossy(&hold.stdout).contains("1 node(s) carry node-holder's hold"),
        "{}",
        text(&hold)
    );
    // Only status, release and hold are the plugin's.
    let serve = kubectl(&["node-holder", "serve"]);
    assert_eq!(serve.status.code(), Some(2), "{}", text(&serve));
}

/// `kubectl node-holder status` lists the nodes that carry node-holder's
/// hold and not one that carries someone else's, pages its table
/// (`--limit`), speaks YAML (`-o yaml`) and takes `-n` as kubectl does.
#[tokio::test]
async fn status_lists_node_holders_holds_only_pages_them_and_speaks_yaml() {
    let cp = ControlPlane::start().await.unwrap();
    let served = serve(&cp, &["--hold-duration=1h"]).await;
    register_webhook(&cp, &served).await;
    let nodes: Api<Node> = Api::all(cp.admin_client().await.unwrap());
    for name in ["mine", "mine-2"] {
        nodes
            .create(&PostParams::default(), &node(name))
            .await
            .unwrap();
    }
    let mut theirs = node("theirs");
    theirs.metadata.annotations = Some(
        [(
            "karpenter.sh/do-not-disrupt".to_string(),
            "true".to_string(),
        )]
        .into(),
    );
    nodes.create(&PostParams::default(), &theirs).await.unwrap();
    let kubeconfig = cp.admin_kubeconfig().to_str().unwrap().to_string();
    let run = |args: &[&str]| {
        let mut all = vec!["node-holder"];
        all.extend_from_slice(args);
        all.extend(["--kubeconfig", &kubeconfig]);
        let out = kubectl(&all);
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // The webhook held both of mine at their CREATE; theirs is theirs.
    let held = run(&["status", "-n", "node-holder"]);
    for expected in ["Held nodes:  2\n", "\nmine ", "\nmine-2 "] {
        assert!(held.contains(expected), "{expected:?} in\n{held}");
    }
    assert!(!held.contains("theirs"), "{held}");

    // status: YAML, and a table of at most --limit rows with the rest counted.
    let yaml = run(&["status", "-o", "yaml", "-n", "node-holder"]);
    let status = testenv::parse_manifests(&yaml).unwrap().remove(0);
    assert_eq!(
        status["heldNodes"].as_array().map(Vec::len),
        Some(2),
        "{yaml}"
    );
    let limited = run(&["status", "--limit", "1"]);
    assert!(
        limited.contains("… and 1 more (--limit 0 shows all)"),
        "{limited}"
    );
    drop(served);
}

/// `.krew.yaml`, rendered as krew-release-bot renders it for a tag (its two
/// template actions replaced by a tag and an archive's `uri` and `sha256`),
/// is a krew Plugin of the binary kubectl runs, for Linux and macOS.
#[test]
fn the_krew_manifest_names_the_plugins_binary_for_each_platform() {
    let template =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(".krew.yaml")).unwrap();
    let sha = "0".repeat(64);
    let rendered: String = template
        .lines()
        .map(
            |line| match line.trim_start().strip_prefix("{{addURIAndSha \"") {
                Some(rest) => {
                    let indent = &line[..line.len() - line.trim_start().len()];
                    let uri = rest
                        .split('"')
                        .next()
                        .unwrap()
                        .replace("{{ .TagName }}", "v0.1.0");
                    format!("{indent}uri: {uri}\n{indent}sha256: \"{sha}\"")
                }
                None => line.replace("{{ .TagName }}", "v0.1.0"),
            },
        )
        .collect::<Vec<_>>()
        .join("\n");
    let plugin = testenv::parse_manifests(&rendered).unwrap().remove(0);
    assert_eq!(plugin["kind"], "Plugin");
    // krew runs `kubectl-<name with - as _>`: the binary this crate builds.
    let name = plugin["metadata"]["name"].as_str().unwrap();
    let binary = Path::new(env!("CARGO_BIN_EXE_kubectl-node_holder"))
        .file_name()
        .unwrap();
    assert_eq!(
        format!("kubectl-{}", name.replace('-', "_")),
        binary.to_str().unwrap()
    );
    let platforms = plugin["spec"]["platforms"].as_array().unwrap();
    let mut seen = Vec::new();
    for platform in platforms {
        assert_eq!(platform["bin"], binary.to_str().unwrap(), "{platform}");
        assert!(
            platform["uri"].as_str().unwrap().ends_with(".tar.gz"),
            "{platform}"
        );
        assert_eq!(
            platform["sha256"].as_str().map(str::len),
            Some(64),
            "{platform}"
        );
        let labels = &platform["selector"]["matchLabels"];
        seen.push(format!(
            "{}/{}",
            labels["os"].as_str().unwrap(),
            labels["arch"].as_str().unwrap()
        ));
    }
    assert_eq!(seen, ["linux/amd64", "linux/arm64", "darwin/arm64"]);
    assert_eq!(plugin["spec"]["version"], "v0.1.0");
}
