//! Every backend operation on the CPU backend against its reference transcription
//! (`ds4-conformance`): the measured error of each case must stay under its tolerance.

use ds4_engine::backend::cpu::CpuBackend;

#[test]
fn every_operation_matches_its_reference_on_the_cpu() {
    let b = CpuBackend::new(2).unwrap();
    let outcomes = ds4_conformance::run(&b, "");
    for o in &outcomes {
        eprintln!("{o}");
    }
    let bad: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.ok())
        .map(|o| o.to_string())
        .collect();
    assert!(
        bad.is_empty(),
        "{} cases failed:\n{}",
        bad.len(),
        bad.join("\n")
    );
    assert!(outcomes.len() >= 40, "only {} cases ran", outcomes.len());
}
