//! `ds4-server supervise` and `ds4-server compare`: thin dispatch to `ds4-measure`
//! (issue 6, items 3 and 4). The argument structs and all behaviour live there.

use anyhow::Result;
use ds4_measure::args::{CompareArgs, SuperviseArgs, run_compare};
use ds4_measure::supervise::{EXIT_SUPERVISOR_ERROR, forward_signals, supervise};

/// Runs the command under the watchdog and exits with the code
/// `ds4_measure::supervise` documents (the command's own code when it exited by
/// itself, 121–123 when a limit killed it, 125–127 for supervisor errors).
pub fn supervise_main(args: SuperviseArgs) -> ! {
    if let Err(e) = forward_signals() {
        eprintln!("supervise: installing signal handlers: {e}");
        std::process::exit(EXIT_SUPERVISOR_ERROR);
    }
    let outcome = supervise(
        &args.options(),
        &args.command,
        std::io::stdout().lock(),
        std::io::stderr().lock(),
    );
    std::process::exit(match outcome {
        Ok(o) => o.exit_code,
        Err(e) => {
            eprintln!("{e}");
            e.exit_code()
        }
    })
}

/// Compares receipts and prints the table (or JSON with `--json`) on stdout.
pub fn compare_main(args: CompareArgs) -> Result<()> {
    run_compare(&args, std::io::stdout().lock())?;
    Ok(())
}
