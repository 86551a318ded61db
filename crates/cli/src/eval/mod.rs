//! `ds4-server eval`: a fixed, realistic chat workload run to natural end of
//! generation (issue 6, item 1; docs/eval.md).
//!
//! A separate warm-up session answers one short question; then one conversation of
//! three turns runs in one session, each turn's prompt being the whole conversation so
//! far rendered by the chat template (so the session reuses the common prefix):
//!
//! 1. `summarise`: summarise a document (default: `assets/eval/document.txt`, shipped
//!    with the binary so the input does not change from commit to commit);
//! 2. `story`: a short story about a lighthouse keeper;
//! 3. `is_prime`: a Python function `is_prime(n)`, extracted and checked in a sandbox
//!    against every integer from -10 to 5000 ([`prime`]).
//!
//! Sampling: temperature 0.6, top-p 0.95, top-k 0, min-p 0, seed 42 (turn `i` of the
//! conversation uses seed + i, the warm-up the seed itself); `--greedy` for argmax. Each
//! turn stops at end-of-generation or at `--max-tokens` (default 2048, stop reason
//! `length`). The chat template's clock is fixed (2025-01-01T00:00:00Z) so that
//! templates printing a date render the same prompt every day.
//!
//! Per turn the receipt records prompt tokens, cached tokens, prefill time at the
//! engine's prefill boundary (`null` when nothing was evaluated), generated tokens,
//! decode time and tokens/s, stop reason, the SHA-256 of the answer text and of the
//! reasoning (`<think>` block, when there is one) and the session frontier after the
//! turn (token count and SHA-256 of the ids).

pub mod prime;

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::Args;
use ds4_args::{int, real};
use ds4_engine::generate::{GenerateParams, GenerateStats, StopReason as EngineStop, generate};
use ds4_engine::sampler::SamplerParams;
use ds4_engine::{LoadedModel, Session};
use ds4_http::output::THINK_OPEN;
use ds4_http::output::reasoning::split as split_reasoning;
use ds4_measure::args::ReceiptArgs;
use ds4_measure::hash::{sha256_bytes, sha256_tokens};
use ds4_measure::receipt::{EvalResults, Failure, Receipt, ReceiptKind, StopReason, TurnRecord};
use ds4_tokenizer::{ChatMessage, RenderOptions};
use serde_json::{Map, Value, json};

use crate::common::{
    BackendKind, Loaded, ModelArgs, PrefillProgress, error_text, load_on, model_path, stats_line,
};
use crate::gpu_probe::{self, GpuProbeArgs, ProbeHandle, set_phase};

/// The default document of the `summarise` turn (an original text, ~650 words).
pub const DOCUMENT: &str = include_str!("../../assets/eval/document.txt");

/// The warm-up question, answered in its own session.
pub const WARMUP_PROMPT: &str = "In one sentence, what does a tide mill do?";
/// Token cap of the warm-up turn.
const WARMUP_MAX_TOKENS: usize = 32;

/// The conversation's user turns: (name, message); the first is completed with the
/// document.
pub const TURNS: [(&str, &str); 3] = [
    (
        "summarise",
        "Summarise the following document in about 150 words.\n\n",
    ),
    (
        "story",
        "Now write a short story, about 300 words, about a lighthouse keeper.",
    ),
    (
        "is_prime",
        "Write a Python function is_prime(n) that returns True when the integer n is a \
         prime number and False otherwise; it must handle 0, 1 and negative numbers. \
         Give the complete function in one ```python code block.",
    ),
];

/// Seconds since the epoch of the template clock (2025-01-01T00:00:00Z).
const TEMPLATE_CLOCK: u64 = 1_735_689_600;

