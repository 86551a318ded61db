//! Deliberately broken variants of the model (one feature off at a time, the same
//! perturbations as the reference's sensitivity table in `tools/reference/README.md`:
//! mHC, sinks, norms, rope, compression, the indexer, hash routing, the router, the
//! SwiGLU clamp, …) must fail the f32 comparison wherever the reference itself moves
//! clearly beyond the tolerance, and by the same margin: ours broken vs the reference
//! intact ≈ the reference broken vs intact, within 5% wherever the reference moves by
//! more than 0.05 (measured 2026-12-02: within a factor 1.000, docs/parity.md).

use super::*;
use crate::ablation::Ablation;

/// The switches that move the reference by more than 1e-3 (each must move ours by more
/// than 1e-4), counted per fixture on 2026-12-02: neither the sensitivity table nor the
/// switch list may shrink unseen.
fn detected_count(name: &str) -> usize {
    match name {
        "small_rates_f32" => 37,
        "real_layout_f32" => 35,
        _ => panic!("{name}: no count pinned"),
    }
}

fn check(name: &str) {
    let dir = dir(name);
    let m = llamacpp_model(&dir);
    let g = golden(&dir);
    let intact = run_protocol(&m, &g);
    let sens = manifest(&dir)["sensitivity"].clone();
    let mut detected = 0;
    let mut worst_ratio = 1f64;
    for &(a, key) in Ablation::DEEPSEEK4 {
        let s = sens
            .get(key)
            .unwrap_or_else(|| panic!("{name}: {key} is not in the reference's table"));
        let (rp, rd) = (
            s["prefill_rel_err"].as_f64().unwrap(),
            s["decode_rel_err"].as_f64().unwrap(),
        );
        m.backend().set_ablation(Some(a));
        let (pre, dec) = run_protocol(&m, &g);
        let (ep, ed) = (
            max_err(&pre, &g.prefill, g.vocab),
            max_err(&dec, &g.decode, g.vocab),
        );
        eprintln!("{name}: {key:28} ours {ep:9.2e} / {ed:9.2e}   reference {rp:9.2e} / {rd:9.2e}");
        if rp.max(rd) > 1e-3 {
            assert!(
                ep.max(ed) > 1e-4,
                "{name}: {key} is not detected ({ep:.2e} / {ed:.2e})"
            );
            detected += 1;
        }
        // Same margin: each side within 5% of the reference's when it is clear.
        for (ours, theirs, what) in [(ep, rp, "prefill"), (ed, rd, "decode")] {
            if theirs > 0.05 {
                let ratio = (ours / theirs).max(theirs / ours);
                worst_ratio = worst_ratio.max(ratio);
                assert!(
                    ratio < 1.05,
                    "{name}: {key} {what}: ours {ours:.2e}, reference {theirs:.2e}"
                );
            }
        }
    }
    m.backend().set_ablation(None);
    assert!(
        run_protocol(&m, &g) == intact,
        "{name}: the intact model changed after the ablations"
    );
    eprintln!(
        "{name}: {detected} broken variants detected; margins within a factor {worst_ratio:.3} of the reference's"
    );
    assert_eq!(detected, detected_count(name), "{name}: detected switches");
}

#[test]
fn broken_variants_fail_small_rates() {
    check("small_rates_f32");
}

#[test]
fn broken_variants_fail_real_layout() {
    check("real_layout_f32");
}
