//! A daemon started while a client probes the state root's lock file (clients take a momentary
//! shared flock on `daemon.lock` to learn whether a daemon holds it) starts once the probe ends;
//! it does not refuse as if another daemon served the root. The chaos test met this as a daemon,
//! restarted after its predecessor was SIGKILLed, exiting 3 and naming the dead predecessor
//! (whose pid the lock file still held) because a `leash` client was probing at that instant.
mod common;
use common::*;
use std::process::Stdio;
use std::time::Duration;

#[test]
fn a_clients_lock_probe_does_not_make_a_starting_daemon_refuse() {
    let tmp = TempDir::new("d-lockprobe");
    let state = tmp.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let lock = state.join("daemon.lock");
    // What a SIGKILLed daemon leaves: its info, naming a pid that no longer runs.
    std::fs::write(
        &lock,
        format!(
            r#"{{"pid":999999,"socket":"{}","startedAt":1}}"#,
            state.join("leash.sock").display()
        ),
    )
    .unwrap();
    // A client's probe, held (as a descheduled client would) while the daemon starts.
    let probe = std::fs::File::open(&lock).unwrap();
    let probe = nix::fcntl::Flock::lock(probe, nix::fcntl::FlockArg::LockSharedNonblock)
        .expect("shared lock");

    let log = tmp.join("serve.log");
    let mut serve = Serve(
        leash(&state)
            .args(["serve", "--grace-ms", "200"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let child = &mut serve.0;
    let pid = child.id();
    // The daemon opens the lock file and tries it at once: wait until it has it open, then
    // give a refusal time to happen while the probe is still held.
    let opened = wait_for(|| {
        matches!(child.try_wait(), Ok(Some(_)))
            || std::fs::read_dir(format!("/proc/{pid}/fd"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == lock))
    });
    assert!(opened, "leash serve never opened its lock file");
    let refused = wait_for_within(Duration::from_millis(300), || {
        matches!(child.try_wait(), Ok(Some(_)))
    });
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !refused,
        "leash serve refused to start while a client only probed the lock: {}",
        text()
    );
    drop(probe.unlock().unwrap());

    let named = format!("\"pid\":{pid}");
    let up = wait_for(|| {
        std::fs::read_to_string(&lock).is_ok_and(|t| t.contains(&named))
            && std::os::unix::net::UnixStream::connect(state.join("leash.sock")).is_ok()
    });
    assert!(
        up,
        "leash serve did not come up after the probe ended: {}",
        text()
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "clean exit: {}", text());
}

/// SIGKILLs the daemon if the test fails before it stops it: only while it is still our unreaped
/// child, so the pid cannot name another process.
struct Serve(std::process::Child);

impl Drop for Serve {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