#[derive(Args, Debug)]
pub struct EvalArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Sampling temperature.
    #[arg(long = "temp", default_value_t = 0.6, allow_negative_numbers = true,
          value_parser = real::<f32>(0.0..=100.0))]
    pub temp: f32,
    /// Nucleus sampling threshold (1: off).
    #[arg(long = "top-p", default_value_t = 0.95, allow_negative_numbers = true,
          value_parser = real::<f32>(0.0..=1.0))]
    pub top_p: f32,
    /// Keep the k most likely tokens (0: off).
    #[arg(long = "top-k", default_value_t = 0, allow_negative_numbers = true,
          value_parser = int::<i32>(0..))]
    pub top_k: i32,
    /// Drop tokens less likely than min-p × the top token's probability (0: off).
    #[arg(long = "min-p", default_value_t = 0.0, allow_negative_numbers = true,
          value_parser = real::<f32>(0.0..=1.0))]
    pub min_p: f32,
    /// RNG seed (turn i of the conversation uses seed + i).
    #[arg(long = "seed", default_value_t = 42, allow_negative_numbers = true,
          value_parser = int::<u64>(..))]
    pub seed: u64,
    /// Greedy decoding (argmax) instead of sampling.
    #[arg(long = "greedy")]
    pub greedy: bool,
    /// Most tokens per turn; a turn that reaches it stops with reason `length`.
    #[arg(long = "max-tokens", default_value_t = 2048, allow_negative_numbers = true,
          value_parser = int::<usize>(1..))]
    pub max_tokens: usize,
    /// The document to summarise (default: the one shipped with the binary).
    #[arg(long = "document", value_name = "FILE")]
    pub document: Option<PathBuf>,
    /// Python interpreter for the is_prime check.
    #[arg(long = "python", default_value = "python3")]
    pub python: String,
    /// Wall-clock limit of the is_prime check, seconds.
    #[arg(long = "check-timeout", default_value_t = 20, allow_negative_numbers = true,
          value_parser = int::<u64>(1..))]
    pub check_timeout: u64,
    /// Address-space limit of the is_prime check, MiB.
    #[arg(long = "check-memory-mb", default_value_t = 512, allow_negative_numbers = true,
          value_parser = int::<u64>(1..))]
    pub check_memory_mb: u64,
    /// Write the conversation (messages, answers, reasoning) as JSON to FILE.
    #[arg(long = "transcript", value_name = "FILE")]
    pub transcript: Option<PathBuf>,
    /// Print the receipt as JSON on stdout instead of the table.
    #[arg(long = "json")]
    pub json: bool,
    #[command(flatten)]
    pub receipt: ReceiptArgs,
    #[command(flatten)]
    pub probe: GpuProbeArgs,
}

impl EvalArgs {
    fn sampler(&self) -> SamplerParams {
        if self.greedy {
            SamplerParams::GREEDY
        } else {
            SamplerParams {
                temperature: self.temp,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
            }
        }
    }

    fn check_options(&self) -> prime::CheckOptions {
        prime::CheckOptions {
            python: self.python.clone(),
            timeout: Duration::from_secs(self.check_timeout.max(1)),
            memory_mb: self.check_memory_mb,
        }
    }

    fn settings(&self, document: &str) -> Map<String, Value> {
        let s = self.sampler();
        let threads = self
            .model
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let v = json!({
            "greedy": self.greedy,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "min_p": s.min_p,
            "seed": self.seed,
            "max_tokens": self.max_tokens,
            "warmup_max_tokens": WARMUP_MAX_TOKENS.min(self.max_tokens),
            "threads": threads,
            "ctx": self.model.ctx,
            "document_sha256": sha256_bytes(document.as_bytes()),
            "prime_check": {
                "range": [prime::LOW, prime::HIGH],
                "timeout_s": self.check_timeout.max(1),
                "memory_mb": self.check_memory_mb,
                "network": prime::Isolation::detect().as_str(),
            },
        });
        v.as_object().cloned().unwrap_or_default()
    }
}

/// One turn's text as generated.
#[derive(Debug, Clone, serde::Serialize)]
struct TurnText {
    name: String,
    user: String,
    answer: String,
    reasoning: Option<String>,
}

pub fn main(args: EvalArgs) -> Result<()> {
    // The receipt's folder first: a run of hours is not lost to a typo in its path.
    args.receipt
        .check_writable()
        .context("writing the receipt")?;
    let document = match &args.document {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("reading the document {}", p.display())),
        None => Ok(DOCUMENT.to_string()),
    };
    let backend = match args.model.backend {
        BackendKind::Cpu => "cpu",
        BackendKind::Cuda => "cuda",
    };
    let path = model_path(&args.model);
    let ctx = args.receipt.context(
        backend,
        path.as_ref().ok().map(PathBuf::as_path),
        args.settings(document.as_deref().unwrap_or_default()),
        None,
    );
    let mut receipt = Receipt::start(ReceiptKind::Eval, &ctx);
    let mut texts = Vec::new();
    let result = path
        .and(document)
        .and_then(|d| run(&args, &d, &mut receipt, &mut texts));
    if let Err(e) = &result {
        receipt.record_failure("eval", &error_text(e));
    }
    receipt.finish_time();
    args.receipt
        .write(&receipt)
        .context("writing the receipt")?;
    if let Some(p) = &args.transcript {
        let doc = json!({ "turns": texts });
        std::fs::write(p, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("writing the transcript {}", p.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&receipt)?);
    } else if let Some(e) = receipt.eval.as_ref().filter(|e| e.warmup.is_some()) {
        // (A run that failed before its warm-up turn has no table to show.)
        print!("{}", table(e));
    }
    result?;
    if receipt.is_failed() {
        bail!("eval failed: {}", receipt.failures[0].message);
    }
    Ok(())
}

