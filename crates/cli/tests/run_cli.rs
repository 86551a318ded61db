//! `ds4-server run`'s prompt sources.

mod support;

use std::io::Write;
use std::process::Stdio;

use support::{bin, run, show};

/// `-f -` reads the prompt from standard input: the same prompt tokens as `-p`.
#[test]
fn the_prompt_can_come_from_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let m = path.to_str().unwrap();
    let out = run(&["synth", "tiny-llama:q4_0", m]);
    assert!(out.status.success(), "{}", show(&out));
    let common = [
        "run",
        "-m",
        m,
        "--no-template",
        "-n",
        "1",
        "--temp",
        "0",
        "--dump-tokens",
    ];
    let prompt = |out: &std::process::Output| -> serde_json::Value {
        assert!(out.status.success(), "{}", show(out));
        let err = String::from_utf8_lossy(&out.stderr);
        let dump: serde_json::Value = serde_json::from_str(err.lines().last().unwrap()).unwrap();
        dump["prompt"].clone()
    };
    let given = prompt(&run(&[&common[..], &["-p", "abc abc"]].concat()));
    let mut child = bin()
        .args(common)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"abc abc").unwrap();
    let piped = prompt(&child.wait_with_output().unwrap());
    assert!(given.as_array().is_some_and(|p| p.len() > 1), "{given}");
    assert_eq!(piped, given);
}
