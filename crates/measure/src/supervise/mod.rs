//! `supervise`: run a command under a watchdog (Linux).
//!
//! The command starts in its own process group, stdin inherited, stdout and stderr
//! piped. The supervisor forwards its output line by line and kills the whole
//! process tree (SIGKILL to the group, then to every member found in `/proc`,
//! including descendants that moved to other groups) when:
//! - the tree's summed resident memory exceeds `mem_limit_mib` (reason `memory`);
//! - nothing was printed (stdout or stderr) within `start_timeout` of the start
//!   (reason `start_timeout`);
//! - nothing was printed for `idle_timeout` (reason `idle_timeout`); measured from
//!   the last output, or from the start when there is no `start_timeout`.
//!
//! Limits are checked every `min(sample interval, 100 ms)`. When the command
//! itself exits, any processes it left in its tree are killed too, the pipes are
//! drained (for at most [`DRAIN_GRACE`]), and a final partial line is flushed.
//!
//! # Where output goes
//! Child stdout → `out`. Child stderr, the supervisor's samples and its final exit
//! record → `err`. With `merge`, all of it → `out`. Every complete line is one
//! write (then flush); a line without newline is forwarded in chunks of at most
//! 64 KiB; records of other sources never land inside a line (see
//! `output.rs` for the rules, and the one separator byte it may add when a child's
//! stream ends mid-line). The price of that guarantee: while the child keeps a line
//! open on a stream (e.g. a progress bar without newlines), samples bound for the
//! same stream wait and come out right after the line ends; the watchdog itself
//! keeps checking meanwhile.
//!
//! Supervisor records, one JSON object per line:
//! `{"supervise":"sample","t_ms":…,"rss_mb":…,"cpu_pct":…,"cpu_s":…,"procs":…}` and
//! `{"supervise":"exit","reason":…,"code":…,"signal":…,"exit_code":…,"t_ms":…,
//! "peak_rss_mb":…,"cpu_s":…,"stdout_bytes":…,"stderr_bytes":…,"pid":…}`.
//! `rss_mb` is MiB (2^20 bytes) summed over the tree's processes (pages shared
//! between processes count once per process); `cpu_pct` is CPU time over wall
//! time since the previous sample (100 = one core).
//!
//! # Exit codes (`SuperviseOutcome::exit_code`)
//! | reason | exit code |
//! |---|---|
//! | `exited` | the command's own exit code |
//! | `signal` (died by a signal we did not send) | 128 + signal number |
//! | `memory` | [`EXIT_MEMORY`] = 121 |
//! | `start_timeout` | [`EXIT_START_TIMEOUT`] = 122 |
//! | `idle_timeout` | [`EXIT_IDLE_TIMEOUT`] = 123 |
//! | supervisor failure (output closed, OS error) | [`EXIT_SUPERVISOR_ERROR`] = 125 |
//! | command cannot be executed / not found | 126 / 127 |
//!
//! A command may itself exit with 121–127; the exit record's `reason` is the
//! unambiguous answer.

mod output;
mod proctree;
mod signals;

pub use output::{MAX_CHUNK, STALE_PARTIAL};
pub use signals::forward_signals;

use output::{LineSplitter, Mux, Source};
use proctree::ProcTree;
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Exit code when the memory limit killed the tree.
pub const EXIT_MEMORY: i32 = 121;
/// Exit code when nothing was printed before the start timeout.
pub const EXIT_START_TIMEOUT: i32 = 122;
/// Exit code when nothing was printed for the idle timeout.
pub const EXIT_IDLE_TIMEOUT: i32 = 123;
/// Exit code when the supervisor itself failed.
pub const EXIT_SUPERVISOR_ERROR: i32 = 125;
/// Exit code when the command exists but cannot be executed.
pub const EXIT_CANNOT_EXECUTE: i32 = 126;
/// Exit code when the command is not found.
pub const EXIT_NOT_FOUND: i32 = 127;

/// How long to keep draining the pipes after the command has exited.
pub const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// Longest time between two limit checks.
const MAX_CHECK_INTERVAL: Duration = Duration::from_millis(100);
/// Reads per stream per loop turn (64 KiB each), so checks stay timely under a flood.
const READS_PER_TURN: usize = 16;
const MIB: f64 = 1024.0 * 1024.0;

