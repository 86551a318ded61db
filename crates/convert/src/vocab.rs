//! Copying a tokenizer between GGUF files: every `tokenizer.*` metadata key (the
//! vocabulary, merges, special token ids, chat template).

use ds4_gguf::{GgufFile, GgufWriter};

use crate::ConvertError;

/// The number of tokens of `file`'s vocabulary (`tokenizer.ggml.tokens`).
///
/// # Errors
/// [`ConvertError::Config`] when the file has no vocabulary.
pub fn token_count(file: &GgufFile) -> Result<usize, ConvertError> {
    file.get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .map(|a| a.len())
        .ok_or_else(|| ConvertError::Config(format!("{}: no tokenizer.ggml.tokens to copy", file.label())))
}

/// Copies `from`'s `tokenizer.*` keys into `w`; returns how many.
///
/// # Errors
/// [`ConvertError::Gguf`] if `w` already holds one of the keys.
pub fn copy(from: &GgufFile, w: &mut GgufWriter) -> Result<usize, ConvertError> {
    let mut n = 0;
    for (k, v) in from.metadata().iter() {
        if k.starts_with("tokenizer.") {
            w.add_metadata(k, v.clone())?;
            n += 1;
        }
    }
    Ok(n)
}
