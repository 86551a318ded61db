//! Session behaviour of the `deepseek4` family against the reference's logits: the
//! prompt split into prefill calls of any size gives the same logits (the f32
//! reference is split-invariant, doc §8), rewind-then-replay reproduces them, a
//! speculative block can be verified and partly accepted, snapshots restore exactly,
//! and the state file round-trips.

use super::*;
use crate::backend::cpu::CpuBackend;
use crate::families::deepseek4::{DeepSeek4Cache, state_file};
use crate::model::Cache;
use crate::{EngineError, Session};

/// The fixture's model, golden master and f32 tolerance (its parity bound: 3× the
/// worst row measured, [`f32_pinned`]).
fn setup(name: &str) -> (Cpu, Golden, f64) {
    let dir = dir(name);
    let tol = f32_pinned(name).worst_bound();
    (llamacpp_model(&dir), golden(&dir), tol)
}

/// Runs the prompt in pieces of `piece` tokens (every row of logits), then the 32
/// decode steps; returns (prefill rows, decode rows).
fn split_run(m: &Cpu, g: &Golden, piece: usize) -> (Vec<f32>, Vec<f32>) {
    let mut cache = m.new_cache(4096).unwrap();
    let mut pre = Vec::new();
    let mut out = Vec::new();
    for p in g.prompt.chunks(piece) {
        m.forward(&mut *cache, p, Logits::All, &mut out).unwrap();
        pre.extend_from_slice(&out);
    }
    let mut dec = Vec::new();
    for i in 0..32 {
        m.forward(&mut *cache, &[g.decode_tokens[i]], Logits::Last, &mut out)
            .unwrap();
        dec.extend_from_slice(&out);
    }
    (pre, dec)
}

#[test]
fn prompt_split_does_not_matter() {
    for name in ["small_rates_f32", "real_layout_f32"] {
        let (m, g, tol) = setup(name);
        let (one_pre, one_dec) = run_protocol(&m, &g);
        for piece in [64, 37, 5, 1] {
            let (pre, dec) = split_run(&m, &g, piece);
            let (e_pre, e_dec) = (
                max_err(&pre, &g.prefill, g.vocab),
                max_err(&dec, &g.decode, g.vocab),
            );
            eprintln!("{name}: pieces of {piece}: prefill {e_pre:.2e}, decode {e_dec:.2e}");
            assert!(
                e_pre <= tol && e_dec <= tol,
                "{name}: pieces of {piece}: {e_pre:.2e} / {e_dec:.2e}"
            );
            // Every operation is a per-token function of the state: bit-identical.
            assert_eq!(
                pre, one_pre,
                "{name}: pieces of {piece}: prefill rows differ"
            );
            assert_eq!(
                dec, one_dec,
                "{name}: pieces of {piece}: decode rows differ"
            );
        }
    }
}

fn downcast(c: &mut dyn Cache) -> &mut DeepSeek4Cache<CpuBackend> {
    c.as_any_mut()
        .downcast_mut::<DeepSeek4Cache<CpuBackend>>()
        .unwrap()
}

/// The sequence prompt + decode_tokens[..n] and the reference's logits after each
/// position.
fn want(g: &Golden, p: usize) -> &[f32] {
    let (s, v) = (g.prompt.len(), g.vocab);
    if p < s {
        &g.prefill[p * v..(p + 1) * v]
    } else {
        &g.decode[(p - s) * v..(p - s + 1) * v]
    }
}

