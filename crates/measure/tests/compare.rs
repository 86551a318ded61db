//! `compare` on synthetic receipts written to disk and read back, through the
//! same entry point the CLI uses (`run_compare`).

use ds4_measure::args::CompareArgs;
use ds4_measure::args::run_compare;
use ds4_measure::compare::{CompareError, Comparison, DiffScope, VerdictKind};
use ds4_measure::hash::sha256_bytes;
use ds4_measure::receipt::{
    BenchResults, BenchRun, EvalResults, Receipt, ReceiptContext, ReceiptKind, StopReason,
    TurnRecord,
};
use std::path::PathBuf;
use std::sync::OnceLock;

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ds4-measure-compare-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A started receipt (hashing the test binary once) to clone from.
fn base(kind: ReceiptKind) -> Receipt {
    static EVAL: OnceLock<Receipt> = OnceLock::new();
    static BENCH: OnceLock<Receipt> = OnceLock::new();
    let ctx = ReceiptContext {
        backend: "cpu".into(),
        ..Default::default()
    };
    let cell = if kind == ReceiptKind::Eval {
        &EVAL
    } else {
        &BENCH
    };
    cell.get_or_init(|| Receipt::start(kind, &ctx)).clone()
}

fn turn(name: &str, text: &str, generated: u64, decode_tok_s: f64, prefill_ms: f64) -> TurnRecord {
    TurnRecord {
        name: name.into(),
        prompt_tokens: 300,
        cached_tokens: 100,
        restore_ms: None,
        prefill_ms: Some(prefill_ms),
        generated_tokens: generated,
        decode_ms: None,
        decode_tok_s: Some(decode_tok_s),
        stop_reason: StopReason::Eos,
        text_sha256: sha256_bytes(text.as_bytes()),
        reasoning_sha256: None,
        frontier_tokens: Some(300 + generated),
        frontier_sha256: None,
    }
}

/// An eval receipt of three turns with texts `texts` at speed `tok_s`, started at second `t`.
fn eval(texts: [&str; 3], tok_s: f64, t: u32, threads: u32) -> Receipt {
    let mut r = base(ReceiptKind::Eval);
    r.started_at = format!("2026-01-01T00:00:{t:02}.000Z");
    r.settings.insert("threads".into(), threads.into());
    r.eval = Some(EvalResults {
        warmup: None,
        turns: vec![
            turn("summarise", texts[0], 100, tok_s, 100.0),
            turn("story", texts[1], 200, tok_s, 100.0),
            turn("is_prime", texts[2], 150, tok_s, 100.0),
        ],
        is_prime: None,
    });
    r.finish_time();
    r
}

fn write(dir: &std::path::Path, name: &str, r: &Receipt) -> PathBuf {
    let p = dir.join(name);
    r.write(&p).unwrap();
    p
}

fn args(files: Vec<PathBuf>) -> CompareArgs {
    CompareArgs {
        files,
        a: vec![],
        b: vec![],
        tolerance: 0.02,
        json: false,
    }
}

const TEXTS: [&str; 3] = ["a summary", "a lighthouse story", "def is_prime(n): ..."];

