//! Log output on stderr. Text by default (coloured only on a terminal); `--log-format json`
//! (or `LEASH_LOG_FORMAT=json`) for `leash serve` writes one JSON object per line with the
//! event's fields flattened to the top level, so `lease_id`, `session`, `pid` and `op` are keys
//! a log pipeline can index. journald takes either from the daemon's stderr under systemd.

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

pub(super) fn init(verbose: u8, daemon: bool, format: LogFormat) {
    let default = match verbose {
        0 if daemon => "info",
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("LEASH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
    };
}
