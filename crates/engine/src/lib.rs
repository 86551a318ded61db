//! The engine: model families, backends, sessions and the sampler.
//!
//! Data flows one way: a GGUF file ([`ds4_gguf`]) → weights on a [`backend`] → a
//! [`Model`] (one of the [`families`]) → a [`Session`] (one sequence's state: KV
//! cache, frontier, rewind, snapshots) → logits → the [`sampler`].

/// Whether the test switch `$a` ([`ablation::Ablation`]) is on for backend or family
/// `$b` (which has an `ablation()` method in test builds); `false` outside tests.
macro_rules! ablated {
    ($b:expr, $a:ident) => {{
        #[cfg(test)]
        let on = $b.ablation() == Some($crate::ablation::Ablation::$a);
        #[cfg(not(test))]
        let on = {
            let _ = &$b;
            false
        };
        on
    }};
}
pub(crate) use ablated;

#[cfg(test)]
pub(crate) mod ablation;
pub mod backend;
mod error;
pub mod families;
pub mod fixtures;
pub mod generate;
pub mod loaded;
pub mod loader;
pub mod logprobs;
pub mod model;
pub mod partition;
pub mod sampler;
pub mod session;

pub use error::{EngineError, Result, human_bytes};
pub use loaded::LoadedModel;
pub use model::{Cache, Logits, Model, ModelInfo};
pub use session::{GreedyEnd, Session};
