//! Bad input over a live connection — broken JSON, non-objects, unknown ops, missing, unknown and
//! mistyped fields, a line over 1 MiB, invalid UTF-8 — each gets an error reply with its documented
//! code (and the request id when it could be read); the same connection keeps working afterwards,
//! and so does the daemon.
mod common;
mod daemon_support;
use common::*;
use daemon_support::*;
use serde_json::{json, Value};

#[test]
fn every_bad_line_gets_an_error_and_the_connection_survives() {
    let tmp = TempDir::new("d-malformed");
    let state = tmp.join("state");
    let daemon = Daemon::start(&state, &[]);
    let mut c = daemon.connect();

    let cases: &[(&[u8], Value, &str)] = &[
        (b"{nope", Value::Null, "bad_json"),
        (b"[1,2,3]", Value::Null, "bad_json"),
        (b"42", Value::Null, "bad_json"),
        (b"{\"op\":\"status\"}", Value::Null, "bad_request"),
        (
            b"{\"id\":{\"a\":1},\"op\":\"status\"}",
            Value::Null,
            "bad_request",
        ),
        (b"{\"id\":1}", json!(1), "bad_request"),
        (b"{\"id\":2,\"op\":7}", json!(2), "bad_request"),
        (
            b"{\"id\":3,\"op\":\"launch_missiles\"}",
            json!(3),
            "unknown_op",
        ),
        (
            b"{\"id\":\"four\",\"op\":\"send\",\"line\":\"x\"}",
            json!("four"),
            "bad_request",
        ),
        (
            b"{\"id\":5,\"op\":\"attach\",\"session\":\"s\",\"since\":\"yesterday\"}",
            json!(5),
            "bad_request",
        ),
        // A misspelt flag must not fall back to a default: a real reap is not a dry run.
        (
            b"{\"id\":6,\"op\":\"reap\",\"dryrun\":true}",
            json!(6),
            "bad_request",
        ),
        (
            b"{\"id\":7,\"op\":\"status\",\"verbose\":true}",
            json!(7),
            "bad_request",
        ),
        (
            b"{\"id\":8,\"op\":\"send\",\"session\":\"s\",\"line\":\"a\\nb\"}",
            json!(8),
            "bad_request",
        ),
        (
            b"{\"id\":9,\"op\":\"ensure\",\"session\":\"s\",\"argv\":[]}",
            json!(9),
            "bad_request",
        ),
        (
            b"{\"id\":10,\"op\":\"send\",\"session\":\"nobody\",\"line\":\"x\"}",
            json!(10),
            "not_found",
        ),
        (
            b"{\"id\":11,\"op\":\"status\",\"x\":\"\xff\xfe\"}",
            Value::Null,
            "bad_utf8",
        ),
        (
            b"{\"id\":12,\"op\":\"close\",\"session\":\"nobody\"}",
            json!(12),
            "not_found",
        ),
    ];
    for (line, id, code) in cases {
        let mut bytes = line.to_vec();
        bytes.push(b'\n');
        c.send_raw(&bytes);
        let r = c.read_line();
        assert_eq!(r["ok"], false, "{}: {r}", String::from_utf8_lossy(line));
        assert_eq!(
            r["error"]["code"],
            *code,
            "{}: {r}",
            String::from_utf8_lossy(line)
        );
        assert_eq!(r["id"], *id, "{}: {r}", String::from_utf8_lossy(line));
        assert!(
            r["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{r}"
        );
    }

    // Over 1 MiB without a newline, then a good request in the same write: the long line is
    // refused, the good one answered.
    let mut long = vec![b'x'; (1 << 20) + 4096];
    long.extend_from_slice(b"\n{\"id\":13,\"op\":\"status\"}\n");
    c.send_raw(&long);
    let r = c.read_line();
    assert_eq!(r["error"]["code"], "line_too_long", "{r}");
    let r = c.read_line();
    assert_eq!(
        (r["id"].clone(), r["ok"].clone()),
        (json!(13), json!(true)),
        "{r}"
    );

    // A long line that is valid JSON is refused as well.
    let big = format!(
        "{{\"id\":14,\"op\":\"send\",\"session\":\"s\",\"line\":\"{}\"}}\n",
        "y".repeat(2 << 20)
    );
    c.send_raw(big.as_bytes());
    assert_eq!(c.read_line()["error"]["code"], "line_too_long");

    // Blank lines are ignored; CRLF is accepted.
    c.send_raw(b"\n  \n{\"id\":15,\"op\":\"status\"}\r\n");
    let r = c.read_line();
    assert_eq!(
        (r["id"].clone(), r["ok"].clone()),
        (json!(15), json!(true)),
        "{r}"
    );

    // The daemon is up and serves this connection and new ones.
    let st = c.call("status", json!({}));
    assert_eq!(st["daemon"]["pid"], daemon.pid.pid);
    assert!(daemon.pid.alive());
    let mut other = daemon.connect();
    other.call("status", json!({}));
}