/// Rewinding by any number of tokens within the rings' reach (including into the
/// prefill and across compressor windows) and replaying reproduces the reference's
/// logits; past the reach a clear error, and rewind_point says where to go instead.
#[test]
fn rewind_then_replay() {
    let (m, g, tol) = setup("real_layout_f32");
    let mut cache = m.new_ds4_cache(4096).unwrap();
    cache.set_rewind_window(48).unwrap();
    let mut out = Vec::new();
    m.forward(&mut cache, &g.prompt, Logits::Last, &mut out)
        .unwrap();
    let s = g.prompt.len();
    for i in 0..20 {
        m.forward(&mut cache, &[g.decode_tokens[i]], Logits::Last, &mut out)
            .unwrap();
    }
    let seq: Vec<u32> = g
        .prompt
        .iter()
        .chain(&g.decode_tokens[..20])
        .copied()
        .collect();
    let len = s + 20;
    assert_eq!(cache.earliest_rewind(), len - 48);
    assert_eq!(cache.anchors(), vec![s - 48..=s]);
    for back in [1usize, 3, 7, 30, 48] {
        let to = len - back;
        cache.truncate(to).unwrap();
        // Replay in one block (every row) and check each position.
        m.forward(&mut cache, &seq[to..], Logits::All, &mut out)
            .unwrap();
        for (k, row) in out.chunks(g.vocab).enumerate() {
            let e = row_err(row, want(&g, to + k));
            assert!(e <= tol, "rewind by {back}: position {}: {e:.2e}", to + k);
        }
    }
    // Past the reach of the rings and of the prefill-end anchor (positions s − 48 ..= s):
    // a clear error.
    let err = cache.truncate(s - 60).unwrap_err();
    assert!(matches!(err, EngineError::Rewind { .. }), "{err}");
    assert!(err.to_string().contains("rewind_point"), "{err}");
    assert_eq!(cache.rewind_point(s - 60), 0);
    // The anchor's end follows the truncations (the history after them may differ).
    assert_eq!(cache.anchors(), vec![s - 48..=len - 48]);
    assert_eq!(cache.rewind_point(s - 10), s - 10);
    cache.truncate(s - 10).unwrap();
    m.forward(&mut cache, &seq[s - 10..s + 5], Logits::All, &mut out)
        .unwrap();
    for (k, row) in out.chunks(g.vocab).enumerate() {
        assert!(
            row_err(row, want(&g, s - 10 + k)) <= tol,
            "after the anchor: {k}"
        );
    }
    // Rewinding to 0 always works and replays from scratch.
    cache.truncate(0).unwrap();
    m.forward(&mut cache, &g.prompt, Logits::All, &mut out)
        .unwrap();
    assert!(max_err(&out, &g.prefill, g.vocab) <= tol);
}

/// The session rewinds to any frontier: within reach by truncating, beyond it from the
/// nearest reachable point (re-evaluating the rest); the logits after the rewind are
/// the reference's.
#[test]
fn session_rewinds_anywhere() {
    let (m, g, tol) = setup("small_rates_f32");
    let v = g.vocab;
    let m: Arc<dyn Model> = Arc::new(m);
    let mut sess = Session::new(m, 4096).unwrap();
    sess.prefill(&g.prompt, &mut |_, _| {}).unwrap();
    for i in 0..32 {
        sess.decode(g.decode_tokens[i]).unwrap();
    }
    let s = g.prompt.len();
    let seq: Vec<u32> = g.prompt.iter().chain(&g.decode_tokens).copied().collect();
    for to in [s + 30, s + 3, s, s - 1, 100, 17, 3] {
        sess.rewind(to).unwrap();
        assert_eq!(sess.tokens(), &seq[..to]);
        let out = sess.forward_all(&seq[to..to + 2]).unwrap();
        assert!(
            max_err(&out, &[want(&g, to), want(&g, to + 1)].concat(), v) <= tol,
            "rewind to {to}"
        );
        sess.rewind(to).unwrap();
    }
    let out = sess.forward_all(&g.prompt[3..]).unwrap();
    assert!(max_err(&out, &g.prefill[3 * v..], v) <= tol);
}

/// Speculative verification: a block of 5 draft tokens evaluated in one call, 2
/// accepted, the rest rolled back, decoding continues.
#[test]
fn speculative_block_partly_accepted() {
    let (m, g, tol) = setup("small_rates_f32");
    let v = g.vocab;
    let mut cache = m.new_cache(4096).unwrap();
    let mut out = Vec::new();
    m.forward(&mut *cache, &g.prompt, Logits::Last, &mut out)
        .unwrap();
    let s = g.prompt.len();
    m.forward(&mut *cache, &g.decode_tokens[..5], Logits::All, &mut out)
        .unwrap();
    assert!(max_err(&out, &g.decode[..5 * v], v) <= tol, "block logits");
    cache.truncate(s + 2).unwrap();
    for i in 2..12 {
        m.forward(&mut *cache, &[g.decode_tokens[i]], Logits::Last, &mut out)
            .unwrap();
        assert!(
            row_err(&out, &g.decode[i * v..(i + 1) * v]) <= tol,
            "step {i}"
        );
    }
}

/// Session snapshots restore bit for bit.
#[test]
fn session_snapshot_restores_exactly() {
    let (m, g, _) = setup("real_layout_f32");
    let m: Arc<dyn Model> = Arc::new(m);
    let mut sess = Session::new(m, 4096).unwrap();
    sess.prefill(&g.prompt, &mut |_, _| {}).unwrap();
    let snap = sess.snapshot().unwrap();
    let a: Vec<Vec<f32>> = (0..6)
        .map(|i| sess.decode(g.decode_tokens[i]).unwrap().to_vec())
        .collect();
    sess.restore(&snap).unwrap();
    let b: Vec<Vec<f32>> = (0..6)
        .map(|i| sess.decode(g.decode_tokens[i]).unwrap().to_vec())
        .collect();
    assert_eq!(a, b, "restore then replay must be bit-identical");
}

