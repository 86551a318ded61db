//! `ds4-server replay`: teacher-forced replay of an exact token sequence.
//!
//! The first `--prefill N` tokens are evaluated in one prefill, then the remaining ids
//! are fed one at a time (never our own choice). Row `i` of the output is the logits
//! after token `i` (the distribution over token `i + 1`), for every position.
//!
//! Formats:
//! - `--dump-logits OUT`: raw little-endian f32, `n_tokens × n_vocab`, row-major, no
//!   header (`n_vocab` is printed on stderr).
//! - `--dump-logprobs OUT --top-k K`: JSON `{"n_vocab", "tokens", "positions": [{"pos",
//!   "top": [{"id", "logprob"}]}]}` with the K most likely ids per position (log-softmax
//!   of the raw logits in f64; ties by increasing id).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use ds4_engine::Session;
use ds4_engine::logprobs::top_logprobs;

use crate::common::{ModelArgs, load};

#[derive(Args, Debug)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A JSON array of token ids.
    #[arg(long = "tokens")]
    pub tokens: PathBuf,
    /// Tokens evaluated in the first prefill (default: all).
    #[arg(long = "prefill", value_name = "N", allow_negative_numbers = true,
          value_parser = ds4_args::int::<usize>(1..))]
    pub prefill: Option<usize>,
    /// Write every logits row as little-endian f32.
    #[arg(long = "dump-logits")]
    pub dump_logits: Option<PathBuf>,
    /// Write the top-k log-probabilities per position as JSON.
    #[arg(long = "dump-logprobs")]
    pub dump_logprobs: Option<PathBuf>,
    /// How many log-probabilities per position.
    #[arg(long = "top-k", value_name = "K", default_value_t = 10, allow_negative_numbers = true,
          value_parser = ds4_args::int::<usize>(1..))]
    pub top_k: usize,
}

pub fn main(args: ReplayArgs) -> Result<()> {
    if args.dump_logits.is_none() && args.dump_logprobs.is_none() {
        bail!("nothing to write: give --dump-logits OUT and/or --dump-logprobs OUT");
    }
    let text = std::fs::read_to_string(&args.tokens)
        .with_context(|| format!("reading {}", args.tokens.display()))?;
    let tokens: Vec<u32> = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a JSON array of token ids", args.tokens.display()))?;
    if tokens.is_empty() {
        bail!("{} holds no tokens", args.tokens.display());
    }
    let prefill = args.prefill.unwrap_or(tokens.len()).clamp(1, tokens.len());
    if let Some(ctx) = args.model.ctx.filter(|&c| c < tokens.len()) {
        bail!(
            "--ctx {ctx}: {} holds {} tokens (raise --ctx, or leave it out: replay then sizes its session to them)",
            args.tokens.display(),
            tokens.len()
        );
    }
    let lm = load(&args.model)?;
    let n_vocab = lm.model.info().n_vocab;
    if Session::check_ctx(lm.model.info(), tokens.len()).is_err() {
        bail!(
            "{} holds {} tokens, more than the {} this model was trained for",
            args.tokens.display(),
            tokens.len(),
            lm.model.info().n_ctx_train
        );
    }
    let mut session = Session::new(lm.model.clone(), args.model.n_ctx(&lm).max(tokens.len()))?;
    let mut logits = session.forward_all(&tokens[..prefill])?;
    for &t in &tokens[prefill..] {
        let row = session.decode(t)?;
        logits.extend_from_slice(row);
    }
    if let Some(out) = &args.dump_logits {
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?,
        );
        for v in &logits {
            f.write_all(&v.to_le_bytes())?;
        }
        f.flush()?;
    }
    if let Some(out) = &args.dump_logprobs {
        let positions: Vec<_> = logits
            .chunks(n_vocab)
            .enumerate()
            .map(|(pos, row)| {
                let top: Vec<_> = top_logprobs(row, args.top_k)
                    .into_iter()
                    .map(|(id, lp)| serde_json::json!({ "id": id, "logprob": lp }))
                    .collect();
                serde_json::json!({ "pos": pos, "top": top })
            })
            .collect();
        let doc =
            serde_json::json!({ "n_vocab": n_vocab, "tokens": tokens, "positions": positions });
        std::fs::write(out, serde_json::to_vec(&doc)?)
            .with_context(|| format!("writing {}", out.display()))?;
    }
    eprintln!(
        "replayed {} tokens (prefill {prefill}), n_vocab {n_vocab}",
        tokens.len()
    );
    Ok(())
}
