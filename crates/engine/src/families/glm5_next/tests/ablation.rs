//! Deliberately broken variants of the model (one feature off at a time, the same
//! perturbations as the reference's sensitivity table in `tools/reference/README.md`)
//! must fail the f32 comparison wherever the reference itself moves clearly beyond the
//! tolerance, and by the same margin (ours broken vs the reference intact ≈ the
//! reference broken vs intact, within 5%).

use ds4_convert::OutType;

use super::*;
use crate::ablation::Ablation;

fn check(name: &str) {
    let dir = dir(name);
    let m = model(&dir, OutType::F32);
    let g = golden(&dir);
    let sens = manifest(&dir)["sensitivity"].clone();
    let mut failed_as_expected = 0;
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
        let reference = rp.max(rd);
        if reference > 1e-3 {
            assert!(
                ep.max(ed) > 1e-4,
                "{name}: {key} is not detected ({ep:.2e} / {ed:.2e})"
            );
            failed_as_expected += 1;
        }
        // Same margin: each side within a factor 3 of the reference's when it is clear.
        for (ours, theirs, what) in [(ep, rp, "prefill"), (ed, rd, "decode")] {
            if theirs > 0.05 {
                assert!(
                    ours > theirs / 3.0 && ours < theirs * 3.0,
                    "{name}: {key} {what}: ours {ours:.2e}, reference {theirs:.2e}"
                );
            }
        }
    }
    m.backend().set_ablation(None);
    let (pre, _) = run_protocol(&m, &g);
    assert!(max_err(&pre, &g.prefill, g.vocab) <= 1e-4);
    eprintln!("{name}: {failed_as_expected} broken variants detected");
    assert!(failed_as_expected >= 20);
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
