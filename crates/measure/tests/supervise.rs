//! `supervise` end to end with small helper programs (tests/helpers/*.py, run by
//! `python3`): memory limit, start and idle timeouts, long lines without newlines,
//! a fast JSON writer interleaved with fast samples, and grandchildren.
//!
//! Expected child output is obtained by running the helper directly (unsupervised),
//! never from the supervisor's own code.
//!
//! Wall-clock limits hold on a loaded 2-core machine (CI runs on one): a timeout under
//! test starts only once the helper has printed (idle timeouts get a generous start
//! timeout, so a slow Python start-up is not "idle"), and upper bounds on how long a
//! kill took stay well below what the unkilled command would take (its sleep), never
//! near the timeout itself.

use ds4_measure::supervise::{
    EXIT_IDLE_TIMEOUT, EXIT_MEMORY, EXIT_START_TIMEOUT, ExitReason, SuperviseOptions, supervise,
};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

fn helper(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/helpers")
        .join(name)
}

/// `python3`: a failure under CI when absent, a visible skip elsewhere.
fn python() -> Option<&'static str> {
    ds4_testkit::python3()
}

fn cmd(parts: &[&str]) -> Vec<OsString> {
    parts.iter().map(OsString::from).collect()
}

fn py(script: &str, args: &[&str]) -> Vec<OsString> {
    let mut v = vec![OsString::from("python3"), helper(script).into_os_string()];
    v.extend(args.iter().map(OsString::from));
    v
}

/// Runs `cmd` under `opts`; returns (outcome, out bytes, err bytes).
fn run(
    opts: &SuperviseOptions,
    cmd: &[OsString],
) -> (ds4_measure::supervise::SuperviseOutcome, Vec<u8>, Vec<u8>) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let outcome = supervise(opts, cmd, &mut out, &mut err).expect("supervise");
    (outcome, out, err)
}

fn json_lines(bytes: &[u8]) -> Vec<serde_json::Value> {
    bytes
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| {
            serde_json::from_slice(l).unwrap_or_else(|e| {
                panic!(
                    "unparsable line {:?}: {e}",
                    String::from_utf8_lossy(&l[..l.len().min(200)])
                )
            })
        })
        .collect()
}

fn is_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn exit_code_and_signal_pass_through() {
    let opts = SuperviseOptions::default();
    let (o, out, err) = run(&opts, &cmd(&["sh", "-c", "echo hi; echo oops >&2; exit 7"]));
    assert_eq!(
        (o.reason, o.code, o.exit_code),
        (ExitReason::Exited, Some(7), 7)
    );
    assert_eq!(out, b"hi\n");
    assert!(err.starts_with(b"oops\n"));
    let last = json_lines(&err[5..]).pop().unwrap();
    assert_eq!(last["supervise"], "exit");
    assert_eq!(last["reason"], "exited");
    assert_eq!(last["code"], 7);

    let (o, _, _) = run(&opts, &cmd(&["sh", "-c", "kill -TERM $$"]));
    assert_eq!(
        (o.reason, o.signal, o.exit_code),
        (ExitReason::Signal, Some(15), 143)
    );
}

#[test]
fn missing_program_is_an_error_with_127() {
    let e = supervise(
        &SuperviseOptions::default(),
        &cmd(&["/nonexistent/ds4-x"]),
        Vec::new(),
        Vec::new(),
    )
    .unwrap_err();
    assert_eq!(e.exit_code(), 127);
    assert!(e.to_string().contains("/nonexistent/ds4-x"));
}

