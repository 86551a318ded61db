//! A model file opened for use: the GGUF, the model on a backend, its tokenizer and
//! its chat template, with the prompt-building helpers the CLI and the server share.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ds4_gguf::GgufFile;
use ds4_tokenizer::{ChatMessage, ChatTemplate, RenderOptions, Tokenizer};

use crate::Result;
use crate::model::Model;

/// A loaded model with everything needed to talk to it.
pub struct LoadedModel {
    pub path: PathBuf,
    pub gguf: Arc<GgufFile>,
    pub model: Arc<dyn Model>,
    pub tokenizer: Arc<Tokenizer>,
    /// The chat template ([`ChatTemplate::for_gguf`]).
    pub template: Arc<ChatTemplate>,
}

impl LoadedModel {
    /// Opens `path`, loads the model on the CPU backend and builds the tokenizer and
    /// chat template.
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_with(path, crate::loader::load_model)
    }

    /// Like [`LoadedModel::open`] with the model loaded by `load` (another backend).
    pub fn open_with(
        path: &Path,
        load: impl FnOnce(&Arc<GgufFile>, &Path) -> Result<Arc<dyn Model>>,
    ) -> Result<Self> {
        let gguf = Arc::new(GgufFile::open(path)?);
        let model = load(&gguf, path)?;
        Self::from_parts(path, gguf, model)
    }

    /// Builds the tokenizer and chat template of `gguf` around an already loaded model
    /// (e.g. a synthetic one whose weights never existed as a file).
    pub fn from_parts(path: &Path, gguf: Arc<GgufFile>, model: Arc<dyn Model>) -> Result<Self> {
        let tokenizer = Arc::new(Tokenizer::from_gguf(&gguf)?);
        let template = ChatTemplate::for_gguf(&gguf)?;
        Ok(LoadedModel {
            path: path.to_path_buf(),
            gguf,
            model,
            tokenizer,
            template: Arc::new(template),
        })
    }

    /// Renders `messages` with the chat template and tokenizes the text (special-token
    /// text becomes special tokens; BOS is added only when the vocabulary asks for it
    /// and the template did not already write it). Returns the text and the tokens.
    pub fn chat_prompt(
        &self,
        messages: &[ChatMessage],
        opts: &RenderOptions,
    ) -> Result<(String, Vec<u32>)> {
        let text = self.template.render(messages, opts)?;
        let tokens = self.tokenize_rendered(&text);
        Ok((text, tokens))
    }

    /// Tokenizes text that may hold special-token text, adding BOS as the vocabulary
    /// asks unless the text already starts with it.
    pub fn tokenize_rendered(&self, text: &str) -> Vec<u32> {
        let mut tokens = self.tokenizer.encode(text, false, true);
        if let Some(bos) = self.tokenizer.bos().filter(|_| self.tokenizer.add_bos())
            && tokens.first() != Some(&bos)
        {
            tokens.insert(0, bos);
        }
        tokens
    }
}