/// Watchdog settings. `None` disables a limit.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SuperviseOptions {
    /// Kill when the tree's summed RSS exceeds this many MiB.
    pub mem_limit_mib: Option<u64>,
    /// Kill when nothing is printed this long after the start.
    pub start_timeout: Option<Duration>,
    /// Kill when nothing is printed for this long.
    pub idle_timeout: Option<Duration>,
    /// Emit a resource sample this often; `None`: no samples.
    pub sample_interval: Option<Duration>,
    /// Send child stderr and supervisor records to `out` too.
    pub merge: bool,
    /// Make this process a child subreaper (`prctl(PR_SET_CHILD_SUBREAPER)`) so
    /// that orphaned descendants stay findable. Process-wide and permanent: set it
    /// only in a process whose only children are supervised (the CLI), not in tests.
    pub subreaper: bool,
}

/// Why the supervised command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitReason {
    /// It exited on its own (`code` is its exit code).
    Exited,
    /// It died from a signal the watchdog did not send (`signal`).
    Signal,
    /// Killed: memory limit.
    Memory,
    /// Killed: no output before the start timeout.
    StartTimeout,
    /// Killed: no output for the idle timeout.
    IdleTimeout,
}

/// The result of a supervised run; serialised (with `"supervise":"exit"`) as the
/// final record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuperviseOutcome {
    /// Why it ended.
    pub reason: ExitReason,
    /// The command's exit code, when it exited normally.
    pub code: Option<i32>,
    /// The signal that ended it, when one did (9 when the watchdog killed it).
    pub signal: Option<i32>,
    /// The supervisor's exit code (see the module table).
    pub exit_code: i32,
    /// Wall time from spawn to the end of draining, ms.
    pub t_ms: u64,
    /// Peak summed RSS of the tree over all checks, MiB.
    pub peak_rss_mb: f64,
    /// CPU seconds (user + system) of the tree: the larger of the sampled total and
    /// the command's own rusage (which includes the children it waited for).
    pub cpu_s: f64,
    /// Bytes the command wrote to stdout (all forwarded).
    pub stdout_bytes: u64,
    /// Bytes the command wrote to stderr (all forwarded).
    pub stderr_bytes: u64,
    /// The command's pid (also its process group id).
    pub pid: u32,
    /// A termination signal received by the supervisor and forwarded to the group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarded_signal: Option<i32>,
}

/// Errors of the supervisor itself (not of the command).
#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    /// The command line was empty.
    #[error("supervise: no command given")]
    NoCommand,
    /// The command could not be started.
    #[error("supervise: cannot start {program}: {source}")]
    Spawn { program: String, source: io::Error },
    /// Writing forwarded output failed; the command was killed.
    #[error("supervise: writing output failed (command killed): {0}")]
    Output(io::Error),
    /// An OS call failed.
    #[error("supervise: {what}: {source}")]
    Os {
        what: &'static str,
        source: io::Error,
    },
}

impl SuperviseError {
    /// The exit code a binary should use for this error (126, 127 or 125).
    pub fn exit_code(&self) -> i32 {
        match self {
            SuperviseError::Spawn { source, .. } if source.kind() == io::ErrorKind::NotFound => {
                EXIT_NOT_FOUND
            }
            SuperviseError::Spawn { .. } => EXIT_CANNOT_EXECUTE,
            _ => EXIT_SUPERVISOR_ERROR,
        }
    }
}

struct Stream {
    file: File,
    splitter: LineSplitter,
}

