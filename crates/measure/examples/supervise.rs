//! Standalone `supervise` until the `ds4-server` binary wires the subcommand:
//! `cargo run -p ds4-measure --example supervise -- [OPTIONS] -- CMD …`.

use clap::Parser;
use ds4_measure::args::SuperviseArgs;
use ds4_measure::supervise::{forward_signals, supervise};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: SuperviseArgs,
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = forward_signals() {
        eprintln!("supervise: cannot install signal handlers: {e}");
    }
    let code = match supervise(
        &cli.args.options(),
        &cli.args.command,
        std::io::stdout().lock(),
        std::io::stderr().lock(),
    ) {
        Ok(o) => o.exit_code,
        Err(e) => {
            eprintln!("{e}");
            e.exit_code()
        }
    };
    std::process::exit(code);
}
