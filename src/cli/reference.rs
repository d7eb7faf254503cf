//! `docs/configuration.md`, generated from the flags' definitions.

use super::Cli;

/// `docs/configuration.md`: every flag of every subcommand with its
/// environment variable and default, generated from the definitions in
/// `src/cli/` (a test keeps the file in step).
pub fn reference_markdown() -> String {
    use clap::CommandFactory;
    let cli = Cli::command();
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