#[test]
fn memory_limit_kills() {
    if python().is_none() {
        return;
    }
    let opts = SuperviseOptions {
        mem_limit_mib: Some(150),
        sample_interval: Some(Duration::from_millis(50)),
        ..Default::default()
    };
    let t = Instant::now();
    let (o, out, err) = run(&opts, &py("alloc.py", &["20", "1000"]));
    assert_eq!(
        o.reason,
        ExitReason::Memory,
        "stderr: {}",
        String::from_utf8_lossy(&err)
    );
    assert_eq!(o.exit_code, EXIT_MEMORY);
    assert_eq!(o.signal, Some(9));
    assert!(o.peak_rss_mb > 150.0, "peak {}", o.peak_rss_mb);
    // Killed on the way up, not at the end: it never reached 1000 MiB.
    let steps = String::from_utf8(out).unwrap();
    assert!(steps.lines().count() < 20, "{steps}");
    // alloc.py would take 50 steps to reach 1000 MiB; the count above is the real check.
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
    let samples = json_lines(&err);
    assert!(
        samples
            .iter()
            .any(|s| s["supervise"] == "sample" && s["rss_mb"].as_f64().unwrap() > 50.0)
    );
    assert_eq!(samples.last().unwrap()["reason"], "memory");
}

#[test]
fn start_timeout_kills_a_silent_command() {
    let opts = SuperviseOptions {
        start_timeout: Some(Duration::from_millis(500)),
        ..Default::default()
    };
    let t = Instant::now();
    let (o, out, _) = run(&opts, &cmd(&["sleep", "30"]));
    assert_eq!(
        (o.reason, o.exit_code),
        (ExitReason::StartTimeout, EXIT_START_TIMEOUT)
    );
    assert!(out.is_empty());
    let took = t.elapsed();
    // Not before the timeout, and well before `sleep 30` would have ended by itself.
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(25),
        "{took:?}"
    );
}

#[test]
fn idle_timeout_kills_after_output_stops() {
    if python().is_none() {
        return;
    }
    let opts = SuperviseOptions {
        start_timeout: Some(Duration::from_secs(120)),
        idle_timeout: Some(Duration::from_millis(700)),
        ..Default::default()
    };
    let t = Instant::now();
    let (o, out, _) = run(&opts, &py("idle.py", &["30"]));
    assert_eq!(
        (o.reason, o.exit_code),
        (ExitReason::IdleTimeout, EXIT_IDLE_TIMEOUT)
    );
    assert_eq!(out, b"hello\n");
    // idle.py stays silent for 30 s after its line.
    assert!(t.elapsed() < Duration::from_secs(25), "{:?}", t.elapsed());
}

fn direct_output(script: &str, args: &[&str]) -> (Vec<u8>, Vec<u8>) {
    let o = Command::new("python3")
        .arg(helper(script))
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success());
    (o.stdout, o.stderr)
}

#[test]
fn long_lines_without_newlines_arrive_intact() {
    if python().is_none() {
        return;
    }
    let (want, _) = direct_output("longline.py", &["11"]);
    assert_eq!(want.len(), (3 << 20) + 123 + 12 + (1 << 20) + 7);

    // Separate streams: stdout is exactly the child's bytes.
    let opts = SuperviseOptions {
        sample_interval: Some(Duration::from_millis(2)),
        ..Default::default()
    };
    let (o, out, err) = run(&opts, &py("longline.py", &["11"]));
    assert_eq!(o.reason, ExitReason::Exited);
    assert_eq!(o.stdout_bytes, want.len() as u64);
    assert!(
        out == want,
        "stdout differs: {} vs {} bytes",
        out.len(),
        want.len()
    );
    assert!(json_lines(&err).iter().all(|v| v["supervise"].is_string()));

    // Merged with fast samples: no sample inside a child line; the unterminated
    // last line is followed by exactly one separator newline before the exit record.
    let opts = SuperviseOptions {
        merge: true,
        ..opts
    };
    let (_, merged, _) = run(&opts, &py("longline.py", &["11"]));
    let mut child = Vec::new();
    let mut records = 0;
    for line in merged.split_inclusive(|&b| b == b'\n') {
        if line.starts_with(b"{\"") {
            let v: serde_json::Value = serde_json::from_slice(line).expect("record parses");
            assert!(v["supervise"].is_string());
            records += 1;
        } else {
            child.extend_from_slice(line);
        }
    }
    assert!(records >= 1);
    let mut want_sep = want.clone();
    want_sep.push(b'\n');
    assert!(
        child == want_sep,
        "merged child bytes differ: {} vs {}",
        child.len(),
        want_sep.len()
    );
}

