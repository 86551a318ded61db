//! `ds4-server run`: one prompt, one streamed answer, one stats line.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use ds4_engine::Session;
use ds4_engine::generate::{GenerateParams, generate};
use ds4_tokenizer::{ChatMessage, RenderOptions, StreamDecoder};

use crate::common::{ModelArgs, PrefillProgress, SamplingArgs, load, stats_line};
use crate::gpu_probe::{self, GpuProbeArgs, set_phase};

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// The prompt: the user message, or raw text with --no-template.
    #[arg(short = 'p', long = "prompt", conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from a file (`-`: standard input).
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// A system message (chat template only).
    #[arg(long = "system", conflicts_with = "no_template")]
    pub system: Option<String>,
    /// Most tokens to generate.
    #[arg(short = 'n', long = "n-predict", value_name = "N", default_value_t = 512,
          allow_negative_numbers = true, value_parser = ds4_args::int::<usize>(0..))]
    pub n_predict: usize,
    /// Use the prompt as raw text, without the chat template.
    #[arg(long = "no-template")]
    pub no_template: bool,
    /// Print the prompt and generated token ids as one JSON line on stderr.
    #[arg(long = "dump-tokens")]
    pub dump_tokens: bool,
    #[command(flatten)]
    pub probe: GpuProbeArgs,
}

/// The prompt text from `-p` or `-f`.
fn prompt_text(args: &RunArgs) -> Result<String> {
    match (&args.prompt, &args.file) {
        (Some(p), _) => Ok(p.clone()),
        (None, Some(f)) if f.as_os_str() == "-" => {
            std::io::read_to_string(std::io::stdin()).context("reading the prompt from stdin")
        }
        (None, Some(f)) => {
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))
        }
        (None, None) => bail!("give a prompt with -p TEXT or -f FILE"),
    }
}

pub fn main(args: RunArgs) -> Result<()> {
    let text = prompt_text(&args)?;
    let probe = args.probe.start(args.model.ordinal())?;
    set_phase(&probe, "load");
    let lm = load(&args.model)?;
    let prompt = if args.no_template {
        lm.tokenize_rendered(&text)
    } else {
        let mut messages = Vec::new();
        if let Some(s) = &args.system {
            messages.push(ChatMessage::new("system", s));
        }
        messages.push(ChatMessage::new("user", &text));
        lm.chat_prompt(&messages, &RenderOptions::default())?.1
    };
    let mut session = Session::new(lm.model.clone(), args.model.n_ctx(&lm))?;
    let params = GenerateParams {
        max_tokens: args.n_predict,
        sampler: args.sampling.params(),
        seed: args.sampling.seed(),
        needs_logits: false,
    };
    let mut decoder = StreamDecoder::new();
    let mut generated = Vec::new();
    let mut stdout = std::io::stdout().lock();
    let mut progress = PrefillProgress::new();
    let tok = &lm.tokenizer;
    set_phase(&probe, "prefill");
    let stats = generate(
        &mut session,
        &prompt,
        &params,
        &|t| tok.is_eog(t),
        &mut |d, n| progress.update(d, n),
        &mut |t, _| {
            if generated.is_empty() {
                set_phase(&probe, "decode");
            }
            generated.push(t);
            let piece = decoder.push(&tok.piece(t, false));
            // A closed stdout (e.g. `| head`) ends generation quietly.
            match stdout
                .write_all(piece.as_bytes())
                .and_then(|_| stdout.flush())
            {
                Ok(()) => ControlFlow::Continue(()),
                Err(_) => ControlFlow::Break(()),
            }
        },
    )?;
    set_phase(&probe, "idle");
    let _ = writeln!(stdout, "{}", decoder.flush());
    eprintln!("{}", stats_line(&stats));
    gpu_probe::finish(probe);
    if args.dump_tokens {
        eprintln!(
            "{}",
            serde_json::json!({ "prompt": prompt, "generated": generated })
        );
    }
    Ok(())
}
