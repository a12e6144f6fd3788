//! `leash snapshot` and `leash simulate FILE`: write down what a decision reads on this host
//! ([`crate::controller::snapshot`]), and replay a decision from such a file anywhere
//! ([`crate::controller::simulate`]), printing what `reap --dry-run` prints and then the timeline
//! of signals. `simulate`'s exit status is for CI: 0 no signal, 1 some, 2 a refusal (a file
//! that is not a snapshot, of a newer version, with a cycle in its parent links, an unknown
//! lease) or an expectation the plan does not meet.

use super::exit::Failure;
use crate::controller::simulate::{self, SimVerb, Simulation};
use crate::controller::snapshot::{Expectation, SnapshotDoc, SnapshotFilter};
use crate::controller::Controller;
use crate::proc::LiveTable;
use crate::signal::{Delivery, SimEvent, SimWhat};
use crate::state::StateRoot;
use clap::Args;
use leash_core::kind::{exitcode, Kind};
use std::path::PathBuf;

pub(super) const SNAPSHOT_ABOUT: &str = "Write, as JSON on stdout, what a decision reads: the \
gateway (id, wrapper root), the caller, the leases and legacy records (all, or those --lease and \
--session name), and the processes that matter (each lease's root, tree, group and cgroup \
members, every process carrying lease markers, the processes the leases' pids name now) with \
pid, ppid, pgid, sid, uid, start time, pidfs inode, state, exe, argv and the lease markers of \
the environment. No other environment value is written; the file says so in its `environment` \
field. Its format is versioned (snapshot.schema.json in leash's documentation). Replay it with `leash simulate FILE`. Signals nothing.";

pub(super) const SIMULATE_ABOUT: &str = "Replay a snapshot (from `leash snapshot`, or a fixture \
written by hand in the same format) through the same plan, guards and TERM → grace → KILL \
escalation as `reap` (the default), `close --lease` or `verify`, with a recording signaller on a \
simulated clock: nothing on this host is signalled. Prints what `reap --dry-run` would print, \
then the verb's outcome and the timeline of signals (`t+0 ms SIGTERM pid 1201`). With --expect, \
checks the pids that must and must not be signalled and prints a diff when the plan disagrees.";

pub(super) const SIMULATE_CODES: &str = "\
Exit codes:
  0    no process would be signalled (with --expect: the expectation holds)
  1    some process would be signalled
  2    refused: not a snapshot, a newer version, a cycle in its parent links, an unknown lease,
       bad usage; or (with --expect) the plan disagrees with the expectation";

#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// Only this lease (repeatable)
    #[arg(long = "lease", value_name = "ID")]
    pub leases: Vec<String>,
    /// Only this session's leases and legacy records (repeatable)
    #[arg(long, value_name = "KEY", value_parser = super::parse::parse_key)]
    pub session: Vec<String>,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("verb").args(["reap", "close", "verify"])))]
pub struct SimulateArgs {
    /// The snapshot to replay
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Replay `leash reap` (the default)
    #[arg(long)]
    pub reap: bool,
    /// Replay `leash close` of this lease
    #[arg(long, value_name = "LEASE")]
    pub close: Option<String>,
    /// Replay `leash verify` of this lease
    #[arg(long, value_name = "LEASE")]
    pub verify: Option<String>,
    /// A JSON file of {"signalled": [pids, in order], "notSignalled": [pids]} (or a document
    /// holding one under "expect", such as the snapshot itself)
    #[arg(long, value_name = "FILE")]
    pub expect: Option<PathBuf>,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

/// A refusal of `simulate`: exit 2 whatever its kind.
fn refused(e: impl std::fmt::Display) -> Failure {
    Failure::new(Kind::Usage, e.to_string())
}

pub(super) fn run_snapshot(root: StateRoot, a: SnapshotArgs) -> Result<u8, Failure> {
    let ctl = Controller::open(root, &LiveTable)?;
    let doc = ctl.snapshot(&SnapshotFilter {
        leases: a.leases,
        sessions: a.session,
    })?;
    super::output::print_json(&doc);
    Ok(exitcode::OK)
}

pub(super) fn run_simulate(a: SimulateArgs) -> Result<u8, Failure> {
    let doc = SnapshotDoc::load(&a.file).map_err(refused)?;
    let expect = match &a.expect {
        Some(p) => {
            let name = p.display().to_string();
            let text = std::fs::read_to_string(p)
                .map_err(|e| refused(format!("cannot read {name}: {e}")))?;
            Some(Expectation::parse(&text, &name).map_err(refused)?)
        }
        None => None,
    };
    let verb = match (&a.close, &a.verify) {
        (Some(id), _) => SimVerb::Close(id.clone()),
        (None, Some(id)) => SimVerb::Verify(id.clone()),
        (None, None) => SimVerb::Reap,
    };
    let sim = simulate::simulate(&doc, &verb, expect.as_ref()).map_err(refused)?;
    print(&sim, a.json);
    Ok(exit_code(&sim))
}

/// 2 when an expectation was given and the plan disagrees with it; with one that holds, 0;
/// else 1 when any process would be signalled, 0 when none.
pub(super) fn exit_code(sim: &Simulation) -> u8 {
    match &sim.expect {
        Some(e) if !e.diff.is_empty() => Kind::Usage.exit_code(),
        Some(_) => exitcode::OK,
        None if sim.signals_any() => exitcode::FAILURE,
        None => exitcode::OK,
    }
}

/// One line of the timeline: `t+3000 ms SIGKILL pid 1204`, with ` group [members]` for a signal
/// to the group the process leads and ` (already gone)` when it had exited.
pub fn timeline_line(e: &SimEvent) -> String {
    match &e.what {
        SimWhat::Signal {
            signal,
            group,
            delivery,
            members,
        } => format!(
            "t+{} ms {} pid {}{}{}",
            e.at,
            signal.name(),
            e.pid,
            if *group {
                format!(" group {members:?}")
            } else {
                String::new()
            },
            match delivery {
                Delivery::Delivered => "",
                Delivery::AlreadyGone => " (already gone)",
                Delivery::CgroupKill => " (cgroup.kill)",
            }
        ),
        SimWhat::Refused { reason } => {
            format!("t+{} ms refused pid {}: {reason}", e.at, e.pid)
        }
        SimWhat::CgroupKill { cgroup, members } => {
            format!("t+{} ms cgroup.kill {cgroup} {members:?}", e.at)
        }
    }
}

fn print(sim: &Simulation, json: bool) {
    if json {
        super::output::print_json(sim);
        return;
    }
    super::output::reap_plan(&sim.plan, false);
    outln!();
    match (&sim.reap, &sim.close, &sim.verify) {
        (Some(r), _, _) => {
            outln!("simulated reap:");
            super::output::reap_report(r, false);
        }
        (_, Some(c), _) => {
            outln!("simulated close:");
            super::output::close(c, false);
        }
        (_, _, Some(v)) => {
            outln!("simulated verify:");
            super::verify::print(v, false);
        }
        _ => {}
    }
    outln!();
    outln!("timeline (simulated clock; nothing on this host was signalled):");
    if sim.timeline.is_empty() {
        outln!("  no signal");
    }
    for e in &sim.timeline {
        outln!("  {}", timeline_line(e));
    }
    if let Some(e) = &sim.expect {
        outln!();
        if e.diff.is_empty() {
            outln!("expectation holds");
        } else {
            outln!("expectation not met:");
            for d in &e.diff {
                outln!("  {d}");
            }
        }
    }
}