#[test]
fn same_binary_twice_is_identical_and_not_significant() {
    let dir = tmpdir("same");
    let a = write(&dir, "a.json", &eval(TEXTS, 20.0, 1, 2));
    let b = write(&dir, "b.json", &eval(TEXTS, 20.1, 2, 2));
    let mut out = Vec::new();
    let c = run_compare(&args(vec![a, b]), &mut out).unwrap();
    assert_eq!(c.sides.len(), 2);
    let p = &c.pairs[0];
    let o = p.outputs.as_ref().unwrap();
    assert!(o.identical);
    assert_eq!(o.turns_compared, 3);
    assert!((p.decode.ratio.unwrap() - 1.005).abs() < 1e-9);
    assert!(!p.decode.verdict.significant);
    assert!(
        p.decode.verdict.reason.contains("one run per side"),
        "{}",
        p.decode.verdict.reason
    );
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("outputs: identical over 3 turns"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn clear_speed_difference_over_interleaved_runs_is_significant() {
    let dir = tmpdir("speed");
    // Order A B B A A B B A: side A at ~10 tok/s, B at ~20 tok/s.
    let order = ["A", "B", "B", "A", "A", "B", "B", "A"];
    let (mut fa, mut fb) = (Vec::new(), Vec::new());
    for (t, side) in order.iter().enumerate() {
        let jitter = t as f64 * 0.05;
        let (speed, threads, list) = if *side == "A" {
            (10.0 + jitter, 1, &mut fa)
        } else {
            (20.0 + jitter, 2, &mut fb)
        };
        list.push(write(
            &dir,
            &format!("{t}{side}.json"),
            &eval(TEXTS, speed, t as u32, threads),
        ));
    }
    let mut out = Vec::new();
    let c = run_compare(
        &CompareArgs {
            a: fa,
            b: fb,
            ..args(vec![])
        },
        &mut out,
    )
    .unwrap();
    let p = &c.pairs[0];
    assert_eq!(p.order, "A B B A A B B A");
    assert_eq!(p.interleaved, Some(true));
    assert_eq!(
        p.decode.verdict.kind,
        VerdictKind::BFaster,
        "{}",
        p.decode.verdict.reason
    );
    assert!(p.decode.verdict.significant);
    // Prefill took the same time on both sides.
    assert_eq!(p.prefill.verdict.kind, VerdictKind::WithinTolerance);
    assert_eq!(
        p.config_differences,
        vec!["settings.threads: 1 → 2".to_string()]
    );
    assert!(p.outputs.as_ref().unwrap().identical);
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("significant: B faster"), "{text}");

    // The same files grouped by configuration (positional) give the same verdict.
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let c2 = run_compare(&args(files), std::io::sink()).unwrap();
    assert_eq!(c2.pairs[0].decode.verdict.kind, VerdictKind::BFaster);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn overlapping_runs_are_not_significant() {
    let dir = tmpdir("overlap");
    let speeds_a = [10.0, 12.5, 11.0, 9.5];
    let speeds_b = [11.5, 13.0, 12.0, 10.5];
    let fa: Vec<PathBuf> = speeds_a
        .iter()
        .enumerate()
        .map(|(i, s)| write(&dir, &format!("a{i}.json"), &eval(TEXTS, *s, i as u32, 1)))
        .collect();
    let fb: Vec<PathBuf> = speeds_b
        .iter()
        .enumerate()
        .map(|(i, s)| {
            write(
                &dir,
                &format!("b{i}.json"),
                &eval(TEXTS, *s, 10 + i as u32, 2),
            )
        })
        .collect();
    let c = run_compare(
        &CompareArgs {
            a: fa,
            b: fb,
            ..args(vec![])
        },
        std::io::sink(),
    )
    .unwrap();
    let p = &c.pairs[0];
    assert_eq!(p.decode.verdict.kind, VerdictKind::NotSignificant);
    assert!(p.decode.verdict.reason.contains("overlap"));
    assert_eq!(p.interleaved, Some(false)); // all A before all B
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn differing_output_names_the_first_differing_turn() {
    let dir = tmpdir("differ");
    let a = write(&dir, "a.json", &eval(TEXTS, 20.0, 1, 2));
    let mut other = eval(
        [TEXTS[0], "a different story", "another function"],
        20.0,
        2,
        2,
    );
    other.eval.as_mut().unwrap().turns[1].generated_tokens = 180;
    let b = write(&dir, "b.json", &other);
    let mut out = Vec::new();
    let c = run_compare(&args(vec![a, b]), &mut out).unwrap();
    let o = c.pairs[0].outputs.as_ref().unwrap();
    assert!(!o.identical);
    assert_eq!(o.first_differing_turn, Some(1));
    assert_eq!(o.first_differing_name.as_deref(), Some("story"));
    let fields: Vec<&str> = o
        .first_differing_fields
        .iter()
        .map(|f| f.field.as_str())
        .collect();
    assert_eq!(fields, ["generated_tokens", "text_sha256"]);
    assert!(
        o.first_differing_fields
            .iter()
            .all(|f| f.scope == DiffScope::BetweenSides)
    );
    assert!(c.pairs[0].turns[0].identical);
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("first differing turn 1 (story)"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bench_receipts_by_configuration_and_failures_kept() {
    let dir = tmpdir("bench");
    let bench = |threads: u32, speeds: &[f64], t: u32| {
        let mut r = base(ReceiptKind::Bench);
        r.started_at = format!("2026-01-01T00:01:{t:02}.000Z");
        r.settings.insert("threads".into(), threads.into());
        r.bench = Some(BenchResults {
            prompt_tokens: 512,
            gen_tokens: 128,
            warmup_runs: 1,
            runs: speeds
                .iter()
                .map(|s| BenchRun {
                    prefill_tokens: 512,
                    prefill_ms: Some(512.0),
                    decode_tokens: 128,
                    decode_tok_s: Some(*s),
                    ..Default::default()
                })
                .collect(),
        });
        r
    };
    let one = write(
        &dir,
        "t1.json",
        &bench(1, &[30.0, 30.2, 29.9, 30.1, 30.05], 1),
    );
    let two = write(
        &dir,
        "t2.json",
        &bench(2, &[55.0, 55.3, 54.8, 55.1, 54.9], 2),
    );
    let mut failed = bench(2, &[], 3);
    failed.record_failure("load", &"model file truncated");
    let bad = write(&dir, "t2-failed.json", &failed);
    let mut out = Vec::new();
    let c = run_compare(&args(vec![one, two, bad]), &mut out).unwrap();
    assert_eq!(c.sides.len(), 2);
    assert_eq!((c.sides[1].runs, c.sides[1].failed), (1, 1));
    assert_eq!(c.sides[1].decode_tok_s.unwrap().n, 5);
    let p = &c.pairs[0];
    assert_eq!(
        p.decode.verdict.kind,
        VerdictKind::BFaster,
        "{}",
        p.decode.verdict.reason
    );
    assert!(p.outputs.is_none());
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("model file truncated"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ambiguous_and_mixed_inputs_are_refused() {
    let dir = tmpdir("refuse");
    let files: Vec<PathBuf> = (0..3)
        .map(|i| write(&dir, &format!("{i}.json"), &eval(TEXTS, 20.0, i, 1)))
        .collect();
    let e = run_compare(&args(files.clone()), std::io::sink()).unwrap_err();
    assert!(
        matches!(e, CompareError::AmbiguousSides { files: 3 }),
        "{e}"
    );
    let mut bench = base(ReceiptKind::Bench);
    bench.finish_time();
    let b = write(&dir, "bench.json", &bench);
    let e = run_compare(&args(vec![files[0].clone(), b]), std::io::sink()).unwrap_err();
    assert!(matches!(e, CompareError::MixedKinds { .. }), "{e}");
    let e = run_compare(
        &args(vec![dir.join("absent.json"), files[0].clone()]),
        std::io::sink(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("absent.json"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn json_output_round_trips() {
    let dir = tmpdir("json");
    let a = write(&dir, "a.json", &eval(TEXTS, 20.0, 1, 1));
    let b = write(&dir, "b.json", &eval(TEXTS, 25.0, 2, 2));
    let mut out = Vec::new();
    let c = run_compare(
        &CompareArgs {
            json: true,
            ..args(vec![a, b])
        },
        &mut out,
    )
    .unwrap();
    let back: Comparison = serde_json::from_slice(&out).unwrap();
    assert_eq!(back, c);
    assert_eq!(back.pairs[0].decode.ratio, Some(1.25));
    std::fs::remove_dir_all(&dir).unwrap();
}
