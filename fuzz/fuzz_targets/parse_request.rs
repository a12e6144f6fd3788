//! Fuzz target: the daemon's NDJSON request parser (`leash::protocol::parse_request`),
//! which sees every line a client writes to the socket. Any bytes must give a request or an
//! error that the daemon can answer, never a panic: a parse error carries one of the
//! pre-request codes (bad UTF-8, bad JSON, line too long, bad request, unknown op) with a
//! message, and an id that is null or the request's own string or number id. Parsing is
//! deterministic, and what it accepts keeps the protocol's framing rules.
#![no_main]

use leash::protocol::{parse_request, Op, MAX_LINE};
use leash_core::kind::Code;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let parsed = parse_request(data);
    assert_eq!(parsed, parse_request(data), "parsing is deterministic");
    match parsed {
        Err(e) => {
            assert!(
                matches!(
                    e.code,
                    Code::BadUtf8
                        | Code::BadJson
                        | Code::LineTooLong
                        | Code::BadRequest
                        | Code::UnknownOp
                ),
                "a parse error has a parse code, not {:?}",
                e.code
            );
            assert_eq!(Code::parse(e.code.as_str()), Some(e.code));
            assert!(!e.message.is_empty());
            assert!(
                matches!(e.id, Value::Null | Value::String(_) | Value::Number(_)),
                "{:?}",
                e.id
            );
            if std::str::from_utf8(data).is_err() && data.len() <= MAX_LINE {
                assert_eq!(e.code, Code::BadUtf8);
            }
        }
        Ok(req) => {
            assert!(data.len() <= MAX_LINE);
            assert!(std::str::from_utf8(data).is_ok());
            assert!(matches!(req.id, Value::String(_) | Value::Number(_)));
            if let Op::Send(s) = &req.op {
                assert!(!s.line.contains(['\n', '\r']), "send takes one line");
            }
        }
    }
});