/// Runs `cmd` (program and arguments) under the watchdog, forwarding its output to
/// `out`/`err` as the module documents, and returns how it ended.
///
/// Pass `std::io::stdout().lock()` / `std::io::stderr().lock()` from a binary; any
/// `Write` works (tests pass `Vec<u8>`). The final exit record is written before
/// returning. Errors: [`SuperviseError`]; the command is never left running.
pub fn supervise(
    opts: &SuperviseOptions,
    cmd: &[OsString],
    out: impl Write,
    err: impl Write,
) -> Result<SuperviseOutcome, SuperviseError> {
    let (program, args) = cmd.split_first().ok_or(SuperviseError::NoCommand)?;
    if opts.subreaper {
        // SAFETY: prctl with PR_SET_CHILD_SUBREAPER only sets a process attribute.
        if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
            return Err(os_err("prctl(PR_SET_CHILD_SUBREAPER)"));
        }
    }
    let spawn_err = |source| SuperviseError::Spawn {
        program: program.to_string_lossy().into_owned(),
        source,
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::inherit())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(spawn_err)?;
    let t0 = Instant::now();
    let pid = child.id() as i32;
    let mut tree = ProcTree::new(pid, opts.subreaper);
    let pipes = [
        child
            .stdout
            .take()
            .map(|p| (OwnedFd::from(p), Source::ChildStdout)),
        child
            .stderr
            .take()
            .map(|p| (OwnedFd::from(p), Source::ChildStderr)),
    ];
    let mut streams: [Option<Stream>; 2] = [None, None];
    for (slot, pipe) in streams.iter_mut().zip(pipes) {
        if let Some((fd, source)) = pipe {
            let file = File::from(fd);
            if let Err(e) = set_nonblocking(&file) {
                tree.kill_all();
                let _ = wait_blocking(pid);
                return Err(SuperviseError::Os {
                    what: "fcntl(O_NONBLOCK)",
                    source: e,
                });
            }
            *slot = Some(Stream {
                file,
                splitter: LineSplitter::new(source),
            });
        }
    }
    let mut mux = Mux::new(out, err, opts.merge);
    let check_every = opts
        .sample_interval
        .map_or(MAX_CHECK_INTERVAL, |s| s.min(MAX_CHECK_INTERVAL))
        .max(Duration::from_millis(1));

    let mut next_check = t0;
    let mut sampler = opts.sample_interval.map(|iv| Sampler::new(iv, t0));
    let mut bytes = [0u64; 2];
    let mut last_output: Option<Instant> = None;
    let mut kill_reason: Option<ExitReason> = None;
    let mut output_failed = false;
    let mut status: Option<(i32, libc::rusage)> = None;
    let mut drain_deadline: Option<Instant> = None;
    let mut peak_rss = 0u64;
    let mut forwarded_signal = None;
    let mut buf = vec![0u8; MAX_CHUNK];

    loop {
        let timeout = next_check
            .saturating_duration_since(Instant::now())
            .min(check_every);
        wait_readable(&streams, timeout);
        let now = Instant::now();
        for (slot, count) in streams.iter_mut().zip(bytes.iter_mut()) {
            let Some(s) = slot else { continue };
            let (n, eof) = read_available(s, &mut buf, now, &mut mux);
            *count += n;
            if n > 0 {
                last_output = Some(now);
            }
            if eof {
                s.splitter.finish(&mut mux);
                *slot = None;
            }
        }
        if let Some(sig) = signals::take_pending() {
            tree.signal_group(sig);
            forwarded_signal = Some(sig);
        }
        if status.is_none() {
            status = try_wait(pid)?;
        }
        let now = Instant::now();
        if now >= next_check {
            let snap = tree.scan();
            peak_rss = peak_rss.max(snap.rss_bytes);
            next_check = now + check_every;
            if let Some(line) = sampler
                .as_mut()
                .and_then(|s| s.sample(now, t0, &snap, &tree))
            {
                mux.line(Source::Supervisor, line);
            }
            if status.is_none() && kill_reason.is_none() {
                kill_reason = limit_exceeded(opts, snap.rss_bytes, t0, last_output, now);
                if kill_reason.is_some() {
                    tree.kill_all();
                }
            }
        }
        if mux.failed() && !output_failed {
            output_failed = true;
            tree.kill_all();
        }
        for s in streams.iter_mut().flatten() {
            s.splitter.flush_stale(now, &mut mux);
        }
        if status.is_some() {
            let deadline = *drain_deadline.get_or_insert_with(|| {
                tree.kill_all(); // whatever the command left behind
                now + DRAIN_GRACE
            });
            if streams.iter().all(Option::is_none) || now >= deadline {
                break;
            }
        }
    }
    // Pipes still open after the grace period (held by a process we could not
    // find): flush what was read and stop listening.
    for s in streams.iter_mut().flatten() {
        s.splitter.finish(&mut mux);
    }
    let (raw, usage) = status.expect("loop ends only after the command was reaped");
    let (code, signal) = decode_status(raw);
    let reason = kill_reason.unwrap_or(if signal.is_some() {
        ExitReason::Signal
    } else {
        ExitReason::Exited
    });
    let exit_code = match reason {
        ExitReason::Exited => code.unwrap_or(EXIT_SUPERVISOR_ERROR),
        ExitReason::Signal => 128 + signal.unwrap_or(0),
        ExitReason::Memory => EXIT_MEMORY,
        ExitReason::StartTimeout => EXIT_START_TIMEOUT,
        ExitReason::IdleTimeout => EXIT_IDLE_TIMEOUT,
    };
    let rusage_cpu = timeval_s(usage.ru_utime) + timeval_s(usage.ru_stime);
    let sampled_cpu = tree.cpu_ticks_total as f64 / tree.clk_tck;
    let outcome = SuperviseOutcome {
        reason,
        code,
        signal,
        exit_code,
        t_ms: t0.elapsed().as_millis() as u64,
        peak_rss_mb: round1(peak_rss as f64 / MIB),
        cpu_s: round3(rusage_cpu.max(sampled_cpu)),
        stdout_bytes: bytes[0],
        stderr_bytes: bytes[1],
        pid: pid as u32,
        forwarded_signal,
    };
    mux.line(Source::Supervisor, record_line("exit", &outcome));
    mux.close(Source::Supervisor);
    match mux.take_error() {
        Some(e) => Err(SuperviseError::Output(e)),
        None => Ok(outcome),
    }
}

