//! Line-atomic forwarding of a child's stdout and stderr next to the supervisor's
//! own JSON records.
//!
//! Each source (child stdout, child stderr, supervisor) is cut into records:
//! complete lines (ending in `\n`; the complete lines of one read are one record,
//! written whole with one `write_all` + flush), or
//! chunks of a line that has not ended yet (at most [`MAX_CHUNK`] bytes each, or
//! whatever is pending at EOF or after [`STALE_PARTIAL`] without a newline).
//!
//! Several sources may share one sink (stderr carries the child's stderr and the
//! supervisor's samples; with `merge` everything shares stdout). Once a source has
//! written a chunk to a sink, it *owns* that sink until its line ends: records of
//! other sources are queued (in order) and written after the line's newline, so a
//! sample can never land inside a child's line. If a source ends (EOF) in the
//! middle of a line, the next record another source writes to that sink is
//! preceded by one `\n` so it starts on a line of its own; that separator is the
//! only byte the supervisor ever adds to a child's output.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::time::{Duration, Instant};

/// Largest piece of an unterminated line forwarded at once: 64 KiB.
pub const MAX_CHUNK: usize = 64 * 1024;

/// A partial line pending this long without a newline is forwarded as a chunk
/// (so prompts like `Password: ` or progress dots show up).
pub const STALE_PARTIAL: Duration = Duration::from_millis(1000);

/// Where a record comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    ChildStdout = 0,
    ChildStderr = 1,
    Supervisor = 2,
}

#[derive(Debug)]
enum Kind {
    /// Bytes ending in `\n`.
    Line,
    /// Bytes of a line not yet ended.
    Chunk,
    /// The source has ended; releases a sink it owned mid-line.
    Close,
}

#[derive(Debug)]
struct Record {
    source: Source,
    kind: Kind,
    bytes: Vec<u8>,
}

struct Sink<'a> {
    w: Box<dyn Write + 'a>,
    owner: Option<Source>,
    /// The last bytes written did not end a line and their source has ended.
    dangling: bool,
    backlog: VecDeque<Record>,
}

impl Sink<'_> {
    fn emit(&mut self, rec: Record) -> io::Result<()> {
        match rec.kind {
            Kind::Close => {
                if self.owner == Some(rec.source) {
                    self.owner = None;
                    self.dangling = true;
                }
                return Ok(());
            }
            Kind::Line | Kind::Chunk => {}
        }
        if rec.bytes.is_empty() {
            return Ok(());
        }
        if self.dangling && self.owner.is_none() {
            self.w.write_all(b"\n")?;
        }
        self.dangling = false;
        self.w.write_all(&rec.bytes)?;
        self.w.flush()?;
        self.owner = match rec.kind {
            Kind::Chunk => Some(rec.source),
            _ => None,
        };
        Ok(())
    }

    fn admits(&self, source: Source) -> bool {
        self.owner.is_none() || self.owner == Some(source)
    }

    fn submit(&mut self, rec: Record) -> io::Result<()> {
        if self.admits(rec.source) && !self.backlog.iter().any(|r| r.source == rec.source) {
            self.emit(rec)?;
            self.drain()
        } else {
            self.backlog.push_back(rec);
            Ok(())
        }
    }

    /// Writes queued records that the current owner admits, keeping each source's
    /// records in order, until no more can be written.
    fn drain(&mut self) -> io::Result<()> {
        loop {
            let mut blocked: [bool; 3] = [false; 3];
            let mut progressed = false;
            let mut kept = VecDeque::with_capacity(self.backlog.len());
            while let Some(rec) = self.backlog.pop_front() {
                let s = rec.source as usize;
                if !blocked[s] && self.admits(rec.source) {
                    self.emit(rec)?;
                    progressed = true;
                } else {
                    blocked[s] = true;
                    kept.push_back(rec);
                }
            }
            self.backlog = kept;
            if !progressed || self.backlog.is_empty() {
                return Ok(());
            }
        }
    }
}

/// The sinks (stdout, stderr) and the routing of sources to them.
pub(crate) struct Mux<'a> {
    sinks: Vec<Sink<'a>>,
    route: [usize; 3],
    error: Option<io::Error>,
}

impl<'a> Mux<'a> {
    /// Child stdout goes to `out`; child stderr and supervisor records go to `err`,
    /// or everything to `out` when `merge`.
    pub(crate) fn new(out: impl Write + 'a, err: impl Write + 'a, merge: bool) -> Self {
        let sink = |w: Box<dyn Write + 'a>| Sink {
            w,
            owner: None,
            dangling: false,
            backlog: VecDeque::new(),
        };
        let route = if merge { [0, 0, 0] } else { [0, 1, 1] };
        Mux {
            sinks: vec![sink(Box::new(out)), sink(Box::new(err))],
            route,
            error: None,
        }
    }

    fn submit(&mut self, source: Source, kind: Kind, bytes: Vec<u8>) {
        if self.error.is_some() {
            return; // output is gone; the supervisor stops the child and reports it
        }
        let sink = &mut self.sinks[self.route[source as usize]];
        if let Err(e) = sink.submit(Record {
            source,
            kind,
            bytes,
        }) {
            self.error = Some(e);
        }
    }

    /// A complete line (must end in `\n`).
    pub(crate) fn line(&mut self, source: Source, bytes: Vec<u8>) {
        debug_assert!(bytes.last() == Some(&b'\n'));
        self.submit(source, Kind::Line, bytes);
    }

    /// A piece of a line not yet ended.
    pub(crate) fn chunk(&mut self, source: Source, bytes: Vec<u8>) {
        self.submit(source, Kind::Chunk, bytes);
    }

    /// The source has ended.
    pub(crate) fn close(&mut self, source: Source) {
        self.submit(source, Kind::Close, Vec::new());
    }

    /// The first write error, if any (later output is discarded).
    pub(crate) fn take_error(&mut self) -> Option<io::Error> {
        self.error.take()
    }

    /// True once a write has failed.
    pub(crate) fn failed(&self) -> bool {
        self.error.is_some()
    }
}

