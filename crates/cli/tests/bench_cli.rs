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
