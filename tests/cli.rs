//! The command line a user meets first.

use std::process::Command;

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
    for subcommand in [
        "serve",
        "status",
        "release",
        "hold",
        "uninstall",
        "self-check",
    ] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(subcommand)),
            "{subcommand} missing from:\n{help}"
        );
    }
}

/// `serve` as `--help` lists it, the global flags and `--help` included:
/// at most 30 flags. A knob that no measured figure asks for is a constant
/// where it is used (docs/comparison.md says which stayed and why).
#[test]
fn serve_lists_at_most_30_flags() {
    let out = node_holder(&["serve", "--help"]);
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    // Flags start their line within the first columns; their help is
    // indented further.
    let flags: Vec<&str> = help
        .lines()
        .filter(|line| {
            let text = line.trim_start();
            line.len() - text.len() <= 6 && text.starts_with('-')
        })
        .collect();
    assert!(flags.iter().any(|f| f.contains("--log-level")), "{help}");
    assert!(
        flags.len() <= 30,
        "{} flags:\n{}",
        flags.len(),
        flags.join("\n")
    );
}

/// A manual hold always has an end and a reason: what is refused, and why,
/// before any request reaches a cluster.
#[test]
fn hold_refuses_a_hold_without_an_end_or_a_reason() {
    let cases: [(&[&str], &str); 6] = [
        (&["hold", "--reason", "r"], "--for"),
        (&["hold", "--for", "0s", "--reason", "r"], "longer than 0s"),
        (
            &["hold", "--for", "2years", "--reason", "r"],
            "at most 1year",
        ),
        (&["hold", "--for", "soon", "--reason", "r"], "--for"),
        (&["hold", "--for", "45m"], "--reason"),
        (&["hold", "--for", "45m", "--reason", "  "], "say why"),
    ];
    for (args, expected) in cases {
        let out = node_holder(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

/// Window flags a pass could not honour are refused by name before `serve`
/// needs a cluster.
#[test]
fn serve_refuses_window_flags_it_could_not_honour() {
    let cert = "--tls-cert-file=/nonexistent/tls.crt";
    let cases: [(&[&str], &str); 2] = [
        (
            &["--hold-duration=0s"],
            "--hold-duration must be longer than 0",
        ),
        (
            &["--warm-before-runs=90s"],
            "--warm-before-runs needs --launch-cost",
        ),
    ];
    for (args, expected) in cases {
        let out = node_holder(&[&["serve", cert][..], args].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[test]
fn the_configuration_reference_matches_the_cli() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md");
    let generated = reference_markdown();
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

/// `docs/configuration.md`: every flag of every subcommand with its
/// environment variable and default, generated from the definitions in
/// `src/cli/` (the test below keeps the file in step).
fn reference_markdown() -> String {
    use clap::CommandFactory;
    let cli = node_holder::cli::Cli::command();
    let mut out = String::from(
        "# Configuration reference\n\n\
         Generated from node-holder's command-line definitions (`src/cli/`);\n\
         `NODE_HOLDER_UPDATE_DOCS=1 cargo test --test cli` rewrites it.\n\
         Every flag also reads the environment variable beside it; a flag given\n\
         on the command line wins. Durations take units: `90s`, `20m`, `2h`.\n",
    );
    out.push_str("\n## Every subcommand\n\n");
    table(&mut out, cli.get_arguments().filter(|a| a.is_global_set()));
    for sub in cli.get_subcommands() {
        out.push_str(&format!("\n## `node-holder {}`\n\n", sub.get_name()));
        if let Some(about) = sub.get_about() {
            out.push_str(&format!("{about}\n\n"));
        }
        table(&mut out, sub.get_arguments().filter(|a| !a.is_global_set()));
    }
    out
}

fn table<'a>(out: &mut String, args: impl Iterator<Item = &'a clap::Arg>) {
    let rows: Vec<String> = args
        .filter(|arg| !matches!(arg.get_id().as_str(), "help" | "version"))
        .map(|arg| {
            let flag = match (arg.get_long(), arg.get_short()) {
                (Some(long), Some(short)) => format!("`-{short}`, `--{long}`"),
                (Some(long), None) => format!("`--{long}`"),
                _ => format!("`{}`", arg.get_id()),
            };
            let env = arg
                .get_env()
                .map_or(String::new(), |e| format!("`{}`", e.to_string_lossy()));
            let default = arg
                .get_default_values()
                .iter()
                .map(|v| format!("`{}`", v.to_string_lossy()))
                .collect::<Vec<_>>()
                .join(", ");
            let default = if default.is_empty() || default == "``" {
                "—".to_string()
            } else {
                default
            };
            let mut help = arg
                .get_long_help()
                .or(arg.get_help())
                .map(|h| h.to_string().replace('\n', " "))
                .unwrap_or_default();
            let values: Vec<String> = arg
                .get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| format!("`{}`", v.get_name()))
                .collect();
            if !help.is_empty() && !help.ends_with('.') {
                help.push('.');
            }
            if !values.is_empty() {
                help.push_str(&format!(" One of {}.", values.join(", ")));
            }
            format!("| {flag} | {env} | {default} | {help} |")
        })
        .collect();
    if rows.is_empty() {
        out.push_str("No flags of its own.\n");
        return;
    }
    out.push_str("| flag | environment | default | meaning |\n| --- | --- | --- | --- |\n");
    for row in rows {
        out.push_str(&row);
        out.push('\n');
    }
}