/// Emits resource samples at a fixed interval.
struct Sampler {
    every: Duration,
    due: Instant,
    prev: (Instant, u64),
}

impl Sampler {
    fn new(every: Duration, t0: Instant) -> Self {
        Sampler {
            every,
            due: t0 + every,
            prev: (t0, 0),
        }
    }

    /// The sample line when one is due at `now`.
    fn sample(
        &mut self,
        now: Instant,
        t0: Instant,
        snap: &proctree::Snapshot,
        tree: &ProcTree,
    ) -> Option<Vec<u8>> {
        if now < self.due {
            return None;
        }
        let (t_prev, ticks_prev) = self.prev;
        let wall = now.duration_since(t_prev).as_secs_f64().max(1e-9);
        let cpu = tree.cpu_ticks_total.saturating_sub(ticks_prev) as f64 / tree.clk_tck;
        let sample = Sample {
            t_ms: now.duration_since(t0).as_millis() as u64,
            rss_mb: round1(snap.rss_bytes as f64 / MIB),
            cpu_pct: round1(100.0 * cpu / wall),
            cpu_s: round3(tree.cpu_ticks_total as f64 / tree.clk_tck),
            procs: snap.procs,
        };
        self.prev = (now, tree.cpu_ticks_total);
        self.due += self.every;
        if self.due <= now {
            self.due = now + self.every; // fell behind: do not burst
        }
        Some(record_line("sample", &sample))
    }
}

/// Which limit, if any, is exceeded at `now`.
fn limit_exceeded(
    opts: &SuperviseOptions,
    rss_bytes: u64,
    t0: Instant,
    last_output: Option<Instant>,
    now: Instant,
) -> Option<ExitReason> {
    if opts
        .mem_limit_mib
        .is_some_and(|mib| rss_bytes > mib.saturating_mul(1 << 20))
    {
        return Some(ExitReason::Memory);
    }
    match (last_output, opts.start_timeout) {
        (None, Some(limit)) => {
            (now.duration_since(t0) >= limit).then_some(ExitReason::StartTimeout)
        }
        _ => {
            let since = last_output.unwrap_or(t0);
            let limit = opts.idle_timeout?;
            (now.duration_since(since) >= limit).then_some(ExitReason::IdleTimeout)
        }
    }
}

