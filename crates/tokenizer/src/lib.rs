//! Tokenizers built from GGUF metadata (`tokenizer.ggml.*`), chat templates and
//! UTF-8-safe streaming detokenization.
//!
//! Reference: llama.cpp `src/llama-vocab.cpp` and `src/unicode.cpp` (pre-tokenizer regexes
//! per `tokenizer.ggml.pre`, BPE and SentencePiece merges, special-token handling, the
//! end-of-generation set, detokenization), and `common/chat.cpp` with its Jinja engine for
//! chat templates. The golden master is llama.cpp's output: the vocabulary fixtures of
//! llama.cpp's `test-tokenizer-0` and the prompts llama.cpp tokenized for two real models.
//!
//! - [`Tokenizer`]: `encode` / `piece` / `decode`, special ids, the EOG set.
//! - [`StreamDecoder`]: token pieces to text, never splitting a UTF-8 character.
//! - [`chat`]: rendering a GGUF's `tokenizer.chat_template` (Jinja).

#![warn(missing_docs)]

mod bpe;
pub mod chat;
mod error;
mod llama_order;
mod partition;
mod pre_table;
mod pretokenize;
mod spm;
mod stream;
mod text_index;
mod tokenizer;
mod unicode;
mod unicode_table;
mod vocab;

pub use chat::{ChatMessage, ChatTemplate, RenderOptions, ToolCall};
pub use error::TokenizerError;
pub use stream::StreamDecoder;
pub use tokenizer::Tokenizer;
pub use vocab::{SpecialTokens, VocabKind};
