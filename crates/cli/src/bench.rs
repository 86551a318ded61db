//! `ds4-server bench`: prefill tokens/s for an N-token prompt (default 512) and decode
//! tokens/s for M greedy tokens (default 128) after a short chat prompt, each over
//! several runs after a warm-up, reported as median, min and max (table or `--json`).
//!
//! Method, as llama.cpp's figures in the fixtures were taken: prefill is one fresh
//! session evaluating the first N tokens of fixed prose (no template); decode is the
//! time from the first to the (M+1)-th sampled token (M single-token decodes,
//! end-of-generation ignored).

use std::time::Instant;

use anyhow::{Result, bail};
use clap::Args;
use ds4_engine::sampler::{Rng, SamplerParams, sample};
use ds4_engine::{LoadedModel, Session};
use ds4_tokenizer::{ChatMessage, RenderOptions};

use crate::common::{ModelArgs, load};

/// Fixed prose for the prefill prompt (original text, repeated as needed).
const PROSE: &str = include_str!("../assets/bench-prose.txt");

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens for the prefill measurement.
    #[arg(long = "prefill-tokens", default_value_t = 512)]
    pub prefill_tokens: usize,
    /// Tokens for the decode measurement.
    #[arg(long = "decode-tokens", default_value_t = 128)]
    pub decode_tokens: usize,
    /// Counted runs of each measurement (after one warm-up).
    #[arg(long = "runs", default_value_t = 5)]
    pub runs: usize,
    /// Print JSON instead of a table.
    #[arg(long = "json")]
    pub json: bool,
}

/// Median, min and max of a set of rates.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: Vec<f64>,
}

impl Summary {
    fn of(mut runs: Vec<f64>) -> Summary {
        let mut s = runs.clone();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        runs.shrink_to_fit();
        Summary {
            median,
            min: s[0],
            max: s[n - 1],
            runs,
        }
    }
}

fn prefill_prompt(lm: &LoadedModel, n: usize) -> Vec<u32> {
    let one = lm.tokenizer.encode(PROSE, false, false);
    let mut tokens: Vec<u32> = lm
        .tokenizer
        .bos()
        .filter(|_| lm.tokenizer.add_bos())
        .into_iter()
        .collect();
    while tokens.len() < n {
        tokens.extend_from_slice(&one);
    }
    tokens.truncate(n);
    tokens
}

fn prefill_run(lm: &LoadedModel, n_ctx: usize, prompt: &[u32]) -> Result<f64> {
    let mut s = Session::new(lm.model.clone(), n_ctx)?;
    let t0 = Instant::now();
    s.prefill(prompt, &mut |_, _| {})?;
    Ok(prompt.len() as f64 / t0.elapsed().as_secs_f64())
}

fn decode_run(lm: &LoadedModel, n_ctx: usize, prompt: &[u32], n: usize) -> Result<f64> {
    let mut s = Session::new(lm.model.clone(), n_ctx)?;
    s.prefill(prompt, &mut |_, _| {})?;
    let greedy = SamplerParams {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
    };
    let mut rng = Rng(0);
    let mut token = sample(s.logits().expect("after prefill"), &greedy, &mut rng);
    let t0 = Instant::now();
    for _ in 0..n {
        let logits = s.decode(token)?;
        token = sample(logits, &greedy, &mut rng);
    }
    Ok(n as f64 / t0.elapsed().as_secs_f64())
}

pub fn main(args: BenchArgs) -> Result<()> {
    if args.runs == 0 || args.prefill_tokens == 0 || args.decode_tokens == 0 {
        bail!("--runs, --prefill-tokens and --decode-tokens must be at least 1");
    }
    let lm = load(&args.model)?;
    let question = [ChatMessage::new(
        "user",
        "What is the capital city of Australia?",
    )];
    let (_, chat) = lm.chat_prompt(&question, &RenderOptions::default())?;
    let n_ctx = args
        .model
        .ctx
        .max(args.prefill_tokens)
        .max(chat.len() + args.decode_tokens + 1);
    let prompt = prefill_prompt(&lm, args.prefill_tokens);
    prefill_run(&lm, n_ctx, &prompt)?;
    let prefill = (0..args.runs)
        .map(|_| prefill_run(&lm, n_ctx, &prompt))
        .collect::<Result<Vec<_>>>()?;
    decode_run(&lm, n_ctx, &chat, args.decode_tokens)?;
    let decode = (0..args.runs)
        .map(|_| decode_run(&lm, n_ctx, &chat, args.decode_tokens))
        .collect::<Result<Vec<_>>>()?;
    let (prefill, decode) = (Summary::of(prefill), Summary::of(decode));
    let info = lm.model.info();
    let threads = rayon::current_num_threads();
    if args.json {
        let doc = serde_json::json!({
            "model": info.name, "path": lm.path, "architecture": info.architecture, "backend": info.backend,
            "threads": threads, "prefill_tokens": args.prefill_tokens, "decode_tokens": args.decode_tokens,
            "decode_prompt_tokens": chat.len(), "prefill_tps": prefill, "decode_tps": decode,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!(
            "model: {} ({}, backend {}, {threads} threads)",
            info.name, info.architecture, info.backend
        );
        println!(
            "{:<24} {:>10} {:>10} {:>10} {:>5}",
            "measurement", "median", "min", "max", "runs"
        );
        let row = |name: String, s: &Summary| {
            println!(
                "{name:<24} {:>10.1} {:>10.1} {:>10.1} {:>5}",
                s.median,
                s.min,
                s.max,
                s.runs.len()
            )
        };
        row(format!("prefill {} tok/s", args.prefill_tokens), &prefill);
        row(format!("decode {} tok/s", args.decode_tokens), &decode);
    }
    Ok(())
}
