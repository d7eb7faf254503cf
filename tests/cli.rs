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

#[test]
fn the_configuration_reference_matches_the_cli() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md");
    let generated = node_holder::cli::reference_markdown();
    if std::env::var_os("NODE_HOLDER_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let written = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        written == generated,
        "docs/configuration.md is out of date: run NODE_HOLDER_UPDATE_DOCS=1 cargo test --test cli"
    );
}

#[test]
fn every_flag_reads_an_environment_variable() {
    use clap::CommandFactory;
    let cli = node_holder::cli::Cli::command();
    let mut missing = Vec::new();
    for command in std::iter::once(&cli).chain(cli.get_subcommands()) {
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if !matches!(id, "help" | "version") && arg.get_env().is_none() {
                missing.push(format!("{} --{id}", command.get_name()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "flags without an environment variable: {missing:?}"
    );
}
