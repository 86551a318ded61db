//! Token sampler with antirez/ds4 semantics (`ds4.c`: `sample_top_p_min_p`,
//! `sample_full_vocab`, `sample_argmax`, xorshift64* RNG).
//!
//! API CONTRACT (stub written by the lead; the sampler helper implements it).

/// Sampling parameters (all floats are f32, as in ds4).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerParams {
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
}

/// ds4's xorshift64* RNG state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rng(pub u64);

/// Samples one token id from a logits row.
pub fn sample(logits: &[f32], params: &SamplerParams, rng: &mut Rng) -> u32 {
    let _ = (logits, params, rng);
    todo!()
}
