//! Parity with the golden masters: at every prefill position and decode step,
//! max |ours − reference| ≤ 1e-4 × max(1, std of the reference row) for f32 weights,
//! the greedy tokens of all 32 decode steps identical; bf16 within the reference's own
//! spread. `real_layout` is also run from the file llama.cpp's own converter wrote
//! (`real_layout_f32/llamacpp.gguf`), loaded directly.

use ds4_convert::OutType;

use super::*;

fn check_f32(name: &str) {
    check_f32_model(name, name, model(&dir(name), OutType::F32));
}

/// The f32 check of model `m` against fixture `fixture` (`name` labels the messages).
fn check_f32_model(fixture: &str, name: &str, m: Cpu) {
    let dir = dir(fixture);
    let g = golden(&dir);
    let (pre, dec) = run_protocol(&m, &g);
    let e_pre = max_err(&pre, &g.prefill, g.vocab);
    let e_dec = max_err(&dec, &g.decode, g.vocab);
    eprintln!("{name}: prefill rel err {e_pre:.2e}, decode rel err {e_dec:.2e}");
    assert!(e_pre <= 1e-4, "{name}: prefill error {e_pre:.3e} > 1e-4");
    assert!(e_dec <= 1e-4, "{name}: decode error {e_dec:.3e} > 1e-4");
    for (i, row) in dec.chunks(g.vocab).enumerate() {
        assert_eq!(
            argmax(row) as u32,
            g.decode_tokens[i + 1],
            "{name}: greedy token of decode step {i}"
        );
    }
}

#[test]
fn lowerbound_sparse_f32() {
    check_f32("lowerbound_sparse_f32");
}

#[test]
fn softplus_dense_f32() {
    check_f32("softplus_dense_f32");
}

#[test]
fn real_layout_f32() {
    check_f32("real_layout_f32");
}

/// llama.cpp's file (architecture `glm5-next`, its keys: no `kda.head_count`, per-layer
/// `head_count_kv` 0/1, 4-D conv weights, no gating-function key), no converter of ours
/// involved.
#[test]
fn real_layout_llamacpp_gguf_f32() {
    let path = dir("real_layout_f32").join("llamacpp.gguf");
    let m = load(std::fs::read(&path).unwrap());
    assert_eq!(m.config().arch, "glm5-next");
    assert_eq!(m.config().kda_heads, 4);
    assert!(!m.config().kda_heads_from_key);
    check_f32_model("real_layout_f32", "real_layout_f32 (llamacpp.gguf)", m);
}

/// bf16: the reference is not self-consistent in bf16 (prefilling token by token moves
/// its own logits by 0.79 / 2.2 in this metric, eager attention by 1.5 / 4.1), so the
/// bound on the worst row is the reference's own token-by-token spread of the fixture
/// (manifest `checks.prefill_split_invariance_rel_err.token_by_token`), and the median
/// row must stay within 0.05; see docs/parity.md. The decode steps are fed the bf16
/// reference's own tokens.
fn check_bf16(name: &str) {
    let dir = dir(name);
    let m = model(&dir, OutType::Bf16);
    let g = golden(&dir);
    let (pre, dec) = run_protocol(&m, &g);
    let e_pre = max_err(&pre, &g.prefill, g.vocab);
    let e_dec = max_err(&dec, &g.decode, g.vocab);
    let rows_pre: Vec<f64> = pre
        .chunks(g.vocab)
        .zip(g.prefill.chunks(g.vocab))
        .map(|(a, b)| row_err(a, b))
        .collect();
    let mut sorted = rows_pre.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let agree = dec
        .chunks(g.vocab)
        .enumerate()
        .filter(|(i, r)| argmax(r) as u32 == g.decode_tokens[i + 1])
        .count();
    let bound = manifest(&dir)["checks"]["prefill_split_invariance_rel_err"]["token_by_token"]
        .as_f64()
        .unwrap();
    eprintln!(
        "{name}: prefill max {e_pre:.3}, median {median:.3}; decode max {e_dec:.3}; greedy agreement {agree}/32; reference self-spread {bound:.3}"
    );
    assert!(
        e_pre <= bound && e_dec <= bound,
        "{name}: bf16 error {e_pre:.3}/{e_dec:.3} above the reference's own spread {bound:.3}"
    );
    // Typical rows: a few bf16 roundings (2⁻⁹ relative) of logits of std ≈ 2.
    assert!(
        median <= 0.05,
        "{name}: median bf16 row error {median:.3} > 0.05"
    );
}

#[test]
fn lowerbound_sparse_bf16() {
    check_bf16("lowerbound_sparse_bf16");
}

#[test]
fn softplus_dense_bf16() {
    check_bf16("softplus_dense_bf16");
}

#[test]
fn real_layout_bf16() {
    check_bf16("real_layout_bf16");
}
