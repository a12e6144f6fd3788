//! The daemon's wire protocol: newline-delimited JSON over a Unix socket (see `docs/protocol.md`).
//!
//! Everything here is pure: [`parse_request`] turns one line into a [`Request`] or a
//! [`ProtoError`] that already knows its error code and, when it could be read, the request id,
//! so a malformed line always gets a reply and never takes the connection down. A fuzz target
//! can call [`parse_request`] on arbitrary bytes.
//!
//! By concern: this file holds the table of ops (`ops!`) and the request envelope;
//! `requests.rs` the request types, one per op, with their [`OpRequest`] (name, parse, reply
//! type); `reply.rs` the replies and stream items (the daemon builds them, the client reads them
//! back into the same types) and the `*_line` functions that render them; the wire-code table is
//! `leash_core::kind::CODES`; `framing.rs` the [`LineReader`] that frames a byte stream into lines with a
//! hard length limit.

mod framing;
mod reply;
mod requests;
pub mod strict_json;
pub use framing::*;
pub use reply::*;
pub use requests::*;

use crate::controller::LeaseRef;
use leash_core::kind::Code;
use serde::Serialize;
use serde_json::Value;

/// The longest request line accepted, newline excluded.
pub const MAX_LINE: usize = 1 << 20;

/// The protocol version `hello` reports. Additions that old clients can ignore (a new op, a new
/// optional field, a new stream item a client asks for) are announced as features instead.
pub const PROTOCOL_VERSION: u32 = 1;

/// A request type of the table of ops: the op's name on the wire (written only here), how its
/// fields parse, and the type of its reply's `result` (which the client reads back).
pub trait OpRequest: Sized {
    const NAME: &'static str;
    type Reply: Serialize;
    /// The request's fields (`id` and `op` removed), checked at the edge: a bad one is a
    /// `bad_request` with a message naming the field.
    fn parse(fields: Value) -> Result<Self, (Code, String)>;
}

/// Runs requests of type `T`: the daemon's connection implements it once per row of the table
/// ([`Op::dispatch`] does not compile until every op has its handler).
pub trait Handles<T> {
    /// What a handler hands back to the dispatcher.
    type Done;
    fn handle(self, request: T) -> Self::Done;
}

/// Defines [`Op`], [`OPS`], the names and the parse and handler dispatch from one list of rows
/// `Variant(RequestType)`.
macro_rules! ops {
    ($($(#[$doc:meta])* $variant:ident($ty:ty),)*) => {
        /// One parsed request's op and its fields: a variant per row of the table.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Op {
            $($(#[$doc])* $variant($ty),)*
        }

        /// The operation names, in the order `docs/protocol.md` lists them (the table's).
        pub const OPS: &[&str] = &[$(<$ty as OpRequest>::NAME,)*];

        impl Op {
            /// The op's name on the wire (a label of the request metrics).
            pub fn name(&self) -> &'static str {
                match self {
                    $(Op::$variant(_) => <$ty as OpRequest>::NAME,)*
                }
            }

            /// Hands the request to its handler.
            pub fn dispatch<H, D>(self, handler: H) -> D
            where
                $(H: Handles<$ty, Done = D>,)*
            {
                match self {
                    $(Op::$variant(r) => <H as Handles<$ty>>::handle(handler, r),)*
                }
            }
        }

        fn parse_op(op: &str, fields: Value) -> Result<Op, (Code, String)> {
            $(
                if op == <$ty as OpRequest>::NAME {
                    return <$ty as OpRequest>::parse(fields).map(Op::$variant);
                }
            )*
            Err((
                Code::UnknownOp,
                format!(
                    "unknown op {:?} (one of: {})",
                    truncate(op, 64),
                    OPS.join(", ")
                ),
            ))
        }
    };
}

// The table of ops, in the order `docs/protocol.md` lists them. A new op is a row here, its
// request type (`requests.rs`), its reply type (`reply.rs`) and its handler (a file of its own
// in `daemon/conn/`).
ops! {
    Status(StatusRequest),
    /// Boxed: the largest request by far, and every other op would pay its size.
    Ensure(Box<Ensure>),
    Send(Send),
    Attach(Attach),
    Cancel(Cancel),
    Close(Close),
    Reap(Reap),
    Leases(Leases),
    Sessions(SessionsRequest),
    Events(Events),
    Verify(Verify),
    Metrics(MetricsRequest),
    Hello(Hello),
    Ping(Ping),
    Detach(Detach),
    /// Boxed, as `ensure`: large beside the other requests.
    Exec(Box<crate::controller::exec::ExecAsk>),
    Upgrade(UpgradeRequest),
}

/// A request that could not be parsed, with what is needed to answer it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProtoError {
    /// The request's id when it could be read, else `null`.
    pub id: Value,
    pub code: Code,
    pub message: String,
}

impl ProtoError {
    fn new(id: &Value, code: Code, message: impl Into<String>) -> ProtoError {
        ProtoError {
            id: id.clone(),
            code,
            message: message.into(),
        }
    }
}

/// One parsed request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Echoed in the reply and in every stream item: a string or a number.
    pub id: Value,
    pub op: Op,
}