#[test]
fn fast_json_lines_and_fast_samples_never_split() {
    if python().is_none() {
        return;
    }
    const N: usize = 30_000;
    let n = N.to_string();
    let (want_out, want_err) = direct_output("jsonspam.py", &[&n]);

    // Merged: every line of the combined output parses.
    let opts = SuperviseOptions {
        merge: true,
        sample_interval: Some(Duration::from_millis(2)),
        ..Default::default()
    };
    let (o, merged, err) = run(&opts, &py("jsonspam.py", &[&n]));
    assert!(err.is_empty());
    assert_eq!(o.reason, ExitReason::Exited);
    let lines = json_lines(&merged);
    let child: Vec<&serde_json::Value> = lines.iter().filter(|v| v.get("i").is_some()).collect();
    let samples = lines.iter().filter(|v| v["supervise"] == "sample").count();
    assert_eq!(child.len(), N, "lost child lines");
    assert!(samples > 0, "no samples were interleaved");
    assert_eq!(lines.last().unwrap()["supervise"], "exit");
    // Each stream keeps its order.
    for stream in ["out", "err"] {
        let idx: Vec<u64> = child
            .iter()
            .filter(|v| v["stream"] == stream)
            .map(|v| v["i"].as_u64().unwrap())
            .collect();
        assert!(idx.windows(2).all(|w| w[0] < w[1]), "{stream} out of order");
    }
    assert_eq!(o.stdout_bytes, want_out.len() as u64);
    assert_eq!(o.stderr_bytes, want_err.len() as u64);

    // Separate: stdout is byte-exact; stderr is the child's stderr plus records.
    let opts = SuperviseOptions {
        merge: false,
        ..opts
    };
    let (_, out, err) = run(&opts, &py("jsonspam.py", &[&n]));
    assert!(out == want_out, "stdout differs");
    let child_err: Vec<u8> = err
        .split_inclusive(|&b| b == b'\n')
        .filter(|l| !l.starts_with(b"{\"supervise\""))
        .flatten()
        .copied()
        .collect();
    assert!(child_err == want_err, "stderr differs");
    json_lines(&err);
}

#[test]
fn grandchildren_are_killed_including_escaped_ones() {
    if python().is_none() {
        return;
    }
    // The idle timeout counts from the helper's line (a start timeout is set): on a
    // loaded machine starting Python and two children can take longer than 800 ms.
    let opts = SuperviseOptions {
        start_timeout: Some(Duration::from_secs(120)),
        idle_timeout: Some(Duration::from_millis(800)),
        ..Default::default()
    };
    let (o, out, _) = run(&opts, &py("grandchild.py", &[]));
    assert_eq!(o.reason, ExitReason::IdleTimeout);
    let text = String::from_utf8(out).unwrap();
    let pids: Vec<i32> = text
        .trim()
        .strip_prefix("pids ")
        .unwrap()
        .split(' ')
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2);
    // SIGKILL is asynchronous; allow the kernel (on a busy machine) to finish the exits.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !pids.iter().all(|&p| is_dead(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in pids {
        assert!(is_dead(p), "grandchild {p} survived");
    }
}

#[test]
fn leftovers_are_killed_when_the_command_exits() {
    // The shell exits at once, leaving a background sleeper that holds the pipes.
    let t = Instant::now();
    let (o, out, _) = run(
        &SuperviseOptions::default(),
        &cmd(&["sh", "-c", "sleep 30 & echo $!"]),
    );
    assert_eq!((o.reason, o.code), (ExitReason::Exited, Some(0)));
    let pid: i32 = String::from_utf8(out).unwrap().trim().parse().unwrap();
    // Well before the sleeper's 30 s.
    assert!(t.elapsed() < Duration::from_secs(25), "{:?}", t.elapsed());
    let deadline = Instant::now() + Duration::from_secs(30);
    while !is_dead(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(is_dead(pid), "background sleeper {pid} survived");
}
