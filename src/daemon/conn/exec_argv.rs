//! `execArgv`: the front door's `leash exec`. The `leash` binary has no C library and
//! no parser of its own (src/front/main.rs): it asks the daemon to do, for it, everything
//! `leash exec` does before the wrapper's exec. The daemon reads the peer's command line,
//! environment, current directory and binary from `/proc/<pid>` (the peer proven, as for `exec`,
//! by `SO_PEERPIDFD`, and checked again after the reads), parses them with leash's own parser
//! (the CLI's, handed in as `ServeConfig::peer_exec`), resolves the state root, the containment and the wrapper as
//! that process would, runs the same decision as `leash exec` ([`decide_and_commit`]), and
//! answers with the wrapper's command line and the edits to the peer's environment.
//!
//! Whatever the daemon would not decide exactly as `leash-main` would is answered
//! [`ExecArgvAnswer::Direct`] before anything is made: another state root, other containment
//! settings, `--no-daemon`, `-v`, `LEASH_LOG`, a command line that does not parse, a path that
//! is not UTF-8. Then `leash-main` runs the command line, as it did before the front door.

use super::exec::{peer_origin_reading, test_pause};
use super::*;
use crate::controller::exec::{
    check_limits_enforceable, check_request_for, cli_message, decide_and_commit, lease_markers,
    wrapper_options, ExecError,
};
use protocol::{ExecArgv, ExecArgvAnswer, WrapperEnv};
use std::cell::OnceCell;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// What `/proc/<pid>` says of the peer.
struct PeerProcess {
    proc: PathBuf,
    argv: Vec<OsString>,
    /// `NAME=value` entries, parsed as Rust's std parses `environ`.
    env: Vec<(OsString, OsString)>,
    /// Read when a relative path needs it.
    cwd: OnceCell<Option<PathBuf>>,
    exe: Option<PathBuf>,
}

impl PeerProcess {
    fn read(pid: i32) -> Result<PeerProcess, String> {
        let proc = PathBuf::from(format!("/proc/{pid}"));
        let read = |name: &str| {
            crate::proc::read_proc(proc.join(name))
                .map_err(|e| format!("cannot read /proc/{pid}/{name}: {e}"))
        };
        let argv = nul_separated(read("cmdline")?);
        let env = nul_separated(read("environ")?)
            .into_iter()
            .filter_map(|e| {
                let b = e.into_vec();
                // A name runs to the first `=` after its first byte; an entry without one is no
                // variable (std's rule).
                let at = 1 + b.get(1..)?.iter().position(|&c| c == b'=')?;
                Some((
                    OsString::from_vec(b[..at].to_vec()),
                    OsString::from_vec(b[at + 1..].to_vec()),
                ))
            })
            .collect();
        Ok(PeerProcess {
            cwd: OnceCell::new(),
            exe: std::fs::read_link(proc.join("exe")).ok(),
            proc,
            argv,
            env,
        })
    }

    fn cwd(&self) -> Option<&Path> {
        self.cwd
            .get_or_init(|| std::fs::read_link(self.proc.join("cwd")).ok())
            .as_deref()
    }

