//! `ds4-server chat` commands with piped input: `/help` lists them, `/system TEXT` and
//! `/system` say what they did to the system message, `/reset` says whether a system
//! message stays, unknown commands point to `/help`. A synthetic model (written by
//! `ds4-server synth`) is enough: no command generates text.

mod support;

use std::io::Write;
use std::process::Stdio;

use support::{bin, run, show};

#[test]
fn help_system_and_reset_say_what_they_do() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    let out = run(&["synth", "tiny-llama:q4_0", model.to_str().unwrap()]);
    assert!(out.status.success(), "{}", show(&out));

    let mut child = bin()
        .args(["chat", "-m", model.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let input = "/help\n/reset\n/system Answer in French.\n/reset\n/system\n/reset\n/nope\n/quit\n";
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", show(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    // The load report first, then the banner, which points to /help.
    let lines: Vec<&str> = err.lines().skip(1).collect();
    assert!(err.starts_with("tiny.gguf on cpu: weights "), "{err}");
    assert!(lines[0].contains("/help for commands"), "{err}");
    // /help: one line per command.
    let help = &lines[1..8];
    assert_eq!(help[0], "commands:", "{err}");
    for cmd in ["/help", "/reset", "/system TEXT", "/system ", "/quit"] {
        assert!(
            help.iter().any(|l| l.trim_start().starts_with(cmd)),
            "/help does not list {cmd}: {err}"
        );
    }
    assert!(help[6].starts_with("Ctrl-C"), "{err}");
    // Then, in order, what each command said.
    assert_eq!(
        &lines[8..],
        [
            "(conversation cleared)",
            "(system message set to \"Answer in French.\"; conversation cleared)",
            "(conversation cleared; the system message is kept: \"Answer in French.\" — `/system` alone removes it)",
            "(system message removed; conversation cleared)",
            "(conversation cleared)",
            "unknown command /nope (/help lists the commands)",
        ],
        "{err}"
    );
    assert!(out.stdout.is_empty(), "{}", show(&out));
}
