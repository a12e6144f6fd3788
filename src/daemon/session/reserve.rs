//! Where the session's seqs come from: blocks of [`SEQ_BLOCK`] seqs reserved in the store for
//! output lines ([`Seqs`] hands them out), events recorded and merged into the stream in seq
//! order, and the hold while the store cannot be written (see the module docs of `session`).

use super::base::*;
use super::shown;
use super::supervised::*;

impl Supervised {
    /// Records a lifecycle event in the store and merges it (with anything recorded before it)
    /// into the stream. Returns its seq.
    pub fn record_event(&self, kind: &str, detail: Option<Value>) -> Result<i64, StoreError> {
        let mut store = self.store();
        let seq = store.record_event(&self.key, self.lease_id(), kind, detail)?;
        self.sync_with(&store);
        drop(store);
        Ok(seq)
    }

    /// Merges events other parties recorded into the stream.
    pub fn sync_events(&self) {
        let store = self.store();
        self.sync_with(&store);
    }

    /// Reads the stored events above what was merged and merges them. The caller holds the
    /// store lock, so two merges never interleave (a later read pushed first would make the
    /// earlier one's events look old); `inner` is held only for the in-memory part.
    pub(super) fn sync_with(&self, store: &Store) {
        let after = self.lock().seqs.last_synced();
        match store.events_since(&self.key, after) {
            Ok(events) if !events.is_empty() => {
                let mut g = self.lock();
                for e in events {
                    g.push_event(e);
                }
                drop(g);
                self.changed.notify_all();
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(session = %self.key, error = %e, "cannot read events"),
        }
    }

    /// Reserves the next block of seqs for output (merging the events stored meanwhile, which
    /// all lie below it). On failure the error is kept for `status` and returned.
    pub(super) fn reserve_block(&self) -> Result<(), StoreError> {
        let mut store = self.store();
        let (after, len) = {
            let mut g = self.lock();
            let read = g.replay.governed();
            let seqs = &mut g.quiet_mut().seqs;
            (seqs.last_synced(), seqs.block_len(Instant::now(), read))
        };
        match store.reserve_seqs(&self.key, len, after) {
            Ok((start, events)) => {
                let mut g = self.lock();
                for e in events {
                    g.push_event(e);
                }
                g.seqs.reserved(start, len);
                if g.held.take().is_some() {
                    tracing::info!(session = %self.key, "seqs reserved again; output resumes");
                }
                Ok(())
            }
            Err(e) => {
                drop(store);
                let mut g = self.lock();
                if g.held.is_none() {
                    tracing::error!(session = %self.key, error = %e, "cannot reserve seqs in the store; holding the adapter's output until it can");
                }
                g.held = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// A seq for the next output line, with the lock under which it must be pushed (so no
    /// event slips in between): one from a reserved block, never one the store has not
    /// reserved. Waits (holding the line) while the store cannot be written; `None` when the
    /// session ended meanwhile and the line must be dropped.
    pub(super) fn output_seq(&self) -> Option<(shown::Locked<'_>, i64)> {
        let mut pause = HOLD_RETRY_MIN;
        loop {
            {
                let mut g = self.lock();
                if let Some(seq) = g.seqs.take() {
                    return Some((g, seq));
                }
            }
            if self.reserve_block().is_err() {
                let mut g = self.lock();
                if g.life.is_ended() {
                    g.output_dropped += 1;
                    return None;
                }
                drop(g);
                std::thread::sleep(pause);
                pause = (pause * 2).min(HOLD_RETRY_MAX);
            }
        }
    }
}
