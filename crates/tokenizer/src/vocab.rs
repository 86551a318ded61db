//! The vocabulary read from GGUF metadata: token texts, scores, attributes, special ids,
//! tokenizer flags and the end-of-generation set.
//!
//! Follows llama.cpp `src/llama-vocab.cpp` (`llama_vocab::impl::load`): the defaults per
//! tokenizer model, the `tokenizer.ggml.*` keys, the token-type to attribute mapping, the
//! detection of EOT/EOM/FIM tokens by their text, the end-of-generation (EOG) set and the
//! special-token list used to split text before tokenizing.

use std::collections::BTreeSet;

use ds4_gguf::{GgufFile, Value};

use crate::TokenizerError;
use crate::llama_order::llama_visit_order;
use crate::pre_table::PreSpec;
use crate::text_index::TextIndex;

/// Token attribute bits (llama.cpp `llama_token_attr`).
pub(crate) mod attr {
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
    pub const LSTRIP: u32 = 1 << 7;
    pub const RSTRIP: u32 = 1 << 8;
}

/// The tokenizer algorithm of a vocabulary (`tokenizer.ggml.model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabKind {
    /// `gpt2`: byte-level BPE with a regex pre-tokenizer.
    Bpe,
    /// `llama`: SentencePiece-style merges by score, with byte fallback.
    Spm,
}

/// Special token ids (`None` where the vocabulary has none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Beginning of sequence (`tokenizer.ggml.bos_token_id`).
    pub bos: Option<u32>,
    /// End of sequence (`eos_token_id`).
    pub eos: Option<u32>,
    /// End of turn (`eot_token_id`, else found by text).
    pub eot: Option<u32>,
    /// End of message (`eom_token_id`, else `<|eom_id|>`).
    pub eom: Option<u32>,
    /// Unknown (`unknown_token_id`).
    pub unk: Option<u32>,
    /// Separator (`seperator_token_id`, spelled as in GGUF).
    pub sep: Option<u32>,
    /// Padding (`padding_token_id`).
    pub pad: Option<u32>,
    /// Mask (`mask_token_id`).
    pub mask: Option<u32>,
    /// Fill-in-the-middle prefix (`fim_pre_token_id`, else found by text).
    pub fim_pre: Option<u32>,
    /// Fill-in-the-middle suffix.
    pub fim_suf: Option<u32>,
    /// Fill-in-the-middle middle.
    pub fim_mid: Option<u32>,
    /// Fill-in-the-middle padding.
    pub fim_pad: Option<u32>,
    /// Fill-in-the-middle repository name.
    pub fim_rep: Option<u32>,
    /// Fill-in-the-middle file separator.
    pub fim_sep: Option<u32>,
}

/// A loaded vocabulary.
#[derive(Debug)]
pub(crate) struct Vocab {
    pub kind: VocabKind,
    pub texts: Vec<String>,
    pub scores: Vec<f32>,
    pub attrs: Vec<u32>,
    index: TextIndex,
    pub special: SpecialTokens,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    pub clean_spaces: bool,
    pub ignore_merges: bool,
    /// The end-of-generation set.
    pub eog: BTreeSet<u32>,
    /// Tokens that split text before tokenizing (control, user-defined, unknown), longest
    /// text first.
    pub special_cache: Vec<u32>,
}

/// Reads metadata with errors that name the file and key.
pub(crate) struct Meta<'a> {
    pub file: &'a GgufFile,
}

impl<'a> Meta<'a> {
    pub fn label(&self) -> String {
        self.file.label().to_owned()
    }

    fn wrong(&self, key: &str, expected: &'static str, found: &Value) -> TokenizerError {
        TokenizerError::WrongType {
            file: self.label(),
            key: key.to_owned(),
            expected,
            found: found.describe(),
        }
    }

