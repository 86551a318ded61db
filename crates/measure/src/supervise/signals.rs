//! Forwarding termination signals to the supervised process group.
//!
//! The child runs in its own process group, so a terminal's Ctrl-C reaches only
//! the supervisor. [`forward_signals`] installs handlers for SIGINT, SIGTERM,
//! SIGHUP and SIGQUIT that only record the signal; the supervise loop then sends
//! it to the child's group, lets the child exit (reason `signal`), and ends as usual.

use std::sync::atomic::{AtomicI32, Ordering};

static PENDING: AtomicI32 = AtomicI32::new(0);

extern "C" fn record(sig: libc::c_int) {
    PENDING.store(sig, Ordering::SeqCst);
}

/// Installs the recording handlers (process-wide; call once, from a binary).
///
/// Errors: the OS error of `sigaction(2)`.
pub fn forward_signals() -> std::io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: a zeroed sigaction with a handler that only stores to an atomic
        // (async-signal-safe); no SA_RESTART so a blocking poll returns EINTR.
        let rc = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = record as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The signal received since the last call, if any.
pub(crate) fn take_pending() -> Option<i32> {
    match PENDING.swap(0, Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}
