//! `ds4-server bench`: prefill tokens/s for N-token prompts (default 512; 512 and 4096
//! on CUDA) and decode tokens/s for M greedy tokens (default 128) after a short chat
//! prompt, each over several runs after a warm-up, reported as median, min and max
//! (table or `--json`), optionally with a receipt of every run (`--receipt FILE`).
//!
//! Method, as llama.cpp's figures in the fixtures were taken: every run goes on one
//! session, emptied before it, as llama-bench keeps one context per test and the server
//! one session per worker (a run's decode steps replay the CUDA graphs the warm-up
//! captured, as a request's do); prefill evaluates the first N tokens of fixed prose (no
//! template); decode is the time from the first to the (M+1)-th sampled token (M
//! single-token decodes, each queued before the token before it is read, as greedy
//! generation decodes; end-of-generation ignored).
//!
//! With `--backend cuda` (issue 5, item 4) it also reports the device's copy bandwidth
//! measured at start (`ds4_cuda::bench::copy_bandwidth`: 1 GiB device-to-device, bytes
//! read plus written), the weight bytes one decode token reads
//! (`ModelInfo::decode_weight_bytes`), the achieved bandwidth (those bytes × tokens/s)
//! and its fraction of the copy bandwidth, kernel launches per decode token and how
//! many decode steps were CUDA-graph replays, and the device time per model part (the
//! family's regions: KDA attention, MLA + DSA, MoE, …) of a few eagerly run decode steps
//! with an event around each kernel. `--synthetic NAME` benchmarks a model of
//! a real shape with random weights built in GPU memory (`ds4-server synth` writes the
//! same weights as a file).

use std::io::Write;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use ds4_args::int;
use ds4_cuda::{CudaBackend, PartTime, by_part};
use ds4_engine::sampler::argmax;
use ds4_engine::{GreedyEnd, LoadedModel, Session};
use ds4_measure::args::ReceiptArgs;
use ds4_measure::receipt::{BenchRun, Failure, GpuInfo, Receipt, ReceiptKind};
use ds4_measure::stats::Summary;
use ds4_tokenizer::{ChatMessage, RenderOptions};
use serde_json::{Map, Value, json};

use crate::common::{
    BackendKind, Loaded, ModelArgs, check_device, error_text, gpu_ordinal, init_threads, load_on,
    model_path,
};
use crate::gpu_probe::{self, GpuProbeArgs, ProbeHandle, set_phase};

/// Fixed prose for the prefill prompt (original text, repeated as needed).
const PROSE: &str = include_str!("../assets/bench-prose.txt");

/// The decode measurement's chat prompt.
const DECODE_QUESTION: &str = "What is the capital city of Australia?";

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Benchmark a synthetic model `SHAPE:QUANT` (e.g. `llama3-8b:q4_k_m`) built in GPU
    /// memory instead of a file (needs --backend cuda).
    #[arg(long = "synthetic", value_name = "NAME", conflicts_with = "model")]
    pub synthetic: Option<String>,
    /// Prompt lengths for the prefill measurement, comma-separated
    /// (default: 512; on CUDA 512,4096; those longer than --ctx left out).
    #[arg(long = "prefill-tokens", value_delimiter = ',', value_name = "N[,N…]",
          allow_negative_numbers = true, value_parser = int::<usize>(1..))]
    pub prefill_tokens: Vec<usize>,
    /// Tokens for the decode measurement.
    #[arg(long = "decode-tokens", value_name = "N", default_value_t = 128,
          allow_negative_numbers = true, value_parser = int::<usize>(1..))]
    pub decode_tokens: usize,
    /// Counted runs of each measurement (after one warm-up).
    #[arg(long = "runs", value_name = "N", default_value_t = 5,
          allow_negative_numbers = true, value_parser = int::<usize>(1..))]
    pub runs: usize,
    /// Print JSON instead of a table.
    #[arg(long = "json")]
    pub json: bool,
    #[command(flatten)]
    pub receipt: ReceiptArgs,
    #[command(flatten)]
    pub probe: GpuProbeArgs,
}

