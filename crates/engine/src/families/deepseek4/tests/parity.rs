//! Parity with the golden masters: at every prefill position and decode step,
//! max |ours − reference| ≤ 1e-4 × max(1, std of the reference row) for the f32 model
//! (loaded from llama.cpp's conversion), the greedy tokens of all 32 decode steps
//! identical.

use super::*;

fn check_f32(name: &str) {
    let dir = dir(name);
    let m = llamacpp_model(&dir);
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
fn small_rates_f32() {
    check_f32("small_rates_f32");
}

#[test]
fn real_layout_f32() {
    check_f32("real_layout_f32");
}

/// Our converter's f32 file holds llama.cpp's values (see the converter's tests): the
/// model loaded from it gives bit-identical logits.
#[test]
fn our_conversion_replays_like_llamacpps() {
    for name in ["small_rates_f32", "real_layout_f32"] {
        let dir = dir(name);
        let g = golden(&dir);
        let theirs = run_protocol(&llamacpp_model(&dir), &g);
        let ours = run_protocol(&load(ours_bytes(&dir, OutType::F32)), &g);
        assert!(
            ours == theirs,
            "{name}: logits differ between the two conversions"
        );
    }
}

/// Per row [`row_err`] of `ours` against `reference`, sorted.
fn sorted_rows(ours: &[f32], reference: &[f32], v: usize) -> Vec<f64> {
    let mut rows: Vec<f64> = ours
        .chunks(v)
        .zip(reference.chunks(v))
        .map(|(a, b)| row_err(a, b))
        .collect();
    rows.sort_by(f64::total_cmp);
    rows
}

/// bf16, through our converter's BF16 file (matrices BF16, what the reference keeps in
/// float32 F32, experts MXFP4 = their exact values), decode fed the bf16 reference's own
/// tokens. The bf16 reference is not self-consistent: PyTorch's bf16 matrix products
/// round differently with the number of rows (layer 0's `kv_proj` at position 52 of
/// `small_rates` gives 0.0086060 in the one-call prefill, 0.0086670 for the row alone;
/// the exact value is 0.0086364, which we round to 0.0086365), so prefilling its own
/// prompt token by token moves its logits by 0.837 / 1.503 in this metric (manifest
/// `prefill_split_invariance_rel_err.token_by_token`, the largest of its splits). Bounds:
/// - every row within 1.25 × that spread (measured: 0.825 / 1.499 prefill, 0.471 /
///   0.051 decode: we are as far from the one-call reference as its own other call
///   shapes are);
/// - the median prefill row within `MEDIAN` = 0.036 (measured 0.029 / 0.030), which the
///   f32 model fails (the reference's own f32 logits against its bf16 ones: 0.067 /
///   0.044), so a model computing in the wrong precision does not pass.
///
/// Numbers in docs/parity.md.
fn check_bf16(name: &str, f32_name: &str) -> (f64, f64, f64) {
    const MEDIAN: f64 = 0.036;
    let dir = dir(name);
    let m = load(ours_bytes(&dir, OutType::Bf16));
    assert_eq!(m.prec(), crate::backend::Prec::Bf16);
    let g = golden(&dir);
    let (pre, dec) = run_protocol(&m, &g);
    let rows = sorted_rows(&pre, &g.prefill, g.vocab);
    let (worst, median) = (*rows.last().unwrap(), rows[rows.len() / 2]);
    let e_dec = max_err(&dec, &g.decode, g.vocab);
    let agree = dec
        .chunks(g.vocab)
        .enumerate()
        .filter(|(i, r)| argmax(r) as u32 == g.decode_tokens[i + 1])
        .count();
    // The same median bound applied to the f32 reference against the bf16 one.
    let f = golden(&super::dir(f32_name));
    assert_eq!(f.prompt, g.prompt);
    let f32_rows = sorted_rows(&f.prefill, &g.prefill, g.vocab);
    let f32_median = f32_rows[f32_rows.len() / 2];
    let spread = manifest(&dir)["checks"]["prefill_split_invariance_rel_err"]["token_by_token"]
        .as_f64()
        .unwrap();
    eprintln!(
        "{name}: prefill max {worst:.3}, median {median:.4}; decode max {e_dec:.3}; greedy {agree}/32; \
         reference self-spread {spread:.3}; f32 model vs bf16 reference: median {f32_median:.4}"
    );
    let bound = 1.25 * spread;
    assert!(
        worst <= bound && e_dec <= bound,
        "{name}: bf16 error {worst:.3}/{e_dec:.3} above 1.25 × the reference's own spread {spread:.3}"
    );
    assert!(
        median <= MEDIAN,
        "{name}: median bf16 row error {median:.4} > {MEDIAN}"
    );
    assert!(
        f32_median > MEDIAN,
        "{name}: the median bound {MEDIAN} does not tell the f32 model ({f32_median:.4}) from bf16"
    );
    assert!(agree >= 28, "{name}: greedy agreement {agree}/32");
    (worst, median, f32_median)
}

#[test]
fn small_rates_bf16() {
    check_bf16("small_rates_bf16", "small_rates_f32");
}

#[test]
fn real_layout_bf16() {
    check_bf16("real_layout_bf16", "real_layout_f32");
}
