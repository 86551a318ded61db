//! `ds4-server supervise` and `compare` as wired in the binary (their behaviour is
//! tested in `ds4-measure`; here: exit codes and output reach the user).

mod support;

use support::{bin, have_python, run, show};

#[test]
fn supervise_passes_the_exit_code_and_output() {
    let out = run(&[
        "supervise",
        "--sample-ms",
        "0",
        "--",
        "sh",
        "-c",
        "echo hi; echo err >&2; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", show(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("err\n"), "{err}");
    let last: serde_json::Value = serde_json::from_str(err.lines().last().unwrap()).unwrap();
    assert_eq!(last["supervise"], "exit");
    assert_eq!(last["reason"], "exited");
    assert_eq!(last["code"], 3);
}

#[test]
fn supervise_limits_kill_with_their_codes() {
    // Idle timeout: nothing printed for 0.3 s.
    let out = run(&[
        "supervise",
        "--sample-ms",
        "0",
        "--idle-timeout",
        "0.3",
        "--",
        "sleep",
        "20",
    ]);
    assert_eq!(out.status.code(), Some(123), "{}", show(&out));
    // Start timeout.
    let out = run(&[
        "supervise",
        "--sample-ms",
        "0",
        "--start-timeout",
        "0.3",
        "--",
        "sleep",
        "20",
    ]);
    assert_eq!(out.status.code(), Some(122), "{}", show(&out));
    // Memory: 300 MiB touched under a 100 MiB limit.
    if have_python() {
        let out = run(&[
            "supervise",
            "--sample-ms",
            "0",
            "--mem-mb",
            "100",
            "--",
            "python3",
            "-c",
            "import time; x = bytearray(300 << 20); time.sleep(20)",
        ]);
        assert_eq!(out.status.code(), Some(121), "{}", show(&out));
    }
    // Not found.
    let out = run(&["supervise", "--", "/nonexistent/program"]);
    assert_eq!(out.status.code(), Some(127), "{}", show(&out));
}

#[test]
fn compare_refuses_missing_receipts() {
    let out = bin()
        .args(["compare", "/nonexistent/a.json", "/nonexistent/b.json"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/nonexistent/a.json"),
        "{}",
        show(&out)
    );
}