    pub fn str_opt(&self, key: &str) -> Result<Option<&'a str>, TokenizerError> {
        match self.file.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.wrong(key, "a string", v)),
        }
    }

    pub fn bool_opt(&self, key: &str) -> Result<Option<bool>, TokenizerError> {
        match self.file.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong(key, "a bool", v)),
        }
    }

    /// A token id: any integer type (negative or huge values come back as they are).
    pub fn id_opt(&self, key: &str) -> Result<Option<i128>, TokenizerError> {
        match self.file.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_i128()
                .map(Some)
                .ok_or_else(|| self.wrong(key, "an integer", v)),
        }
    }

    pub fn array_opt(&self, key: &str) -> Result<Option<&'a [Value]>, TokenizerError> {
        match self.file.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items)),
            Some(v) => Err(self.wrong(key, "an array", v)),
        }
    }

    pub fn strings(&self, key: &str) -> Result<Vec<&'a str>, TokenizerError> {
        let items = self
            .array_opt(key)?
            .ok_or_else(|| TokenizerError::MissingKey {
                file: self.label(),
                key: key.to_owned(),
            })?;
        items
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.as_str()),
                other => Err(self.wrong(key, "an array of strings", other)),
            })
            .collect()
    }
}

const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TYPES: &str = "tokenizer.ggml.token_type";

/// Token texts that mark the end of a turn (llama.cpp's EOT detection list).
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<\u{FF5C}end\u{2581}of\u{2581}sentence\u{FF5C}>",
    "<end_of_utterance>",
];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<\u{FF5C}fim\u{2581}begin\u{FF5C}>",
    "<PRE>",
    "\u{2581}<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<\u{FF5C}fim\u{2581}hole\u{FF5C}>",
    "<SUF>",
    "\u{2581}<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<\u{FF5C}fim\u{2581}end\u{FF5C}>",
    "<MID>",
    "\u{2581}<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Token texts that end generation (llama.cpp's EOG list).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\u{FF5C}end\u{2581}of\u{2581}sentence\u{FF5C}>",
    "[e~[",
];

/// Tokenizer flags decided by the model and pre-tokenizer before the GGUF overrides.
pub(crate) struct Defaults {
    pub kind: VocabKind,
    pub spec: Option<PreSpec>,
}

impl Vocab {
    /// Loads the vocabulary from `file`'s metadata.
    pub fn load(meta: &Meta<'_>, defaults: &Defaults) -> Result<Vocab, TokenizerError> {
        let kind = defaults.kind;
        let words = meta.strings(KEY_TOKENS)?;
        let n = words.len();
        if n == 0 || n > i32::MAX as usize {
            return Err(TokenizerError::BadVocabSize {
                file: meta.label(),
                count: n,
            });
        }

        let scores = read_scores(meta, n)?;
        let types = read_types(meta, n)?;

        let mut texts = Vec::with_capacity(n);
        let mut attrs = Vec::with_capacity(n);
        for (i, word) in words.iter().enumerate() {
            let text = if word.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                (*word).to_owned()
            };
            texts.push(text);
            attrs.push(match types.as_ref().map(|t| t[i]) {
                None | Some(1) => attr::NORMAL,
                Some(2) => attr::UNKNOWN,
                Some(3) => attr::CONTROL,
                Some(4) => attr::USER_DEFINED,
                Some(5) => attr::UNUSED,
                Some(6) => attr::BYTE,
                Some(_) => 0,
            });
        }

        // Flags: the model's defaults, the pre-tokenizer's, then the GGUF keys.
        let (mut add_bos, mut add_eos, mut add_space_prefix, clean_spaces, ignore_merges) =
            match (kind, &defaults.spec) {
                (VocabKind::Spm, _) => (true, false, true, false, false),
                (VocabKind::Bpe, Some(spec)) => (
                    spec.add_bos,
                    false,
                    false,
                    spec.clean_spaces,
                    spec.ignore_merges,
                ),
                (VocabKind::Bpe, None) => (false, false, false, true, false),
            };
        if let Some(v) = meta.bool_opt("tokenizer.ggml.add_space_prefix")? {
            add_space_prefix = v;
        }