/// The state file holds everything: a loaded cache continues and rewinds exactly like
/// the saved one; bad files give clear errors.
#[test]
fn state_file_round_trip() {
    let (m, g, tol) = setup("small_rates_f32");
    let mut cache = m.new_ds4_cache(4096).unwrap();
    let mut out = Vec::new();
    m.forward(&mut cache, &g.prompt, Logits::Last, &mut out)
        .unwrap();
    for i in 0..3 {
        m.forward(&mut cache, &[g.decode_tokens[i]], Logits::Last, &mut out)
            .unwrap();
    }
    let tmp = std::env::temp_dir().join(format!("ds4_state_{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let path = tmp.join("state.bin");
    state_file::save(&cache, &path).unwrap();
    let mut loaded = state_file::load(&m, &path).unwrap();
    let bytes_of = |c: &DeepSeek4Cache<CpuBackend>| {
        let mut v = Vec::new();
        state_file::write_state(c, &mut v).unwrap();
        v
    };
    assert_eq!(
        bytes_of(&loaded),
        bytes_of(&cache),
        "the loaded state differs"
    );
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for i in 3..8 {
        m.forward(&mut cache, &[g.decode_tokens[i]], Logits::Last, &mut a)
            .unwrap();
        m.forward(&mut loaded, &[g.decode_tokens[i]], Logits::Last, &mut b)
            .unwrap();
        assert_eq!(a, b);
    }
    let s = g.prompt.len();
    loaded.truncate(s + 1).unwrap();
    m.forward(&mut loaded, &[g.decode_tokens[1]], Logits::Last, &mut b)
        .unwrap();
    assert!(row_err(&b, &g.decode[g.vocab..2 * g.vocab]) <= tol);
    // Bad magic, another version, another model, a cut file.
    let bytes = std::fs::read(&path).unwrap();
    let mut bad = bytes.clone();
    bad[0] = b'X';
    let e = state_file::read_state(&m, &mut &bad[..], "bad")
        .err()
        .unwrap();
    assert!(e.to_string().contains("bad magic"), "{e}");
    let mut v2 = bytes.clone();
    v2[8] = 7;
    let e = state_file::read_state(&m, &mut &v2[..], "v7")
        .err()
        .unwrap();
    assert!(e.to_string().contains("version 7"), "{e}");
    let other = llamacpp_model(&dir("real_layout_f32"));
    let e = state_file::read_state(&other, &mut &bytes[..], "other")
        .err()
        .unwrap();
    assert!(e.to_string().contains("another model"), "{e}");
    let e = state_file::read_state(&m, &mut &bytes[..bytes.len() / 2], "cut")
        .err()
        .unwrap();
    assert!(e.to_string().contains("cut"), "{e}");
    std::fs::remove_dir_all(&tmp).ok();
    let _ = downcast;
}

/// A chat's next turn diverges just before the previous prompt's end: after more
/// generated tokens than the rings reach, the prefill-end anchor still reaches it, and
/// the replay from there reproduces the reference (windows and compressor rings
/// restored from the anchor).
#[test]
fn next_turn_rewinds_through_the_prefill_anchor() {
    let (m, g, tol) = setup("small_rates_f32");
    let mut cache = m.new_ds4_cache(4096).unwrap();
    cache.set_rewind_window(16).unwrap();
    let mut out = Vec::new();
    m.forward(&mut cache, &g.prompt, Logits::Last, &mut out)
        .unwrap();
    for i in 0..32 {
        m.forward(&mut cache, &[g.decode_tokens[i]], Logits::Last, &mut out)
            .unwrap();
    }
    let s = g.prompt.len();
    assert_eq!(cache.earliest_rewind(), s + 32 - 16);
    assert_eq!(cache.rewind_point(s - 5), s - 5);
    cache.truncate(s - 5).unwrap();
    let seq: Vec<u32> = g.prompt.iter().chain(&g.decode_tokens).copied().collect();
    m.forward(&mut cache, &seq[s - 5..s + 10], Logits::All, &mut out)
        .unwrap();
    for (k, row) in out.chunks(g.vocab).enumerate() {
        let e = row_err(row, want(&g, s - 5 + k));
        assert!(e <= tol, "position {}: {e:.2e}", s - 5 + k);
    }
    // Below the anchor's reach only 0 is left.
    assert_eq!(cache.rewind_point(s - 30), 0);
}

/// Greedy decoding with the backend choosing every token, each step queued before the
/// host reads its token (`Session::decode_greedy`), picks the reference's greedy tokens,
/// stops and fills the context as `decode` and the host's argmax would.
#[test]
fn pipelined_greedy_picks_the_reference_tokens() {
    for name in ["real_layout_f32", "small_rates_f32"] {
        let (m, g, tol) = setup(name);
        let m: Arc<dyn Model> = Arc::new(m);
        crate::fixtures::check_pipelined_greedy(&m, &g, tol)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}
