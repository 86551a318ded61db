//! The official `openai` and `anthropic` Python SDKs (versions pinned in
//! `tests/sdk/requirements.txt`) against the server on loopback: SmolLM2 for chat,
//! streaming, Responses, completions, Anthropic messages and error mapping;
//! Qwen2.5-Coder-0.5B (whose template supports tools) for greedy tool-call round trips.
//! The script is `tests/sdk/check_sdks.py`.
//!
//! The SDKs are installed by `scripts/sdk-venv.sh` into a virtual environment under the
//! target directory (`make test-setup` runs it before the tests; here it does nothing when
//! up to date). When the SDKs, the models or python3 cannot be had, the test fails under
//! CI and prints a visible `skipped:` line elsewhere; when it runs, the SDKs' reported
//! versions must be the pinned ones and every check must have passed.

#![cfg(feature = "engine")]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{engine_server, open_model};
use ds4_http::{ServerConfig, ServerHandle};

const N_CTX: usize = 4096;

/// The venv's python with the pinned SDKs, or why it cannot be had.
fn sdk_python() -> Result<PathBuf, String> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("sdk-venv");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/sdk-venv.sh");
    let out = Command::new(&script)
        .arg(&venv)
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "scripts/sdk-venv.sh failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(venv.join("bin/python"))
}

/// The pinned `(package, version)` pairs of `requirements.txt`.
fn pinned() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/requirements.txt");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter_map(|l| l.split_once("=="))
        .map(|(p, v)| (p.trim().to_string(), v.trim().to_string()))
        .collect()
}

async fn serve(file: &str) -> Option<ServerHandle> {
    let lm = open_model(file)?;
    Some(engine_server(lm, N_CTX, ServerConfig::default()).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_sdks_against_the_server() {
    let found = tokio::task::spawn_blocking(sdk_python).await.unwrap();
    let Some(python) =
        ds4_testkit::require(found.map_err(|why| {
            format!("the SDK test needs the openai/anthropic Python packages: {why}")
        }))
    else {
        return;
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
    // The checks ran, with the pinned SDKs.
    let pins = pinned();
    assert_eq!(pins.len(), 2, "{pins:?}");
    for (package, version) in pins {
        assert!(
            stdout.contains(&format!("{package} {version}")),
            "{package} {version} not reported:\n{stdout}"
        );
    }
    assert!(stdout.contains("all SDK checks passed"), "{stdout}");
    chat.shutdown().await.unwrap();
    tools.shutdown().await.unwrap();
}
