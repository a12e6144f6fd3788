//! `attach`: the reply, then the session's items streamed from a thread of their own; the
//! registry of a connection's running attaches (for `detach`).

use super::cx::*;

/// How often an idle attach checks whether its client is still there.
const ATTACH_TICK: Duration = Duration::from_millis(250);
/// Stream items written per batch.
const ATTACH_BATCH: usize = 1024;
/// An attach writes its buffer once it holds this much, not once per batch: a batch of 1,024
/// items of 1 KiB filled a 1 MiB buffer, past the CPU's cache, and the kernel's copy of it into
/// the socket read it back from memory (the attach thread's largest cost in `perf`). A write
/// of 64 KiB is still one syscall per few hundred short lines, and replies on the same
/// connection wait behind one such write at most.
const ATTACH_WRITE: usize = 64 * 1024;
/// The write buffer an attach keeps between writes (one that grew past four times this, for
/// long lines, is given back).
const ATTACH_BUF: usize = 128 * 1024;

fn attach(d: &Arc<Daemon>, out: &Arc<Out>, id: Value, mut a: Attach) {
    let Some(s) = d.session(&a.session) else {
        out.reply::<Attached>(&id, Err(not_supervised(d, &a.session)));
        return;
    };
    match s.check_since(a.since) {
        Err((oldest, last)) => {
            let e = OpError {
                code: Code::SeqEvicted,
                message: format!(
                    "seq {} fell out of session {}'s replay buffer (oldest buffered seq {oldest}); attach with since >= {} or read persisted events with the events op",
                    a.since + 1,
                    a.session,
                    oldest - 1
                ),
                data: Box::new(ErrorData {
                    last_seq: Some(last),
                    oldest_seq: Some(oldest),
                    ..ErrorData::default()
                }),
            };
            out.reply::<Attached>(&id, Err(e));
            return;
        }
        Ok((oldest, last)) => {
            // A since above the last seq (a client's seq from another state root, or a bug)
            // would otherwise stall the stream until the seqs caught up: start at the last seq
            // instead and say so.
            let clamped = a.since > last;
            let since = a.since.min(last);
            let ok = Attached {
                clamped,
                last_seq: last,
                lease_id: s.lease_id().map(str::to_owned),
                oldest_seq: oldest,
                phase: s.phase(),
                requested_since: clamped.then_some(a.since),
                session_key: s.key.clone(),
                since,
            };
            a.since = since;
            if !out.reply(&id, Ok(ok)) {
                return;
            }
        }
    }
    let out = out.clone();
    let stop = out.attaches.register(&id);
    let spawned = std::thread::Builder::new()
        .name(format!("attach:{}", a.session))
        .stack_size(crate::daemon::stack::SMALL_STACK)
        .spawn(move || {
            // The stream runs at the daemon's own priority, the adapter's, as the session's
            // stdout reader does while it is attached (`session::stdio`, `ReaderPriority`): the
            // relay's two halves are then scheduled as a pipe's two ends are. Raised with its
            // connection, it took the CPU from the adapter or the client each time the reader
            // woke it (docs/benchmarks.md). Requests on the connection are
            // still answered by its raised thread.
            let _at_adapters = crate::daemon::priority::lowered();
            // Live from here until the stream ends: its cursor holds the adapter back (see
            // docs/protocol.md, backpressure).
            let token = s.join(a.since);
            stream(&s, token, &out, &id, &a, &stop);
            out.attaches.unregister(&id, &stop);
            s.leave(token);
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start an attach thread");
    }
}

/// Streams items above `since` until the session ends, the client goes, or the client falls
/// out of the buffer.
fn stream(
    s: &session::Supervised,
    token: u64,
    out: &Out,
    id: &Value,
    a: &Attach,
    stop: &AtomicBool,
) {
    let mut cursor = a.since;
    let id_json = serde_json::to_string(id).expect("JSON values serialise");
    // `{"id":ID,"seq":N`, the start of every item line of this attach: the prefix rendered
    // once, the seq counted up from line to line.
    let mut head = session::LineHead::new(&id_json);
    // One write buffer for the whole attach: a fresh one per batch grew by doubling past the
    // allocator's mmap threshold, so every batch paid an mmap, page faults and an munmap.
    let mut buf = Vec::new();
    // The items of a batch: plain slots and one reference per text, reused.
    let mut run = session::Run::default();
    loop {
        if stop.load(Ordering::SeqCst) {
            let body = item_body(&StreamItem::End {
                error: None,
                last_seq: cursor,
                reason: EndReason::Detached,
            });
            out.send(&stream_line(id, &body));
            return;
        }
        match s.next_batch(token, cursor, ATTACH_BATCH, ATTACH_TICK, &mut run) {
            // Detached while waiting: nothing more goes out on this attach.
            _ if stop.load(Ordering::SeqCst) => continue,
            Batch::Items => {
                buf.clear();
                if buf.capacity() > 4 * ATTACH_BUF {
                    buf.shrink_to(ATTACH_BUF);
                }
                for (slot, rest) in run.iter().filter(|(it, _)| a.stderr || !it.stderr) {
                    head.write_line(&mut buf, slot, rest);
                    if buf.len() >= ATTACH_WRITE {
                        if !out.send(&buf) {
                            return;
                        }
                        buf.clear();
                    }
                }
                if !buf.is_empty() && !out.send(&buf) {
                    return;
                }
                cursor = run.last_seq().unwrap_or(cursor);
            }
            Batch::Idle => {
                if out.hung_up() {
                    return;
                }
            }
            Batch::Ended {
                last_seq,
                start_failed,
            } => {
                let body = item_body(&match start_failed {
                    // The same words and fields as an ensure's `start_failed`.
                    Some(f) => StreamItem::End {
                        error: Some(EndError {
                            code: Code::StartFailed.as_str().into(),
                            last_seq,
                            message: f.to_string(),
                            oldest_seq: s.status().oldest_seq.unwrap_or(last_seq),
                            exit_status: Some(f.status),
                            stderr: Some(f.stderr.clone()),
                        }),
                        last_seq,
                        reason: EndReason::StartFailed,
                    },
                    None => StreamItem::End {
                        error: None,
                        last_seq,
                        reason: EndReason::Ended,
                    },
                });
                out.send(&stream_line(id, &body));
                return;
            }
            Batch::Evicted {
                oldest_seq,
                last_seq,
            } => {
                let body = item_body(&StreamItem::End {
                    error: Some(EndError {
                        code: Code::SeqEvicted.as_str().into(),
                        last_seq,
                        message: format!("the client fell behind: seq {} fell out of the replay buffer; attach again", cursor + 1),
                        oldest_seq,
                        exit_status: None,
                        stderr: None,
                    }),
                    last_seq: cursor,
                    reason: EndReason::Evicted,
                });
                out.send(&stream_line(id, &body));
                return;
            }
        }
    }
}

impl Handles<Attach> for Cx<'_> {
    type Done = Timed;

    fn handle(self, a: Attach) -> Timed {
        attach(self.d, self.out, self.id, a);
        Timed::Here
    }
}
