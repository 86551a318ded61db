//! Bad input gives one clear `error:` line and a non-zero exit, never a panic: a missing
//! file, a truncated or corrupted GGUF, an unknown architecture, an unsupported tensor
//! type, a missing tensor, a prompt longer than `--ctx`, GPU flags that cannot apply, a
//! checkpoint directory that cannot be made, a port in use, a system message without the
//! chat template.

mod support;

use std::path::Path;
use std::process::Output;

use ds4_gguf::{GgmlType, GgufFile, GgufWriter};
use support::{run, show};

/// Asserts a clean failure whose one error line contains `needle`.
fn fails_with(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", show(out));
    assert!(!err.contains("panicked"), "{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(errors[0].contains(needle), "expected '{needle}' in: {err}");
}

fn run_model(path: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "run",
        "-m",
        path.to_str().unwrap(),
        "--no-template",
        "-p",
        "hello",
        "-n",
        "2",
    ];
    args.extend_from_slice(extra);
    run(&args)
}

/// A tiny valid llama model written by `ds4-server synth`.
fn tiny_model(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("tiny.gguf");
    let out = run(&["synth", "tiny-llama:q4_0", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", show(&out));
    path
}

/// Rewrites `src` to `dst` with `edit` applied to each tensor (name, dims, type, bytes);
/// returning `None` drops the tensor.
fn rewrite(
    src: &Path,
    dst: &Path,
    edit: impl Fn(&str, &[u64], GgmlType, &[u8]) -> Option<(Vec<u64>, GgmlType, Vec<u8>)>,
) {
    let f = GgufFile::open(src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata().iter() {
        w.add_metadata(k, v.clone()).unwrap();
    }
    for t in f.tensors() {
        if let Some((dims, ty, data)) = edit(&t.name, &t.dims, t.dtype, f.tensor_data(t)) {
            w.add_tensor(t.name.clone(), &dims, ty, data).unwrap();
        }
    }
    w.write_file(dst).unwrap();
}

#[test]
fn missing_file() {
    fails_with(
        &run_model(Path::new("/nonexistent/model.gguf"), &[]),
        "does not exist",
    );
}

#[test]
fn truncated_and_corrupted_files() {
    let dir = tempfile::tempdir().unwrap();
    let good = tiny_model(dir.path());
    let bytes = std::fs::read(&good).unwrap();
    for cut in [10, 100, bytes.len() / 2, bytes.len() - 1] {
        let p = dir.path().join(format!("cut{cut}.gguf"));
        std::fs::write(&p, &bytes[..cut]).unwrap();
        fails_with(&run_model(&p, &[]), p.to_str().unwrap());
    }
    let mut bad = bytes.clone();
    bad[..4].copy_from_slice(b"GGUX");
    let p = dir.path().join("magic.gguf");
    std::fs::write(&p, &bad).unwrap();
    fails_with(&run_model(&p, &[]), "magic");
}

#[test]
fn unknown_architecture() {
    let dir = tempfile::tempdir().unwrap();
    let good = tiny_model(dir.path());
    let f = GgufFile::open(&good).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata().iter() {
        let v = if k == "general.architecture" {
            ds4_gguf::Value::String("mamba9".into())
        } else {
            v.clone()
        };
        w.add_metadata(k.replace("llama.", "mamba9."), v).unwrap();
    }
    for t in f.tensors() {
        w.add_tensor(t.name.clone(), &t.dims, t.dtype, f.tensor_data(t))
            .unwrap();
    }
    let p = dir.path().join("arch.gguf");
    w.write_file(&p).unwrap();
    fails_with(&run_model(&p, &[]), "unknown model architecture 'mamba9'");
}

#[test]
fn unsupported_tensor_type_and_missing_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let good = tiny_model(dir.path());
    // IQ3_S is a valid GGUF type this engine does not compute with.
    let p = dir.path().join("iq3s.gguf");
    rewrite(&good, &p, |name, dims, ty, data| {
        if name == "blk.0.attn_q.weight" {
            let n = (dims.iter().product::<u64>() as usize) / 256 * GgmlType::IQ3_S.type_size();
            Some((dims.to_vec(), GgmlType::IQ3_S, vec![0u8; n]))
        } else {
            Some((dims.to_vec(), ty, data.to_vec()))
        }
    });
    fails_with(&run_model(&p, &[]), "blk.0.attn_q.weight");
    let p = dir.path().join("missing.gguf");
    rewrite(&good, &p, |name, dims, ty, data| {
        (name != "blk.0.ffn_down.weight").then(|| (dims.to_vec(), ty, data.to_vec()))
    });
    fails_with(
        &run_model(&p, &[]),
        "tensor 'blk.0.ffn_down.weight' is missing",
    );
}

#[test]
fn prompt_longer_than_the_context() {
    let dir = tempfile::tempdir().unwrap();
    let good = tiny_model(dir.path());
    let long = "word ".repeat(200);
    let out = run(&[
        "run",
        "-m",
        good.to_str().unwrap(),
        "--no-template",
        "-p",
        &long,
        "--ctx",
        "64",
    ]);
    fails_with(&out, "but the context holds 64");
    // A context longer than the model's names the flag, before the load report prices
    // a context that is never allocated.
    let out = run_model(&good, &["--ctx", "10000000"]);
    fails_with(&out, "--ctx 10000000: longer than the");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("context takes"), "{err}");
}

/// Asserts a clean failure whose one error line holds each of `parts` exactly once.
fn fails_once_with(out: &Output, parts: &[&str]) {
    fails_with(out, parts[0]);
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err.lines().find(|l| l.starts_with("error:")).unwrap();
    for part in parts {
        assert_eq!(
            line.matches(part).count(),
            1,
            "'{part}' not once in: {line}"
        );
    }
}

#[test]
fn error_lines_do_not_repeat_themselves() {
    let dir = tempfile::tempdir().unwrap();
    let not_gguf = dir.path().join("notes.gguf");
    std::fs::write(&not_gguf, "just some text, not a model").unwrap();
    let not_gguf = not_gguf.to_str().unwrap();
    // ENOENT as the OS words it ("No such file or directory (os error 2)").
    let enoent = std::io::Error::from_raw_os_error(2).to_string();

    // bench and run load the same way: "loading the model" once.
    let loading = ["loading the model", "not a GGUF file"];
    fails_once_with(&run(&["bench", "-m", not_gguf]), &loading);
    fails_once_with(&run(&["run", "-m", not_gguf, "-p", "x"]), &loading);
    // convert: a missing checkpoint directory names the file and the OS error once.
    let missing = dir.path().join("no-such-checkpoint");
    let out = run(&[
        "convert",
        missing.to_str().unwrap(),
        "-o",
        dir.path().join("x.gguf").to_str().unwrap(),
    ]);
    fails_once_with(&out, &["config.json", &enoent]);
    // A checkpoint and --synthetic: one or the other, not the second silently.
    let out = run(&[
        "convert",
        missing.to_str().unwrap(),
        "--synthetic",
        "small",
        "-o",
        dir.path().join("x.gguf").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot be used with '--synthetic"),
        "{}",
        show(&out)
    );
    // Receipts that cannot be read (compare) or written (bench).
    let receipt = dir.path().join("missing-dir").join("r.json");
    let receipt = receipt.to_str().unwrap();
    fails_once_with(&run(&["compare", receipt, receipt]), &["r.json", &enoent]);
    let tiny = tiny_model(dir.path());
    let out = run(&[
        "bench",
        "-m",
        tiny.to_str().unwrap(),
        "--prefill-tokens",
        "8",
        "--decode-tokens",
        "2",
        "--runs",
        "1",
        "--receipt",
        receipt,
    ]);
    fails_once_with(&out, &["writing the receipt", "r.json", &enoent]);
    // eval checks the receipt's folder before it runs anything (the model path here does
    // not exist either: the receipt is what it names), and a document that cannot be
    // read is a failure its receipt records.
    let out = run(&["eval", "-m", not_gguf, "--receipt", receipt]);
    fails_once_with(&out, &["writing the receipt", "r.json", &enoent]);
    let written = dir.path().join("eval.json");
    let out = run(&[
        "eval",
        "-m",
        tiny.to_str().unwrap(),
        "--document",
        missing.to_str().unwrap(),
        "--receipt",
        written.to_str().unwrap(),
    ]);
    fails_once_with(&out, &["reading the document", &enoent]);
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&written).unwrap()).unwrap();
    assert_eq!(r["status"], "failed", "{r}");
    // Contexts the user did not ask for are not reported as --ctx: eval's workload does
    // not fit the tiny model's 2,048 tokens; replay's tokens do not fit --ctx or the model.
    let tiny = tiny.to_str().unwrap();
    let out = run(&["eval", "-m", tiny, "--max-tokens", "8"]);
    fails_once_with(
        &out,
        &[
            "the workload needs a context of",
            "2048 tokens this model was trained for",
        ],
    );
    let ids = |n: usize| {
        let p = dir.path().join(format!("ids{n}.json"));
        std::fs::write(&p, serde_json::to_string(&vec![1u32; n]).unwrap()).unwrap();
        p
    };
    let (eight, many) = (ids(8), ids(2100));
    let dump = dir.path().join("logits.bin");
    let replay = |tokens: &std::path::Path, ctx: &[&str]| {
        let mut a = vec!["replay", "-m", tiny, "--tokens", tokens.to_str().unwrap()];
        a.extend_from_slice(ctx);
        a.extend_from_slice(&["--dump-logits", dump.to_str().unwrap()]);
        run(&a)
    };
    fails_once_with(
        &replay(&eight, &["--ctx", "4"]),
        &["--ctx 4:", "holds 8 tokens"],
    );
    fails_once_with(
        &replay(&many, &[]),
        &["holds 2100 tokens, more than the 2048"],
    );
}

