//! Parity with the golden masters: at every prefill position and decode step, the
//! metric max |ours − reference| / max(1, std of the reference row) within the bounds of
//! [`Pinned`] — each fixture's measurement (docs/parity.md) times a stated margin, so a
//! regression of 10× fails — and each check shows that its bounds reject our error grown
//! 10× and logits scaled by 1.01. f32: worst rows within 3× the measured, the greedy
//! tokens of all 32 decode steps identical. bf16: worst rows of the prefill and the
//! decode steps within 2× the measured, median rows within 1.5×, greedy agreement at
//! most one step below the measured, and the f32 reference itself fails the
//! prefill-median bound. `real_layout`
//! is also run from the file llama.cpp's own converter wrote
//! (`real_layout_f32/llamacpp.gguf`), loaded directly.

use ds4_convert::OutType;

use super::*;
use crate::families::bounds::{Errors, Pinned, Rows};

fn check_f32(name: &str) {
    check_f32_model(name, name, model(&dir(name), OutType::F32));
}

/// The f32 check of model `m` against fixture `fixture` (`name` labels the messages).
fn check_f32_model(fixture: &str, name: &str, m: Cpu) {
    let dir = dir(fixture);
    let g = golden(&dir);
    let (pre, dec) = run_protocol(&m, &g);
    f32_pinned(fixture).check(name, &pre, &dec, &g);
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

/// bf16 bounds: the worst rows within 2× and the median rows within 1.5× of the rows
/// measured on 2026-12-02 (docs/parity.md, GLM bf16 table; 1.5 is what still rejects
/// logits scaled by 1.01 on `softplus_dense`), greedy agreement at most one step below
/// the measured. The reference is not self-consistent in bf16 (prefilling token by token
/// moves its own logits by 0.79 / 2.2 / 1.1 in this metric, manifest
/// `checks.prefill_split_invariance_rel_err`), so the worst rows say little; the medians
/// tell a bf16 model from an f32 one.
fn bf16_pinned(name: &str) -> Pinned {
    let (pre, dec, greedy) = match name {
        "lowerbound_sparse_bf16" => ((0.691, 0.0181), (0.261, 0.0319), 31),
        "softplus_dense_bf16" => ((1.07, 0.0246), (0.0635, 0.0348), 30),
        // The median prefill row equals the reference's bit for bit.
        "real_layout_bf16" => ((0.0194, 0.0), (0.506, 0.0262), 29),
        _ => panic!("{name}: no bf16 measurement pinned"),
    };
    let rows = |(worst, median)| Rows { worst, median };
    Pinned {
        measured: Errors {
            prefill: rows(pre),
            decode: rows(dec),
            greedy,
        },
        worst_margin: 2.0,
        median_margin: 1.5,
        greedy_slack: 1,
    }
}

/// The bf16 model against the bf16 reference (decode fed the bf16 reference's own
/// tokens); the f32 reference's prefill logits against the bf16 reference's (same
/// prompt) must fail the prefill-median bound: a model computing in the wrong
/// precision does not pass.
fn check_bf16(name: &str, f32_name: &str) {
    let dir = dir(name);
    let m = model(&dir, OutType::Bf16);
    let g = golden(&dir);
    let (pre, dec) = run_protocol(&m, &g);
    let pinned = bf16_pinned(name);
    pinned.check(name, &pre, &dec, &g);
    let f = golden(&super::dir(f32_name));
    assert_eq!(f.prompt, g.prompt, "{f32_name}: another prompt");
    let f32_rows = Rows::of(&f.prefill, &g.prefill, g.vocab);
    let bound = pinned.median_margin * pinned.measured.prefill.median;
    eprintln!(
        "{name}: f32 reference vs bf16 reference: prefill median {:.3e}",
        f32_rows.median
    );
    assert!(
        f32_rows.median > bound,
        "{name}: the median bound {bound:.3e} does not tell the f32 reference ({:.3e}) from bf16",
        f32_rows.median
    );
}

#[test]
fn lowerbound_sparse_bf16() {
    check_bf16("lowerbound_sparse_bf16", "lowerbound_sparse_f32");
}

#[test]
fn softplus_dense_bf16() {
    check_bf16("softplus_dense_bf16", "softplus_dense_f32");
}

#[test]
fn real_layout_bf16() {
    check_bf16("real_layout_bf16", "real_layout_f32");
}
