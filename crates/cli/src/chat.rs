//! `ds4-server chat`: interactive multi-turn chat. The transcript stays in one session,
//! so each turn prefills only the text the template adds after the common prefix.
//! Commands: `/help`, `/reset`, `/system [TEXT]`, `/quit`. Ctrl-C stops the current
//! answer and returns to the prompt; at the prompt it quits.
//!
//! Ctrl-C: the terminal sends SIGINT, which the `ctrlc` handler turns into a flag that
//! the token callback checks before each decode step. The line editor (rustyline) is
//! built with its `signal-hook` feature so that it never installs a SIGINT handler of its
//! own: without it, rustyline replaces ours for the editor's whole life and swallows
//! every Ctrl-C pressed while an answer streams (its handler only writes to a pipe that
//! it reads during `readline`). At the prompt the editor reads Ctrl-C as a key.

use std::io::{BufRead, IsTerminal, Write};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;
use clap::Args;
use ds4_engine::Session;
use ds4_engine::generate::{GenerateParams, StopReason, generate};
use ds4_tokenizer::{ChatMessage, RenderOptions, StreamDecoder};

use crate::common::{ModelArgs, PrefillProgress, SamplingArgs, load, stats_line};

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// A system message for the conversation.
    #[arg(long = "system")]
    pub system: Option<String>,
    /// Most tokens per answer.
    #[arg(short = 'n', long = "n-predict", value_name = "N", default_value_t = 2048,
          allow_negative_numbers = true, value_parser = ds4_args::int::<usize>(0..))]
    pub n_predict: usize,
}

/// What `/help` prints.
const HELP: &str = "\
commands:
  /help         this list
  /reset        clear the conversation (the system message is kept)
  /system TEXT  set the system message and clear the conversation
  /system       remove the system message and clear the conversation
  /quit, /exit  leave (also Ctrl-D, or Ctrl-C at the prompt)
Ctrl-C while an answer streams stops it and returns to the prompt.";

/// What `/reset` says: the conversation is cleared, and whether a system message stays.
fn reset_message(system: Option<&str>) -> String {
    match system {
        Some(s) => format!(
            "(conversation cleared; the system message is kept: {s:?} — `/system` alone removes it)"
        ),
        None => "(conversation cleared)".to_string(),
    }
}

/// What `/system` says after setting (`Some`) or removing (`None`) the system message.
fn system_message(system: Option<&str>) -> String {
    match system {
        Some(s) => format!("(system message set to {s:?}; conversation cleared)"),
        None => "(system message removed; conversation cleared)".to_string(),
    }
}

/// Reads user lines: a line editor on a terminal, plain lines otherwise.
enum Input {
    Editor(Box<rustyline::DefaultEditor>),
    Plain(std::io::StdinLock<'static>),
}

impl Input {
    fn new() -> Self {
        if std::io::stdin().is_terminal()
            && let Ok(ed) = rustyline::DefaultEditor::new()
        {
            return Input::Editor(Box::new(ed));
        }
        Input::Plain(std::io::stdin().lock())
    }

