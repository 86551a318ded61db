//! The official `openai` and `anthropic` Python SDKs (versions pinned in
//! `tests/sdk/requirements.txt`) against the server on loopback: SmolLM2 for chat,
//! streaming, Responses, completions, Anthropic messages and error mapping;
//! Qwen2.5-Coder-0.5B (whose template supports tools) for greedy tool-call round trips.
//! The script is `tests/sdk/check_sdks.py`.
//!
//! The SDKs are installed into a virtual environment under the target directory on
//! first use. Skips with a message when the models, python3, venv or pip (or PyPI) are
//! unavailable.

#![cfg(feature = "engine")]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{engine_server, open_model};
use ds4_http::{ServerConfig, ServerHandle};

const N_CTX: usize = 4096;

/// The venv's python with the pinned SDKs, or why it cannot be had.
fn sdk_python() -> Result<PathBuf, String> {
    let sdk_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk");
    let requirements = std::fs::read_to_string(sdk_dir.join("requirements.txt"))
        .map_err(|e| format!("reading requirements.txt: {e}"))?;
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("sdk-venv");
    let python = venv.join("bin/python");
    let stamp = venv.join(".requirements.txt");
    if python.exists()
        && std::fs::read_to_string(&stamp).ok().as_deref() == Some(requirements.as_str())
    {
        return Ok(python);
    }
    let ok = |c: &mut Command| c.status().map(|s| s.success()).unwrap_or(false);
    if !ok(Command::new("python3").arg("--version")) {
        return Err("python3 is not installed".into());
    }
    if !ok(Command::new("python3")
        .args(["-m", "venv", "--clear"])
        .arg(&venv))
    {
        return Err(format!(
            "`python3 -m venv {}` failed (is the venv module installed?)",
            venv.display()
        ));
    }
    let pip = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-r",
        ])
        .arg(sdk_dir.join("requirements.txt"))
        .output()
        .map_err(|e| format!("running pip: {e}"))?;
    if !pip.status.success() {
        return Err(format!(
            "pip install failed (offline or no pip?): {}",
            String::from_utf8_lossy(&pip.stderr).trim()
        ));
    }
    std::fs::write(&stamp, requirements)
        .map_err(|e| format!("writing {}: {e}", stamp.display()))?;
    Ok(python)
}

async fn serve(file: &str) -> Option<ServerHandle> {
    let lm = open_model(file)?;
    Some(engine_server(lm, N_CTX, ServerConfig::default()).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_sdks_against_the_server() {
    let python = match tokio::task::spawn_blocking(sdk_python).await.unwrap() {
        Ok(p) => p,
        Err(why) => {
            eprintln!("skipped: the SDK test needs the openai/anthropic Python packages: {why}");
            return;
        }
    };
    let (Some(chat), Some(tools)) = (
        serve("smollm2-135m-instruct-q4_1.gguf").await,
        serve("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf").await,
    ) else {
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/check_sdks.py");
    let (chat_url, tools_url) = (chat.base_url(), tools.base_url());
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
            .args(["--chat-url", &chat_url, "--tools-url", &tools_url])
            .output()
    })
    .await
    .unwrap()
    .expect("running the SDK script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "SDK checks failed:\n{stdout}");
    chat.shutdown().await.unwrap();
    tools.shutdown().await.unwrap();
}
