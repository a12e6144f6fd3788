//! The hard refusals every signal passes, whatever a lease row says: pid ≤ 1, leash's own pid,
//! the leader of leash's own process group, a process group ≤ 1 or leash's own, and a process of
//! another uid; and the only signals leash may send ([`Sig`]: SIGTERM and SIGKILL, never "every
//! process" or "my group" the way kill(2) could). Pure: the caller and the target are arguments;
//! `leash::signal` applies these right before each pidfd signal, and the planner applies them
//! before it plans one.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The signals leash may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Sig {
    #[serde(rename = "SIGTERM")]
    Term,
    #[serde(rename = "SIGKILL")]
    Kill,
}

impl Sig {
    /// The signal's number (POSIX fixes both: SIGTERM 15, SIGKILL 9; a test in `leash::signal`
    /// compares them with libc's).
    pub fn number(self) -> i32 {
        match self {
            Sig::Term => 15,
            Sig::Kill => 9,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Sig::Term => "SIGTERM",
            Sig::Kill => "SIGKILL",
        }
    }
}

/// Who is signalling: the guards compare targets against it (`leash::signal` reads the current
/// process's with `Caller::current()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Caller {
    pub pid: i32,
    pub pgid: i32,
    pub uid: u32,
}

/// Why leash will not signal a process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "refusal", rename_all = "camelCase")]
pub enum Refusal {
    PidTooLow { pid: i32 },
    OwnPid { pid: i32 },
    OwnGroupLeader { pid: i32 },
    Group { pgid: i32 },
    ForeignUid { pid: i32, uid: u32, ours: u32 },
    Changed { pid: i32, found: u64, expected: u64 },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::PidTooLow { pid } => write!(f, "pid {pid} is 1 or lower: never signalled"),
            Refusal::OwnPid { pid } => write!(f, "pid {pid} is leash itself"),
            Refusal::OwnGroupLeader { pid } => {
                write!(f, "pid {pid} leads leash's own process group")
            }
            Refusal::Group { pgid } => write!(
                f,
                "process group {pgid} is 1 or lower, or leash's own: never signalled"
            ),
            Refusal::ForeignUid { pid, uid, ours } => {
                write!(f, "pid {pid} runs as uid {uid}, not as leash's uid {ours}")
            }
            Refusal::Changed {
                pid,
                found,
                expected,
            } => write!(
                f,
                "pid {pid} is no longer the verified process (start time {found} ≠ {expected}): \
                 pid reused"
            ),
        }
    }
}

impl std::error::Error for Refusal {}

/// Would leash refuse to signal the process `pid`, running as `uid`?
pub fn check_process(pid: i32, uid: u32, caller: &Caller) -> Result<(), Refusal> {
    check_pid(pid, caller)?;
    if uid != caller.uid {
        return Err(Refusal::ForeignUid {
            pid,
            uid,
            ours: caller.uid,
        });
    }
    Ok(())
}

/// The refusals that need only the pid: ≤ 1, leash itself, the leader of leash's group.
pub fn check_pid(pid: i32, caller: &Caller) -> Result<(), Refusal> {
    if pid <= 1 {
        return Err(Refusal::PidTooLow { pid });
    }
    if pid == caller.pid {
        return Err(Refusal::OwnPid { pid });
    }
    if pid == caller.pgid {
        return Err(Refusal::OwnGroupLeader { pid });
    }
    Ok(())
}

/// Would leash refuse to signal the process group `pgid`?
pub fn check_group(pgid: i32, caller: &Caller) -> Result<(), Refusal> {
    if pgid <= 1 || pgid == caller.pgid {
        return Err(Refusal::Group { pgid });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: Caller = Caller {
        pid: 500,
        pgid: 400,
        uid: 1000,
    };

    #[test]
    fn the_hard_refusals() {
        for pid in [i32::MIN, -1, 0, 1] {
            assert_eq!(
                check_process(pid, 1000, &ME),
                Err(Refusal::PidTooLow { pid })
            );
        }
        assert_eq!(
            check_process(500, 1000, &ME),
            Err(Refusal::OwnPid { pid: 500 })
        );
        assert_eq!(
            check_process(400, 1000, &ME),
            Err(Refusal::OwnGroupLeader { pid: 400 })
        );
        assert_eq!(
            check_process(600, 0, &ME),
            Err(Refusal::ForeignUid {
                pid: 600,
                uid: 0,
                ours: 1000
            })
        );
        assert_eq!(check_process(600, 1000, &ME), Ok(()));
        for pgid in [0, 1, 400] {
            assert_eq!(check_group(pgid, &ME), Err(Refusal::Group { pgid }));
        }
        assert_eq!(check_group(600, &ME), Ok(()));
    }

    #[test]
    fn refusals_say_why_on_the_wire_and_to_people() {
        let r = Refusal::ForeignUid {
            pid: 7,
            uid: 0,
            ours: 1000,
        };
        assert_eq!(
            r.to_string(),
            "pid 7 runs as uid 0, not as leash's uid 1000"
        );
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["refusal"], "foreignUid");
        assert_eq!(serde_json::to_value(Sig::Term).unwrap(), "SIGTERM");
    }
}
