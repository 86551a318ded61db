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

/// The collected outcomes of a run.
pub struct Report<'a, B: Backend> {
    pub(crate) b: &'a B,
    pub(crate) rng: Rng,
    filter: String,
    pub outcomes: Vec<Outcome>,
}

impl<B: Backend> Report<'_, B> {
    /// Runs `case` of `op` unless the filter excludes it; `f` returns (error, tolerance).
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
        let (err, tol, failure) = match f(self.b, &mut self.rng) {
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

/// Runs every case whose operation or case name contains `filter` (all for `""`) on
/// backend `b`, inside the backend's workers.
pub fn run<B: Backend>(b: &B, filter: &str) -> Vec<Outcome> {
    b.run(|| {
        let mut r = Report {
            b,
            rng: Rng::new(0x5eed_d54d),
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
