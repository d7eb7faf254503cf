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

/// Installs the global subscriber: node-holder's own lines up to `level`,
/// warnings and errors from its dependencies.
pub fn init(format: LogFormat, level: LevelFilter) {
    // Dependencies' chatter at debug level drowns node-holder's own lines.
    let filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::WARN.into())
        .parse_lossy(format!("node_holder={level}"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
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
