//! Session behaviour of the `glm5_next` family against the reference's logits: the
//! prompt split into prefill calls of any size gives the same logits (within the f32
//! tolerance), rewind-then-replay reproduces them, a speculative block can be verified
//! and partly accepted, snapshots restore exactly, and the state file round-trips.

use std::sync::Arc;

use ds4_convert::OutType;

use super::*;
use crate::backend::cpu::CpuBackend;
use crate::families::glm5_next::{Glm5NextCache, state_file};
use crate::model::Cache;
use crate::{EngineError, Session};

/// The fixture's model, golden master and f32 tolerance (its parity bound: 3× the
/// worst row measured, [`f32_pinned`]).
fn setup(name: &str) -> (Cpu, Golden, f64) {
    let dir = dir(name);
    let tol = f32_pinned(name).worst_bound();
    (model(&dir, OutType::F32), golden(&dir), tol)
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
    for name in [
        "lowerbound_sparse_f32",
        "softplus_dense_f32",
        "real_layout_f32",
    ] {
        let (m, g, tol) = setup(name);
        for piece in [64, 37, 1] {
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
        }
    }
}

fn downcast(c: &mut dyn Cache) -> &mut Glm5NextCache<CpuBackend> {
    c.as_any_mut()
        .downcast_mut::<Glm5NextCache<CpuBackend>>()
        .unwrap()
}

/// Rewinding by 1..=window tokens and replaying reproduces the reference's decode
/// logits; rewinding past the journal and the anchors fails with a clear error.
#[test]
fn rewind_then_replay() {
    let (m, g, tol) = setup("lowerbound_sparse_f32");
    let v = g.vocab;
    let mut cache = m.new_cache(4096).unwrap();
    let mut out = Vec::new();
    m.forward(&mut *cache, &g.prompt, Logits::Last, &mut out)
        .unwrap();
    let s = g.prompt.len();
    for i in 0..20 {
        m.forward(&mut *cache, &[g.decode_tokens[i]], Logits::Last, &mut out)
            .unwrap();
    }
    let earliest = downcast(&mut *cache).earliest_rewind();
    assert!(s + 20 - earliest >= crate::families::glm5_next::DEFAULT_REWIND_WINDOW);
    // The sequence so far: the prompt, then decode_tokens[..20]; the logits after token
    // at position p are the reference's prefill row p or decode row p − s.
    let seq: Vec<u32> = g
        .prompt
        .iter()
        .chain(&g.decode_tokens[..20])
        .copied()
        .collect();
    let want = |p: usize| {
        if p < s {
            &g.prefill[p * v..(p + 1) * v]
        } else {
            &g.decode[(p - s) * v..(p - s + 1) * v]
        }
    };
    for back in [1usize, 3, 7, s + 20 - earliest] {
        let to = s + 20 - back;
        cache.truncate(to).unwrap();
        for (p, &tok) in seq.iter().enumerate().skip(to) {
            m.forward(&mut *cache, &[tok], Logits::Last, &mut out)
                .unwrap();
            let e = row_err(&out, want(p));
            assert!(e <= tol, "rewind by {back}: position {p}: {e:.2e}");
        }
    }
    // Below the journal and the prefill anchor (positions 128..=150): a clear error.
    let err = cache.truncate(5).unwrap_err();
    assert!(matches!(err, EngineError::Rewind { .. }), "{err}");
    assert!(err.to_string().contains("snapshot"), "{err}");
    // Rewinding to 0 always works and replays from scratch.
    cache.truncate(0).unwrap();
    m.forward(&mut *cache, &g.prompt, Logits::All, &mut out)
        .unwrap();
    assert!(max_err(&out, &g.prefill, v) <= tol);
}

/// A wide rewind window reaches back into the prefill (the base is taken at a
/// 64-token chunk boundary of the prompt call).
#[test]
fn rewind_into_prefill_with_a_wide_window() {
    let (m, g, tol) = setup("softplus_dense_f32");
    let v = g.vocab;
    let mut cache = m.new_glm_cache(4096).unwrap();
    cache.set_rewind_window(100).unwrap();
    let mut out = Vec::new();
    m.forward(&mut cache, &g.prompt, Logits::Last, &mut out)
        .unwrap();
    let s = g.prompt.len();
    assert!(
        cache.earliest_rewind() <= s - 100,
        "earliest {}",
        cache.earliest_rewind()
    );
    cache.truncate(s - 90).unwrap();
    m.forward(&mut cache, &g.prompt[s - 90..], Logits::All, &mut out)
        .unwrap();
    assert!(max_err(&out, &g.prefill[(s - 90) * v..], v) <= tol);
    m.forward(&mut cache, &[g.decode_tokens[0]], Logits::Last, &mut out)
        .unwrap();
    assert!(row_err(&out, &g.decode[..v]) <= tol);
}

/// Speculative verification: a block of 5 draft tokens evaluated in one call, 2
/// accepted, the rest rolled back, decoding continues.
#[test]
fn speculative_block_partly_accepted() {
    let (m, g, tol) = setup("lowerbound_sparse_f32");
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
    for i in 2..8 {
        m.forward(&mut *cache, &[g.decode_tokens[i]], Logits::Last, &mut out)
            .unwrap();
        assert!(
            row_err(&out, &g.decode[i * v..(i + 1) * v]) <= tol,
            "step {i}"
        );
    }
}

