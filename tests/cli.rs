//! The command line a user meets first.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use base64::Engine;

fn node_holder(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_node-holder"))
        .args(args)
        .output()
        .expect("node-holder runs")
}

#[test]
fn help_lists_the_subcommands_of_the_spec() {
    let out = node_holder(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for subcommand in ["serve", "status", "release", "certs"] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(subcommand)),
            "{subcommand} missing from:\n{help}"
        );
    }
}

#[test]
fn certs_writes_a_ca_and_a_serving_pair_and_prints_the_ca_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("dev");
    let out = node_holder(&[
        "certs",
        "--out-dir",
        out_dir.to_str().unwrap(),
        "--dns-name",
        "node-holder.example.svc",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let ca = std::fs::read_to_string(out_dir.join("ca.crt")).unwrap();
    let printed = String::from_utf8(out.stdout).unwrap();
    let bundle = base64::engine::general_purpose::STANDARD
        .decode(printed.trim())
        .expect("stdout is the base64 caBundle");
    assert_eq!(bundle, ca.as_bytes());

    assert!(
        std::fs::read_to_string(out_dir.join("tls.crt"))
            .unwrap()
            .starts_with("-----BEGIN CERTIFICATE-----")
    );
    let key = out_dir.join("tls.key");
    assert!(
        std::fs::read_to_string(&key)
            .unwrap()
            .contains("PRIVATE KEY")
    );
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the private key is readable by its owner only");
}

#[test]
fn certs_rejects_an_invalid_dns_name_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = node_holder(&[
        "certs",
        "--out-dir",
        dir.path().to_str().unwrap(),
        "--dns-name",
        "bad name!",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("invalid DNS name"), "{stderr}");
}