/// Parses one request line (without its newline). Pure: no I/O, no allocation beyond the
/// result, any input gives `Ok` or a [`ProtoError`] (never a panic).
pub fn parse_request(line: &[u8]) -> Result<Request, ProtoError> {
    let null = Value::Null;
    if line.len() > MAX_LINE {
        return Err(ProtoError::new(
            &null,
            Code::LineTooLong,
            format!(
                "request line of {} bytes exceeds the limit of {MAX_LINE}",
                line.len()
            ),
        ));
    }
    let text = std::str::from_utf8(line).map_err(|e| {
        ProtoError::new(
            &null,
            Code::BadUtf8,
            format!("request is not valid UTF-8 ({e})"),
        )
    })?;
    // Strict: an object with a key twice is refused (serde_json would keep the last one).
    let value: Value = strict_json::parse(text).map_err(|e| {
        let code = if e.to_string().starts_with("duplicate key") {
            Code::BadRequest
        } else {
            Code::BadJson
        };
        ProtoError::new(&null, code, format!("request is not valid JSON: {e}"))
    })?;
    let Value::Object(mut map) = value else {
        return Err(ProtoError::new(
            &null,
            Code::BadJson,
            "request must be a JSON object like {\"id\": 1, \"op\": \"status\"}",
        ));
    };
    let id = match map.remove("id") {
        Some(v @ Value::String(_)) => v,
        // Only integers that read back exactly: a larger number (or a fraction) would come back
        // as a float the client could not match with its request.
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Value::Number(n),
        Some(Value::Number(n)) => {
            return Err(ProtoError::new(
                &null,
                Code::BadRequest,
                format!(
                    "\"id\" {n} is not an integer between -2^63 and 2^64-1; use such an integer or a string"
                ),
            ))
        }
        Some(other) => {
            return Err(ProtoError::new(
                &null,
                Code::BadRequest,
                format!(
                    "\"id\" must be a string or a number, not {}",
                    kind_of(&other)
                ),
            ))
        }
        None => {
            return Err(ProtoError::new(
                &null,
                Code::BadRequest,
                "missing \"id\" (a string or number echoed in the reply)",
            ))
        }
    };
    let op = match map.remove("op") {
        Some(Value::String(s)) => s,
        Some(other) => {
            return Err(ProtoError::new(
                &id,
                Code::BadRequest,
                format!("\"op\" must be a string, not {}", kind_of(&other)),
            ))
        }
        None => {
            return Err(ProtoError::new(
                &id,
                Code::BadRequest,
                format!("missing \"op\" (one of: {})", OPS.join(", ")),
            ))
        }
    };
    let op =
        parse_op(&op, Value::Object(map)).map_err(|(code, msg)| ProtoError::new(&id, code, msg))?;
    Ok(Request { id, op })
}

fn fields_of<T: serde::de::DeserializeOwned>(op: &str, v: Value) -> Result<T, (Code, String)> {
    serde_json::from_value(v).map_err(|e| bad(format!("{op}: {e}")))
}

