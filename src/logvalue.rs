//! A log field's value as JSON, for every layer that logs (the store, the controller, the daemon,
//! mcp): here, at the bottom, so that logging a value imports nothing above the caller (it lived
//! in `cli/logging.rs`, which made the store and the controller import the CLI). The CLI's
//! subscriber (`cli/logging.rs`) renders it.

/// A log field holding `value` as the protocol spells it: `role = logvalue::json(&s.role)` logs
/// `"adapter"` (the serde name, not the Rust `Adapter`), `argv = logvalue::json(&argv)` an array,
/// a summary an object. The JSON log emits it as that JSON value; the text log prints it compact
/// (a string bare: `role=adapter`, `argv=["cat"]`). tracing-subscriber has no stable way to nest a
/// value in a field (its `valuable` support needs `--cfg tracing_unstable`), and a visitor sees
/// every other kind of field only as text, so the value travels as an error: the one field kind a
/// visitor receives as a `'static` type it can downcast (the JSON log's visitor in `cli/logging.rs`).
pub fn json<T: serde::Serialize + ?Sized>(
    value: &T,
) -> Box<dyn std::error::Error + Send + Sync + 'static> {
    Box::new(LogJson(
        serde_json::to_value(value).unwrap_or(serde_json::Value::Null),
    ))
}

/// A line received as JSON text (a request), logged as its JSON value; a line that is not JSON
/// is logged as its text.
pub fn json_line(line: &[u8]) -> Box<dyn std::error::Error + Send + Sync + 'static> {
    Box::new(LogJson(serde_json::from_slice(line).unwrap_or_else(|_| {
        String::from_utf8_lossy(line).into_owned().into()
    })))
}

/// A field's value as JSON (see [`json`]).
#[derive(Debug)]
pub struct LogJson(pub(crate) serde_json::Value);

impl std::fmt::Display for LogJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            serde_json::Value::String(s) => f.write_str(s),
            v => write!(f, "{v}"),
        }
    }
}

impl std::error::Error for LogJson {}
