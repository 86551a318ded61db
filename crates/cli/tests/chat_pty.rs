//! `ds4-server chat` in a pseudo-terminal, the way a person meets it: the line editor
//! is active (stdin is a terminal), the user types a question key by key (then one
//! arrives in a single write), and Ctrl-C
//! (the byte 0x03, which the terminal turns into SIGINT for the foreground process)
//! stops the streaming answer and brings the prompt back — in every turn, not only the
//! first. Ctrl-C at the prompt then leaves.
//!
//! Wall-clock limits are generous (the suite runs on loaded 2-core machines); what makes
//! the test exact is that `(stopped)` and `stop: stop` are printed only when the answer
//! was cut by Ctrl-C, never when it ends by itself.

mod support;

use std::time::{Duration, Instant};

use rexpect::session::{Options, PtySession, spawn_with_options};

const SMOLLM: &str = "smollm2-135m-instruct-q4_1.gguf";

/// Most tokens per answer: far more than the model writes before the test presses
/// Ctrl-C (the greedy answer to the question below goes on to the limit).
const N_PREDICT: usize = 4000;

/// The last characters of an expectation's error (rexpect's holds all output so far).
fn tail(e: rexpect::error::Error) -> String {
    let s = e.to_string();
    let cut = s.char_indices().rev().nth(600).map_or(0, |(i, _)| i);
    format!("…{}", &s[cut..])
}

/// Types `text` one key at a time, as a person (and a terminal) would deliver it.
fn type_keys(p: &mut PtySession, text: &str) {
    for c in text.chars() {
        p.send(&c.to_string()).unwrap();
        p.flush().unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn ctrl_c_stops_the_answer_and_returns_to_the_prompt_every_turn() {
    let Some(model) = support::model(SMOLLM) else {
        return;
    };
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ds4-server"));
    cmd.args(["chat", "-m", model.to_str().unwrap(), "--temp", "0"])
        .args(["--ctx", "8192", "-n", &N_PREDICT.to_string()])
        .env("TERM", "xterm");
    let opts = Options::default()
        .timeout_ms(Some(120_000))
        .strip_ansi_escape_codes(true);
    let mut p = spawn_with_options(cmd, opts).expect("spawning ds4-server chat in a pty");
    p.exp_string("Ctrl-C stops an answer").expect("the banner");
    p.exp_string("> ").expect("the first prompt");

    for turn in 0..2 {
        if turn == 1 {
            // A fresh conversation: the second answer does not depend on where Ctrl-C
            // cut the first (greedy decoding of a long history may end at once).
            p.send("/reset\r").unwrap();
            p.flush().unwrap();
            p.exp_string("conversation cleared")
                .unwrap_or_else(|e| panic!("/reset: {}", tail(e)));
            p.exp_string("> ").expect("the prompt after /reset");
        }
        let question = format!("Tell me a very long story about dragon {turn}.");
        if turn == 0 {
            type_keys(&mut p, &format!("{question}\r"));
        } else {
            // All at once, as a script, a paste without bracketed-paste markers or keys
            // typed ahead arrive: the editor reads every byte, not only the first.
            p.send(&format!("{question}\r")).unwrap();
            p.flush().unwrap();
        }
        // Wait until the answer streams: a few words after the echoed question.
        p.exp_string(&question)
            .unwrap_or_else(|e| panic!("turn {turn}: the question was not echoed: {}", tail(e)));
        p.exp_regex(r"\w+[ ,.]+\w+[ ,.]+\w+[ ,.]+\w+[ ,.]+\w+[ ,.]+\w+")
            .unwrap_or_else(|e| panic!("turn {turn}: no answer streamed: {}", tail(e)));
        let t0 = Instant::now();
        p.send_control('c').unwrap();
        let before = p
            .exp_string("(stopped)")
            .unwrap_or_else(|e| panic!("turn {turn}: Ctrl-C did not stop the answer: {}", tail(e)));
        let took = t0.elapsed();
        let (_, stats) = p
            .exp_regex(r"generated (\d+) tokens, decode [^,]+, stop: (\w+)\]")
            .unwrap_or_else(|e| panic!("turn {turn}: no stats line: {}", tail(e)));
        p.exp_string("> ")
            .unwrap_or_else(|e| panic!("turn {turn}: the prompt did not return: {}", tail(e)));
        assert!(
            stats.ends_with("stop: stop]"),
            "turn {turn}: stats line {stats:?}"
        );
        let generated: usize = stats
            .split("generated ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|s| s.parse().ok())
            .unwrap();
        assert!(
            generated < N_PREDICT,
            "turn {turn}: {generated} tokens: the answer ran to its limit"
        );
        // One decode step is a few milliseconds of a 135M model; 20 s leaves room for a
        // machine loaded many times over, and is still far less than the rest of the
        // answer would take.
        assert!(
            took < Duration::from_secs(20),
            "turn {turn}: the answer stopped {took:?} after Ctrl-C"
        );
        // What streamed after the answer was seen and before `(stopped)`: the token being
        // decoded when SIGINT came, plus what streamed while this (possibly descheduled)
        // test process reacted — a few words, not the thousands left of the answer.
        let words = before.split_whitespace().count();
        assert!(
            words <= 64,
            "turn {turn}: {words} words after Ctrl-C: {before:?}"
        );
    }

    // At the prompt, Ctrl-C leaves.
    p.send_control('c').unwrap();
    p.exp_eof().expect("chat exits on Ctrl-C at the prompt");
    match p.process().wait().unwrap() {
        rexpect::process::WaitStatus::Exited(_, code) => assert_eq!(code, 0),
        other => panic!("chat ended with {other:?}"),
    }
}
