//! Measuring ourselves the way a careful user would (issue 6).
//!
//! - [`supervise`]: run a command under a watchdog (memory, start and idle
//!   timeouts) while forwarding its output line-atomically next to JSON resource
//!   samples.
//! - [`receipt`]: the JSON record of a `bench` or `eval` run and what it takes to
//!   trust it (hashes, settings, machine, failures).
//! - [`compare`]: paired comparison of receipts with medians, spread and a
//!   verdict that refuses to call a difference inside the spread real.
//! - [`stats`]: median, MAD, range overlap, exact separation p-value.
//! - [`args`]: clap argument structs for the `ds4-server` subcommands.

pub mod args;
pub mod compare;
pub mod hash;
pub mod receipt;
pub mod stats;
pub mod supervise;
pub mod time;