fn run(
    args: &EvalArgs,
    document: &str,
    receipt: &mut Receipt,
    texts: &mut Vec<TurnText>,
) -> Result<()> {
    let probe = args.probe.start(args.model.ordinal())?;
    set_phase(&probe, "load");
    let loaded = load_on(&args.model);
    set_phase(&probe, "idle");
    let result = loaded
        .context("loading the model")
        .and_then(|l| conversation(args, document, &l, receipt, texts, &probe));
    gpu_probe::finish(probe);
    result
}

fn render_options() -> RenderOptions {
    RenderOptions {
        now: Some(UNIX_EPOCH + Duration::from_secs(TEMPLATE_CLOCK)),
        ..RenderOptions::default()
    }
}

fn conversation(
    args: &EvalArgs,
    document: &str,
    loaded: &Loaded,
    receipt: &mut Receipt,
    texts: &mut Vec<TurnText>,
    probe: &Option<ProbeHandle>,
) -> Result<()> {
    let lm = &loaded.lm;
    if let Some(b) = &loaded.cuda {
        receipt.machine.gpu = Some(crate::bench::gpu_info(b));
    }
    // Warm-up: its own session, dropped afterwards.
    let warm = [ChatMessage::new("user", WARMUP_PROMPT)];
    let (_, prompt) = lm.chat_prompt(&warm, &render_options())?;
    let mut session = Session::new(
        lm.model.clone(),
        args.model.n_ctx(lm).max(prompt.len() + 64),
    )?;
    let params = GenerateParams {
        max_tokens: WARMUP_MAX_TOKENS.min(args.max_tokens),
        sampler: args.sampler(),
        seed: args.seed,
        needs_logits: false,
    };
    let warm = match turn(lm, &mut session, "warmup", &prompt, false, &params, probe) {
        Ok(t) => t,
        Err(e) => {
            receipt.push_failure(Failure {
                stage: "warmup".into(),
                message: error_text(&e),
                turn: None,
                run: None,
            });
            return Ok(());
        }
    };
    eval_mut(receipt).warmup = Some(warm.record);
    drop(session);

    let mut history: Vec<ChatMessage> = Vec::new();
    let mut session: Option<Session> = None;
    for (i, (name, text)) in TURNS.iter().enumerate() {
        let user = if i == 0 {
            format!("{text}{}", document.trim())
        } else {
            text.to_string()
        };
        history.push(ChatMessage::new("user", &user));
        let (rendered, prompt) = lm.chat_prompt(&history, &render_options())?;
        let starts_in_reasoning = rendered.trim_end().ends_with(THINK_OPEN);
        // Room for this prompt and every remaining turn at the cap, plus their messages.
        let s = match session.as_mut() {
            Some(s) => s,
            None => {
                let need = prompt.len() + TURNS.len() * (args.max_tokens + 128);
                if Session::check_ctx(lm.model.info(), need).is_err() {
                    bail!(
                        "the workload needs a context of {need} tokens (its first prompt of {} tokens, then {} turns of up to --max-tokens {} and their messages), more than the {} tokens this model was trained for",
                        prompt.len(),
                        TURNS.len(),
                        args.max_tokens,
                        lm.model.info().n_ctx_train
                    );
                }
                session.insert(Session::new(
                    lm.model.clone(),
                    args.model.n_ctx(lm).max(need),
                )?)
            }
        };
        let params = GenerateParams {
            max_tokens: args.max_tokens,
            sampler: args.sampler(),
            seed: args.seed.wrapping_add(i as u64),
            needs_logits: false,
        };
        match turn(lm, s, name, &prompt, starts_in_reasoning, &params, probe) {
            Ok(t) => {
                let context_full = t.stats.stop == EngineStop::ContextFull;
                eval_mut(receipt).turns.push(t.record);
                texts.push(TurnText {
                    name: name.to_string(),
                    user: user.clone(),
                    answer: t.answer.clone(),
                    reasoning: t.reasoning.clone(),
                });
                if context_full {
                    receipt.push_failure(Failure {
                        stage: "turn".into(),
                        message: format!(
                            "the context ({} tokens) filled up before the turn ended",
                            s.n_ctx()
                        ),
                        turn: Some(i),
                        run: None,
                    });
                    return Ok(());
                }
                if *name == "is_prime" {
                    set_phase(probe, "check");
                    let code = prime::extract_python(&t.answer);
                    let (check, infra) = prime::check(code.as_deref(), &args.check_options());
                    set_phase(probe, "idle");
                    eval_mut(receipt).is_prime = Some(check);
                    if let Some(e) = infra {
                        receipt.push_failure(Failure {
                            stage: "prime_check".into(),
                            message: e,
                            turn: Some(i),
                            run: None,
                        });
                    }
                }
                let mut reply = ChatMessage::new("assistant", &t.answer);
                reply.reasoning_content = t.reasoning;
                history.push(reply);
            }
            Err(e) => {
                receipt.push_failure(Failure {
                    stage: "turn".into(),
                    message: error_text(&e),
                    turn: Some(i),
                    run: None,
                });
                return Ok(());
            }
        }
    }
    Ok(())
}