    /// The next line, or `None` at end of input (Ctrl-D, Ctrl-C at the prompt).
    fn line(&mut self) -> Option<String> {
        match self {
            Input::Editor(ed) => match ed.readline("> ") {
                Ok(l) => {
                    let _ = ed.add_history_entry(&l);
                    Some(l)
                }
                Err(_) => None,
            },
            Input::Plain(stdin) => {
                let mut l = String::new();
                match stdin.read_line(&mut l) {
                    Ok(0) | Err(_) => None,
                    Ok(_) => Some(l.trim_end_matches(['\n', '\r']).to_string()),
                }
            }
        }
    }
}

pub fn main(args: ChatArgs) -> Result<()> {
    let lm = load(&args.model)?;
    let stop = Arc::new(AtomicBool::new(false));
    let generating = Arc::new(AtomicBool::new(false));
    {
        let (stop, generating) = (stop.clone(), generating.clone());
        ctrlc::set_handler(move || {
            if generating.load(Ordering::SeqCst) {
                stop.store(true, Ordering::SeqCst);
            } else {
                std::process::exit(130);
            }
        })?;
    }
    eprintln!(
        "{} ({}, {} layers) — /help for commands; Ctrl-C stops an answer",
        lm.model.info().name,
        lm.model.info().architecture,
        lm.model.info().n_layer
    );
    let mut session = Session::new(lm.model.clone(), args.model.n_ctx(&lm))?;
    let mut system = args.system.clone();
    let mut history: Vec<ChatMessage> = Vec::new();
    let mut input = Input::new();
    let seed = args.sampling.seed();
    let mut turn = 0u64;
    while let Some(line) = input.line() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        match line
            .split_once(' ')
            .map_or((line, ""), |(c, r)| (c, r.trim()))
        {
            ("/quit" | "/exit", _) => break,
            ("/help", _) => {
                eprintln!("{HELP}");
                continue;
            }
            ("/reset", _) => {
                // The session keeps what the next prompt shares with it (the system
                // message), as after `/system`.
                history.clear();
                eprintln!("{}", reset_message(system.as_deref()));
                continue;
            }
            ("/system", text) => {
                system = (!text.is_empty()).then(|| text.to_string());
                history.clear();
                eprintln!("{}", system_message(system.as_deref()));
                continue;
            }
            (cmd, _) if cmd.starts_with('/') => {
                eprintln!("unknown command {cmd} (/help lists the commands)");
                continue;
            }
            _ => {}
        }
        history.push(ChatMessage::new("user", line));
        let mut messages: Vec<ChatMessage> = system
            .iter()
            .map(|s| ChatMessage::new("system", s))
            .collect();
        messages.extend(history.iter().cloned());
        let prompt = match lm.chat_prompt(&messages, &RenderOptions::default()) {
            Ok((_, p)) => p,
            Err(e) => {
                history.pop();
                eprintln!("error: {e}");
                continue;
            }
        };
        let params = GenerateParams {
            max_tokens: args.n_predict,
            sampler: args.sampling.params(),
            seed: seed.wrapping_add(turn),
            needs_logits: false,
        };
        turn += 1;
        let mut decoder = StreamDecoder::new();
        let mut answer = String::new();
        let mut progress = PrefillProgress::new();
        let tok = &lm.tokenizer;
        stop.store(false, Ordering::SeqCst);
        generating.store(true, Ordering::SeqCst);
        let mut stdout = std::io::stdout().lock();
        let result = generate(
            &mut session,
            &prompt,
            &params,
            &|t| tok.is_eog(t),
            &mut |d, n| progress.update(d, n),
            &mut |t, _| {
                if stop.load(Ordering::SeqCst) {
                    return ControlFlow::Break(());
                }
                if !tok.is_eog(t) {
                    let piece = decoder.push(&tok.piece(t, false));
                    answer.push_str(&piece);
                    let _ = stdout.write_all(piece.as_bytes());
                    let _ = stdout.flush();
                }
                ControlFlow::Continue(())
            },
        );
        generating.store(false, Ordering::SeqCst);
        let tail = decoder.flush();
        answer.push_str(&tail);
        let _ = writeln!(stdout, "{tail}");
        drop(stdout);
        match result {
            Ok(stats) => {
                if stats.stop == StopReason::Stopped {
                    eprintln!("(stopped)");
                }
                eprintln!("{}", stats_line(&stats));
                history.push(ChatMessage::new("assistant", &answer));
            }
            Err(e) => {
                history.pop();
                eprintln!("error: {e}");
                if session.reset().is_err() {
                    session = Session::new(lm.model.clone(), args.model.n_ctx(&lm))?;
                }
            }
        }
    }
    Ok(())
}