impl BenchArgs {
    /// The prompt lengths asked for, else the defaults that fit `--ctx` (or `--ctx`
    /// itself, when it is shorter than all of them).
    fn prefill_sizes(&self) -> Vec<usize> {
        if !self.prefill_tokens.is_empty() {
            return self.prefill_tokens.clone();
        }
        let defaults: &[usize] = match self.model.backend {
            BackendKind::Cpu => &[512],
            BackendKind::Cuda => &[512, 4096],
        };
        let ctx = self.model.ctx.unwrap_or(usize::MAX);
        let fit: Vec<usize> = defaults.iter().copied().filter(|&n| n <= ctx).collect();
        if fit.is_empty() { vec![ctx] } else { fit }
    }

    fn settings(&self) -> Map<String, Value> {
        let threads = self
            .model
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let v = json!({
            "prefill_tokens": self.prefill_sizes(),
            "decode_tokens": self.decode_tokens,
            "runs": self.runs,
            "warmup_runs": 1,
            "threads": threads,
            "ctx": self.model.ctx,
            "synthetic": self.synthetic,
            "decode_prompt": DECODE_QUESTION,
        });
        v.as_object().cloned().unwrap_or_default()
    }
}

/// One timed measurement: milliseconds and tokens per second.
#[derive(Debug, Clone, Copy)]
struct Timed {
    ms: f64,
    tok_s: f64,
}

