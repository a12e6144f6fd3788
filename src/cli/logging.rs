//! Log output on stderr. Text by default (coloured only on a terminal); `--log-format json`
//! (or `LEASH_LOG_FORMAT=json`) for `leash serve` writes one JSON object per line with the
//! event's fields flattened to the top level, so `lease_id`, `session`, `pid` and `op` are keys
//! a log pipeline can index. journald takes either from the daemon's stderr under systemd.
//! Every field is the protocol's value: numbers as numbers, an absent value absent, an enum by its
//! serde name (`"role":"adapter"`), an argv or a summary as a JSON array or object: call sites log
//! such values through [`crate::logvalue::json`].

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The log filter's variable (tracing's filter syntax); it overrides `-v`.
pub const ENV_LOG: &str = "LEASH_LOG";

pub(super) fn init(verbose: u8, daemon: bool, format: LogFormat) {
    let default = match verbose {
        0 if daemon => "info",
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env(ENV_LOG)
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
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(FlatJson)
            .try_init(),
    };
}

/// One JSON object per event: `timestamp`, `level`, the fields of every span the event is in
/// (outermost first: a request's `op` and `session`, a terminated lease's `lease_id`), then the
/// event's own fields, all at the top level, so a line logged deep in a close still names the
/// request and the lease it belongs to. The formatter of tracing-subscriber nests span fields
/// under `span`/`spans`, which a log pipeline cannot index as `lease_id`.
struct FlatJson;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for FlatJson
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        use serde_json::{Map, Value};
        let mut obj = Map::new();
        obj.insert(
            "timestamp".into(),
            Value::String(
                humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string(),
            ),
        );
        obj.insert(
            "level".into(),
            Value::String(event.metadata().level().to_string()),
        );
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                let Some(fields) = ext.get::<tracing_subscriber::fmt::FormattedFields<N>>() else {
                    continue;
                };
                if let Ok(Value::Object(m)) = serde_json::from_str::<Value>(fields) {
                    obj.extend(m);
                }
            }
        }
        event.record(&mut JsonVisitor(&mut obj));
        let line = serde_json::to_string(&obj).map_err(|_| std::fmt::Error)?;
        writeln!(writer, "{line}")
    }
}

/// Records an event's fields as JSON values (numbers and booleans stay typed, a [`json`] field is
/// its JSON value).
struct JsonVisitor<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl tracing::field::Visit for JsonVisitor<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
    fn record_error(
        &mut self,
        field: &tracing::field::Field,
        value: &(dyn std::error::Error + 'static),
    ) {
        let v = match value.downcast_ref::<crate::logvalue::LogJson>() {
            Some(j) => j.0.clone(),
            None => value.to_string().into(),
        };
        self.0.insert(field.name().into(), v);
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
}
