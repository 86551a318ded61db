//! The `is_prime` check of `ds4-server eval`: extract the Python answer from the
//! model's text and run it, sandboxed, against the truth for every integer in
//! [`LOW`]..=[`HIGH`] (5011 cases). Termination of the turn and correctness of its
//! code are recorded separately (docs/eval.md).
//!
//! Extraction ([`extract_python`]), in order of preference:
//! 1. the last fenced block tagged `python`/`py`/`python3` that contains `def is_prime`;
//! 2. the last fenced block of any tag that contains `def is_prime`;
//! 3. the last fenced block tagged `python`/`py`/`python3`;
//! 4. unfenced code: the `import`/`from` lines directly above the first line starting
//!    with `def is_prime`, that line, and the indented or blank lines after it.
//!
//! A fence is a line starting (after up to three spaces) with three backticks; a block
//! left open at the end of the text (a turn cut by the token cap) runs to the end.
//!
//! Sandbox: `python3 -I assets/eval/prime_check.py` in its own process group, killed
//! after a wall-clock timeout; inside, the script limits the address space and CPU
//! time (`resource.setrlimit`), forbids new processes, and replaces the socket
//! module's connecting functions. Where `unshare -rn` works (unprivileged user and
//! network namespaces), the process also runs with no network interface but loopback.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ds4_measure::receipt::PrimeCheck;

/// Smallest argument checked.
pub const LOW: i64 = -10;
/// Largest argument checked.
pub const HIGH: i64 = 5000;

/// The checking script (written next to the answer in a temporary folder).
const SCRIPT: &str = include_str!("../../assets/eval/prime_check.py");
/// Prefix of the script's result line on stdout.
const RESULT_TAG: &str = "DS4-PRIME-CHECK ";
/// Output kept from the answer's own printing (for error messages).
const KEEP_STDERR: usize = 4096;

/// How the check runs.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// The Python interpreter.
    pub python: String,
    /// Wall-clock limit of the whole check.
    pub timeout: Duration,
    /// Address-space limit of the checking process, MiB.
    pub memory_mb: u64,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            python: "python3".into(),
            timeout: Duration::from_secs(20),
            memory_mb: 512,
        }
    }
}

/// How the check process is kept off the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// `unshare -rn`: a new network namespace (no interface but loopback), plus the
    /// script's socket block.
    NetNamespace,
    /// The script's socket block only (`unshare -rn` is unavailable here).
    SocketBlock,
}

impl Isolation {
    /// The name recorded in receipts: `netns` or `socket-block`.
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::NetNamespace => "netns",
            Isolation::SocketBlock => "socket-block",
        }
    }

    /// What this machine supports (probed once: `unshare -rn true`).
    pub fn detect() -> Isolation {
        static DETECTED: OnceLock<Isolation> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            let ok = Command::new("unshare")
                .args(["-rn", "true"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                Isolation::NetNamespace
            } else {
                Isolation::SocketBlock
            }
        })
    }
}

fn is_python_tag(info: &str) -> bool {
    let tag = info.split_whitespace().next().unwrap_or("");
    ["python", "py", "python3"]
        .iter()
        .any(|t| tag.eq_ignore_ascii_case(t))
}

/// Fenced code blocks of `text`: (info string, body).
fn fenced_blocks(text: &str) -> Vec<(String, String)> {
    fn fence(line: &str) -> Option<&str> {
        let trimmed = line.trim_start_matches(' ');
        (line.len() - trimmed.len() <= 3)
            .then(|| trimmed.strip_prefix("```"))
            .flatten()
    }
    let mut blocks = Vec::new();
    let mut open: Option<(String, Vec<&str>)> = None;
    for line in text.lines() {
        match (&mut open, fence(line)) {
            (None, Some(info)) => open = Some((info.trim().to_string(), Vec::new())),
            (Some(_), Some(rest)) if rest.trim().is_empty() => {
                let (info, body) = open.take().expect("open block");
                blocks.push((info, body.join("\n")));
            }
            (Some((_, body)), _) => body.push(line),
            (None, None) => {}
        }
    }
    if let Some((info, body)) = open {
        blocks.push((info, body.join("\n")));
    }
    blocks
}