/// The receipt's eval results (created when absent).
fn eval_mut(r: &mut Receipt) -> &mut EvalResults {
    r.eval.get_or_insert_with(EvalResults::default)
}

/// One generated turn.
struct Turn {
    record: TurnRecord,
    stats: GenerateStats,
    answer: String,
    reasoning: Option<String>,
}

fn stop_reason(s: EngineStop) -> StopReason {
    match s {
        EngineStop::Eog => StopReason::Eos,
        // A full context is a cap too; the caller records it as a failure.
        EngineStop::Length | EngineStop::ContextFull => StopReason::Length,
        EngineStop::Stopped => StopReason::Stop,
    }
}

/// Generates one turn in `session` and measures it.
fn turn(
    lm: &LoadedModel,
    session: &mut Session,
    name: &str,
    prompt: &[u32],
    starts_in_reasoning: bool,
    params: &GenerateParams,
    probe: &Option<ProbeHandle>,
) -> Result<Turn> {
    let tok = &lm.tokenizer;
    let mut generated = Vec::new();
    let mut progress = PrefillProgress::new();
    set_phase(probe, "prefill");
    let stats = generate(
        session,
        prompt,
        params,
        &|t| tok.is_eog(t),
        &mut |d, n| progress.update(d, n),
        &mut |t, _| {
            if generated.is_empty() {
                set_phase(probe, "decode");
            }
            generated.push(t);
            ControlFlow::Continue(())
        },
    );
    set_phase(probe, "idle");
    let stats = stats.with_context(|| format!("turn {name}"))?;
    eprintln!("{name}: {}", stats_line(&stats));
    let visible: Vec<u32> = generated
        .iter()
        .copied()
        .filter(|&t| !tok.is_eog(t))
        .collect();
    let text = tok.decode(&visible, false);
    let (reasoning, answer) = split_reasoning(&text, starts_in_reasoning);
    let record = record(
        name,
        &stats,
        &answer,
        reasoning.as_deref(),
        session.tokens(),
    );
    Ok(Turn {
        record,
        stats,
        answer,
        reasoning,
    })
}

/// The receipt record of a turn: `stats` as measured (unmeasured times stay `None`,
/// serialised as `null`), hashes of the answer and reasoning, and the frontier.
fn record(
    name: &str,
    stats: &GenerateStats,
    answer: &str,
    reasoning: Option<&str>,
    frontier: &[u32],
) -> TurnRecord {
    let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e3);
    TurnRecord {
        name: name.to_string(),
        prompt_tokens: stats.prompt_tokens as u64,
        cached_tokens: stats.cached_tokens as u64,
        restore_ms: None,
        prefill_ms: ms(stats.prefill_time),
        generated_tokens: stats.generated_tokens as u64,
        decode_ms: ms(stats.decode_time),
        decode_tok_s: stats.decode_tps(),
        stop_reason: stop_reason(stats.stop),
        text_sha256: sha256_bytes(answer.as_bytes()),
        reasoning_sha256: reasoning.map(|r| sha256_bytes(r.as_bytes())),
        frontier_tokens: Some(frontier.len() as u64),
        frontier_sha256: Some(sha256_tokens(frontier)),
    }
}

