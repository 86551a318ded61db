//! The engine: model families, backends, sessions and the sampler.
//!
//! Data flows one way: a GGUF file ([`ds4_gguf`]) → weights on a [`backend`] → a
//! [`Model`] (one of the [`families`]) → a [`Session`] (one sequence's state: KV
//! cache, frontier, rewind, snapshots) → logits → the [`sampler`].

pub mod backend;
mod error;
pub mod families;
pub mod generate;
pub mod loaded;
pub mod loader;
pub mod logprobs;
pub mod model;
pub mod sampler;
pub mod session;

pub use error::{EngineError, Result};
pub use loaded::LoadedModel;
pub use model::{Cache, Logits, Model, ModelInfo};
pub use session::Session;