/// Unfenced `def is_prime` with the imports just above it and its indented body.
fn bare_definition(text: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let def = lines.iter().position(|l| l.starts_with("def is_prime"))?;
    let mut start = def;
    while start > 0 && {
        let l = lines[start - 1];
        l.starts_with("import ") || l.starts_with("from ")
    } {
        start -= 1;
    }
    let mut end = def + 1;
    while end < lines.len() && (lines[end].trim().is_empty() || lines[end].starts_with([' ', '\t']))
    {
        end += 1;
    }
    Some(lines[start..end].join("\n").trim_end().to_string() + "\n")
}

/// The Python answer in `text` by the module's rules; `None` when there is none.
pub fn extract_python(text: &str) -> Option<String> {
    let blocks = fenced_blocks(text);
    let defines = |b: &&(String, String)| b.1.contains("def is_prime");
    let python = |b: &&(String, String)| is_python_tag(&b.0);
    blocks
        .iter()
        .rev()
        .find(|b| python(b) && defines(b))
        .or_else(|| blocks.iter().rev().find(defines))
        .or_else(|| blocks.iter().rev().find(python))
        .map(|b| b.1.clone() + "\n")
        .or_else(|| bare_definition(text))
}

/// Runs the check on `code` (`None`: nothing was extracted). Never fails: problems of
/// the answer (syntax error, timeout, memory) and of the checker (no Python) both end
/// up in `error`; the second element says whether the checker itself failed (an
/// infrastructure failure to record in the receipt, not a property of the answer).
pub fn check(code: Option<&str>, opts: &CheckOptions) -> (PrimeCheck, Option<String>) {
    let total = (HIGH - LOW + 1) as u32;
    let Some(code) = code else {
        return (
            PrimeCheck {
                extracted: false,
                passed: 0,
                total,
                first_counterexample: None,
                error: Some("no Python code found in the answer".into()),
            },
            None,
        );
    };
    let failed = |error: String, infra: bool| {
        let check = PrimeCheck {
            extracted: true,
            passed: 0,
            total,
            first_counterexample: None,
            error: Some(error.clone()),
        };
        (check, infra.then_some(error))
    };
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => return failed(format!("creating a temporary folder: {e}"), true),
    };
    let (script, answer) = (
        dir.path().join("prime_check.py"),
        dir.path().join("answer.py"),
    );
    if let Err(e) = std::fs::write(&script, SCRIPT).and_then(|_| std::fs::write(&answer, code)) {
        return failed(format!("writing the check files: {e}"), true);
    }
    match run_script(&script, &answer, opts) {
        Ok(Outcome::Result(c)) => (c, None),
        Ok(Outcome::Answer(e)) => failed(e, false),
        Err(e) => failed(e, true),
    }
}

/// What the checking process produced.
enum Outcome {
    /// The script's result line.
    Result(PrimeCheck),
    /// The answer made the process fail (timeout, memory, CPU limit, crash).
    Answer(String),
}

