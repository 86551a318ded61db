//! [`Tokenizer`]: text to token ids and back, as llama.cpp's `llama_tokenize`,
//! `llama_token_to_piece` and `llama_detokenize` do it.
//!
//! Follows llama.cpp `src/llama-vocab.cpp` (`llama_vocab::impl::tokenize`,
//! `token_to_piece`, `detokenize`): special-token partition first, then per text fragment
//! either byte-level BPE (pre-tokenizer, GPT-2 byte alphabet, merges) or SentencePiece
//! merges (spaces as "▁", a leading space after BOS/special tokens when `add_space_prefix`).

use std::collections::BTreeSet;

use ds4_gguf::GgufFile;

use crate::TokenizerError;
use crate::bpe::BpeMerges;
use crate::partition::{Fragment, partition};
use crate::pre_table::pre_spec;
use crate::pretokenize::PreTokenizer;
use crate::spm;
use crate::unicode::{byte_chars, char_byte};
use crate::vocab::{Defaults, Meta, SpecialTokens, Vocab, VocabKind, attr};

/// The algorithm that tokenizes text fragments.
#[derive(Debug)]
enum Algorithm {
    Bpe {
        merges: BpeMerges,
        pre: PreTokenizer,
    },
    Spm,
}

/// A tokenizer for one vocabulary. Immutable and `Send + Sync`; share it by reference.
#[derive(Debug)]
pub struct Tokenizer {
    vocab: Vocab,
    algorithm: Algorithm,
    /// `llama_token_to_piece(id, special = true)` of every token.
    pieces: PieceTable,
}

/// Every token's piece in one buffer: token `i` is `bytes[starts[i]..starts[i + 1]]`.
#[derive(Debug)]
struct PieceTable {
    bytes: Vec<u8>,
    starts: Vec<usize>,
}

impl PieceTable {
    fn new(vocab: &Vocab) -> PieceTable {
        let mut bytes = Vec::with_capacity(vocab.n_tokens() * 6);
        let mut starts = Vec::with_capacity(vocab.n_tokens() + 1);
        for id in 0..vocab.n_tokens() as u32 {
            starts.push(bytes.len());
            render_piece(vocab, id, &mut bytes);
        }
        starts.push(bytes.len());
        PieceTable { bytes, starts }
    }

