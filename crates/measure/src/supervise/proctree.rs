//! The supervised process tree, read from Linux `/proc`: which processes belong
//! to it, their summed resident memory and CPU time, and killing all of them.
//!
//! Membership, recomputed at every scan: the child itself, every process in the
//! child's process group, every process seen in the tree at an earlier scan (same
//! pid *and* start time, so a recycled pid is never mistaken for a member), with
//! `subreaper` every child of the supervisor (orphans re-parent to a subreaper),
//! and transitively every descendant (by parent pid) of any of those. A process
//! that escapes into its own group (`setsid`) and is orphaned before the first scan
//! sees it cannot be found without `subreaper`.
//!
//! Field layout of `/proc/PID/stat`: proc(5), "/proc/pid/stat" — the command name
//! is in parentheses and may itself contain spaces and parentheses, so fields are
//! counted after the *last* `)`.

use std::collections::{HashMap, HashSet};
use std::fs;

/// The fields of `/proc/PID/stat` the supervisor uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStat {
    pub pid: i32,
    /// Process state letter (`R`, `S`, `Z`, …).
    pub state: u8,
    pub ppid: i32,
    pub pgrp: i32,
    /// User + system CPU time, clock ticks.
    pub cpu_ticks: u64,
    /// Start time after boot, clock ticks (with pid, identifies a process).
    pub start_time: u64,
    /// Resident set size, pages.
    pub rss_pages: u64,
}

/// Parses the text of `/proc/PID/stat`; `None` when malformed.
pub(crate) fn parse_stat(text: &str) -> Option<ProcStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let f: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // f[0] is field 3 (state); field k is f[k - 3].
    let num = |k: usize| -> Option<u64> { f.get(k - 3)?.parse().ok() };
    let int = |k: usize| -> Option<i32> { f.get(k - 3)?.parse().ok() };
    Some(ProcStat {
        pid,
        state: *f.first()?.as_bytes().first()?,
        ppid: int(4)?,
        pgrp: int(5)?,
        cpu_ticks: num(14)? + num(15)?,
        start_time: num(22)?,
        rss_pages: num(24)?,
    })
}

fn read_stat(pid: i32) -> Option<ProcStat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn all_processes() -> Vec<ProcStat> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(read_stat)
        .collect()
}

/// Totals of one scan.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Snapshot {
    /// Summed RSS of live members, bytes (shared pages are counted once per process).
    pub rss_bytes: u64,
    /// CPU ticks members used since the previous scan.
    pub cpu_delta_ticks: u64,
    /// Live (non-zombie) members.
    pub procs: usize,
}

/// The tree rooted at the supervised child (also its process-group id).
pub(crate) struct ProcTree {
    root: i32,
    /// Start time of the root, once a scan has seen it (guards against pid reuse
    /// after the root has been reaped).
    root_start: Option<u64>,
    own_pid: i32,
    subreaper: bool,
    /// pid -> (start time, cpu ticks at last scan)
    known: HashMap<i32, (u64, u64)>,
    page_size: u64,
    /// Total CPU ticks accumulated over all scans.
    pub cpu_ticks_total: u64,
    /// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
    pub clk_tck: f64,
}

impl ProcTree {
    pub(crate) fn new(root: i32, subreaper: bool) -> Self {
        // SAFETY: sysconf and getpid only read process-wide constants.
        let (page, tck, own) = unsafe {
            (
                libc::sysconf(libc::_SC_PAGESIZE),
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::getpid(),
            )
        };
        ProcTree {
            root,
            root_start: None,
            own_pid: own,
            subreaper,
            known: HashMap::new(),
            page_size: if page > 0 { page as u64 } else { 4096 },
            cpu_ticks_total: 0,
            clk_tck: if tck > 0 { tck as f64 } else { 100.0 },
        }
    }

