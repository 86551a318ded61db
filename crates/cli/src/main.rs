//! `ds4-server`: chat, one-shot runs, teacher-forced replay, benchmarks and model
//! fetching. Each subcommand is a thin layer over the library crates.

mod bench;
mod chat;
mod common;
mod pull;
mod replay;
mod run;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "ds4-server",
    version,
    about = "Inference engine and server for large MoE language models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Interactive multi-turn chat (the default model unless -m is given).
    Chat(chat::ChatArgs),
    /// One-shot generation from a prompt.
    Run(run::RunArgs),
    /// Teacher-forced replay of an exact token sequence, dumping logits or log-probs.
    Replay(replay::ReplayArgs),
    /// Prefill and decode speed: median and spread of repeated runs.
    Bench(bench::BenchArgs),
    /// Fetch a known model into the local cache.
    Pull(pull::PullArgs),
}

fn main() {
    let cli = Cli::parse();
    common::init_tracing();
    let result = match cli.command {
        Command::Chat(a) => chat::main(a),
        Command::Run(a) => run::main(a),
        Command::Replay(a) => replay::main(a),
        Command::Bench(a) => bench::main(a),
        Command::Pull(a) => pull::main(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
