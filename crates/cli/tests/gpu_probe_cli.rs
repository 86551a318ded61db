//! `ds4-server gpu-probe`: without a GPU it says so (exit status 2) and these tests
//! skip; with one, phases from stdin label the samples and the summary counts them.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::Duration;

use support::{bin, run};

#[test]
fn probe_without_gpu_reports_it() {
    if ds4_cuda::driver::driver_present() {
        eprintln!("skipped: a CUDA driver is present (see probe_samples_phases)");
        return;
    }
    let out = run(&["gpu-probe"]);
    assert_eq!(out.status.code(), Some(2));
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(line["probe"], "no_gpu");
    eprintln!("skipped: no GPU ({})", line["reason"]);
}

#[test]
fn probe_samples_phases() {
    if let Err(why) = ds4_cuda::probe::Probe::new(0).map(|_| ()) {
        eprintln!("skipped: no GPU ({why})");
        return;
    }
    let mut child = bin()
        .args(["gpu-probe", "--interval-ms", "20"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    let ready: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(ready["probe"], "ready");
    let mut stdin = child.stdin.take().unwrap();
    for phase in ["decode", "prefill"] {
        writeln!(stdin, "{phase}").unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    drop(stdin);
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    assert!(child.wait().unwrap().success());
    let summary = &lines.last().unwrap()["summary"];
    for phase in ["calibrate", "decode", "prefill"] {
        let p = &summary["phases"][phase];
        assert!(p["count"].as_u64().unwrap() >= 1, "{summary:#}");
        assert_eq!(p["failures"], 0, "{summary:#}");
        assert!(p["total_ms"]["max"].as_f64().unwrap() > 0.0);
    }
    for s in &lines[..lines.len() - 1] {
        let total = s["total_ms"].as_f64().unwrap();
        let parts = s["wait_ms"].as_f64().unwrap()
            + s["gpu_ms"].as_f64().unwrap()
            + s["return_ms"].as_f64().unwrap();
        assert!((total - parts).abs() < 0.01, "{s}");
    }
}
