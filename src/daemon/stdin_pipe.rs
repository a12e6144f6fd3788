//! The write end of an adapter's stdin, with a deadline on every write.
//!
//! An adapter that stops reading its stdin fills the pipe, and a blocking write would then hold
//! the session's order lock forever (so `cancel`, `close` and idle close would queue behind it).
//! The pipe is non-blocking and each line is written with a deadline. A line cut short by the
//! deadline is not dropped half-way: the rest is *owed* and goes out before any later line, so
//! the adapter never sees two lines spliced together; a later write first pays what is owed
//! under its own deadline.

use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::process::ChildStdin;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum PipeError {
    #[error("the adapter's stdin is closed")]
    Closed,
    #[error("the adapter did not read its stdin within {waited:?}: {written} of {total} bytes of this line went out{owed}")]
    TimedOut {
        waited: Duration,
        /// Bytes of this line written (0 when an earlier line still owed bytes).
        written: usize,
        total: usize,
        /// A note on what is still owed (the rest goes out before any later line).
        owed: String,
    },
    #[error("cannot write to the adapter's stdin: {0}")]
    Io(#[from] io::Error),
}

pub struct StdinPipe {
    pipe: Option<ChildStdin>,
    /// The unwritten rest of a line cut short by a deadline.
    owed: Vec<u8>,
}

impl StdinPipe {
    /// Takes the pipe and makes it non-blocking (only our end: the adapter's read end is a
    /// separate open file).
    pub fn new(pipe: Option<ChildStdin>) -> StdinPipe {
        if let Some(p) = &pipe {
            if let Err(e) = crate::sys::set_nonblocking(p.as_fd()) {
                tracing::warn!(error = %e, "cannot make the adapter's stdin non-blocking; writes may block");
            }
        }
        StdinPipe {
            pipe,
            owed: Vec::new(),
        }
    }

    /// The pipe's descriptor (none once closed) and the rest of a line still owed, for a
    /// handoff: the next program takes the pipe over with [`StdinPipe::adopt`].
    pub fn handed(&self) -> (Option<std::os::fd::RawFd>, Vec<u8>) {
        (self.pipe.as_ref().map(|p| p.as_raw_fd()), self.owed.clone())
    }

    /// The pipe a handoff passed on, with what it still owed.
    pub fn adopt(pipe: Option<std::os::fd::OwnedFd>, owed: Vec<u8>) -> StdinPipe {
        let mut p = StdinPipe::new(pipe.map(ChildStdin::from));
        p.owed = owed;
        p
    }

    /// Drops the pipe (the adapter sees EOF); what was owed is lost with it.
    pub fn close(&mut self) {
        self.pipe = None;
        self.owed.clear();
    }

    /// Writes `line` and a newline before `deadline`: what is owed first, then the line.
    pub fn write_line(&mut self, line: &[u8], timeout: Duration) -> Result<(), PipeError> {
        let deadline = Instant::now() + timeout;
        let Some(pipe) = self.pipe.as_mut() else {
            return Err(PipeError::Closed);
        };
        let total = line.len() + 1;
        if !self.owed.is_empty() {
            let n = write_until(pipe, &self.owed, deadline)?;
            self.owed.drain(..n);
            if !self.owed.is_empty() {
                return Err(PipeError::TimedOut {
                    waited: timeout,
                    written: 0,
                    total,
                    owed: format!(
                        "; {} bytes of an earlier line are still owed and go first",
                        self.owed.len()
                    ),
                });
            }
        }
        let mut buf = Vec::with_capacity(total);
        buf.extend_from_slice(line);
        buf.push(b'\n');
        let n = write_until(pipe, &buf, deadline)?;
        if n == buf.len() {
            return Ok(());
        }
        let owed = if n == 0 {
            String::new()
        } else {
            self.owed = buf[n..].to_vec();
            format!(
                "; the other {} bytes go out before any later line",
                self.owed.len()
            )
        };
        Err(PipeError::TimedOut {
            waited: timeout,
            written: n,
            total,
            owed,
        })
    }
}

/// Writes as much of `buf` as the pipe takes before `deadline`; returns how much.
fn write_until(pipe: &mut ChildStdin, buf: &[u8], deadline: Instant) -> Result<usize, PipeError> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut done = 0;
    while done < buf.len() {
        match pipe.write(&buf[done..]) {
            Ok(0) => return Err(PipeError::Closed),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
                let mut fds = [PollFd::new(pipe.as_fd(), PollFlags::POLLOUT)];
                match poll(&mut fds, PollTimeout::from(ms)) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => return Err(PipeError::Io(io::Error::from(e))),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Err(PipeError::Closed),
            Err(e) => return Err(PipeError::Io(e)),
        }
    }
    Ok(done)
}
