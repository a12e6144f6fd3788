//! Framing: a byte stream split into lines with a hard length limit.

use std::io::{self, Read};

/// What [`LineReader::next_frame`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A complete line, without its `\n` (and without a `\r` before it).
    Line(Vec<u8>),
    /// A line longer than the limit; its bytes up to the next newline are discarded.
    TooLong,
}

/// Splits a byte stream into lines of at most `limit` bytes, never holding more than `limit`
/// plus one read's worth in memory: a longer line is reported once as [`Frame::TooLong`] and
/// skipped up to its newline, and the stream stays usable after it.
pub struct LineReader<R> {
    inner: R,
    buf: Vec<u8>,
    limit: usize,
    skipping: bool,
    eof: bool,
}

impl<R: Read> LineReader<R> {
    pub fn new(inner: R, limit: usize) -> LineReader<R> {
        LineReader {
            inner,
            buf: Vec::new(),
            limit,
            skipping: false,
            eof: false,
        }
    }

    /// The next frame; `Ok(None)` at end of stream (a final unterminated line is returned first).
    pub fn next_frame(&mut self) -> io::Result<Option<Frame>> {
        let mut scanned = 0;
        loop {
            if let Some(pos) = self.buf[scanned..].iter().position(|&b| b == b'\n') {
                let end = scanned + pos;
                let mut line: Vec<u8> = self.buf.drain(..=end).collect();
                line.pop();
                if self.skipping {
                    self.skipping = false;
                    scanned = 0;
                    continue;
                }
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                if line.len() > self.limit {
                    return Ok(Some(Frame::TooLong));
                }
                return Ok(Some(Frame::Line(line)));
            }
            scanned = self.buf.len();
            if self.skipping {
                self.buf.clear();
                scanned = 0;
            } else if self.buf.len() > self.limit + 1 {
                self.buf.clear();
                self.skipping = true;
                return Ok(Some(Frame::TooLong));
            }
            if self.eof {
                if self.buf.is_empty() || self.skipping {
                    return Ok(None);
                }
                let line = std::mem::take(&mut self.buf);
                return Ok(Some(Frame::Line(line)));
            }
            let mut chunk = [0u8; 64 * 1024];
            match self.inner.read(&mut chunk) {
                Ok(0) => self.eof = true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_reader_frames_and_survives_overlong_lines() {
        let mut input = Vec::new();
        input.extend_from_slice(b"one\r\n");
        input.extend(std::iter::repeat_n(b'x', 300));
        input.extend_from_slice(b"\ntwo\n\nthree");
        let mut r = LineReader::new(&input[..], 100);
        let mut frames = Vec::new();
        while let Some(f) = r.next_frame().unwrap() {
            frames.push(f);
        }
        assert_eq!(
            frames,
            vec![
                Frame::Line(b"one".to_vec()),
                Frame::TooLong,
                Frame::Line(b"two".to_vec()),
                Frame::Line(Vec::new()),
                Frame::Line(b"three".to_vec()),
            ]
        );
    }

    #[test]
    fn line_reader_handles_one_byte_reads() {
        struct Trickle<'a>(&'a [u8]);
        impl Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if self.0.is_empty() || buf.is_empty() {
                    return Ok(0);
                }
                buf[0] = self.0[0];
                self.0 = &self.0[1..];
                Ok(1)
            }
        }
        let mut data = b"ab\n".to_vec();
        data.extend(std::iter::repeat_n(b'y', 50));
        data.extend_from_slice(b"\ncd\n");
        let mut r = LineReader::new(Trickle(&data), 10);
        assert_eq!(r.next_frame().unwrap(), Some(Frame::Line(b"ab".to_vec())));
        assert_eq!(r.next_frame().unwrap(), Some(Frame::TooLong));
        assert_eq!(r.next_frame().unwrap(), Some(Frame::Line(b"cd".to_vec())));
        assert_eq!(r.next_frame().unwrap(), None);
    }
}
