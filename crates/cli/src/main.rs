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
    /// Convert a Hugging Face checkpoint (GLM-5.3 or DeepSeek-V4) to GGUF.
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use clap::builder::ValueParser;
    use std::any::TypeId;

    /// Whether flags parsed by `p` hold numbers (or durations given as numbers).
    fn numeric(p: &ValueParser) -> bool {
        [
            TypeId::of::<u16>(),
            TypeId::of::<u32>(),
            TypeId::of::<u64>(),
            TypeId::of::<usize>(),
            TypeId::of::<i32>(),
            TypeId::of::<i64>(),
            TypeId::of::<f32>(),
            TypeId::of::<f64>(),
            TypeId::of::<std::time::Duration>(),
        ]
        .into_iter()
        .any(|t| p.type_id() == t)
    }

    /// Every numeric flag of every subcommand, as (subcommand, flag).
    fn numeric_flags() -> Vec<(String, clap::Arg)> {
        let cli = Cli::command();
        let mut flags = Vec::new();
        for sub in cli.get_subcommands() {
            for arg in sub.get_arguments() {
                if arg.get_long().is_some() && numeric(arg.get_value_parser()) {
                    flags.push((sub.get_name().to_string(), arg.clone()));
                }
            }
        }
        flags
    }

    /// The error a lone `--flag VALUE` gets, rendered as the user sees it.
    fn error_for(arg: &clap::Arg, value: &str) -> Option<String> {
        let long = format!("--{}", arg.get_long().unwrap());
        let cmd = clap::Command::new("t").arg(arg.clone().required(false));
        cmd.try_get_matches_from(["t", long.as_str(), value])
            .err()
            .map(|e| e.to_string())
    }

    #[test]
    fn every_numeric_flag_names_itself_and_its_range_for_a_negative_number() {
        let flags = numeric_flags();
        // The walk sees the flags it must (one per kind of parser at least).
        let names: Vec<String> = flags
            .iter()
            .map(|(s, a)| format!("{s} --{}", a.get_long().unwrap()))
            .collect();
        for must in [
            "run --ctx",
            "run --temp",
            "chat --n-predict",
            "bench --prefill-tokens",
            "serve --port",
            "supervise --idle-timeout",
            "compare --tolerance",
            "convert --seed",
            "eval --top-p",
        ] {
            assert!(names.iter().any(|n| n == must), "{must} not in {names:?}");
        }
        // `error: invalid value '-5' for '--FLAG <NAME>': must be <a range>`.
        let shape = |long: &str, line: &str| {
            line.strip_prefix(&format!("error: invalid value '-5' for '--{long} <"))
                .and_then(|rest| rest.split_once(">': must be "))
                .is_some_and(|(_, range)| {
                    ["a whole number", "a number", "a percentage"]
                        .iter()
                        .any(|kind| range.starts_with(kind))
                })
        };
        let mut bad = Vec::new();
        for (sub, arg) in &flags {
            let long = arg.get_long().unwrap();
            if !(arg.is_allow_negative_numbers_set() || arg.is_allow_hyphen_values_set()) {
                bad.push(format!(
                    "{sub} --{long}: no allow_negative_numbers (clap would say \"unexpected argument '-5'\")"
                ));
                continue;
            }
            match error_for(arg, "-5") {
                None => bad.push(format!("{sub} --{long}: accepts -5")),
                Some(e) => {
                    let first = e.lines().next().unwrap_or_default().to_string();
                    if !shape(long, &first) {
                        bad.push(format!("{sub} --{long}: {first}"));
                    }
                }
            }
        }
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    #[test]
    fn messages_name_the_flag_and_the_range() {
        let flags = numeric_flags();
        let get = |sub: &str, long: &str| {
            flags
                .iter()
                .find(|(s, a)| s == sub && a.get_long() == Some(long))
                .map(|(_, a)| a.clone())
                .unwrap_or_else(|| panic!("{sub} --{long}"))
        };
        let first = |e: Option<String>| e.unwrap().lines().next().unwrap().to_string();
        assert_eq!(
            first(error_for(&get("run", "ctx"), "-5")),
            "error: invalid value '-5' for '--ctx <N>': must be a whole number, at least 1"
        );
        assert_eq!(
            first(error_for(&get("run", "ctx"), "0")),
            "error: invalid value '0' for '--ctx <N>': must be a whole number, at least 1"
        );
        assert_eq!(
            first(error_for(&get("serve", "port"), "-3")),
            "error: invalid value '-3' for '--port <PORT>': must be a whole number from 0 to 65535"
        );
        assert_eq!(
            first(error_for(&get("run", "top-k"), "-3")),
            "error: invalid value '-3' for '--top-k <TOP_K>': must be a whole number, at least 0"
        );
        assert_eq!(
            first(error_for(&get("run", "top-p"), "1.5")),
            "error: invalid value '1.5' for '--top-p <TOP_P>': must be a number from 0 to 1"
        );
        assert_eq!(
            first(error_for(&get("supervise", "idle-timeout"), "-1")),
            "error: invalid value '-1' for '--idle-timeout <S>': must be a number of seconds greater than 0"
        );
        assert_eq!(error_for(&get("run", "ctx"), "4096"), None);
        assert_eq!(error_for(&get("bench", "prefill-tokens"), "512,4096"), None);
        assert!(
            first(error_for(&get("bench", "prefill-tokens"), "512,-1"))
                .ends_with("for '--prefill-tokens <N[,N…]>': must be a whole number, at least 1")
        );
    }
}