fn run_script(script: &Path, answer: &Path, opts: &CheckOptions) -> Result<Outcome, String> {
    let cpu_s = opts.timeout.as_secs().max(1);
    let py_args = [
        "-I".to_string(),
        script.display().to_string(),
        answer.display().to_string(),
        LOW.to_string(),
        HIGH.to_string(),
        opts.memory_mb.to_string(),
        cpu_s.to_string(),
    ];
    let mut cmd = match Isolation::detect() {
        Isolation::NetNamespace => {
            let mut c = Command::new("unshare");
            c.arg("-rn").arg(&opts.python);
            c
        }
        Isolation::SocketBlock => Command::new(&opts.python),
    };
    cmd.args(&py_args)
        .current_dir(script.parent().unwrap_or(Path::new(".")))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("starting {}: {e}", opts.python))?;
    let pid = child.id() as i32;
    let reader = |pipe: Option<Box<dyn Read + Send>>, keep: usize| {
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            if let Some(mut p) = pipe {
                let mut buf = [0u8; 8192];
                while let Ok(n) = p.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    // Keep the last `keep` bytes (the result line comes last).
                    kept.extend_from_slice(&buf[..n]);
                    if kept.len() > 2 * keep {
                        kept.drain(..kept.len() - keep);
                    }
                }
            }
            String::from_utf8_lossy(&kept).into_owned()
        })
    };
    let out = reader(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        1 << 16,
    );
    let err = reader(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        KEEP_STDERR,
    );
    let t0 = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if t0.elapsed() >= opts.timeout => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(format!("waiting for the check: {e}")),
        }
    };
    if status.is_none() {
        // SAFETY: kill(2) on the child's own process group (it was started with
        // process_group(0), so its group id is its pid).
        unsafe { libc::kill(-pid, libc::SIGKILL) };
        let _ = child.wait();
    }
    let (stdout, stderr) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    let Some(status) = status else {
        return Ok(Outcome::Answer(format!(
            "timed out after {:.0} s",
            opts.timeout.as_secs_f64()
        )));
    };
    if let Some(line) = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(RESULT_TAG))
    {
        return serde_json::from_str::<PrimeCheck>(line)
            .map(Outcome::Result)
            .map_err(|e| format!("unreadable check result ({e}): {line}"));
    }
    let tail = stderr.trim();
    let tail = &tail[tail.len().saturating_sub(500)..];
    // Exit code 127 from unshare or the shell: the interpreter is missing.
    if status.code() == Some(127)
        || tail.contains("No such file or directory") && tail.contains(&opts.python)
    {
        return Err(format!("{} was not found: {tail}", opts.python));
    }
    Ok(Outcome::Answer(format!(
        "the check process ended without a result ({status}): {tail}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extraction_prefers_the_last_defining_python_block() {
        let text = "Here:\n```python\ndef is_prime(n):\n    return False\n```\nBetter:\n\
                    ```python\ndef is_prime(n):\n    return n == 2\n```\nUsage:\n```python\nprint(is_prime(7))\n```\n";
        assert_eq!(
            extract_python(text).unwrap(),
            "def is_prime(n):\n    return n == 2\n"
        );
        // Untagged block defining it beats a tagged block that does not.
        let text = "```\ndef is_prime(n): return True\n```\n```py\nx = 1\n```";
        assert_eq!(
            extract_python(text).unwrap(),
            "def is_prime(n): return True\n"
        );
        // A block cut by the token cap runs to the end.
        let text = "```python\nimport math\ndef is_prime(n):\n    return n > 1";
        assert_eq!(
            extract_python(text).unwrap(),
            "import math\ndef is_prime(n):\n    return n > 1\n"
        );
        assert_eq!(extract_python("No code at all."), None);
    }

    #[test]
    fn bare_definition_with_imports_and_body() {
        let text = "Sure.\nimport math\ndef is_prime(n):\n    if n < 2:\n        return False\n\n    return True\nThis works.";
        assert_eq!(
            extract_python(text).unwrap(),
            "import math\ndef is_prime(n):\n    if n < 2:\n        return False\n\n    return True\n"
        );
    }

    /// Whether `python3` runs: a failure under CI when it does not, a visible skip
    /// elsewhere.
    fn have_python() -> bool {
        ds4_testkit::python3().is_some()
    }

    fn run(code: &str) -> PrimeCheck {
        let (c, infra) = check(Some(code), &CheckOptions::default());
        assert_eq!(infra, None, "{c:?}");
        c
    }

    // Truths used below: 669 primes up to 5000 (Legendre/the prime-counting
    // function, pi(5000) = 669); 5011 integers in -10..=5000.
    #[test]
    fn correct_answer_passes_every_case() {
        if !have_python() {
            return;
        }
        let c = run(
            "def is_prime(n):\n    if n < 2:\n        return False\n    i = 2\n    while i * i <= n:\n        if n % i == 0:\n            return False\n        i += 1\n    return True\n",
        );
        assert!(c.all_passed(), "{c:?}");
        assert_eq!((c.passed, c.total), (5011, 5011));
        assert_eq!(c.first_counterexample, None);
    }

    #[test]
    fn wrong_answers_report_first_counterexample() {
        if !have_python() {
            return;
        }
        // Always False: wrong exactly on the 669 primes; the first is 2.
        let c = run("def is_prime(n):\n    return False\n");
        assert_eq!(c.passed, 5011 - 669);
        let ce = c.first_counterexample.unwrap();
        assert_eq!((ce.n, ce.expected, ce.got.as_str()), (2, true, "False"));
        // Forgets that 1 and negatives are not prime: -10, -9 and -8 have a divisor
        // in range(2, 4) and come out False (right); -7 is the first called prime.
        let c = run(
            "def is_prime(n):\n    return all(n % d for d in range(2, int(abs(n) ** 0.5) + 1))\n",
        );
        let ce = c.first_counterexample.unwrap();
        assert_eq!((ce.n, ce.expected, ce.got.as_str()), (-7, false, "True"));
        // Exceptions count as failed cases: right everywhere but at 7.
        let c = run(
            "def is_prime(n):\n    if n == 7:\n        raise ValueError('seven')\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))\n",
        );
        assert_eq!(c.passed, 5010);
        let ce = c.first_counterexample.unwrap();
        assert_eq!((ce.n, ce.expected), (7, true));
        assert_eq!(ce.got, "raised ValueError: seven");
    }

    #[test]
    fn sandbox_limits_hold() {
        if !have_python() {
            return;
        }
        let opts = CheckOptions {
            timeout: Duration::from_secs(3),
            ..CheckOptions::default()
        };
        // An endless loop at import time: killed at the timeout.
        let t0 = Instant::now();
        let (c, infra) = check(Some("while True:\n    pass\n"), &opts);
        // Killed at the 3 s timeout; the bound leaves room for a loaded machine.
        assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
        assert_eq!(infra, None);
        assert!(c.error.unwrap().contains("timed out"));
        // 2 GiB allocation under the 512 MiB address-space limit.
        let c = run("x = bytearray(2 << 30)\ndef is_prime(n):\n    return False\n");
        assert!(c.error.unwrap().contains("MemoryError"));
        // No network: connecting fails (socket block, or no route in a namespace).
        let c = run(
            "import socket\nsocket.create_connection(('192.0.2.1', 80), timeout=1)\ndef is_prime(n):\n    return False\n",
        );
        assert!(c.error.unwrap().contains("did not run"));
        // Syntax errors and missing functions are reported.
        assert!(
            run("def is_prime(n) return 1\n")
                .error
                .unwrap()
                .contains("SyntaxError")
        );
        assert!(
            run("x = 1\n")
                .error
                .unwrap()
                .contains("no function is_prime")
        );
        // Printing cannot forge or hide the result.
        let c = run("print('DS4-PRIME-CHECK {}')\ndef is_prime(n):\n    return False\n");
        assert_eq!(c.passed, 5011 - 669);
    }

    #[test]
    fn nothing_extracted_and_missing_python() {
        let (c, infra) = check(None, &CheckOptions::default());
        assert!(!c.extracted && infra.is_none() && !c.all_passed());
        let opts = CheckOptions {
            python: "/nonexistent/python3".into(),
            ..CheckOptions::default()
        };
        let (c, infra) = check(Some("def is_prime(n): return False\n"), &opts);
        assert!(infra.is_some(), "{c:?}");
        assert!(c.error.unwrap().contains("nonexistent"));
    }
}