/// Cuts a byte stream into lines and bounded chunks for a [`Mux`].
pub(crate) struct LineSplitter {
    source: Source,
    pending: Vec<u8>,
    pending_since: Option<Instant>,
}

impl LineSplitter {
    pub(crate) fn new(source: Source) -> Self {
        LineSplitter {
            source,
            pending: Vec::new(),
            pending_since: None,
        }
    }

    /// Feeds bytes read from the child at time `now`. All complete lines in `data`
    /// (with any pending start of the first) go out as one record: still whole
    /// lines, in one write.
    pub(crate) fn push(&mut self, mut data: &[u8], now: Instant, mux: &mut Mux) {
        if let Some(i) = data.iter().rposition(|&b| b == b'\n') {
            let (lines, rest) = data.split_at(i + 1);
            let mut bytes = std::mem::take(&mut self.pending);
            bytes.extend_from_slice(lines);
            mux.line(self.source, bytes);
            self.pending_since = None;
            data = rest;
        }
        if data.is_empty() {
            return;
        }
        if self.pending.is_empty() {
            self.pending_since = Some(now);
        }
        self.pending.extend_from_slice(data);
        while self.pending.len() >= MAX_CHUNK {
            let rest = self.pending.split_off(MAX_CHUNK);
            let chunk = std::mem::replace(&mut self.pending, rest);
            mux.chunk(self.source, chunk);
            self.pending_since = Some(now);
        }
        if self.pending.is_empty() {
            self.pending_since = None;
        }
    }

    /// Forwards a partial line that has waited longer than [`STALE_PARTIAL`].
    pub(crate) fn flush_stale(&mut self, now: Instant, mux: &mut Mux) {
        if self
            .pending_since
            .is_some_and(|t| now.duration_since(t) >= STALE_PARTIAL)
        {
            mux.chunk(self.source, std::mem::take(&mut self.pending));
            self.pending_since = None;
        }
    }

    /// End of stream: flushes the partial last line and closes the source.
    pub(crate) fn finish(&mut self, mux: &mut Mux) {
        if !self.pending.is_empty() {
            mux.chunk(self.source, std::mem::take(&mut self.pending));
        }
        self.pending_since = None;
        mux.close(self.source);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    /// A writer that records each `write_all` call's bytes as one entry.
    #[derive(Clone, Default)]
    struct Calls(Rc<RefCell<Vec<Vec<u8>>>>);

    impl Write for Calls {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.borrow_mut().push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Calls {
        fn joined(&self) -> Vec<u8> {
            self.0.borrow().concat()
        }
    }

    #[test]
    fn lines_are_whole_and_partials_wait() {
        let out = Calls::default();
        let mut mux = Mux::new(out.clone(), io::sink(), true);
        let mut sp = LineSplitter::new(Source::ChildStdout);
        let t = Instant::now();
        sp.push(b"ab", t, &mut mux);
        sp.push(b"c\nde", t, &mut mux);
        assert_eq!(*out.0.borrow(), vec![b"abc\n".to_vec()]);
        sp.finish(&mut mux);
        assert_eq!(out.joined(), b"abc\nde");
    }

    #[test]
    fn sample_waits_for_child_line_to_end() {
        let out = Calls::default();
        let mut mux = Mux::new(out.clone(), io::sink(), true);
        let mut sp = LineSplitter::new(Source::ChildStdout);
        let t = Instant::now();
        let big = vec![b'x'; MAX_CHUNK + 10];
        sp.push(&big, t, &mut mux); // one chunk forwarded, 10 bytes pending
        mux.line(Source::Supervisor, b"{\"s\":1}\n".to_vec());
        assert_eq!(out.0.borrow().len(), 1, "sample must be queued mid-line");
        sp.push(b"\n", t, &mut mux);
        let mut want = big.clone();
        want.extend_from_slice(b"\n{\"s\":1}\n");
        assert_eq!(out.joined(), want);
    }

    #[test]
    fn eof_mid_line_gets_one_separator_before_next_record() {
        let out = Calls::default();
        let mut mux = Mux::new(out.clone(), io::sink(), true);
        let mut a = LineSplitter::new(Source::ChildStdout);
        let mut b = LineSplitter::new(Source::ChildStderr);
        let t = Instant::now();
        a.push(b"partial", t, &mut mux);
        a.flush_stale(t + STALE_PARTIAL, &mut mux); // forwarded, a owns the sink
        b.push(b"err line\n", t, &mut mux); // queued
        a.finish(&mut mux); // releases with a separator
        b.finish(&mut mux);
        mux.line(Source::Supervisor, b"end\n".to_vec());
        assert_eq!(out.joined(), b"partial\nerr line\nend\n");
    }

    #[test]
    fn split_sinks_do_not_block_each_other() {
        let (out, err) = (Calls::default(), Calls::default());
        let mut mux = Mux::new(out.clone(), err.clone(), false);
        let mut a = LineSplitter::new(Source::ChildStdout);
        let t = Instant::now();
        a.push(&vec![b'y'; MAX_CHUNK], t, &mut mux); // stdout owned mid-line
        mux.line(Source::Supervisor, b"s\n".to_vec());
        assert_eq!(err.joined(), b"s\n");
        assert_eq!(out.joined().len(), MAX_CHUNK);
    }
}
