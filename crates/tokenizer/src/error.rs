//! Errors from building a tokenizer and from chat templates.

/// Errors from loading a vocabulary, compiling a pre-tokenizer or rendering a chat template.
///
/// Loading errors name the GGUF file (`file`: its label, usually the path) and the metadata
/// key at fault (`key`).
#[allow(missing_docs)] // the fields are named for what the messages say
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A required `tokenizer.*` key is absent.
    #[error("{file}: metadata key '{key}' is missing")]
    MissingKey { file: String, key: String },
    /// The file has no tokenizer at all (no `tokenizer.ggml.model`).
    #[error(
        "{file}: the file has no tokenizer (metadata key 'tokenizer.ggml.model' is missing); a file converted from a checkpoint without tokenizer.json needs `ds4-server convert --vocab-from FILE.gguf`"
    )]
    NoTokenizer { file: String },
    /// A `tokenizer.*` key holds the wrong type of value.
    #[error("{file}: metadata key '{key}': expected {expected}, found {found}")]
    WrongType {
        file: String,
        key: String,
        expected: &'static str,
        found: String,
    },
    /// An array keyed per token (scores, token types) is shorter than the token list.
    #[error("{file}: metadata key '{key}' has {found} entries for {needed} tokens")]
    ShortArray {
        file: String,
        key: String,
        found: usize,
        needed: usize,
    },
    /// The vocabulary is empty or has more tokens than ids can hold.
    #[error("{file}: 'tokenizer.ggml.tokens' has {count} tokens")]
    BadVocabSize { file: String, count: usize },
    /// `tokenizer.ggml.model` is not one this crate implements (`gpt2`, `llama`).
    #[error("{file}: tokenizer model '{model}' is not supported (supported: gpt2, llama)")]
    UnsupportedModel { file: String, model: String },
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not implement.
    #[error("{file}: pre-tokenizer '{pre}' (tokenizer.ggml.pre) is not supported")]
    UnsupportedPreTokenizer { file: String, pre: String },
    /// A pre-tokenizer regex failed to compile.
    #[error("{file}: pre-tokenizer '{pre}': {message}")]
    BadPreTokenizer {
        file: String,
        pre: String,
        message: String,
    },
    /// A chat template failed to parse.
    #[error("chat template does not parse: {message}")]
    TemplateSyntax { message: String },
    /// A chat template failed while rendering (including `raise_exception` calls).
    #[error("chat template failed to render: {message}")]
    TemplateRender { message: String },
}