/// Reads what is available (up to [`READS_PER_TURN`] reads) into the splitter.
/// Returns (bytes read, end of stream).
fn read_available(s: &mut Stream, buf: &mut [u8], now: Instant, mux: &mut Mux) -> (u64, bool) {
    let mut total = 0u64;
    for _ in 0..READS_PER_TURN {
        match s.file.read(buf) {
            Ok(0) => return (total, true),
            Ok(n) => {
                total += n as u64;
                s.splitter.push(&buf[..n], now, mux);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(_) => return (total, true),
        }
    }
    (total, false)
}

/// Blocks until a stream is readable (or closed) or `timeout` passes.
fn wait_readable(streams: &[Option<Stream>; 2], timeout: Duration) {
    let mut fds: Vec<libc::pollfd> = streams
        .iter()
        .flatten()
        .map(|s| libc::pollfd {
            fd: s.file.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    if fds.is_empty() {
        std::thread::sleep(timeout);
        return;
    }
    // SAFETY: fds is a valid array of pollfd for open descriptors we own. EINTR
    // and other failures just end the wait early; the loop re-checks everything.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
}

fn set_nonblocking(file: &File) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Reaps the command if it has ended: (raw wait status, its rusage).
fn try_wait(pid: i32) -> Result<Option<(i32, libc::rusage)>, SuperviseError> {
    let mut status = 0;
    // SAFETY: zeroed rusage is a valid out-parameter; wait4 on our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
    match rc {
        0 => Ok(None),
        r if r == pid => Ok(Some((status, usage))),
        _ => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(None)
            } else {
                Err(SuperviseError::Os {
                    what: "wait4",
                    source: e,
                })
            }
        }
    }
}

fn wait_blocking(pid: i32) -> io::Result<()> {
    let mut status = 0;
    // SAFETY: waitpid on our own child.
    if unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// (exit code, terminating signal) of a raw wait status.
fn decode_status(raw: i32) -> (Option<i32>, Option<i32>) {
    if libc::WIFEXITED(raw) {
        (Some(libc::WEXITSTATUS(raw)), None)
    } else if libc::WIFSIGNALED(raw) {
        (None, Some(libc::WTERMSIG(raw)))
    } else {
        (None, None)
    }
}

fn os_err(what: &'static str) -> SuperviseError {
    SuperviseError::Os {
        what,
        source: io::Error::last_os_error(),
    }
}

fn timeval_s(t: libc::timeval) -> f64 {
    t.tv_sec as f64 + t.tv_usec as f64 * 1e-6
}

/// One resource sample (serialised after `"supervise":"sample"`).
#[derive(Serialize)]
struct Sample {
    t_ms: u64,
    rss_mb: f64,
    cpu_pct: f64,
    cpu_s: f64,
    procs: usize,
}

/// `{"supervise":"<kind>", <fields of value>}` plus newline; `supervise` comes
/// first so records are easy to pick out with `grep '^{"supervise"'`.
fn record_line(kind: &str, value: &impl Serialize) -> Vec<u8> {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    let mut line = format!("{{\"supervise\":\"{kind}\"").into_bytes();
    if body.len() > 2 {
        line.push(b',');
    }
    line.extend_from_slice(&body[1..]);
    line.push(b'\n');
    line
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_timeout_applies_before_first_output_only() {
        let t0 = Instant::now();
        let opts = SuperviseOptions {
            start_timeout: Some(Duration::from_secs(5)),
            idle_timeout: Some(Duration::from_secs(1)),
            ..Default::default()
        };
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(limit_exceeded(&opts, 0, t0, None, at(2)), None);
        assert_eq!(
            limit_exceeded(&opts, 0, t0, None, at(5)),
            Some(ExitReason::StartTimeout)
        );
        assert_eq!(
            limit_exceeded(&opts, 0, t0, Some(at(3)), at(5)),
            Some(ExitReason::IdleTimeout)
        );
        let idle_only = SuperviseOptions {
            idle_timeout: Some(Duration::from_secs(1)),
            ..Default::default()
        };
        assert_eq!(
            limit_exceeded(&idle_only, 0, t0, None, at(1)),
            Some(ExitReason::IdleTimeout)
        );
        let mem = SuperviseOptions {
            mem_limit_mib: Some(1),
            ..Default::default()
        };
        assert_eq!(limit_exceeded(&mem, 1 << 20, t0, None, t0), None);
        assert_eq!(
            limit_exceeded(&mem, (1 << 20) + 1, t0, None, t0),
            Some(ExitReason::Memory)
        );
    }
}
