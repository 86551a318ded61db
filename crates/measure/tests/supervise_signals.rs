//! Signal forwarding (own test binary: it installs process-wide handlers).

use ds4_measure::supervise::{ExitReason, SuperviseOptions, forward_signals, supervise};
use std::ffi::OsString;
use std::time::{Duration, Instant};

#[test]
fn sigterm_to_supervisor_reaches_the_command() {
    forward_signals().unwrap();
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: sends SIGTERM to this test process; the handler only records it.
        unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
    });
    let t = Instant::now();
    let cmd: Vec<OsString> = ["sleep", "30"].iter().map(OsString::from).collect();
    let o = supervise(&SuperviseOptions::default(), &cmd, Vec::new(), Vec::new()).unwrap();
    assert_eq!(
        (o.reason, o.signal, o.exit_code),
        (ExitReason::Signal, Some(15), 143)
    );
    assert_eq!(o.forwarded_signal, Some(15));
    // Well before `sleep 30` would end by itself (generous for a loaded machine).
    assert!(t.elapsed() < Duration::from_secs(25), "{:?}", t.elapsed());
}