impl Timed {
    fn of(tokens: usize, t0: Instant) -> Timed {
        let s = t0.elapsed().as_secs_f64();
        Timed {
            ms: s * 1e3,
            tok_s: tokens as f64 / s,
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

fn prefill_run(s: &mut Session, prompt: &[u32]) -> Result<Timed> {
    s.reset()?;
    let t0 = Instant::now();
    s.prefill(prompt, &mut |_, _| {})?;
    Ok(Timed::of(prompt.len(), t0))
}

fn decode_run(
    s: &mut Session,
    prompt: &[u32],
    n: usize,
    probe: &Option<ProbeHandle>,
) -> Result<Timed> {
    s.reset()?;
    set_phase(probe, "prefill");
    s.prefill(prompt, &mut |_, _| {})?;
    set_phase(probe, "decode");
    let t0 = Instant::now();
    greedy_steps(s, n)?;
    Ok(Timed::of(n, t0))
}

/// `n` greedy decode steps after what `s` holds, each queued before the previous
/// choice is read ([`Session::decode_greedy`], as generation decodes greedily).
fn greedy_steps(s: &mut Session, n: usize) -> Result<()> {
    let first = argmax(s.logits().context("no logits after prefill")?);
    match s.decode_greedy(first, n, &mut |_| ControlFlow::Continue(()))? {
        GreedyEnd::Max => Ok(()),
        end => bail!("{n} greedy decode steps ended early: {end:?}"),
    }
}

/// Decode steps timed kernel by kernel for the time per model part (CUDA only).
const PROFILED_STEPS: usize = 4;

/// The device time per model part (the family's regions: KDA attention, MLA + DSA,
/// MoE, dense FFN, …) of [`PROFILED_STEPS`] decode steps after `prompt`, run eagerly
/// with an event around every kernel.
fn profile_parts(s: &mut Session, prompt: &[u32], backend: &CudaBackend) -> Result<Vec<PartTime>> {
    s.reset()?;
    s.prefill(prompt, &mut |_, _| {})?;
    let graphs = backend.graphs();
    backend.set_graphs(false);
    backend.set_profile(true);
    backend.take_profile();
    let run = greedy_steps(s, PROFILED_STEPS);
    backend.set_profile(false);
    backend.set_graphs(graphs);
    let rows = backend.take_profile();
    run?;
    Ok(by_part(&rows))
}

/// Loads the model of `args`: a file on the chosen backend, or a synthetic one on the
/// chosen GPU.
fn load_model(args: &BenchArgs) -> Result<Loaded> {
    let Some(name) = &args.synthetic else {
        return load_on(&args.model);
    };
    if args.model.backend != BackendKind::Cuda {
        bail!(
            "--synthetic needs --backend cuda (its weights are built in GPU memory); \
             for the CPU write the model with `ds4-server synth {name} OUT.gguf` and pass -m OUT.gguf"
        );
    }
    init_threads(args.model.threads)?;
    let spec = ds4_cuda::synth::Spec::parse(name)?;
    let ordinal = gpu_ordinal(&args.model, || Ok(spec.layout()?))?;
    check_device(ordinal)?;
    let s =
        ds4_cuda::load_synthetic(&spec, ordinal).with_context(|| format!("synthetic {name}"))?;
    let spec_name = spec.name();
    let lm = LoadedModel::from_parts(Path::new(&spec_name), s.file, s.model)?;
    Ok(Loaded {
        lm,
        cuda: Some(s.backend),
    })
}

/// GPU facts for a receipt: name and memory from the backend; driver version and
/// clocks from `nvidia-smi` when it is installed (else absent).
pub fn gpu_info(b: &CudaBackend) -> GpuInfo {
    let gpu = b.gpu();
    let mut info = GpuInfo {
        name: gpu.name.clone(),
        memory_bytes: gpu.mem_info().ok().map(|(_, total)| total as u64),
        ..Default::default()
    };
    let smi = std::process::Command::new("nvidia-smi")
        .args([
            "--query-gpu=driver_version,clocks.sm,clocks.mem,clocks.max.sm",
            "--format=csv,noheader,nounits",
            "-i",
            "0",
        ])
        .output();
    if let Ok(o) = smi.as_ref()
        && o.status.success()
    {
        let text = String::from_utf8_lossy(&o.stdout);
        let f: Vec<&str> = text
            .lines()
            .next()
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .collect();
        let num = |i: usize| f.get(i).and_then(|s| s.parse::<u32>().ok());
        info.driver = f.first().filter(|s| !s.is_empty()).map(|s| s.to_string());
        info.sm_clock_mhz = num(1);
        info.mem_clock_mhz = num(2);
        info.max_sm_clock_mhz = num(3);
    }
    info
}

/// CUDA figures measured once per benchmark.
struct CudaContext {
    backend: Arc<CudaBackend>,
    /// Copy bandwidth in bytes/s (read + written), when measured.
    copy_bytes_per_s: Option<f64>,
    weight_bytes: u64,
}

/// Everything measured, for the table and the JSON.
struct Measured {
    prefill: Vec<(usize, Vec<Option<Timed>>)>,
    decode: Vec<Option<Timed>>,
    /// CUDA-graph replays of each decode run (CUDA only).
    replays: Vec<Option<u64>>,
    decode_prompt_tokens: usize,
    /// Kernel launches per decode token (CUDA only).
    kernels_per_token: Option<usize>,
    /// Device time per model part of [`PROFILED_STEPS`] eager decode steps (CUDA only).
    parts: Vec<PartTime>,
}

impl Measured {
    /// Graph replays over the measured decode runs (CUDA only).
    fn graph_replays(&self) -> Option<u64> {
        self.replays.iter().copied().sum()
    }
}

pub fn main(args: BenchArgs) -> Result<()> {
    // The receipt's folder first: the measurements are not lost to a typo in its path.
    args.receipt
        .check_writable()
        .context("writing the receipt")?;
    let backend = match args.model.backend {
        BackendKind::Cpu => "cpu",
        BackendKind::Cuda => "cuda",
    };
    let path = match &args.synthetic {
        Some(_) => Ok(None),
        None => model_path(&args.model).map(Some),
    };
    let ctx = args.receipt.context(
        backend,
        path.as_ref().ok().and_then(|p| p.as_deref()),
        args.settings(),
        None,
    );
    let mut receipt = Receipt::start(ReceiptKind::Bench, &ctx);
    let result = path.and_then(|_| run(&args, &mut receipt));
    if let Err(e) = &result {
        receipt.record_failure("bench", &error_text(e));
    }
    receipt.finish_time();
    args.receipt
        .write(&receipt)
        .context("writing the receipt")?;
    result?;
    if receipt.is_failed() {
        bail!("{}", failure_summary(&receipt.failures));
    }
    Ok(())
}

/// One line for failed measurements: how many, then each distinct reason with the
/// measurements it stopped (`prefill 512 run 2`, `decode warm-up`).
fn failure_summary(failures: &[Failure]) -> String {
    let mut reasons: Vec<(&str, Vec<String>)> = Vec::new();
    for f in failures {
        let what = match f.run {
            Some(i) => format!("{} run {}", f.stage, i + 1),
            None => f.stage.clone(),
        };
        match reasons.iter_mut().find(|(m, _)| *m == f.message) {
            Some((_, whats)) => whats.push(what),
            None => reasons.push((&f.message, vec![what])),
        }
    }
    let reasons: Vec<String> = reasons
        .iter()
        .map(|(m, whats)| format!("{}: {m}", whats.join(", ")))
        .collect();
    format!(
        "{} measurement(s) failed — {}",
        failures.len(),
        reasons.join("; ")
    )
}

fn run(args: &BenchArgs, receipt: &mut Receipt) -> Result<()> {
    let probe = args.probe.start(args.model.ordinal())?;
    gpu_probe::set_phase(&probe, "load");
    let loaded = load_model(args);
    gpu_probe::set_phase(&probe, "idle");
    let Loaded { lm, cuda } = match loaded {
        Ok(l) => l,
        Err(e) => {
            gpu_probe::finish(probe);
            return Err(e);
        }
    };
    let cuda = cuda.map(|backend| {
        let mut info = gpu_info(&backend);
        let bw = ds4_cuda::bench::copy_bandwidth(backend.gpu(), backend.kernels(), 1 << 30, 10);
        let copy_bytes_per_s = match bw {
            Ok(b) => Some(b.bytes_per_s),
            Err(e) => {
                receipt.record_failure("copy_bandwidth", &e);
                None
            }
        };
        info.measured_bandwidth_gbs = copy_bytes_per_s.map(|b| b / 1e9);
        receipt.machine.gpu = Some(info);
        CudaContext {
            backend,
            copy_bytes_per_s,
            weight_bytes: lm.model.info().decode_weight_bytes,
        }
    });
    let measured = measure(args, &lm, cuda.as_ref(), receipt, &probe);
    gpu_probe::finish(probe);
    let m = measured?;
    fill_receipt(args, receipt, &m, cuda.as_ref());
    print(args, &lm, &m, cuda.as_ref())
}

fn measure(
    args: &BenchArgs,
    lm: &LoadedModel,
    cuda: Option<&CudaContext>,
    receipt: &mut Receipt,
    probe: &Option<ProbeHandle>,
) -> Result<Measured> {
    let question = [ChatMessage::new("user", DECODE_QUESTION)];
    let (_, chat) = lm.chat_prompt(&question, &RenderOptions::default())?;
    let sizes = args.prefill_sizes();
    check_context(args, lm, &sizes, chat.len())?;
    let n_ctx = sizes
        .iter()
        .copied()
        .fold(args.model.n_ctx(lm), usize::max)
        .max(chat.len() + args.decode_tokens + 1);
    if n_ctx != args.model.n_ctx(lm) {
        Progress::say(&format!(
            "bench: a session of {n_ctx} tokens, what the longest measurement needs\n"
        ));
    }
    let mut session = Session::new(lm.model.clone(), n_ctx)
        .with_context(|| format!("a session of {n_ctx} tokens for the benchmark"))?;
    let mut progress = Progress::new(args.runs);
    let mut fail = |progress: &mut Progress, stage: &str, run: Option<usize>, e: anyhow::Error| {
        let message = error_text(&e);
        progress.failed(&message);
        receipt.push_failure(Failure {
            stage: stage.to_string(),
            message,
            turn: None,
            run,
        });
    };
    let mut prefill = Vec::new();
    for &n in &sizes {
        let prompt = prefill_prompt(lm, n);
        set_phase(probe, "prefill");
        let mut runs = Vec::new();
        progress.start(&format!("prefill {n} tokens"));
        match prefill_run(&mut session, &prompt) {
            Err(e) => fail(&mut progress, &format!("prefill {n} warm-up"), None, e),
            Ok(_) => {
                progress.warmed_up();
                for i in 0..args.runs {
                    match prefill_run(&mut session, &prompt) {
                        Ok(t) => {
                            progress.run(t.tok_s);
                            runs.push(Some(t));
                        }
                        Err(e) => {
                            fail(&mut progress, &format!("prefill {n}"), Some(i), e);
                            runs.push(None);
                        }
                    }
                }
            }
        }
        progress.end();
        set_phase(probe, "idle");
        prefill.push((n, runs));
    }
    let (mut decode, mut replays) = (Vec::new(), Vec::new());
    let replays_so_far = || cuda.map(|c| c.backend.stats().graph_replays);
    progress.start(&format!("decode {} tokens", args.decode_tokens));
    match decode_run(&mut session, &chat, args.decode_tokens, probe) {
        Err(e) => fail(&mut progress, "decode warm-up", None, e),
        Ok(_) => {
            progress.warmed_up();
            for i in 0..args.runs {
                let before = replays_so_far();
                let t = decode_run(&mut session, &chat, args.decode_tokens, probe);
                replays.push(before.zip(replays_so_far()).map(|(b, a)| a - b));
                match t {
                    Ok(t) => {
                        progress.run(t.tok_s);
                        decode.push(Some(t));
                    }
                    Err(e) => {
                        fail(&mut progress, "decode", Some(i), e);
                        decode.push(None);
                    }
                }
            }
        }
    }
    progress.end();
    set_phase(probe, "idle");
    let kernels_per_token = cuda.map(|c| c.backend.stats().decode_kernels);
    let parts = match cuda {
        None => Vec::new(),
        Some(c) => match profile_parts(&mut session, &chat, &c.backend) {
            Ok(parts) => parts,
            Err(e) => {
                fail(&mut progress, "profiled decode step", None, e);
                Vec::new()
            }
        },
    };
    Ok(Measured {
        prefill,
        decode,
        replays,
        decode_prompt_tokens: chat.len(),
        kernels_per_token,
        parts,
    })
}

/// Refuses measurements the model cannot hold: a prefill longer than its trained
/// context (or than `--ctx`, when given), or a decode whose prompt plus tokens exceed
/// either.
fn check_context(
    args: &BenchArgs,
    lm: &LoadedModel,
    sizes: &[usize],
    chat_tokens: usize,
) -> Result<()> {
    let need = chat_tokens + args.decode_tokens + 1;
    if let Some(ctx) = args.model.ctx {
        if let Some(n) = sizes.iter().find(|&&n| n > ctx) {
            bail!(
                "--prefill-tokens {n}: longer than --ctx {ctx} (raise --ctx, or leave it out: bench then sizes its session to the longest measurement)"
            );
        }
        if need > ctx {
            bail!(
                "--decode-tokens {}: the decode prompt ({chat_tokens} tokens) plus {} tokens need a context of {need}, more than --ctx {ctx} (raise --ctx, or leave it out)",
                args.decode_tokens,
                args.decode_tokens
            );
        }
    }
    let train = lm.model.info().n_ctx_train;
    if train == 0 {
        return Ok(());
    }
    if let Some(n) = sizes.iter().find(|&&n| n > train) {
        bail!(
            "--prefill-tokens {n}: longer than the {train} tokens this model was trained for (use 1 to {train})"
        );
    }
    if need > train {
        bail!(
            "--decode-tokens {}: the decode prompt ({chat_tokens} tokens) plus {} tokens exceed the {train} tokens this model was trained for (use at most {})",
            args.decode_tokens,
            args.decode_tokens,
            train.saturating_sub(chat_tokens + 1)
        );
    }
    Ok(())
}

/// Progress on stderr while measuring (the table or JSON comes on stdout at the end):
/// one line per measurement, its runs' tokens/s appended as they finish.
struct Progress {
    runs: usize,
}

impl Progress {
    fn new(runs: usize) -> Self {
        Progress { runs }
    }

    fn say(text: &str) {
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(text.as_bytes());
        let _ = err.flush();
    }

    fn start(&mut self, what: &str) {
        Self::say(&format!("bench: {what}: warm-up"));
    }

    fn warmed_up(&mut self) {
        Self::say(&format!(", {} runs (tok/s):", self.runs));
    }

    fn run(&mut self, tok_s: f64) {
        Self::say(&format!(" {tok_s:.1}"));
    }

    fn failed(&mut self, message: &str) {
        Self::say(&format!(" failed ({message})"));
    }

    fn end(&mut self) {
        Self::say("\n");
    }
}

/// Decode steps of the measured runs (each run decodes `decode_tokens` tokens; the
/// first is sampled from the prefill's logits).
fn decode_steps(args: &BenchArgs) -> u64 {
    (args.runs * args.decode_tokens) as u64
}

fn fill_receipt(args: &BenchArgs, receipt: &mut Receipt, m: &Measured, cuda: Option<&CudaContext>) {
    let Some(results) = receipt.bench.as_mut() else {
        return;
    };
    let first = &m.prefill[0];
    results.prompt_tokens = first.0 as u64;
    results.gen_tokens = args.decode_tokens as u64;
    results.warmup_runs = 1;
    results.runs = (0..args.runs)
        .map(|i| {
            let p = first.1.get(i).copied().flatten();
            let d = m.decode.get(i).copied().flatten();
            let mut run = BenchRun {
                prefill_tokens: first.0 as u64,
                prefill_ms: p.map(|t| t.ms),
                prefill_tok_s: p.map(|t| t.tok_s),
                decode_tokens: args.decode_tokens as u64,
                decode_ms: d.map(|t| t.ms),
                decode_tok_s: d.map(|t| t.tok_s),
                ..Default::default()
            };
            for (n, runs) in &m.prefill[1..] {
                let t = runs.get(i).copied().flatten();
                run.extra
                    .insert(format!("prefill_{n}_ms"), json!(t.map(|t| t.ms)));
                run.extra
                    .insert(format!("prefill_{n}_tok_s"), json!(t.map(|t| t.tok_s)));
            }
            if let (Some(c), Some(d)) = (cuda, d) {
                let achieved = c.weight_bytes as f64 * d.tok_s;
                run.decode_bandwidth_gbs = Some(achieved / 1e9);
                run.bandwidth_fraction = c.copy_bytes_per_s.map(|bw| achieved / bw);
            }
            if let Some(c) = cuda {
                run.extra
                    .insert("weight_bytes_per_token".into(), json!(c.weight_bytes));
                run.extra
                    .insert("kernels_per_token".into(), json!(m.kernels_per_token));
                run.extra.insert(
                    "graph_replays".into(),
                    json!(m.replays.get(i).copied().flatten()),
                );
            }
            run
        })
        .collect();
}

fn summary(runs: &[Option<Timed>]) -> (Option<Summary>, Vec<f64>) {
    let v: Vec<f64> = runs.iter().flatten().map(|t| t.tok_s).collect();
    (Summary::of(&v), v)
}

fn print(
    args: &BenchArgs,
    lm: &LoadedModel,
    m: &Measured,
    cuda: Option<&CudaContext>,
) -> Result<()> {
    let info = lm.model.info();
    let threads = rayon::current_num_threads();
    let (decode, decode_runs) = summary(&m.decode);
    let fig = |tok_s: f64| {
        cuda.map(|c| {
            let achieved = c.weight_bytes as f64 * tok_s;
            (achieved, c.copy_bytes_per_s.map(|bw| achieved / bw))
        })
    };
    if args.json {
        let prefill: Vec<Value> = m
            .prefill
            .iter()
            .map(|(n, runs)| {
                let (s, v) = summary(runs);
                json!({"tokens": n, "tps": s, "runs": v})
            })
            .collect();
        let cuda_doc = cuda.map(|c| {
            let (achieved, fraction) = decode
                .and_then(|d| fig(d.median))
                .map_or((None, None), |(a, f)| (Some(a), f));
            json!({
                "copy_bytes_per_s": c.copy_bytes_per_s,
                "weight_bytes_per_token": c.weight_bytes,
                "achieved_bytes_per_s": achieved,
                "fraction_of_copy": fraction,
                "kernels_per_token": m.kernels_per_token,
                "graph_replays": m.graph_replays(),
                "decode_steps": decode_steps(args),
                "decode_parts": m.parts.iter().map(|p| json!({
                    "part": p.region,
                    "us_per_token": 1e3 * p.ms / PROFILED_STEPS as f64,
                    "launches_per_token": p.launches as f64 / PROFILED_STEPS as f64,
                })).collect::<Vec<_>>(),
            })
        });
        let doc = json!({
            "model": info.name, "path": lm.path, "architecture": info.architecture,
            "backend": info.backend, "synthetic": args.synthetic, "threads": threads,
            "prefill": prefill,
            "decode": {"tokens": args.decode_tokens, "prompt_tokens": m.decode_prompt_tokens,
                       "tps": decode, "runs": decode_runs},
            "cuda": cuda_doc,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!(
        "model: {} ({}, backend {}, {threads} threads)",
        info.name, info.architecture, info.backend
    );
    println!(
        "{:<24} {:>10} {:>10} {:>10} {:>5}",
        "measurement", "median", "min", "max", "runs"
    );
    let row = |name: String, s: Option<Summary>| match s {
        Some(s) => println!(
            "{name:<24} {:>10.1} {:>10.1} {:>10.1} {:>5}",
            s.median, s.min, s.max, s.n
        ),
        None => println!("{name:<24} {:>10} {:>10} {:>10} {:>5}", "-", "-", "-", 0),
    };
    for (n, runs) in &m.prefill {
        row(format!("prefill {n} tok/s"), summary(runs).0);
    }
    row(format!("decode {} tok/s", args.decode_tokens), decode);
    if let Some(c) = cuda {
        match c.copy_bytes_per_s {
            Some(bw) => println!("copy bandwidth: {:.3} TB/s (read + written)", bw / 1e12),
            None => println!("copy bandwidth: not measured"),
        }
        println!(
            "weights read per decode token: {:.3} GB",
            c.weight_bytes as f64 / 1e9
        );
        if let Some((achieved, fraction)) = decode.and_then(|d| fig(d.median)) {
            let frac = fraction.map_or("-".to_string(), |f| format!("{:.1} %", 100.0 * f));
            println!(
                "achieved decode bandwidth: {:.3} TB/s = {frac} of copy",
                achieved / 1e12
            );
        }
        if let Some(k) = m.kernels_per_token {
            println!("kernel launches per decode token: {k}");
        }
        if let Some(r) = m.graph_replays() {
            println!(
                "decode steps replayed from a CUDA graph: {r} of {}",
                decode_steps(args)
            );
        }
        if !m.parts.is_empty() {
            let total: f64 = m.parts.iter().map(|p| p.ms).sum();
            println!(
                "time per model part, {PROFILED_STEPS} eager decode steps with an event around each kernel ({:.0} us/token in kernels):",
                1e3 * total / PROFILED_STEPS as f64
            );
            for p in &m.parts {
                println!(
                    "  {:<24} {:>9.1} us/token {:>5.1} % {:>7.1} launches/token",
                    p.region,
                    1e3 * p.ms / PROFILED_STEPS as f64,
                    100.0 * p.ms / total,
                    p.launches as f64 / PROFILED_STEPS as f64
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(stage: &str, run: Option<usize>, message: &str) -> Failure {
        Failure {
            stage: stage.into(),
            message: message.into(),
            turn: None,
            run,
        }
    }

    #[test]
    fn failure_summary_gives_each_reason_once_with_what_it_stopped() {
        let f = [
            failure("prefill 512", Some(1), "out of memory"),
            failure("decode warm-up", None, "context full"),
            failure("prefill 512", Some(3), "out of memory"),
        ];
        assert_eq!(
            failure_summary(&f),
            "3 measurement(s) failed — prefill 512 run 2, prefill 512 run 4: out of memory; \
             decode warm-up: context full"
        );
    }
}