        let mut special = match kind {
            VocabKind::Spm => SpecialTokens {
                bos: Some(1),
                eos: Some(2),
                unk: Some(0),
                ..SpecialTokens::default()
            },
            VocabKind::Bpe => SpecialTokens {
                bos: Some(11),
                eos: Some(11),
                ..SpecialTokens::default()
            },
        };
        if defaults.spec.is_some_and(|s| s.no_bos) {
            special.bos = None;
        }
        read_special_ids(meta, n, &mut special)?;

        if let Some(v) = meta.bool_opt("tokenizer.ggml.add_bos_token")? {
            add_bos = v;
        }
        if let Some(v) = meta.bool_opt("tokenizer.ggml.add_eos_token")? {
            add_eos = v;
        }

        let mut vocab = Vocab {
            kind,
            texts,
            scores,
            attrs,
            index: TextIndex::default(),
            special,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
            ignore_merges,
            eog: BTreeSet::new(),
            special_cache: Vec::new(),
        };
        vocab.index = TextIndex::new(&vocab.texts);
        vocab.detect_special_by_text();
        vocab.mark_unused();
        vocab.build_eog();
        vocab.apply_name_rules(meta)?;
        vocab.build_special_cache();
        Ok(vocab)
    }

    pub fn n_tokens(&self) -> usize {
        self.texts.len()
    }

    pub fn attr(&self, id: u32) -> u32 {
        self.attrs.get(id as usize).copied().unwrap_or(0)
    }

    pub fn text_to_token(&self, text: &str) -> Option<u32> {
        self.index.get(&self.texts, text)
    }

    /// Whether `id` is the one llama.cpp's text map holds for its text (the last id of a
    /// repeated text).
    fn is_canonical(&self, id: u32) -> bool {
        self.text_to_token(&self.texts[id as usize]) == Some(id)
    }

    /// Sets CONTROL on `id` (llama.cpp does this for every token it finds by text).
    fn force_control(&mut self, id: u32) {
        self.attrs[id as usize] |= attr::CONTROL;
    }

    /// EOT, EOM and FIM tokens by text, where the metadata did not name them: the first
    /// match in llama.cpp's visiting order of its text map wins (see
    /// [`crate::llama_order`]), and the match becomes a control token.
    fn detect_special_by_text(&mut self) {
        type Slot = fn(&mut SpecialTokens) -> &mut Option<u32>;
        let slots: [(Slot, &[&str]); 8] = [
            (|s| &mut s.eot, EOT_TEXTS),
            (|s| &mut s.eom, &["<|eom_id|>"]),
            (|s| &mut s.fim_pre, FIM_PRE_TEXTS),
            (|s| &mut s.fim_suf, FIM_SUF_TEXTS),
            (|s| &mut s.fim_mid, FIM_MID_TEXTS),
            (|s| &mut s.fim_pad, FIM_PAD_TEXTS),
            (|s| &mut s.fim_rep, FIM_REP_TEXTS),
            (|s| &mut s.fim_sep, FIM_SEP_TEXTS),
        ];
        // The candidates present, per slot.
        let found: Vec<Vec<u32>> = slots
            .iter()
            .map(|(_, texts)| texts.iter().filter_map(|t| self.text_to_token(t)).collect())
            .collect();
        if found.iter().all(Vec::is_empty) {
            return;
        }
        // With several candidates for a slot the visiting order decides; compute it only then.
        let mut candidates: Vec<u32> = found.iter().flatten().copied().collect();
        candidates.sort_unstable();
        candidates.dedup();
        if found.iter().any(|ids| ids.len() > 1) {
            let order = llama_visit_order(&self.texts, self.index.len() < self.texts.len());
            candidates = order
                .into_iter()
                .filter(|id| candidates.binary_search(id).is_ok())
                .collect();
        }
        for id in candidates {
            let mut matched = false;
            for ((get, _), ids) in slots.iter().zip(&found) {
                let slot = get(&mut self.special);
                if slot.is_none() && ids.contains(&id) {
                    *slot = Some(id);
                    matched = true;
                }
            }
            if matched {
                self.force_control(id);
            }
        }
    }

    /// Control tokens whose text contains "unused" are unused.
    fn mark_unused(&mut self) {
        for id in 0..self.texts.len() as u32 {
            if self.attrs[id as usize] & attr::CONTROL != 0
                && self.texts[id as usize].contains("unused")
                && self.is_canonical(id)
            {
                self.attrs[id as usize] |= attr::UNUSED;
            }
        }
    }

    /// The end-of-generation set (llama.cpp's rules, including its two exceptions).
    fn build_eog(&mut self) {
        let mut eog = BTreeSet::new();
        let s = &self.special;
        eog.extend([s.fim_pad, s.fim_rep, s.fim_sep].into_iter().flatten());
        let by_text: Vec<u32> = EOG_TEXTS
            .iter()
            .filter_map(|t| self.text_to_token(t))
            .collect();
        for id in by_text {
            eog.insert(id);
            self.force_control(id);
        }
        // gpt-oss: these always render.
        for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = self.text_to_token(text) {
                self.attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        let s = &self.special;
        eog.extend([s.eos, s.eot, s.eom].into_iter().flatten());

        // With both "<|return|>" and "<|call|>" (gpt-oss), or "<|calls|>" and "<|flush|>"
        // (solar-open), "<|end|>" only ends a message, not generation.
        let has =
            |eog: &BTreeSet<u32>, text: &str| eog.iter().any(|&id| self.texts[id as usize] == text);
        let end_id = eog
            .iter()
            .rev()
            .copied()
            .find(|&id| self.texts[id as usize] == "<|end|>");
        let has_call = has(&eog, "<|call|>") || has(&eog, "<|calls|>");
        if let Some(end_id) = end_id
            && has_call
            && (has(&eog, "<|return|>") || has(&eog, "<|flush|>"))
        {
            eog.remove(&end_id);
            self.attrs[end_id as usize] = attr::USER_DEFINED;
        }
        // Gemma 4 and PLaMo have an ordinary "</s>".
        let s_id = eog
            .iter()
            .rev()
            .copied()
            .find(|&id| self.texts[id as usize] == "</s>");
        if let Some(s_id) = s_id
            && (has(&eog, "<|tool_response>") || has(&eog, "<|plamo:eos|>"))
        {
            eog.remove(&s_id);
            self.attrs[s_id as usize] = attr::NORMAL;
        }
        self.eog = eog;
    }

    /// Per-model attribute rules llama.cpp applies by model or pre-tokenizer name.
    fn apply_name_rules(&mut self, meta: &Meta<'_>) -> Result<(), TokenizerError> {
        let name = meta
            .str_opt("general.name")?
            .unwrap_or_default()
            .to_ascii_lowercase();
        let pre = meta.str_opt("tokenizer.ggml.pre")?.unwrap_or_default();
        let arch = meta.str_opt("general.architecture")?.unwrap_or_default();
        let set = |vocab: &mut Vocab, text: &str, bit: u32, on: bool| {
            if let Some(id) = vocab.text_to_token(text) {
                let a = &mut vocab.attrs[id as usize];
                *a = if on { *a | bit } else { *a & !bit };
            }
        };
        if ["jina-v2-de", "jina-v2-es", "jina-v2-code"]
            .iter()
            .any(|p| pre.contains(p))
            || ["nomic-bert-moe", "jina-bert-v3"]
                .iter()
                .any(|a| arch.contains(a))
        {
            set(self, "<mask>", attr::LSTRIP, true);
        } else if name.contains("phi-3") || name.contains("phi3") {
            for id in 0..self.attrs.len() {
                if self.attrs[id] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0 {
                    self.attrs[id] |= attr::RSTRIP;
                }
            }
            set(self, "</s>", attr::RSTRIP, true);
            for text in ["<unk>", "<s>", "<|endoftext|>"] {
                set(self, text, attr::RSTRIP, false);
            }
        } else if name.contains("modern-bert") {
            set(self, "[MASK]", attr::LSTRIP, true);
        }
        Ok(())
    }

    /// Control, user-defined and unknown tokens, longest text first (ties by id).
    fn build_special_cache(&mut self) {
        let mask = attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN;
        let mut cache: Vec<u32> = (0..self.texts.len() as u32)
            .filter(|&id| self.attrs[id as usize] & mask != 0)
            .collect();
        cache.sort_by_key(|&id| std::cmp::Reverse(self.texts[id as usize].len()));
        self.special_cache = cache;
    }
}

