//! `ds4-server bench` receipts on the CPU (SmolLM2-135M), failure receipts, and the
//! CUDA-only options refusing cleanly without a GPU.

mod support;

use std::process::Command;

use support::{json, model, run, show};

const SMOLLM: &str = "smollm2-135m-instruct-q4_1.gguf";

#[test]
fn receipt_keeps_every_run() {
    let Some(m) = model(SMOLLM) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let receipt = dir.path().join("r.json");
    let out = run(&[
        "bench",
        "-m",
        m.to_str().unwrap(),
        "--prefill-tokens",
        "16,24",
        "--decode-tokens",
        "4",
        "--runs",
        "3",
        "--json",
        "--receipt",
        receipt.to_str().unwrap(),
        "--label",
        "smol",
    ]);
    assert!(out.status.success(), "{}", show(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["prefill"][0]["tokens"], 16);
    assert_eq!(doc["prefill"][1]["tokens"], 24);
    assert_eq!(doc["decode"]["runs"].as_array().unwrap().len(), 3);
    assert!(doc["cuda"].is_null());

    let r = json(&receipt);
    assert_eq!(r["status"], "ok", "{r:#}");
    assert_eq!(r["kind"], "bench");
    assert_eq!(r["label"], "smol");
    assert_eq!(r["backend"], "cpu");
    let runs = r["bench"]["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3);
    for run in runs {
        assert_eq!(run["prefill_tokens"], 16);
        assert!(run["prefill_tok_s"].as_f64().unwrap() > 0.0);
        assert!(run["decode_tok_s"].as_f64().unwrap() > 0.0);
        assert!(run["extra"]["prefill_24_tok_s"].as_f64().unwrap() > 0.0);
        // Decode tokens/s agree with the time recorded next to them.
        let (ms, tps) = (
            run["decode_ms"].as_f64().unwrap(),
            run["decode_tok_s"].as_f64().unwrap(),
        );
        assert!((4000.0 / ms - tps).abs() < 1e-6 * tps);
    }
    // The median in the JSON output is the median of the receipt's runs.
    let mut v: Vec<f64> = runs
        .iter()
        .map(|r| r["decode_tok_s"].as_f64().unwrap())
        .collect();
    v.sort_by(f64::total_cmp);
    assert_eq!(doc["decode"]["tps"]["median"].as_f64().unwrap(), v[1]);
    // The model hash matches an independent sha256sum.
    if let Ok(o) = Command::new("sha256sum").arg(&m).output() {
        let text = String::from_utf8_lossy(&o.stdout);
        let want = text.split_whitespace().next().unwrap_or_default();
        assert_eq!(r["model"]["sha256"], want);
    }
    assert_eq!(r["settings"]["runs"], 3);
}

#[test]
fn a_failed_run_still_writes_its_receipt() {
    let dir = tempfile::tempdir().unwrap();
    let receipt = dir.path().join("r.json");
    let out = run(&[
        "bench",
        "-m",
        "/nonexistent/model.gguf",
        "--receipt",
        receipt.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let r = json(&receipt);
    assert_eq!(r["status"], "failed");
    let msg = r["failures"][0]["message"].as_str().unwrap();
    assert!(msg.contains("/nonexistent/model.gguf"), "{msg}");
}

#[test]
fn synthetic_needs_cuda() {
    let dir = tempfile::tempdir().unwrap();
    let receipt = dir.path().join("r.json");
    let out = run(&[
        "bench",
        "--synthetic",
        "tiny-llama:q4_0",
        "--receipt",
        receipt.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--backend cuda"),
        "{}",
        show(&out)
    );
    assert_eq!(json(&receipt)["status"], "failed");
    if ds4_cuda::gpu_available().is_err() {
        let out = run(&[
            "bench",
            "--backend",
            "cuda",
            "--synthetic",
            "tiny-llama:q4_0",
        ]);
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("no usable GPU"),
            "{}",
            show(&out)
        );
    }
}

/// A tiny model written by `ds4-server synth` (trained context 2048), in `dir`.
fn tiny_model(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("tiny.gguf");
    let out = run(&["synth", "tiny-llama:q4_0", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", show(&out));
    path
}

/// The `error:` lines of an output.
fn error_lines(out: &std::process::Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("error:"))
        .map(str::to_string)
        .collect()
}

/// The one `error:` line of a run that exited with status 1.
fn the_error(out: &std::process::Output) -> String {
    let errors = error_lines(out);
    assert!(
        out.status.code() == Some(1) && errors.len() == 1,
        "{}",
        show(out)
    );
    errors[0].clone()
}

#[test]
fn a_measurement_the_model_cannot_hold_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path());
    let receipt = dir.path().join("r.json");
    let m = m.to_str().unwrap();
    let too_long = "--prefill-tokens 9000: longer than the 2048 tokens this model was trained for (use 1 to 2048)";
    let out = run(&[
        "bench",
        "-m",
        m,
        "--prefill-tokens",
        "16,9000",
        "--runs",
        "1",
        "--receipt",
        receipt.to_str().unwrap(),
    ]);
    assert_eq!(the_error(&out), format!("error: {too_long}"));
    // The receipt says the same.
    let r = json(&receipt);
    assert_eq!(r["status"], "failed");
    assert_eq!(r["failures"][0]["message"], too_long);

    let error = the_error(&run(&[
        "bench",
        "-m",
        m,
        "--decode-tokens",
        "2040",
        "--runs",
        "1",
    ]));
    assert!(
        error.starts_with("error: --decode-tokens 2040: the decode prompt (")
            && error.contains("exceed the 2048 tokens this model was trained for"),
        "{error}"
    );

    // The default prompt lengths that --ctx does not hold are left out (here all: the
    // prefill takes --ctx's length).
    let out = run(&[
        "bench",
        "-m",
        m,
        "--ctx",
        "100",
        "--decode-tokens",
        "4",
        "--runs",
        "1",
        "--json",
    ]);
    assert!(out.status.success(), "{}", show(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["prefill"][0]["tokens"], 100, "{doc}");

    // A --ctx the measurements asked for do not fit is refused, not quietly enlarged.
    let error = the_error(&run(&[
        "bench",
        "-m",
        m,
        "--ctx",
        "64",
        "--prefill-tokens",
        "100",
    ]));
    assert_eq!(
        error,
        "error: --prefill-tokens 100: longer than --ctx 64 (raise --ctx, or leave it out: bench then sizes its session to the longest measurement)"
    );
    let error = the_error(&run(&[
        "bench",
        "-m",
        m,
        "--ctx",
        "64",
        "--prefill-tokens",
        "16",
        "--decode-tokens",
        "60",
    ]));
    assert!(
        error.ends_with("more than --ctx 64 (raise --ctx, or leave it out)"),
        "{error}"
    );
}

#[test]
fn progress_is_shown_while_measuring() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path());
    let out = run(&[
        "bench",
        "-m",
        m.to_str().unwrap(),
        "--prefill-tokens",
        "16,24",
        "--decode-tokens",
        "4",
        "--runs",
        "2",
        "--json",
    ]);
    assert!(out.status.success(), "{}", show(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let progress: Vec<&str> = err.lines().filter(|l| l.starts_with("bench: ")).collect();
    assert_eq!(progress.len(), 3, "{err}");
    // Each line names its measurement and shows the runs' figures, the same numbers the
    // JSON reports (to one decimal).
    let figures = |runs: &serde_json::Value| -> String {
        runs.as_array()
            .unwrap()
            .iter()
            .map(|v| format!(" {:.1}", v.as_f64().unwrap()))
            .collect()
    };
    assert_eq!(
        progress[0],
        format!(
            "bench: prefill 16 tokens: warm-up, 2 runs (tok/s):{}",
            figures(&doc["prefill"][0]["runs"])
        )
    );
    assert_eq!(
        progress[1],
        format!(
            "bench: prefill 24 tokens: warm-up, 2 runs (tok/s):{}",
            figures(&doc["prefill"][1]["runs"])
        )
    );
    assert_eq!(
        progress[2],
        format!(
            "bench: decode 4 tokens: warm-up, 2 runs (tok/s):{}",
            figures(&doc["decode"]["runs"])
        )
    );
}