fn one_target(
    op: &str,
    session: Option<String>,
    lease: Option<String>,
) -> Result<LeaseRef, (Code, String)> {
    match (session, lease) {
        (Some(s), None) => {
            check_key("session", &s)?;
            Ok(LeaseRef::Session(s))
        }
        (None, Some(l)) => {
            check_key("lease", &l)?;
            Ok(LeaseRef::Id(l))
        }
        (Some(_), Some(_)) => Err(bad(format!(
            "{op}: give \"session\" or \"lease\", not both"
        ))),
        (None, None) => Err(bad(format!("{op}: missing \"session\" (or \"lease\")"))),
    }
}

fn bad(msg: impl Into<String>) -> (Code, String) {
    (Code::BadRequest, msg.into())
}

/// The one key rule ([`leash_core::limits::check_key`]), the field named as on the wire.
fn check_key(name: &str, v: &str) -> Result<(), (Code, String)> {
    leash_core::limits::check_key("key", v).map_err(|e| bad(format!("\"{name}\": {e}")))
}

/// A millisecond field against its real range ([`leash_core::limits`]): `bad_request` naming the range.
fn check_ms(
    op: &str,
    name: &str,
    v: Option<u64>,
    check: fn(&'static str, u64) -> Result<u64, leash_core::limits::ValueError>,
) -> Result<(), (Code, String)> {
    match v {
        Some(ms) => check("value", ms)
            .map(|_| ())
            .map_err(|e| bad(format!("{op}: \"{name}\": {e}"))),
        None => Ok(()),
    }
}

/// The one rule for `since` (`attach`, `events`): 0 (from the start) or a seq, never negative.
fn check_since(op: &str, since: i64) -> Result<(), (Code, String)> {
    if since < 0 {
        return Err(bad(format!(
            "{op}: \"since\" must be 0 or a seq, got {since}"
        )));
    }
    Ok(())
}

fn no_nul(name: &str, v: &str) -> Result<(), (Code, String)> {
    if v.contains('\0') {
        Err(bad(format!("\"{name}\" must not contain NUL")))
    } else {
        Ok(())
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use leash_core::visibility::Visibility;

    fn code_of(line: &[u8]) -> Code {
        parse_request(line).unwrap_err().code
    }

    #[test]
    fn parses_every_op() {
        type Check = fn(&Op) -> bool;
        let cases: &[(&str, Check)] = &[
            (r#"{"id":1,"op":"status"}"#, |o| matches!(o, Op::Status(_))),
            (
                r#"{"id":"a","op":"ensure","session":"s","argv":["cat"],"env":{"A":"1"},"graceMs":5}"#,
                |o| matches!(o, Op::Ensure(e) if e.argv == ["cat"] && e.grace_ms == Some(5)),
            ),
            (
                r#"{"id":2,"op":"send","session":"s","line":"{}"}"#,
                |o| matches!(o, Op::Send(s) if s.line == "{}"),
            ),
            (
                r#"{"id":3,"op":"attach","session":"s","since":7}"#,
                |o| matches!(o, Op::Attach(a) if a.since == 7),
            ),
            (
                r#"{"id":4,"op":"cancel","session":"s","acpSessionId":"x"}"#,
                |o| matches!(o, Op::Cancel(c) if c.acp_session_id.as_deref() == Some("x")),
            ),
            (
                r#"{"id":5,"op":"close","lease":"L","sessions":["a","b"]}"#,
                |o| matches!(o, Op::Close(c) if c.targets.len() == 3),
            ),
            (
                r#"{"id":6,"op":"reap","dryRun":true}"#,
                |o| matches!(o, Op::Reap(r) if r.dry_run),
            ),
            (r#"{"id":7,"op":"leases","state":"open"}"#, |o| {
                matches!(o, Op::Leases(_))
            }),
            (
                r#"{"id":8,"op":"sessions","requesterSessionKey":"r","visibility":"self"}"#,
                |o| matches!(o, Op::Sessions(s) if s.scope.visibility == Visibility::SelfOnly),
            ),
            (r#"{"id":9,"op":"events","session":"s"}"#, |o| {
                matches!(o, Op::Events(_))
            }),
            (
                r#"{"id":10,"op":"verify","lease":"L"}"#,
                |o| matches!(o, Op::Verify(v) if v.target == LeaseRef::Id("L".into())),
            ),
            (r#"{"id":11,"op":"metrics"}"#, |o| {
                matches!(o, Op::Metrics(_))
            }),
            (
                r#"{"id":12,"op":"hello","client":"t/1","protocol":1,"events":true}"#,
                |o| matches!(o, Op::Hello(h) if h.events),
            ),
            (r#"{"id":13,"op":"ping"}"#, |o| matches!(o, Op::Ping(_))),
            (
                r#"{"id":14,"op":"detach","attachId":7}"#,
                |o| matches!(o, Op::Detach(d) if d.attach_id == 7),
            ),
            (
                r#"{"id":15,"op":"exec","stateDir":"/s","leaseId":"0190b1f2-7c3a-7d4e-8f00-1234567890ab","graceMs":5,"argv":["true"],"wrapper":"/s/wrappers/leash-wrap-1-2","containment":"off"}"#,
                |o| matches!(o, Op::Exec(a) if a.argv == ["true"] && a.grace_ms == 5),
            ),
            (r#"{"id":16,"op":"upgrade"}"#, |o| {
                matches!(o, Op::Upgrade(_))
            }),
        ];
        for (line, check) in cases {
            let r = parse_request(line.as_bytes()).unwrap_or_else(|e| panic!("{line}: {e:?}"));
            assert!(check(&r.op), "{line}: {:?}", r.op);
        }
        assert_eq!(OPS.len(), cases.len());
    }

    /// The table is the one list of ops: each name once, each parses to the op of that name
    /// (a field-less request is either accepted or refused for its fields, never `unknown_op`),
    /// and the refusal of an unknown op lists them all.
    #[test]
    fn the_table_names_every_op_once() {
        let mut seen = std::collections::HashSet::new();
        for name in OPS {
            assert!(seen.insert(*name), "{name} is in the table twice");
            let line = format!(r#"{{"id":1,"op":"{name}"}}"#);
            match parse_request(line.as_bytes()) {
                Ok(r) => assert_eq!(r.op.name(), *name),
                Err(e) => assert_eq!(e.code, Code::BadRequest, "{name}: {}", e.message),
            }
        }
        let e = parse_request(br#"{"id":1,"op":"nope"}"#).unwrap_err();
        assert_eq!(e.code, Code::UnknownOp);
        assert!(
            e.message
                .ends_with(&format!("(one of: {})", OPS.join(", "))),
            "{}",
            e.message
        );
        assert_eq!(
            OPS,
            [
                "status", "ensure", "send", "attach", "cancel", "close", "reap", "leases",
                "sessions", "events", "verify", "metrics", "hello", "ping", "detach", "exec",
                "upgrade"
            ],
            "the order docs/protocol.md lists them in"
        );
    }

    #[test]
    fn malformed_requests_get_codes_and_keep_the_id_when_readable() {
        assert_eq!(code_of(b"{nope"), Code::BadJson);
        assert_eq!(code_of(b"[1,2]"), Code::BadJson);
        assert_eq!(code_of(b"\"status\""), Code::BadJson);
        assert_eq!(code_of(b"{\"id\":1,\"op\":\"st\xffatus\"}"), Code::BadUtf8);
        assert_eq!(code_of(br#"{"op":"status"}"#), Code::BadRequest);
        assert_eq!(code_of(br#"{"id":[1],"op":"status"}"#), Code::BadRequest);
        let e = parse_request(br#"{"id":9,"op":"frobnicate"}"#).unwrap_err();
        assert_eq!((e.code, e.id), (Code::UnknownOp, Value::from(9)));
        let e = parse_request(br#"{"id":"x","op":"send","line":"a"}"#).unwrap_err();
        assert_eq!((e.code, e.id.clone()), (Code::BadRequest, Value::from("x")));
        assert!(e.message.contains("session"), "{}", e.message);
        assert_eq!(
            code_of(br#"{"id":1,"op":"status","extra":1}"#),
            Code::BadRequest
        );
        assert_eq!(
            code_of(br#"{"id":1,"op":"reap","dryrun":true}"#),
            Code::BadRequest
        );
        assert_eq!(
            code_of(br#"{"id":1,"op":"send","session":"s","line":"a\nb"}"#),
            Code::BadRequest
        );
        assert_eq!(
            code_of(br#"{"id":1,"op":"attach","session":"s","since":"x"}"#),
            Code::BadRequest
        );
        assert_eq!(
            code_of(br#"{"id":1,"op":"cancel","session":"s","lease":"l"}"#),
            Code::BadRequest
        );
        assert_eq!(
            code_of(br#"{"id":1,"op":"ensure","session":"s","argv":[]}"#),
            Code::BadRequest
        );
        assert_eq!(
            code_of(br#"{"id":1,"op":"ensure","session":"s","argv":["x"],"env":{"LEASH_WRAP_BIN":"/tmp/evil"}}"#),
            Code::BadRequest
        );
        assert_eq!(
            code_of(br#"{"id":1,"op":"ensure","session":"s","argv":["x"],"cwd":"rel"}"#),
            Code::BadRequest
        );
        assert_eq!(
            code_of(br#"{"id":1,"op":"leases","state":"gone"}"#),
            Code::BadRequest
        );
        assert_eq!(
            code_of(br#"{"id":1,"op":"sessions","visibility":"everything"}"#),
            Code::BadRequest
        );
        assert_eq!(
            code_of(br#"{"id":1,"op":"sessions","a2a":false,"a2aAllow":["a:b"]}"#),
            Code::BadRequest
        );
        let long = vec![b' '; MAX_LINE + 1];
        assert_eq!(code_of(&long), Code::LineTooLong);
    }

    #[test]
    fn close_takes_a_reason_and_discard_persistent_state() {
        let r = parse_request(
            br#"{"id":1,"op":"close","session":"s","reason":"user closed","discardPersistentState":true}"#,
        )
        .unwrap();
        assert!(
            matches!(&r.op, Op::Close(c) if c.discard_persistent_state && c.reason.as_deref() == Some("user closed")),
            "{:?}",
            r.op
        );
        let plain = parse_request(br#"{"id":1,"op":"close","session":"s"}"#).unwrap();
        assert!(
            matches!(&plain.op, Op::Close(c) if !c.discard_persistent_state && c.reason.is_none())
        );
        let long = format!(
            r#"{{"id":1,"op":"close","session":"s","reason":"{}"}}"#,
            "x".repeat(201)
        );
        for line in [
            br#"{"id":1,"op":"close","session":"s","reason":"two\nlines"}"#.to_vec(),
            long.into_bytes(),
            br#"{"id":1,"op":"close","session":"s","discardPersistentState":"yes"}"#.to_vec(),
        ] {
            assert_eq!(
                code_of(&line),
                Code::BadRequest,
                "{}",
                String::from_utf8_lossy(&line)
            );
        }
    }

    #[test]
    fn millisecond_fields_are_checked_against_their_range() {
        for line in [
            r#"{"id":1,"op":"ensure","session":"s","argv":["x"],"graceMs":9223372036854775808}"#,
            r#"{"id":1,"op":"ensure","session":"s","argv":["x"],"graceMs":3600001}"#,
            r#"{"id":1,"op":"close","session":"s","graceMs":18446744073709551615}"#,
            r#"{"id":1,"op":"reap","graceMs":3600001}"#,
            r#"{"id":1,"op":"reap","retentionMs":18446744073709551615}"#,
        ] {
            let e = parse_request(line.as_bytes()).unwrap_err();
            assert_eq!(e.code, Code::BadRequest, "{line}");
            assert!(e.message.contains("at most"), "{line}: {}", e.message);
        }
        let ok = r#"{"id":1,"op":"ensure","session":"s","argv":["x"],"graceMs":3600000}"#;
        assert!(parse_request(ok.as_bytes()).is_ok());
        let e =
            parse_request(br#"{"id":1,"op":"ensure","session":"a\nb","argv":["x"]}"#).unwrap_err();
        assert!(e.message.contains("control characters"), "{}", e.message);
    }

    #[test]
    fn limits_waits_and_since_are_refused_at_the_edge_by_one_rule() {
        for (line, says) in [
            (
                r#"{"id":1,"op":"ensure","session":"s","argv":["x"],"pidsMax":0}"#,
                "pidsMax",
            ),
            (
                r#"{"id":1,"op":"ensure","session":"s","argv":["x"],"memoryMax":0}"#,
                "memoryMax",
            ),
            (
                r#"{"id":1,"op":"ensure","session":"s","argv":["x"],"cpuMax":"0"}"#,
                "cpuMax",
            ),
            (
                r#"{"id":1,"op":"ensure","session":"s","argv":["x"],"waitMs":60001}"#,
                "waitMs",
            ),
            (
                r#"{"id":1,"op":"events","session":"s","since":-5}"#,
                "since",
            ),
            (
                r#"{"id":1,"op":"attach","session":"s","since":-5}"#,
                "since",
            ),
        ] {
            let e = parse_request(line.as_bytes()).unwrap_err();
            assert_eq!(e.code, Code::BadRequest, "{line}");
            assert!(e.message.contains(says), "{line}: {}", e.message);
        }
        for ok in [
            r#"{"id":1,"op":"ensure","session":"s","argv":["x"],"pidsMax":1,"memoryMax":1,"cpuMax":"0.5","waitMs":60000}"#,
            r#"{"id":1,"op":"events","session":"s","since":0}"#,
        ] {
            assert!(parse_request(ok.as_bytes()).is_ok(), "{ok}");
        }
    }

    #[test]
    fn additions_parse_and_refuse_what_they_should() {
        // `ensure {session}`: the stored spec; other spec fields without argv are ambiguous.
        let r = parse_request(br#"{"id":1,"op":"ensure","session":"s"}"#).unwrap();
        assert!(matches!(&r.op, Op::Ensure(e) if e.wants_stored_spec() && e.persist_spec));
        assert_eq!(
            code_of(br#"{"id":1,"op":"ensure","session":"s","cwd":"/"}"#),
            Code::BadRequest
        );
        let r = parse_request(
            br#"{"id":1,"op":"ensure","session":"s","argv":["x"],"persistSpec":false,"waitMs":0}"#,
        )
        .unwrap();
        assert!(
            matches!(&r.op, Op::Ensure(e) if !e.persist_spec && e.wait_ms == Some(0)),
            "{r:?}"
        );
        let r = parse_request(br#"{"id":1,"op":"attach","session":"s","stderr":true}"#).unwrap();
        assert!(matches!(&r.op, Op::Attach(a) if a.stderr));
        assert_eq!(code_of(br#"{"id":1,"op":"ping","x":1}"#), Code::BadRequest);
        assert_eq!(code_of(br#"{"id":1,"op":"detach"}"#), Code::BadRequest);
        assert_eq!(
            code_of(br#"{"id":1,"op":"detach","attachId":null}"#),
            Code::BadRequest
        );
        assert_eq!(
            code_of(br#"{"id":1,"op":"hello","events":"yes"}"#),
            Code::BadRequest
        );
    }

    #[test]
    fn replies_are_single_lines() {
        let id = Value::from("a\nb");
        for line in [
            ok_line(&id, &serde_json::json!({"x": "y\nz"})),
            err_line(
                &id,
                Code::Internal,
                "m\n",
                &ErrorData {
                    oldest_seq: Some(3),
                    ..ErrorData::default()
                },
            ),
            stream_line(&id, r#""seq":1,"type":"output","line":"x""#),
            {
                let mut buf = Vec::new();
                stream_line_into(&mut buf, &serde_json::to_string(&id).unwrap(), r#""seq":1"#);
                buf
            },
        ] {
            assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
            let v: Value = serde_json::from_slice(&line).unwrap();
            assert_eq!(v["id"], id);
        }
        let e: Value = serde_json::from_slice(&err_line(
            &id,
            Code::SeqEvicted,
            "m",
            &ErrorData {
                oldest_seq: Some(3),
                ..ErrorData::default()
            },
        ))
        .unwrap();
        assert_eq!(e["error"]["code"], "seq_evicted");
        assert_eq!(e["error"]["oldestSeq"], 3);
    }
}
