//! Session states written to bytes and read back (what the server's disk checkpoints
//! hold) continue exactly as the original: for the dense family (SmolLM2-135M) and the
//! recurrent/compressed families (GLM-5.3 and DeepSeek-V4 fixture files written by
//! llama.cpp's converter), a session restored from a written snapshot gives logits bit
//! for bit equal to the original session's, rewinds to the same reachable points, and
//! refuses bytes of another model or with a flipped byte in its header.
//!
//! SmolLM2 is located by `ds4_testkit` (a failure under CI when absent, a visible skip
//! elsewhere); the fixture files are committed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ds4_engine::{Model, Session};
use ds4_gguf::GgufFile;

fn load(path: &Path) -> Arc<dyn Model> {
    let gguf = Arc::new(GgufFile::open(path).unwrap());
    ds4_engine::loader::load_model(&gguf, path).unwrap()
}

fn fixture(family: &str, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(family)
        .join(name)
        .join("llamacpp.gguf")
}

/// Deterministic token ids below `n_vocab`.
fn tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % n_vocab as u64) as u32
        })
        .collect()
}

fn check(what: &str, model: Arc<dyn Model>, n_ctx: usize) {
    let n_vocab = model.info().n_vocab;
    let prompt = tokens(70, n_vocab, 7);
    let more = tokens(6, n_vocab, 11);
    let mut a = Session::new(model.clone(), n_ctx).unwrap();
    a.prefill(&prompt, &mut |_, _| {}).unwrap();
    let snap = a.snapshot().unwrap();
    let mut bytes = Vec::new();
    a.write_snapshot(&snap, &mut bytes).unwrap();

    let mut b = Session::new(model.clone(), n_ctx).unwrap();
    let read = b.read_snapshot(&mut &bytes[..]).unwrap();
    assert_eq!(read.tokens(), &prompt[..], "{what}");
    assert_eq!(read.reachable(), snap.reachable(), "{what}");
    b.restore(&read).unwrap();
    assert_eq!(
        a.logits().unwrap(),
        b.logits().unwrap(),
        "{what}: logits after the prompt"
    );
    for &t in &more {
        let la = a.decode(t).unwrap().to_vec();
        let lb = b.decode(t).unwrap().to_vec();
        assert!(
            la.iter().zip(&lb).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{what}: decode of token {t}"
        );
    }
    // Both rewind to the end of the prompt (a checkpoint of every family) alike.
    let end = prompt.len();
    assert_eq!(
        a.reachable(),
        b.reachable(),
        "{what}: reachable after decoding"
    );
    a.rewind(end).unwrap();
    b.rewind(end).unwrap();
    let la = a.decode(more[0]).unwrap().to_vec();
    let lb = b.decode(more[0]).unwrap().to_vec();
    assert!(
        la.iter().zip(&lb).all(|(x, y)| x.to_bits() == y.to_bits()),
        "{what}: after a rewind"
    );

    // A flipped byte in the token count, and bytes cut short, are errors.
    let mut bad = bytes.clone();
    bad[8] ^= 0x80;
    assert!(b.read_snapshot(&mut &bad[..]).is_err(), "{what}");
    assert!(
        b.read_snapshot(&mut &bytes[..bytes.len() - 5]).is_err(),
        "{what}"
    );
    eprintln!(
        "{what}: a {}-byte state restored, 6 decode steps and a rewind bit-identical",
        bytes.len()
    );
}

#[test]
fn written_states_continue_exactly() {
    check(
        "glm5_next real_layout",
        load(&fixture("glm5_next", "real_layout_f32")),
        256,
    );
    check(
        "deepseek4 real_layout",
        load(&fixture("deepseek4", "real_layout_f32")),
        256,
    );
    if let Some(p) = ds4_testkit::model("smollm2-135m-instruct-q4_1.gguf") {
        check("smollm2", load(&p), 256);
    }
}

#[test]
fn a_state_of_another_model_is_refused() {
    let glm = load(&fixture("glm5_next", "real_layout_f32"));
    let ds4 = load(&fixture("deepseek4", "real_layout_f32"));
    let mut a = Session::new(glm.clone(), 128).unwrap();
    a.prefill(
        &tokens(10, glm.info().n_vocab.min(ds4.info().n_vocab), 3),
        &mut |_, _| {},
    )
    .unwrap();
    let mut bytes = Vec::new();
    a.write_snapshot(&a.snapshot().unwrap(), &mut bytes)
        .unwrap();
    let b = Session::new(ds4, 128).unwrap();
    let Err(e) = b.read_snapshot(&mut &bytes[..]) else {
        panic!("a GLM-5.3 state was accepted by a DeepSeek-V4 session");
    };
    eprintln!("refused: {e}");
    // Another context size of the same model is refused too.
    let c = Session::new(glm, 64).unwrap();
    assert!(c.read_snapshot(&mut &bytes[..]).is_err());
}