    /// The variable as `getenv(3)` would find it in the peer (the first entry of the name).
    fn var(&self, name: &str) -> Option<OsString> {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
}

/// Whether the process of `proc` sees the mounts this one sees (the same mount namespace and
/// root): then the cgroup2 mount the daemon found is the peer's too, and its mount table (all of
/// it rendered by the kernel for one read) is not read.
pub(super) fn same_mounts(proc: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    static OWN: std::sync::OnceLock<Option<(u64, u64)>> = std::sync::OnceLock::new();
    let ns = |p: &Path| {
        std::fs::metadata(p.join("ns/mnt"))
            .ok()
            .map(|m| (m.dev(), m.ino()))
    };
    let own = *OWN.get_or_init(|| ns(Path::new("/proc/self")));
    own.is_some()
        && ns(proc) == own
        && std::fs::read_link(proc.join("root")).is_ok_and(|r| r == Path::new("/"))
}

/// The strings of a `/proc/<pid>/{cmdline,environ}` text, each ended by a NUL.
fn nul_separated(mut bytes: Vec<u8>) -> Vec<OsString> {
    if bytes.last() == Some(&0) {
        bytes.pop();
    } else if bytes.is_empty() {
        return Vec::new();
    }
    bytes
        .split(|&c| c == 0)
        .map(|s| OsString::from_vec(s.to_vec()))
        .collect()
}

fn exec_argv(d: &Daemon, peer: &Peer, ask: ExecArgv) -> Reply<ExecArgvAnswer> {
    let direct = |why: String| -> Reply<ExecArgvAnswer> {
        tracing::debug!(%why, "execArgv: leash-main runs this command line");
        Ok(ExecArgvAnswer::Direct { why })
    };
    if d.is_shutting_down() {
        return direct("the daemon is shutting down".into());
    }
    // The peer's command line, environment and binary, proven its with its stat.
    let (origin, p) = match peer_origin_reading(peer, || PeerProcess::read(peer.pid)) {
        Ok(read) => read,
        Err(why) => return direct(why),
    };
    let Some(parse) = d.cfg.peer_exec else {
        return direct("this daemon reads no command lines".into());
    };
    let var = |k: &str| p.var(k);
    let cwd = || p.cwd().map(Path::to_path_buf);
    let line = match parse(&p.argv, &var, &cwd) {
        Ok(l) => l,
        Err(why) => return direct(format!("not a command line the daemon runs: {why}")),
    };
    if line.needs_main {
        return direct("--no-daemon, -v or LEASH_LOG: leash-main runs it".into());
    }
    // The daemon's root is canonical: a path spelt the same is it (no lookups).
    let same_root = line.state_dir == d.root.dir()
        || std::fs::canonicalize(&line.state_dir).is_ok_and(|dir| dir == d.root.dir());
    if !same_root {
        return direct(format!(
            "the daemon serves state root {}, not {}",
            d.root.dir().display(),
            line.state_dir.display()
        ));
    }
    let mut req = line.request;
    let refuse = |e: ExecError| fail(Code::of(e.kind()), cli_message(&e));
    check_request_for(&req, origin.owner.pid).map_err(refuse)?;
    let shared_mounts = same_mounts(&p.proc);
    // Where the peer's wrapper writes its report, picked from the peer's environment as it
    // would pick it (a path of UTF-8: the lease's row records it as text); only when the peer
    // sees the daemon's mounts (`/dev/shm`, `/run` and `$XDG_RUNTIME_DIR` may be its own), else
    // the state root's `run/`. A `LEASH_RUNTIME_DIR` that cannot be used is leash-main's to
    // refuse in words.
    req.report_dir = if shared_mounts {
        match crate::state::resolve_reports_dir(&var) {
            Ok(dir) => dir,
            Err(e) => return direct(format!("the reports directory: {e}")),
        }
    } else {
        None
    };
    // The containment the peer would resolve (the gateway's directory aside): the daemon
    // commits only with its own, as for `exec`. A refusal leash-main would give (limits without
    // containment) is leash-main's to word.
    let known_mount = shared_mounts
        .then_some(d.containment.mount.as_deref())
        .flatten();
    let mine =
        crate::cgroup::Containment::resolve_lean_for(&req.containment, "", &p.proc, known_mount);
    if check_limits_enforceable(&req.limits, &mine).is_err() {
        return direct("limits without containment: leash-main says why".into());
    }
    if mine.mode != d.containment.mode || mine.root != d.containment.root {
        return direct(format!(
            "the client asked for {}; the daemon resolved {}",
            crate::cgroup::describe(&mine.mode, mine.root.as_deref()),
            crate::cgroup::describe(&d.containment.mode, d.containment.root.as_deref())
        ));
    }
    let wrapper = match crate::install::locate_wrapper_for(
        p.exe.as_deref(),
        p.var(crate::install::ENV_WRAP_BIN),
    )
    .and_then(|src| crate::install::install_from(&src, &d.root.wrapper_root()))
    {
        Ok(w) => w,
        Err(e) => return direct(format!("the wrapper: {e}")),
    };
    // Everything the answer names is text (JSON); checked before anything is made.
    let utf8 = |p: Option<&Path>| p.is_none_or(|p| p.to_str().is_some());
    if !(utf8(Some(d.root.dir())) && utf8(mine.root.as_deref()) && utf8(Some(&wrapper))) {
        return direct("a path of the wrapper's command line is not UTF-8".into());
    }
    test_pause("before");
    let mut store = d.exec_store();
    let (lease, made) = decide_and_commit(
        &mut store,
        &d.root,
        &req,
        &origin,
        Some(&ask.lease_id),
        || Ok(wrapper.clone()),
        |_| d.containment.clone(),
    )
    .map_err(refuse)?;
    drop(store);
    d.checkpoints.committed();
    // The cgroup stays: the peer's wrapper starts the adapter in it.
    drop(made);
    test_pause("after");
    tracing::debug!(lease_id = %lease.lease_id, root_pid = lease.root_pid, "execArgv: lease committed for the peer");
    let text = |s: &std::ffi::OsStr| s.to_string_lossy().into_owned();
    let mut args: Vec<String> = wrapper_options(
        &req,
        &d.root
            .report_path_at(req.report_dir.as_deref(), &lease.lease_id),
        origin.owner.pid,
        lease.cgroup_path.as_deref().map(Path::new),
    )
    .iter()
    .map(|a| text(a))
    .collect();
    args.push("--".into());
    let env = WrapperEnv {
        base: req
            .containment
            .env()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.as_deref().map(text)))
            .collect(),
        clear: req.env.clear,
        keep: req.env.keep.clone(),
        unset: req.env.unset.clone(),
        set: lease_markers(&lease.lease_id, &lease.gateway_instance_id)
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    Ok(ExecArgvAnswer::Committed {
        root_pid: lease.root_pid,
        wrapper: PathBuf::from(&lease.wrapper_path),
        args,
        command_at: p.argv.len() - req.command.len(),
        env,
        lease_id: lease.lease_id,
    })
}

impl Handles<ExecArgv> for Cx<'_> {
    type Done = Timed;

    fn handle(self, ask: ExecArgv) -> Timed {
        let r = exec_argv(self.d, self.peer, ask);
        self.answer::<ExecArgv>(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_strings_split_at_each_nul() {
        let s = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            nul_separated(b"leash\0exec\0\0--\0".to_vec()),
            s(&["leash", "exec", "", "--"])
        );
        assert_eq!(nul_separated(b"a".to_vec()), s(&["a"]));
        assert_eq!(nul_separated(Vec::new()), s(&[]));
        assert_eq!(nul_separated(b"\0".to_vec()), s(&[""]));
    }
}
