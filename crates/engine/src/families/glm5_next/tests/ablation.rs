//! Deliberately broken variants of the model (one feature off at a time, the same
//! perturbations as the reference's sensitivity table in `tools/reference/README.md`)
//! must fail the f32 comparison wherever the reference itself moves clearly beyond the
//! tolerance, and by the same margin: ours broken vs the reference intact ≈ the reference
//! broken vs intact, within 5% ([`WINDOW`]), wherever the reference moves by more than
//! 0.05. Two switches are the exceptions, with their own window ([`WIDE`], docs/parity.md):
//! they break the small random models into chaos, where different rounding grows
//! differently.

use ds4_convert::OutType;

use super::*;
use crate::ablation::Ablation;

/// Ours within this factor of the reference's margin (measured 2026-12-02: 1.000 to the
/// three digits printed, for every switch but [`WIDE`]'s).
const WINDOW: f64 = 1.05;

/// The exceptions and their window: `swiglu_clamp_off` (no clamp: activations of up to
/// 1e3 in the random experts) and `kda_chunk_state_reset` measured up to a factor 1.95
/// (`softplus_dense` `swiglu_clamp_off` decode: 1.81 against the reference's 3.53); a
/// window of 2.5 is that plus a quarter.
const WIDE: (&[&str], f64) = (&["swiglu_clamp_off", "kda_chunk_state_reset"], 2.5);

/// The switches that move the reference by more than 1e-3 (each must move ours by more
/// than 1e-4), counted per fixture on 2026-12-02: neither the sensitivity table nor the
/// switch list may shrink unseen.
fn detected_count(name: &str) -> usize {
    match name {
        "lowerbound_sparse_f32" => 39,
        "softplus_dense_f32" => 31,
        "real_layout_f32" => 38,
        _ => panic!("{name}: no count pinned"),
    }
}

/// Whether `ours` is within `window` of `theirs` (as a factor, either way).
fn within(ours: f64, theirs: f64, window: f64) -> bool {
    ours < theirs * window && theirs < ours * window
}

fn check(name: &str) {
    let dir = dir(name);
    let m = model(&dir, OutType::F32);
    let g = golden(&dir);
    let intact = run_protocol(&m, &g);
    let sens = manifest(&dir)["sensitivity"].clone();
    let mut detected = 0;
    let mut worst = 1f64;
    for &(a, key) in Ablation::ALL {
        let Some(s) = sens.get(key) else {
            eprintln!("{name}: {key}: not in the reference table (not applicable)");
            continue;
        };
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
        eprintln!("{name}: {key:32} ours {ep:9.2e} / {ed:9.2e}   reference {rp:9.2e} / {rd:9.2e}");
        if rp.max(rd) > 1e-3 {
            assert!(
                ep.max(ed) > 1e-4,
                "{name}: {key} is not detected ({ep:.2e} / {ed:.2e})"
            );
            detected += 1;
        }
        let window = if WIDE.0.contains(&key) {
            WIDE.1
        } else {
            WINDOW
        };
        for (ours, theirs, what) in [(ep, rp, "prefill"), (ed, rd, "decode")] {
            if theirs > 0.05 {
                assert!(
                    within(ours, theirs, window),
                    "{name}: {key} {what}: ours {ours:.3e}, reference {theirs:.3e} (window {window})"
                );
                if window == WINDOW {
                    worst = worst.max((ours / theirs).max(theirs / ours));
                }
            }
        }
    }
    m.backend().set_ablation(None);
    assert!(
        run_protocol(&m, &g) == intact,
        "{name}: the intact model changed after the ablations"
    );
    eprintln!(
        "{name}: {detected} broken variants detected; margins within a factor {worst:.4} of \
         the reference's (5% switches)"
    );
    assert_eq!(detected, detected_count(name), "{name}: detected switches");
}

#[test]
fn broken_variants_fail_lowerbound_sparse() {
    check("lowerbound_sparse_f32");
}

#[test]
fn broken_variants_fail_softplus_dense() {
    check("softplus_dense_f32");
}

#[test]
fn broken_variants_fail_real_layout() {
    check("real_layout_f32");
}