    fn get(&self, id: u32) -> &[u8] {
        let i = id as usize;
        match (self.starts.get(i), self.starts.get(i + 1)) {
            (Some(&a), Some(&b)) => &self.bytes[a..b],
            _ => &[],
        }
    }
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF's `tokenizer.ggml.*` metadata (vocabulary-only
    /// files work). Supports `tokenizer.ggml.model` `gpt2` (byte-level BPE, with the
    /// pre-tokenizer named by `tokenizer.ggml.pre`) and `llama` (SentencePiece).
    ///
    /// Errors: missing or mistyped keys, an unsupported model or pre-tokenizer; each names
    /// the file and the key.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, TokenizerError> {
        let _span = tracing::info_span!("tokenizer_load", file = file.label()).entered();
        let meta = Meta { file };
        let model_key = "tokenizer.ggml.model";
        let model = meta
            .str_opt(model_key)?
            .ok_or_else(|| TokenizerError::NoTokenizer { file: meta.label() })?;
        let pre_name = meta.str_opt("tokenizer.ggml.pre")?.unwrap_or_default();
        let (kind, spec) = match model {
            "llama" => (VocabKind::Spm, None),
            "gpt2" => {
                let spec =
                    pre_spec(pre_name).ok_or_else(|| TokenizerError::UnsupportedPreTokenizer {
                        file: meta.label(),
                        pre: pre_name.to_owned(),
                    })?;
                (VocabKind::Bpe, Some(spec))
            }
            other => {
                return Err(TokenizerError::UnsupportedModel {
                    file: meta.label(),
                    model: other.to_owned(),
                });
            }
        };
        let vocab = Vocab::load(&meta, &Defaults { kind, spec })?;
        let algorithm = match spec {
            None => Algorithm::Spm,
            Some(spec) => {
                let pre = PreTokenizer::new(spec.regexes).map_err(|message| {
                    TokenizerError::BadPreTokenizer {
                        file: meta.label(),
                        pre: pre_name.to_owned(),
                        message,
                    }
                })?;
                let merges = meta.strings("tokenizer.ggml.merges")?;
                Algorithm::Bpe {
                    merges: BpeMerges::new(&merges, &vocab),
                    pre,
                }
            }
        };
        let pieces = PieceTable::new(&vocab);
        tracing::debug!(
            model,
            pre = pre_name,
            n_vocab = vocab.n_tokens(),
            eog = ?vocab.eog,
            "tokenizer loaded"
        );
        Ok(Tokenizer {
            vocab,
            algorithm,
            pieces,
        })
    }

    /// Number of tokens in the vocabulary (ids are `0..n_vocab`).
    pub fn n_vocab(&self) -> usize {
        self.vocab.n_tokens()
    }

    /// Which algorithm this vocabulary uses.
    pub fn kind(&self) -> VocabKind {
        self.vocab.kind
    }

    /// Tokenizes like `llama_tokenize(text, add_special, parse_special)`.
    ///
    /// `add_special` adds BOS when [`Tokenizer::add_bos`] and EOS when
    /// [`Tokenizer::add_eos`]. `parse_special` lets control tokens written in the text
    /// (`<|im_start|>`) become their ids; user-defined tokens are matched either way.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let v = &self.vocab;
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special
            && v.add_bos
            && let Some(bos) = v.special.bos
        {
            out.push(bos);
        }
        let fragments = partition(text, v, parse_special);
        match &self.algorithm {
            Algorithm::Spm => {
                let mut prev_special = true;
                for fragment in fragments {
                    match fragment {
                        Fragment::Text { start, end } => {
                            let mut piece = String::with_capacity(end - start + 4);
                            if v.add_space_prefix && prev_special {
                                piece.push(' ');
                            }
                            piece.push_str(&text[start..end]);
                            spm::encode(&piece.replace(' ', "\u{2581}"), v, &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            Algorithm::Bpe { merges, pre } => {
                let chars = byte_chars();
                let mut encoded = String::new();
                for fragment in fragments {
                    match fragment {
                        Fragment::Text { start, end } => {
                            for word in pre.split(&text[start..end]) {
                                encoded.clear();
                                encoded.extend(word.bytes().map(|b| chars[b as usize]));
                                merges.encode_word(&encoded, v, &mut out);
                            }
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special
            && v.add_eos
            && let Some(eos) = v.special.eos
        {
            out.push(eos);
        }
        out
    }

    /// The bytes a token stands for; special/control tokens give their text only when
    /// `render_special` (like `llama_token_to_piece(.., lstrip = 0, special)`). Empty for an
    /// id outside the vocabulary.
    pub fn piece(&self, id: u32, render_special: bool) -> Vec<u8> {
        self.piece_ref(id, render_special).to_vec()
    }

    fn piece_ref(&self, id: u32, render_special: bool) -> &[u8] {
        if !render_special && self.vocab.attr(id) & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return &[];
        }
        self.pieces.get(id)
    }

    /// Decodes ids to text like `llama_detokenize(ids, remove_special = false,
    /// unparse_special = render_special)`, invalid UTF-8 replaced by U+FFFD.
    pub fn decode(&self, ids: &[u32], render_special: bool) -> String {
        String::from_utf8_lossy(&self.detokenize(ids, false, render_special)).into_owned()
    }

    /// `llama_detokenize` as bytes: `remove_special` drops a leading BOS / trailing EOS that
    /// the vocabulary adds itself; `unparse_special` renders control tokens. SentencePiece
    /// vocabularies drop the first token's leading space, and vocabularies with
    /// `clean_up_tokenization_spaces` get llama.cpp's three clean-up passes.
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        let v = &self.vocab;
        let mut ids = ids;
        let mut remove_space = v.add_space_prefix;
        if remove_special && v.add_bos && ids.first().is_some_and(|&id| Some(id) == v.special.bos) {
            remove_space = false;
            ids = &ids[1..];
        }
        if remove_special && v.add_eos && ids.last().is_some_and(|&id| Some(id) == v.special.eos) {
            ids = &ids[..ids.len() - 1];
        }
        let mut text = Vec::new();
        for &id in ids {
            let mut piece = self.piece_ref(id, unparse_special);
            if remove_space && piece.first() == Some(&b' ') {
                piece = &piece[1..];
            }
            remove_space = false;
            text.extend_from_slice(piece);
        }
        if v.clean_spaces {
            clean_up_spaces(&mut text);
        }
        text
    }

    /// The BOS id, if the vocabulary has one.
    pub fn bos(&self) -> Option<u32> {
        self.vocab.special.bos
    }

    /// The EOS id, if the vocabulary has one.
    pub fn eos(&self) -> Option<u32> {
        self.vocab.special.eos
    }

    /// The end-of-turn id: `tokenizer.ggml.eot_token_id`, else the token llama.cpp finds by
    /// text (`<|eot_id|>`, `<|im_end|>`, `<|endoftext|>`, …).
    pub fn eot(&self) -> Option<u32> {
        self.vocab.special.eot
    }

    /// All special ids (BOS, EOS, EOT, EOM, UNK, PAD, FIM, …).
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.vocab.special
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.vocab.add_bos && self.vocab.special.bos.is_some()
    }

    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.vocab.add_eos && self.vocab.special.eos.is_some()
    }

    /// Whether `id` ends generation (llama.cpp's EOG set).
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.contains(&id)
    }

    /// The end-of-generation set, ascending.
    pub fn eog_ids(&self) -> &BTreeSet<u32> {
        &self.vocab.eog
    }

    /// The token's text as stored in the vocabulary (GPT-2 byte alphabet for BPE, "▁" for
    /// spaces in SentencePiece); `None` outside the vocabulary.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.texts.get(id as usize).map(String::as_str)
    }

    /// The id whose stored text is exactly `text` (the last one if texts repeat).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.text_to_token(text)
    }

    /// Control token (`<|im_start|>`, `<s>`, …), after llama.cpp's re-typing by text.
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab.attr(id) & attr::CONTROL != 0
    }

    /// Hidden when detokenizing without `render_special` (control or unknown).
    pub fn is_special(&self, id: u32) -> bool {
        self.vocab.attr(id) & (attr::CONTROL | attr::UNKNOWN) != 0
    }

    /// User-defined (added) token: always rendered and always matched in text.
    pub fn is_user_defined(&self, id: u32) -> bool {
        self.vocab.attr(id) & attr::USER_DEFINED != 0
    }

    /// Byte token (`<0x0A>`).
    pub fn is_byte(&self, id: u32) -> bool {
        self.vocab.attr(id) & attr::BYTE != 0
    }
}