#[test]
fn gpu_flags_that_cannot_apply() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    fails_with(
        &run_model(&model, &["--device", "1"]),
        "--device 1 chooses GPUs: it needs --backend cuda",
    );
    fails_with(
        &run_model(&model, &["--gpus", "2"]),
        "--gpus 2 chooses GPUs: it needs --backend cuda",
    );
    // Refused from the model alone, before any GPU is looked at.
    fails_with(
        &run_model(&model, &["--backend", "cuda", "--gpus", "2"]),
        "--gpus 2: the llama family has no multi-GPU plan (plans exist for glm5-next, glm5next, deepseek4)",
    );
    fails_with(
        &run_model(
            &model,
            &["--backend", "cuda", "--gpus", "2", "--device", "1"],
        ),
        "--device 1 picks one GPU and --gpus 2 uses devices 0 to 1",
    );
}

/// `serve` checks its checkpoint directory before it loads anything: a path it cannot
/// create is a flag error (exit 2, naming the flag), not a warning and a server without
/// its disk cache.
#[test]
fn serve_refuses_an_unusable_cache_dir() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let out = run(&[
        "serve",
        "-m",
        model.to_str().unwrap(),
        "--port",
        "0",
        "--cache-dir",
        file.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    assert!(err.contains("--cache-dir"), "{err}");
    assert!(err.contains("cannot create the directory"), "{err}");
    assert!(!err.contains("weights"), "loaded the model first: {err}");
}

/// `serve` binds its address before it loads the model: a busy port is one error line
/// without the load report.
#[test]
fn serve_reports_a_busy_port_before_loading() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port().to_string();
    let out = run(&["serve", "-m", model.to_str().unwrap(), "--port", &port]);
    fails_with(&out, &format!("cannot listen on 127.0.0.1:{port}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("weights"), "loaded the model first: {err}");
}

/// A system message needs the chat template: with --no-template it is refused, not
/// dropped.
#[test]
fn system_message_without_the_template_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let out = run_model(&model, &["--system", "be brief"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    assert!(
        err.contains("--system") && err.contains("--no-template"),
        "{err}"
    );
}