    fn members(&self, procs: &[ProcStat]) -> Vec<ProcStat> {
        let mut children: HashMap<i32, Vec<usize>> = HashMap::new();
        for (i, p) in procs.iter().enumerate() {
            children.entry(p.ppid).or_default().push(i);
        }
        let is_seed = |p: &ProcStat| {
            (p.pid == self.root && self.root_start.is_none_or(|st| st == p.start_time))
                || p.pgrp == self.root
                || self
                    .known
                    .get(&p.pid)
                    .is_some_and(|(st, _)| *st == p.start_time)
                || (self.subreaper && p.ppid == self.own_pid)
        };
        let mut stack: Vec<usize> = (0..procs.len()).filter(|&i| is_seed(&procs[i])).collect();
        let mut seen: HashSet<usize> = stack.iter().copied().collect();
        while let Some(i) = stack.pop() {
            for &c in children
                .get(&procs[i].pid)
                .map(Vec::as_slice)
                .unwrap_or(&[])
            {
                if seen.insert(c) {
                    stack.push(c);
                }
            }
        }
        seen.into_iter()
            .map(|i| procs[i])
            .filter(|p| p.pid != self.own_pid)
            .collect()
    }

    /// Reads `/proc`, updates membership and returns the totals.
    pub(crate) fn scan(&mut self) -> Snapshot {
        let members = self.members(&all_processes());
        if let Some(r) = members.iter().find(|p| p.pid == self.root) {
            self.root_start.get_or_insert(r.start_time);
        }
        let mut snap = Snapshot::default();
        let mut known = HashMap::with_capacity(members.len());
        for p in &members {
            let prev = match self.known.get(&p.pid) {
                Some((st, ticks)) if *st == p.start_time => *ticks,
                _ => 0,
            };
            snap.cpu_delta_ticks += p.cpu_ticks.saturating_sub(prev);
            known.insert(p.pid, (p.start_time, p.cpu_ticks.max(prev)));
            if p.state != b'Z' {
                snap.procs += 1;
                snap.rss_bytes += p.rss_pages * self.page_size;
            } else if self.subreaper && p.ppid == self.own_pid && p.pid != self.root {
                // An orphan re-parented to us has died: reap it (never the root,
                // whose status the supervisor collects itself).
                // SAFETY: waitpid on a specific pid that is our zombie child.
                unsafe { libc::waitpid(p.pid, std::ptr::null_mut(), libc::WNOHANG) };
            }
        }
        self.known = known;
        self.cpu_ticks_total += snap.cpu_delta_ticks;
        snap
    }

    /// SIGKILLs the process group and every member found by fresh scans,
    /// repeating while new live members appear (a forking process may add some).
    pub(crate) fn kill_all(&mut self) {
        // SAFETY: kill(2) with a negative pid signals the child's own process group.
        unsafe { libc::kill(-self.root, libc::SIGKILL) };
        for _ in 0..5 {
            let members = self.members(&all_processes());
            let live: Vec<&ProcStat> = members.iter().filter(|p| p.state != b'Z').collect();
            if live.is_empty() {
                break;
            }
            for p in live {
                // Re-check the start time right before the kill so a recycled pid
                // is never signalled.
                if read_stat(p.pid).is_some_and(|now| now.start_time == p.start_time) {
                    // SAFETY: kill(2) on a pid verified to be a tree member.
                    unsafe { libc::kill(p.pid, libc::SIGKILL) };
                }
                self.known.insert(p.pid, (p.start_time, p.cpu_ticks));
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Sends `sig` to the child's process group (used to forward SIGINT/SIGTERM).
    pub(crate) fn signal_group(&self, sig: i32) {
        // SAFETY: kill(2) with a negative pid signals the child's own process group.
        unsafe { libc::kill(-self.root, sig) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_parens_in_name() {
        // Layout per proc(5); name "a) b (c" contains spaces and parentheses.
        let text = "4242 (a) b (c) S 17 4242 4242 0 -1 4194560 100 0 0 0 \
                    7 3 0 0 20 0 1 0 987654 12345678 321 18446744073709551615\n";
        let s = parse_stat(text).unwrap();
        assert_eq!(s.pid, 4242);
        assert_eq!(s.state, b'S');
        assert_eq!((s.ppid, s.pgrp), (17, 4242));
        assert_eq!(s.cpu_ticks, 10);
        assert_eq!(s.start_time, 987654);
        assert_eq!(s.rss_pages, 321);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn own_stat_is_readable() {
        let me = read_stat(std::process::id() as i32).unwrap();
        assert_eq!(me.pid, std::process::id() as i32);
        assert!(me.rss_pages > 0);
    }
}
