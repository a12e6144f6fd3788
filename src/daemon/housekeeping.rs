//! Housekeeping: one thread that syncs events, notices leases settled elsewhere, closes idle
//! sessions, prunes ended ones, and stops a daemon whose state root went away.

use super::session;
use super::state::*;
use crate::controller::LeaseRef;
use crate::protocol;
use protocol::Phase;
use serde_json::json;
use session::Supervised;
use std::fs::{self};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Ended sessions stay attachable (their last lines and exit) this long, and at most
/// [`MAX_ENDED`] of them (the newest): a daemon that runs for weeks under churn must stay flat.
/// Their events stay in the database (`events`, `sessions history`).
pub(super) const ENDED_RETENTION: Duration = Duration::from_secs(300);

pub(super) const MAX_ENDED: usize = 64;

pub(super) fn run(d: &Arc<Daemon>, stop: &std::sync::mpsc::Receiver<()>) {
    let tick = d
        .cfg
        .idle_close
        .map_or(Duration::from_secs(1), |i| i / 4)
        .clamp(Duration::from_millis(50), Duration::from_secs(1));
    // The sender is dropped at shutdown: the wait ends at once.
    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(tick) {
        if let Some(why) = headless(d) {
            tracing::error!(state_dir = %d.root.dir().display(), socket = %d.socket.display(),
                "{why}: no client can reach this daemon any more, and another leash serve could start on the path (two daemons for one root); closing every session as on SIGTERM and stopping");
            d.headless.store(true, Ordering::SeqCst);
            use std::io::Write;
            let _ = (&d.wake).write(&[1]);
            return;
        }
        let sessions = d.all_sessions();
        for s in &sessions {
            if s.phase() != Phase::Ended {
                s.sync_events();
            }
        }
        notice_changed_leases(d, &sessions);
        if let Some(idle) = d.cfg.idle_close {
            let due: Vec<(Arc<Supervised>, Duration)> = sessions
                .iter()
                .filter_map(|s| s.begin_idle_close(idle).map(|quiet| (s.clone(), quiet)))
                .collect();
            if !due.is_empty() {
                let mut refs = Vec::new();
                for (s, quiet) in &due {
                    tracing::info!(session = %s.key, idle_ms = quiet.as_millis() as u64, "closing idle session");
                    let detail = json!({"idleMs": quiet.as_millis() as u64, "idleCloseMs": idle.as_millis() as u64});
                    let _ = s.record_event("idle", Some(detail));
                    if let Some(id) = s.lease_id() {
                        refs.push(LeaseRef::Id(id.to_string()));
                    }
                }
                let marked: Vec<Arc<Supervised>> = due.into_iter().map(|(s, _)| s).collect();
                if let Err(e) = d.close_marked(&marked, &refs, None) {
                    tracing::warn!(error = %e, "idle close failed");
                }
            }
        }
        prune_ended(d);
    }
}

/// Why the daemon lost its state root, if it did: the state directory (or, unless socket
/// activation owns it, the socket) is gone or is another inode than the one it started with — an
/// `rm -rf` of the root, a root moved away and recreated. Such a daemon runs its sessions
/// headless (no socket a client can reach) while a second `leash serve` could take the path with
/// a new database and gateway id, so it shuts down (checked every housekeeping round).
pub(super) fn headless(d: &Daemon) -> Option<String> {
    let id = |p: &Path| fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let what = |name: &str, p: &Path, was: (u64, u64)| match id(p) {
        None => Some(format!("the {name} {} was removed", p.display())),
        Some(now) if now != was => Some(format!(
            "the {name} {} was replaced (inode {} is now {})",
            p.display(),
            was.1,
            now.1
        )),
        Some(_) => None,
    };
    d.root_inode
        .and_then(|was| what("state directory", d.root.dir(), was))
        .or_else(|| {
            d.socket_inode
                .and_then(|was| what("socket", &d.socket, was))
        })
}

