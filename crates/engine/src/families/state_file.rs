//! What the families' state files share: [`Model::write_cache`] and
//! [`Model::read_cache`] of a family that has its own `state_file` module (GLM-5.3's
//! `glm5_next`, DeepSeek-V4's `deepseek4`). The family supplies its cache type and that
//! module's `write_state` / `read_state`; the downcast, the source label and the
//! [`EngineError::State`] messages are the same for every family.
//!
//! [`Model::write_cache`]: crate::model::Model::write_cache
//! [`Model::read_cache`]: crate::model::Model::read_cache

use std::fmt::Display;
use std::io::{Read, Write};

use crate::model::Cache;
use crate::{EngineError, Result};

/// Writes `cache`, which must be the family's cache `C`, with the family's `write_state`.
///
/// # Errors
/// [`EngineError::State`]: a cache of another model, or `write_state` failing.
pub(crate) fn write_cache<C: Cache + 'static>(
    cache: &dyn Cache,
    out: &mut dyn Write,
    write_state: impl FnOnce(&C, &mut &mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    let cache = cache
        .as_any()
        .downcast_ref::<C>()
        .ok_or_else(|| EngineError::State("the cache belongs to another model".into()))?;
    write_state(cache, &mut &mut *out)
        .map_err(|e| EngineError::State(format!("writing the state: {e}")))
}

/// Reads a cache with the family's `read_state`, which is given the source's label.
///
/// # Errors
/// [`EngineError::State`] with the message of `read_state`'s error.
pub(crate) fn read_cache<C: Cache + 'static, E: Display>(
    input: &mut dyn Read,
    read_state: impl FnOnce(&mut &mut dyn Read, &str) -> Result<C, E>,
) -> Result<Box<dyn Cache>> {
    let cache = read_state(&mut &mut *input, "session state")
        .map_err(|e| EngineError::State(e.to_string()))?;
    Ok(Box::new(cache))
}
