//! Process logs: human-readable text or one JSON object per line.

use clap::ValueEnum;
use tracing::level_filters::LevelFilter;
use tracing_subscriber::EnvFilter;

/// How log lines are written to standard error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Installs the global subscriber, lines filtered by [`filter`].
pub fn init(format: LogFormat, level: LevelFilter) {
    let rust_log = std::env::var("RUST_LOG").ok();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter(level, rust_log.as_deref()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
    }
}

/// `RUST_LOG`'s directives when set; else node-holder's own lines up to
/// `level` and only the warnings of dependencies (their chatter drowns ours).
fn filter(level: LevelFilter, rust_log: Option<&str>) -> EnvFilter {
    let directives = match rust_log.map(str::trim) {
        Some(directives) if !directives.is_empty() => directives.to_string(),
        _ => format!("node_holder={level}"),
    };
    EnvFilter::builder()
        .with_default_directive(LevelFilter::WARN.into())
        .parse_lossy(directives)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_log_when_set_wins_over_the_log_level() {
        let set = filter(LevelFilter::INFO, Some("kube=debug,node_holder=trace")).to_string();
        assert!(set.contains("kube=debug"), "{set}");
        assert!(set.contains("node_holder=trace"), "{set}");
        for unset in [None, Some(""), Some("  ")] {
            let own = filter(LevelFilter::DEBUG, unset).to_string();
            assert!(own.contains("node_holder=debug"), "{own}");
            assert!(!own.contains("kube"), "{own}");
        }
    }
}