/// A lease of a live session that another process moved out of `open` (a `leash --no-daemon
/// close`, a reap run against the database) while the daemon was not closing it. A lease `ended`
/// by its wrapper's report is not such a change (see `plan::take_over_changed_lease`): the
/// session's waiter settles it, and a start failure is still told as one. The session
/// stops taking input at once (phase `closing`), and the daemon finishes the close itself: the
/// claim of a closer that died mid-grace is stale and is taken over, and a closer still at work
/// keeps its claim (the attempt is a conflict, repeated each round until the lease settles).
pub(super) fn notice_changed_leases(d: &Arc<Daemon>, sessions: &[Arc<Supervised>]) {
    for s in sessions {
        if !s.watch_lease() {
            continue;
        }
        let Some(id) = s.lease_id().map(str::to_owned) else {
            continue;
        };
        let row = d.store().lease(&id);
        let Ok(Some(lease)) = row else {
            continue;
        };
        if !leash_core::plan::take_over_changed_lease(lease.state) || !s.begin_takeover() {
            continue;
        }
        tracing::warn!(session_key = %s.key, lease_id = %id, state = %lease.state,
            claimed_by = lease.claimed_by.map(|c| c.pid),
            "the lease changed underneath the daemon; the session takes no more input and the daemon finishes the close");
        let (d, s) = (d.clone(), s.clone());
        let spawned = std::thread::Builder::new()
            .name("takeover".into())
            .spawn(move || {
                // Bounded like the settles: a burst of wrapper deaths on a loaded host changes
                // many leases at once (reconcile marks them), and one connection and process-table
                // read each, all together, is what the daemon's footprint would keep.
                let _slot = session::settle_slot();
                let refs = [LeaseRef::Id(id)];
                if let Err(e) = d.close_marked(std::slice::from_ref(&s), &refs, None) {
                    tracing::warn!(session_key = %s.key, error = %e, "cannot finish the close");
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start a thread to finish a close");
        }
    }
}

/// Drops ended sessions older than [`ENDED_RETENTION`], and the oldest beyond [`MAX_ENDED`].
pub(super) fn prune_ended(d: &Daemon) {
    // Each session's end is read without the sessions' map lock: reading it takes the
    // session's own lock, which a niced output reader may hold while preempted, and every
    // request (`status` first) needs the map lock.
    let ended: Vec<(Instant, Arc<Supervised>)> = d
        .all_sessions()
        .into_iter()
        .filter_map(|s| s.ended_at().map(|at| (at, s)))
        .collect();
    let gone = to_prune(ended.iter().map(|(at, s)| (*at, s.key.as_str())));
    if gone.is_empty() {
        return;
    }
    let mut map = d.sessions();
    for (_, s) in ended.iter().filter(|(_, s)| gone.contains(&s.key.as_str())) {
        // Only the ended session itself: an ensure may have put a new one under the key.
        if map.get(&s.key).is_some_and(|cur| Arc::ptr_eq(cur, s)) {
            map.remove(&s.key);
        }
    }
}

/// Which ended sessions (when they ended, their key) to forget: those ended longer than
/// [`ENDED_RETENTION`] ago, and the oldest beyond the newest [`MAX_ENDED`].
pub(super) fn to_prune<'a>(ended: impl Iterator<Item = (Instant, &'a str)>) -> Vec<&'a str> {
    let (mut kept, mut gone): (Vec<_>, Vec<_>) =
        ended.partition(|(at, _)| at.elapsed() < ENDED_RETENTION);
    if kept.len() > MAX_ENDED {
        kept.sort();
        let extra = kept.len() - MAX_ENDED;
        gone.extend(kept.drain(..extra));
    }
    gone.into_iter().map(|(_, k)| k).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ended_sessions_go_after_the_retention_and_beyond_the_newest_few() {
        let now = Instant::now();
        let old = now - (ENDED_RETENTION + Duration::from_secs(1));
        let keys: Vec<String> = (0..MAX_ENDED + 3).map(|i| format!("k{i:03}")).collect();
        // k000..: ended i ms apart, the first the oldest; one more ended long ago.
        let mut ended: Vec<(Instant, &str)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (now - Duration::from_millis(1000 - i as u64), k.as_str()))
            .collect();
        ended.push((old, "stale"));
        let mut gone = to_prune(ended.into_iter());
        gone.sort();
        assert_eq!(gone, vec!["k000", "k001", "k002", "stale"]);
        assert!(to_prune([(now, "fresh")].into_iter()).is_empty());
    }
}
