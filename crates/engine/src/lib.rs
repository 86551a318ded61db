//! The engine: model families, backends, sessions and the sampler.

pub mod sampler;
