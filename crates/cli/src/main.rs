//! `ds4-server`: chat, one-shot runs, teacher-forced replay, benchmarks and model
//! fetching. Each subcommand is a thin layer over the library crates.

mod bench;
mod chat;
mod common;
mod convert;
mod eval;
mod gpu_probe;
mod measure;
mod pull;
mod replay;
mod run;
mod serve;
mod synth;

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
    /// OpenAI- and Anthropic-compatible HTTP server.
    Serve(serve::ServeCmd),
    /// Teacher-forced replay of an exact token sequence, dumping logits or log-probs.
    Replay(replay::ReplayArgs),
    /// Prefill and decode speed: median and spread of repeated runs.
    Bench(bench::BenchArgs),
    /// Convert a Hugging Face checkpoint (GLM-5.3 family) to GGUF.
    Convert(ds4_convert::ConvertArgs),
    /// Fetch a known model into the local cache.
    Pull(pull::PullArgs),
    /// A fixed three-turn chat workload with per-turn measurements and an is_prime check.
    Eval(eval::EvalArgs),
    /// Write a synthetic model (random weights of a real shape) as a GGUF file.
    Synth(synth::SynthArgs),
    /// Run a command under a watchdog (memory, start and idle timeouts), line-atomic output.
    Supervise(ds4_measure::args::SuperviseArgs),
    /// Paired comparison of receipts: identical outputs, ratios, verdict.
    Compare(ds4_measure::args::CompareArgs),
    /// GPU responsiveness probe; phase labels are read from stdin.
    GpuProbe(gpu_probe::GpuProbeCmd),
}

fn main() {
    let cli = Cli::parse();
    common::init_tracing(matches!(cli.command, Command::Serve(_)));
    let result = match cli.command {
        Command::Chat(a) => chat::main(a),
        Command::Run(a) => run::main(a),
        Command::Serve(a) => serve::main(a),
        Command::Replay(a) => replay::main(a),
        Command::Bench(a) => bench::main(a),
        Command::Pull(a) => pull::main(a),
        Command::Convert(a) => convert::main(a),
        Command::Eval(a) => eval::main(a),
        Command::Synth(a) => synth::main(a),
        Command::Supervise(a) => measure::supervise_main(a),
        Command::Compare(a) => measure::compare_main(a),
        Command::GpuProbe(a) => gpu_probe::main(a),
    };
    if let Err(e) = result {
        eprintln!("error: {}", common::error_text(&e));
        std::process::exit(1);
    }
}
