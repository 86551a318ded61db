//! `ds4-server synth NAME OUT.gguf` writes a model the engine loads and runs.

mod support;

use support::{run, show};

/// The engine runs the model file `p`: greedy, raw prompt, three tokens.
fn generates_three_tokens(p: &str) {
    let out = run(&[
        "run",
        "-m",
        p,
        "--no-template",
        "-p",
        "ab",
        "-n",
        "3",
        "--temp",
        "0",
        "--dump-tokens",
    ]);
    assert!(out.status.success(), "{}", show(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    let dump: serde_json::Value = serde_json::from_str(err.lines().last().unwrap()).unwrap();
    assert_eq!(dump["generated"].as_array().unwrap().len(), 3, "{err}");
}

#[test]
fn synthetic_file_loads_and_generates() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let p = path.to_str().unwrap();
    let out = run(&["synth", "tiny-llama:q4_0", p]);
    assert!(out.status.success(), "{}", show(&out));
    let file = ds4_gguf::GgufFile::open(&path).unwrap();
    let spec = ds4_cuda::synth::Spec::parse("tiny-llama:q4_0").unwrap();
    assert_eq!(file.tensors().len(), spec.tensors().len());
    generates_three_tokens(p);
}

#[test]
fn a_glm_layer_window_loads_and_generates() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("glm.gguf");
    let p = path.to_str().unwrap();
    let args = [
        "synth",
        "tiny-glm5:q2",
        p,
        "--first-layer",
        "2",
        "--layers",
        "3",
    ];
    let out = run(&args);
    assert!(out.status.success(), "{}", show(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("KDA, dense FFN: layer 2") && err.contains("MLA+indexer, MoE: layer 3"),
        "{err}"
    );
    let file = ds4_gguf::GgufFile::open(&path).unwrap();
    assert_eq!(file.get_u32("glm5-next.block_count").unwrap(), 3);
    generates_three_tokens(p);
    // A window past the last layer is refused.
    let out = run(&[
        "synth",
        "tiny-glm5:q2",
        p,
        "--first-layer",
        "7",
        "--layers",
        "2",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("outside"),
        "{}",
        show(&out)
    );
}

#[test]
fn unknown_names_list_the_known_ones() {
    let out = run(&["synth", "nonsense:q4_0", "/tmp/never-written.gguf"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("llama3-8b") && err.contains("q4_k_m") && err.contains("glm53-flash:q2"),
        "{err}"
    );
}
