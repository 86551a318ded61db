//! Operation conformance: every operation of the backend interface
//! ([`ds4_engine::backend::Backend`]) run on random inputs with the shapes of the real
//! models (GLM-5.3-Flash, DeepSeek-V4-Flash, Qwen3.5-MoE-35B-A3B) and compared with a
//! direct transcription of the reference formula in f64 (`reference` in each module),
//! written from the PyTorch references, not from any backend's code.
//!
//! [`run`] is generic over the backend: the CPU backend's test (`tests/cpu.rs`) and the
//! CUDA backend's device check run the same cases. Each [`Outcome`] carries the measured
//! error and the tolerance it must stay under: the relative error
//! `max|ours − ref| / max|ref|` (ids: the count of mismatches).
//!
//! Each case draws its inputs from a generator seeded by [`SEED`] and its own names, so
//! its inputs do not depend on the cases before it; [`run_seeded`] draws others. A
//! tolerance must hold for any draw: `cargo run --release -p ds4-conformance --example
//! seeds -- 6` prints every case's error over six draws beside its tolerance.
//!
//! Tolerances (measured on the CPU backend, `cargo test -p ds4-conformance -- --nocapture`,
//! recorded in docs/parity.md): f32 operations measure 5e-8…1e-6 against f64 and must stay
//! under [`FLOAT_TOL`] = 1e-5 (a backend may sum in another order; 10× the worst); the
//! delta rule 5e-7…9e-7 over 130 chained steps, under 1e-4; products with quantized
//! weights quantize the activations to 8 bits as ggml does, which the f64 reference does
//! not: 6e-3…1e-2 measured, [`QUANT_TOL`] = 2e-2; a quantized expert chain (two
//! products and the SwiGLU) 1.1e-2…1.6e-2, [`EXPERT_TOL`] = 3e-2. Data movement is exact.

/// See the crate header.
pub const FLOAT_TOL: f64 = 1e-5;
/// See the crate header.
pub const QUANT_TOL: f64 = 2e-2;
/// See the crate header.
pub const EXPERT_TOL: f64 = 3e-2;

mod data;
mod delta;
mod dense;
mod mhc;
mod moe;
mod sparse;

use ds4_engine::backend::Backend;

pub use data::Rng;

/// One compared case.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The operation (its name in the trait).
    pub op: &'static str,
    /// The case: shapes, types and settings.
    pub case: String,
    /// The measured error (see the module header).
    pub err: f64,
    /// The largest error that passes.
    pub tol: f64,
    /// Why the operation could not run, if it failed.
    pub failure: Option<String>,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.failure.is_none() && self.err <= self.tol
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.failure {
            Some(e) => write!(f, "{:14} {:58} FAILED: {e}", self.op, self.case),
            None => write!(
                f,
                "{:14} {:58} err {:9.2e}  tol {:8.1e}  {}",
                self.op,
                self.case,
                self.err,
                self.tol,
                if self.ok() { "ok" } else { "OVER" }
            ),
        }
    }
}

/// The seed of [`run`]'s draws.
pub const SEED: u64 = 0x5eed_d54d;

/// The collected outcomes of a run.
pub struct Report<'a, B: Backend> {
    pub(crate) b: &'a B,
    seed: u64,
    filter: String,
    pub outcomes: Vec<Outcome>,
}

impl<B: Backend> Report<'_, B> {
    /// Runs `case` of `op` unless the filter excludes it; `f` returns (error, tolerance).
    /// Its inputs are drawn from a generator seeded by the run's seed and the case's
    /// names, so they do not depend on which cases ran before it (a new case, another
    /// order or a filter leaves every other case's inputs as they were).
    pub(crate) fn check(
        &mut self,
        op: &'static str,
        case: impl Into<String>,
        f: impl FnOnce(&B, &mut Rng) -> ds4_engine::Result<(f64, f64)>,
    ) {
        let case = case.into();
        if !self.filter.is_empty() && !op.contains(&self.filter) && !case.contains(&self.filter) {
            return;
        }
        let mut rng = Rng::new(self.seed ^ name_hash(op, &case));
        let (err, tol, failure) = match f(self.b, &mut rng) {
            Ok((e, t)) => (e, t, None),
            Err(e) => (f64::NAN, 0.0, Some(e.to_string())),
        };
        self.outcomes.push(Outcome {
            op,
            case,
            err,
            tol,
            failure,
        });
    }
}

/// FNV-1a of a case's names.
fn name_hash(op: &str, case: &str) -> u64 {
    op.bytes()
        .chain([0])
        .chain(case.bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
        })
}

/// Runs every case whose operation or case name contains `filter` (all for `""`) on
/// backend `b`, inside the backend's workers, with the draws of [`SEED`].
pub fn run<B: Backend>(b: &B, filter: &str) -> Vec<Outcome> {
    run_seeded(b, filter, SEED)
}

/// [`run`] with other draws: how far each case's error moves with its inputs (the
/// tolerances must hold for any seed).
pub fn run_seeded<B: Backend>(b: &B, filter: &str, seed: u64) -> Vec<Outcome> {
    b.run(|| {
        let mut r = Report {
            b,
            seed,
            filter: filter.to_string(),
            outcomes: Vec::new(),
        };
        dense::checks(&mut r);
        moe::checks(&mut r);
        mhc::checks(&mut r);
        delta::checks(&mut r);
        sparse::checks(&mut r);
        r.outcomes
    })
}

/// `max|a − b| / max|b|` (0 when both are empty or `b` is all zeros and `a` equals it).
pub fn rel_err(ours: &[f32], reference: &[f64]) -> f64 {
    assert_eq!(ours.len(), reference.len(), "compared lengths differ");
    let scale = reference.iter().fold(0f64, |m, v| m.max(v.abs()));
    let d = ours
        .iter()
        .zip(reference)
        .fold(0f64, |m, (a, b)| m.max((*a as f64 - b).abs()));
    if scale == 0.0 { d } else { d / scale }
}
