//! The lifecycle fixtures (`fixtures/lifecycle/`), read as the simulator tests read them: the
//! cases, a case's leases (each with the hash of its command, which the files leave out) and
//! its caller. The planner's test, the controller simulator's, `leash simulate`'s and the
//! schema's all stage the same cases through here.

use leash_core::guard::Caller;
use leash_core::model::{command_hash, Lease};
use leash_core::plan::ReapOptions;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// `fixtures/lifecycle/<rel>`.
pub fn lifecycle_fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/lifecycle")
        .join(rel)
}

/// Every case of `fixtures/lifecycle/` (its `.json` files, not its subfolders), sorted.
pub fn lifecycle_fixtures() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(lifecycle_fixture(""))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    v.sort();
    v
}

/// A case's file, parsed.
pub fn read_case(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A case's leases, each given the hash of its command.
pub fn case_leases(doc: &Value) -> Vec<Lease> {
    doc["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            let mut l = l.clone();
            let argv: Vec<String> = serde_json::from_value(l["command"].clone()).unwrap();
            l["commandHash"] = Value::String(command_hash(&argv));
            serde_json::from_value(l).unwrap()
        })
        .collect()
}

/// The process a case runs `close` and `reap` as.
pub fn case_caller(doc: &Value) -> Caller {
    let c = &doc["caller"];
    Caller {
        pid: c["pid"].as_i64().unwrap() as i32,
        pgid: c["pgid"].as_i64().unwrap() as i32,
        uid: c["uid"].as_u64().unwrap() as u32,
    }
}

/// The reap every case is judged by: live leases left alone, nothing expired by retention, at
/// the cases' clock, each lease's own grace.
pub fn case_reap_options() -> ReapOptions {
    ReapOptions {
        include_live: false,
        retention_ms: i64::MAX / 4,
        now_ms: 1_764_460_100_000,
        grace_ms: None,
    }
}