/// The results as a text table.
pub fn table(e: &EvalResults) -> String {
    let opt = |v: Option<f64>, prec: usize| v.map_or("-".to_string(), |v| format!("{v:.prec$}"));
    let mut s = format!(
        "{:<10} {:>7} {:>7} {:>10} {:>9} {:>8} {:>8} {:<7} {:<16}\n",
        "turn",
        "prompt",
        "cached",
        "prefill ms",
        "prefill/s",
        "gen",
        "decode/s",
        "stop",
        "text sha256"
    );
    for t in e.warmup.iter().chain(&e.turns) {
        let stop = serde_json::to_value(t.stop_reason)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        s.push_str(&format!(
            "{:<10} {:>7} {:>7} {:>10} {:>9} {:>8} {:>8} {:<7} {:<16}\n",
            t.name,
            t.prompt_tokens,
            t.cached_tokens,
            opt(t.prefill_ms, 1),
            opt(t.prefill_tok_s(), 1),
            t.generated_tokens,
            opt(t.decode_rate(), 1),
            stop,
            &t.text_sha256[..16.min(t.text_sha256.len())]
        ));
    }
    match &e.is_prime {
        Some(c) => {
            s.push_str(&format!(
                "is_prime: {} of {} cases passed{}",
                c.passed,
                c.total,
                if c.all_passed() { " (all)" } else { "" }
            ));
            if let Some(ce) = &c.first_counterexample {
                s.push_str(&format!(
                    "; first counterexample is_prime({}) = {} (expected {})",
                    ce.n,
                    ce.got,
                    if ce.expected { "True" } else { "False" }
                ));
            }
            if let Some(err) = &c.error {
                s.push_str(&format!("; {err}"));
            }
            s.push('\n');
        }
        None => s.push_str("is_prime: not checked\n"),
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unmeasured_components_are_null() {
        // Everything cached and one token generated: neither prefill nor decode ran.
        let stats = GenerateStats {
            prompt_tokens: 10,
            cached_tokens: 10,
            prefill_time: None,
            generated_tokens: 1,
            decode_time: None,
            stop: EngineStop::Eog,
        };
        assert!(stats_line(&stats).contains("prefill - tok/s"));
        assert!(stats_line(&stats).contains("decode - tok/s"));
        let r = record("t", &stats, "abc", None, &[1, 256]);
        let v = serde_json::to_value(&r).unwrap();
        for key in [
            "prefill_ms",
            "decode_ms",
            "decode_tok_s",
            "restore_ms",
            "reasoning_sha256",
        ] {
            assert!(v[key].is_null(), "{key}: {}", v[key]);
        }
        assert_eq!(v["stop_reason"], "eos");
        // `printf abc | sha256sum`; ids [1, 256] as little-endian u32 (ds4-measure's vector).
        assert_eq!(
            r.text_sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            r.frontier_sha256.as_deref(),
            Some("242045e2f1bb37769b514f182fd91b3d215324cb57f187cced1e9c62921dbac3")
        );
        // A measured prefill is kept in ms.
        let measured = GenerateStats {
            cached_tokens: 4,
            prefill_time: Some(Duration::from_millis(250)),
            stop: EngineStop::ContextFull,
            ..stats
        };
        let r = record("t", &measured, "", Some("why"), &[]);
        assert_eq!(r.prefill_ms, Some(250.0));
        assert_eq!(r.prefill_tok_s(), Some(24.0));
        assert_eq!(r.stop_reason, StopReason::Length);
        assert!(r.reasoning_sha256.is_some());
    }

    #[test]
    fn table_shows_dashes_and_the_check() {
        let stats = GenerateStats {
            prompt_tokens: 10,
            cached_tokens: 10,
            prefill_time: None,
            generated_tokens: 1,
            decode_time: None,
            stop: EngineStop::Length,
        };
        let e = EvalResults {
            warmup: None,
            turns: vec![record("story", &stats, "x", None, &[])],
            is_prime: Some(ds4_measure::receipt::PrimeCheck {
                extracted: true,
                passed: 4342,
                total: 5011,
                first_counterexample: Some(ds4_measure::receipt::Counterexample {
                    n: 2,
                    expected: true,
                    got: "False".into(),
                }),
                error: None,
            }),
        };
        let t = table(&e);
        assert!(t.contains("story"), "{t}");
        assert!(t.contains("length"), "{t}");
        assert!(t.contains("4342 of 5011"), "{t}");
        assert!(t.contains("is_prime(2) = False (expected True)"), "{t}");
    }
}
