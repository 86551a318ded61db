//! Tokenizers built from GGUF metadata (`tokenizer.ggml.*`), chat templates and
//! UTF-8-safe streaming detokenization.
//!
//! Reference: llama.cpp `src/llama-vocab.cpp` (pre-tokenizer regexes per
//! `tokenizer.ggml.pre`, special-token handling, end-of-generation set).
//!
//! API CONTRACT (stub written by the lead; the tokenizer helper implements it and may
//! extend it, but keeps these names and signatures).

use ds4_gguf::GgufFile;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{0}")]
    Todo(String),
}

/// A tokenizer for one vocabulary.
pub struct Tokenizer {
    _private: (),
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF's metadata (vocabulary-only files work).
    pub fn from_gguf(file: &GgufFile) -> Result<Self, TokenizerError> {
        let _ = file;
        todo!()
    }
    pub fn n_vocab(&self) -> usize {
        todo!()
    }
    /// Tokenizes like `llama_tokenize(text, add_special, parse_special)`.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let _ = (text, add_special, parse_special);
        todo!()
    }
    /// The bytes a token stands for; special/control tokens give their text only when
    /// `render_special` (like `llama_token_to_piece(.., special)`).
    pub fn piece(&self, id: u32, render_special: bool) -> Vec<u8> {
        let _ = (id, render_special);
        todo!()
    }
    /// Decodes ids to text (invalid UTF-8 replaced).
    pub fn decode(&self, ids: &[u32], render_special: bool) -> String {
        let _ = (ids, render_special);
        todo!()
    }
    pub fn bos(&self) -> Option<u32> {
        todo!()
    }
    pub fn eos(&self) -> Option<u32> {
        todo!()
    }
    /// Whether `id` ends generation (llama.cpp's EOG set).
    pub fn is_eog(&self, id: u32) -> bool {
        let _ = id;
        todo!()
    }
}