/// Appends `llama_token_to_piece(id, lstrip = 0, special = true)` to `out`.
fn render_piece(vocab: &Vocab, id: u32, out: &mut Vec<u8>) {
    let a = vocab.attr(id);
    let text = &vocab.texts[id as usize];
    if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
        out.extend_from_slice(text.as_bytes());
    } else if a & attr::NORMAL != 0 {
        match vocab.kind {
            VocabKind::Spm => out.extend_from_slice(text.replace('\u{2581}', " ").as_bytes()),
            VocabKind::Bpe => decode_byte_alphabet(text, out),
        }
    } else if a & attr::BYTE != 0 {
        // `<0xXX>`: the two hex digits at bytes 3..5.
        let byte = text
            .get(3..5)
            .and_then(|hex| u8::from_str_radix(hex, 16).ok())
            .unwrap_or(0);
        out.push(byte);
    }
}

/// GPT-2 byte alphabet back to bytes; a character outside the alphabet is written as
/// llama.cpp does (`[UNK_BYTE_0x<utf8 hex><token text>]`).
fn decode_byte_alphabet(text: &str, out: &mut Vec<u8>) {
    for c in text.chars() {
        match char_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
}

/// llama.cpp's `clean_up_tokenization_spaces`: drops the space before `?!.,`, the spaces
/// around a lone `'`, and the space before `'s`, `'m`, `'re`, `'ve`.
fn clean_up_spaces(text: &mut Vec<u8>) {
    if text.is_empty() {
        return;
    }
    // Pass 1: " ?", " !", " .", " ,".
    let src = std::mem::take(text);
    let mut out = vec![src[0]];
    for i in 1..src.len() {
        let x = src[i];
        if src[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            out.pop();
        }
        out.push(x);
    }
    // Pass 2: " ' " becomes "'".
    let mut src = out;
    let mut out = vec![src[0]];
    let mut i = 1;
    while i < src.len() {
        let x = src[i];
        if x == b'\'' && i + 1 < src.len() && src[i - 1] == b' ' && src[i + 1] == b' ' {
            out.pop();
            src[i + 1] = 0;
            i += 1;
        }
        out.push(x);
        i += 1;
    }
    // Pass 3: " 's", " 'm", " 're", " 've".
    let src = out;
    let mut out = vec![src[0]];
    for i in 1..src.len() {
        let x = src[i];
        if src[i - 1] == b' ' && x == b'\'' && i + 1 < src.len() {
            let x1 = src[i + 1];
            let x2 = src.get(i + 2).copied().filter(|_| i + 2 < src.len());
            let drop = match x1 {
                b's' | b'm' => true,
                b't' | b'd' => false,
                _ => matches!((x1, x2), (b'r', Some(b'e')) | (b'v', Some(b'e'))),
            };
            if drop {
                out.pop();
            }
        }
        out.push(x);
    }
    *text = out;
}

#[cfg(test)]
mod tests {
    use super::clean_up_spaces;

    fn clean(s: &str) -> String {
        let mut v = s.as_bytes().to_vec();
        clean_up_spaces(&mut v);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn clean_up_matches_llama_passes() {
        assert_eq!(clean("Hello , world !"), "Hello, world!");
        assert_eq!(clean("a ' b"), "a'b");
        assert_eq!(
            clean("it 's I 'm we 're you 've they 'll don 't"),
            "it's I'm we're you've they 'll don 't"
        );
        assert_eq!(clean(""), "");
    }
}