/// Session snapshots restore bit for bit; Session::rewind uses the cache's journal.
#[test]
fn session_snapshot_and_rewind() {
    let (m, g, tol) = setup("softplus_dense_f32");
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
    let len = sess.tokens().len();
    sess.rewind(len - 4).unwrap();
    let c = sess.decode(g.decode_tokens[2]).unwrap().to_vec();
    assert!(row_err(&c, &g.decode[2 * g.vocab..3 * g.vocab]) <= tol);
}

/// The state file holds everything: a loaded cache continues and rewinds exactly like
/// the saved one; bad files give clear errors.
#[test]
fn state_file_round_trip() {
    let (m, g, tol) = setup("lowerbound_sparse_f32");
    let mut cache = m.new_glm_cache(4096).unwrap();
    let mut out = Vec::new();
    m.forward(&mut cache, &g.prompt, Logits::Last, &mut out)
        .unwrap();
    for i in 0..3 {
        m.forward(&mut cache, &[g.decode_tokens[i]], Logits::Last, &mut out)
            .unwrap();
    }
    let tmp = std::env::temp_dir().join(format!("glm5_state_{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let path = tmp.join("state.bin");
    state_file::save(&cache, &path).unwrap();
    let mut loaded = state_file::load(&m, &path).unwrap();
    let bytes_of = |c: &Glm5NextCache<CpuBackend>| {
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
    for i in 3..6 {
        m.forward(&mut cache, &[g.decode_tokens[i]], Logits::Last, &mut a)
            .unwrap();
        m.forward(&mut loaded, &[g.decode_tokens[i]], Logits::Last, &mut b)
            .unwrap();
        assert_eq!(a, b);
    }
    loaded.truncate(g.prompt.len() + 1).unwrap();
    m.forward(&mut loaded, &[g.decode_tokens[1]], Logits::Last, &mut b)
        .unwrap();
    assert!(row_err(&b, &g.decode[g.vocab..2 * g.vocab]) <= tol);
    // Bad magic, another version, another model.
    let bytes = std::fs::read(&path).unwrap();
    let mut bad = bytes.clone();
    bad[0] = b'X';
    let e = state_file::read_state(&m, &mut &bad[..], "bad")
        .err()
        .unwrap();
    assert!(e.to_string().contains("bad magic"), "{e}");
    let mut v2 = bytes.clone();
    v2[8] = 3;
    let e = state_file::read_state(&m, &mut &v2[..], "v2")
        .err()
        .unwrap();
    assert!(e.to_string().contains("version 3"), "{e}");
    let other = model(&dir("softplus_dense_f32"), OutType::F32);
    let e = state_file::read_state(&other, &mut &bytes[..], "other")
        .err()
        .unwrap();
    assert!(e.to_string().contains("another model"), "{e}");
    let e = state_file::read_state(&m, &mut &bytes[..bytes.len() / 2], "cut")
        .err()
        .unwrap();
    assert!(e.to_string().contains("cut"), "{e}");
    std::fs::remove_dir_all(&tmp).ok();
}

/// A chat's next turn diverges just before the previous prompt's end (the template
/// re-renders the last assistant turn): after many generated tokens the live journal has
/// moved on, but the prefill-end anchor still reaches that position.
#[test]
fn next_turn_rewinds_through_the_prefill_anchor() {
    let (m, g, tol) = setup("softplus_dense_f32");
    let v = g.vocab;
    let m: Arc<dyn Model> = Arc::new(m);
    let mut sess = Session::new(m.clone(), 4096).unwrap();
    sess.prefill(&g.prompt, &mut |_, _| {}).unwrap();
    for i in 0..32 {
        sess.decode(g.decode_tokens[i]).unwrap();
    }
    let s = g.prompt.len();
    // The new request shares the prompt but its last token.
    let mut next: Vec<u32> = g.prompt[..s - 1].to_vec();
    next.push(g.prompt[s - 1]);
    next.extend_from_slice(&g.decode_tokens[..3]);
    sess.rewind(s - 1).unwrap();
    let out = sess.forward_all(&next[s - 1..]).unwrap();
    assert!(row_err(&out[..v], &g.prefill[(s - 1) * v..s * v]) <= tol);
    assert!(max_err(&out[v..], &g.decode[..3 * v], v) <= tol);
    // A position no journal or anchor covers: the session truncates to the nearest
    // reachable one (0 here) and re-evaluates up to it.
    sess.rewind(10).unwrap();
    assert_eq!(sess.tokens(), &g.prompt[..10]);
    assert!(row_err(sess.logits().unwrap(), &g.prefill[9 * v..10 * v]) <= tol);
    let mut cache = m.new_cache(4096).unwrap();
    let mut o = Vec::new();
    m.forward(&mut *cache, &g.prompt, Logits::Last, &mut o)
        .unwrap();
    for i in 0..40 {
        m.forward(
            &mut *cache,
            &[g.decode_tokens[i % 32]],
            Logits::Last,
            &mut o,
        )
        .unwrap();
    }
    let c = downcast(&mut *cache);
    assert!(c.earliest_rewind() > s);
    assert_eq!(c.rewind_point(s - 3), s - 3);
    assert_eq!(c.rewind_point(5), 0);
}

/// Greedy decoding with the backend choosing every token, each step queued before the
/// host reads its token (`Session::decode_greedy`), picks the reference's greedy tokens,
/// stops and fills the context as `decode` and the host's argmax would.
#[test]
fn pipelined_greedy_picks_the_reference_tokens() {
    for name in ["real_layout_f32", "softplus_dense_f32"] {
        let (m, g, tol) = setup(name);
        let m: Arc<dyn Model> = Arc::new(m);
        crate::fixtures::check_pipelined_greedy(&m, &g, tol)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}