fn read_scores(meta: &Meta<'_>, n: usize) -> Result<Vec<f32>, TokenizerError> {
    let Some(items) = meta.array_opt(KEY_SCORES)? else {
        return Ok(vec![0.0; n]);
    };
    if items.len() < n {
        return Err(TokenizerError::ShortArray {
            file: meta.label(),
            key: KEY_SCORES.to_owned(),
            found: items.len(),
            needed: n,
        });
    }
    items[..n]
        .iter()
        .map(|v| match v {
            Value::F32(f) => Ok(*f),
            Value::I32(i) => Ok(*i as f32),
            other => Err(meta.wrong(KEY_SCORES, "an array of f32 or i32", other)),
        })
        .collect()
}

fn read_types(meta: &Meta<'_>, n: usize) -> Result<Option<Vec<i32>>, TokenizerError> {
    let Some(items) = meta.array_opt(KEY_TYPES)? else {
        return Ok(None);
    };
    if items.len() < n {
        return Err(TokenizerError::ShortArray {
            file: meta.label(),
            key: KEY_TYPES.to_owned(),
            found: items.len(),
            needed: n,
        });
    }
    items[..n]
        .iter()
        .map(|v| match v {
            Value::I32(i) => Ok(*i),
            other => Err(meta.wrong(KEY_TYPES, "an array of i32", other)),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Reads the `tokenizer.ggml.*_token_id` keys. Defaults outside the vocabulary are dropped;
/// an id from the file outside the vocabulary keeps the default (as llama.cpp does).
fn read_special_ids(
    meta: &Meta<'_>,
    n: usize,
    special: &mut SpecialTokens,
) -> Result<(), TokenizerError> {
    type Slot = fn(&mut SpecialTokens) -> &mut Option<u32>;
    let slots: [(&str, Slot); 17] = [
        ("bos_token_id", |s| &mut s.bos),
        ("eos_token_id", |s| &mut s.eos),
        ("eot_token_id", |s| &mut s.eot),
        ("eom_token_id", |s| &mut s.eom),
        ("unknown_token_id", |s| &mut s.unk),
        ("seperator_token_id", |s| &mut s.sep),
        ("padding_token_id", |s| &mut s.pad),
        ("mask_token_id", |s| &mut s.mask),
        ("fim_pre_token_id", |s| &mut s.fim_pre),
        ("fim_suf_token_id", |s| &mut s.fim_suf),
        ("fim_mid_token_id", |s| &mut s.fim_mid),
        ("fim_pad_token_id", |s| &mut s.fim_pad),
        ("fim_rep_token_id", |s| &mut s.fim_rep),
        ("fim_sep_token_id", |s| &mut s.fim_sep),
        ("prefix_token_id", |s| &mut s.fim_pre),
        ("suffix_token_id", |s| &mut s.fim_suf),
        ("middle_token_id", |s| &mut s.fim_mid),
    ];
    for (suffix, get) in slots {
        let slot = get(special);
        if slot.is_some_and(|id| id as usize >= n) {
            *slot = None;
        }
        let key = format!("tokenizer.ggml.{suffix}");
        // llama.cpp reads these as uint32: a negative value wraps out of range.
        if let Some(id) = meta.id_opt(&key)?
            && (0..n as i128).contains(&id)
        {
            *slot = Some(id as u32);
        }
    }
    Ok(())
}
