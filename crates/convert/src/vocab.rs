//! Tokenizer metadata: copied from another GGUF file (every `tokenizer.*` key), or built
//! from a checkpoint's Hugging Face `tokenizer.json` (byte-level BPE) the way llama.cpp's
//! converter does (`tokenizer.ggml.model = gpt2`, `add_{bos,eos}_token` as gguf-py's
//! `SpecialVocab` reads them, the chat template of `tokenizer_config.json` or
//! `chat_template.jinja`), per family ([`Flavor`]): GLM-4.5 and later (pre-tokenizer
//! `glm4`, special tokens `<|endoftext|>` (EOS, padding, unknown), `[gMASK]` (BOS, which
//! llama.cpp's `glm4` pre-tokenizer never adds), `<|user|>` (end of turn),
//! `<|observation|>` (end of message)) and DeepSeek-V3/V4 (pre-tokenizer `deepseek-v3`,
//! `<｜begin▁of▁sentence｜>` BOS, `<｜end▁of▁sentence｜>` EOS, BOS added unless
//! `tokenizer_config.json` says otherwise).

use std::path::Path;

use ds4_gguf::{GgufFile, GgufWriter, Value};
use serde_json::Value as Json;

use crate::ConvertError;

/// llama.cpp's token types.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

/// The number of tokens of `file`'s vocabulary (`tokenizer.ggml.tokens`).
///
/// # Errors
/// [`ConvertError::Config`] when the file has no vocabulary.
pub fn token_count(file: &GgufFile) -> Result<usize, ConvertError> {
    file.get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .map(|a| a.len())
        .ok_or_else(|| {
            ConvertError::Config(format!(
                "{}: no tokenizer.ggml.tokens to copy",
                file.label()
            ))
        })
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

fn read_json(path: &Path) -> Result<Option<Json>, ConvertError> {
    match std::fs::read_to_string(path) {
        Ok(t) => serde_json::from_str(&t)
            .map(Some)
            .map_err(|e| ConvertError::Config(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ConvertError::Io {
            path: path.display().to_string(),
            source: e,
        }),
    }
}

/// How a family's tokenizer is written (see the module header).
#[derive(Debug, Clone, Copy)]
pub struct Flavor {
    /// `tokenizer.ggml.pre`.
    pub pre: &'static str,
    /// `(tokenizer.ggml.{key}, token text)` of the special tokens.
    pub specials: &'static [(&'static str, &'static str)],
    /// `tokenizer.ggml.add_bos_token` when neither `tokenizer_config.json` nor the
    /// post-processor decides it (`None`: not written).
    pub add_bos: Option<bool>,
}

impl Flavor {
    /// GLM-4.5 and later (GLM-5.3).
    pub const GLM: Flavor = Flavor {
        pre: "glm4",
        specials: &[
            ("eos_token_id", "<|endoftext|>"),
            ("padding_token_id", "<|endoftext|>"),
            ("eot_token_id", "<|user|>"),
            ("unknown_token_id", "<|endoftext|>"),
            ("eom_token_id", "<|observation|>"),
            ("bos_token_id", "[gMASK]"),
        ],
        add_bos: None,
    };
    /// DeepSeek-V3 and V4.
    pub const DEEPSEEK: Flavor = Flavor {
        pre: "deepseek-v3",
        specials: &[
            ("bos_token_id", "<｜begin▁of▁sentence｜>"),
            ("eos_token_id", "<｜end▁of▁sentence｜>"),
            ("padding_token_id", "<｜end▁of▁sentence｜>"),
        ],
        add_bos: Some(true),
    };
}

/// GLM's tokenizer (see [`from_hf_with`]).
///
/// # Errors
/// As [`from_hf_with`].
pub fn from_hf(dir: &Path, n_vocab: usize) -> Result<Option<Vec<(String, Value)>>, ConvertError> {
    from_hf_with(dir, n_vocab, &Flavor::GLM)
}

/// The `tokenizer.*` metadata of the checkpoint in `dir` (from `tokenizer.json`,
/// `tokenizer_config.json`, `chat_template.jinja`) in `flavor`, with the token list
/// padded to `n_vocab` entries (`[PAD{i}]`, unused); `None` when there is no
/// `tokenizer.json`.
///
/// # Errors
/// [`ConvertError::Config`] for a tokenizer that is not byte-level BPE, duplicate or
/// missing ids, or more tokens than `n_vocab`.
pub fn from_hf_with(
    dir: &Path,
    n_vocab: usize,
    flavor: &Flavor,
) -> Result<Option<Vec<(String, Value)>>, ConvertError> {
    let Some(tok) = read_json(&dir.join("tokenizer.json"))? else {
        return Ok(None);
    };
    let bad =
        |s: String| ConvertError::Config(format!("{}: {s}", dir.join("tokenizer.json").display()));
    let model = tok.get("model").ok_or_else(|| bad("no `model`".into()))?;
    if model.get("type").and_then(Json::as_str) != Some("BPE") {
        return Err(bad("only BPE tokenizers are supported".into()));
    }
    let mut tokens: Vec<Option<(String, i32)>> = vec![None; n_vocab];
    let mut put = |id: u64, text: &str, ty: i32| -> Result<(), ConvertError> {
        let slot = tokens.get_mut(id as usize).ok_or_else(|| {
            bad(format!(
                "token id {id} ('{text}') is past the model's {n_vocab} embeddings"
            ))
        })?;
        *slot = Some((text.to_string(), ty));
        Ok(())
    };
    let vocab = model
        .get("vocab")
        .and_then(Json::as_object)
        .ok_or_else(|| bad("no `model.vocab`".into()))?;
    for (text, id) in vocab {
        put(
            id.as_u64()
                .ok_or_else(|| bad(format!("bad id for '{text}'")))?,
            text,
            NORMAL,
        )?;
    }
    for a in tok
        .get("added_tokens")
        .and_then(Json::as_array)
        .into_iter()
        .flatten()
    {
        let (Some(id), Some(text)) = (
            a.get("id").and_then(Json::as_u64),
            a.get("content").and_then(Json::as_str),
        ) else {
            return Err(bad(format!("bad added token {a}")));
        };
        let special = a.get("special").and_then(Json::as_bool).unwrap_or(false);
        put(id, text, if special { CONTROL } else { USER_DEFINED })?;
    }
    let mut texts = Vec::with_capacity(n_vocab);
    let mut types = Vec::with_capacity(n_vocab);
    for (i, t) in tokens.into_iter().enumerate() {
        let (text, ty) = t.unwrap_or_else(|| (format!("[PAD{i}]"), UNUSED));
        texts.push(Value::String(text));
        types.push(Value::I32(ty));
    }
    let merges: Vec<Value> = model
        .get("merges")
        .and_then(Json::as_array)
        .into_iter()
        .flatten()
        .map(|m| match m {
            Json::String(s) => Ok(Value::String(s.clone())),
            Json::Array(p) if p.len() == 2 => Ok(Value::String(format!(
                "{} {}",
                p[0].as_str().unwrap_or_default(),
                p[1].as_str().unwrap_or_default()
            ))),
            other => Err(bad(format!("bad merge {other}"))),
        })
        .collect::<Result<_, _>>()?;
    let id_of = |t: &str| {
        texts
            .iter()
            .position(|v| matches!(v, Value::String(s) if s == t))
            .map(|i| Value::U32(i as u32))
    };
    let mut kv = vec![
        (
            "tokenizer.ggml.model".to_string(),
            Value::String("gpt2".into()),
        ),
        (
            "tokenizer.ggml.pre".to_string(),
            Value::String(flavor.pre.into()),
        ),
    ];
    for &(key, text) in flavor.specials {
        if let Some(id) = id_of(text) {
            kv.push((format!("tokenizer.ggml.{key}"), id));
        }
    }
    let config = read_json(&dir.join("tokenizer_config.json"))?;
    // add_{bos,eos}_token as llama.cpp's converter (gguf-py SpecialVocab) sets them:
    // from tokenizer_config.json, else false when tokenizer.json's post-processor is a
    // ByteLevel one, else not written.
    let byte_level_post = tok.get("post_processor").is_some_and(|pp| {
        std::iter::once(pp)
            .chain(
                pp.get("processors")
                    .and_then(Json::as_array)
                    .into_iter()
                    .flatten(),
            )
            .any(|p| p.get("type").and_then(Json::as_str) == Some("ByteLevel"))
    });
    for which in ["bos", "eos"] {
        let key = format!("add_{which}_token");
        let set = config
            .as_ref()
            .and_then(|c| c.get(&key))
            .and_then(Json::as_bool)
            .or(byte_level_post.then_some(false))
            .or(if which == "bos" { flavor.add_bos } else { None });
        if let Some(b) = set {
            kv.push((format!("tokenizer.ggml.{key}"), Value::Bool(b)));
        }
    }
    kv.push(("tokenizer.ggml.tokens".into(), Value::Array(texts)));
    kv.push(("tokenizer.ggml.token_type".into(), Value::Array(types)));
    kv.push(("tokenizer.ggml.merges".into(), Value::Array(merges)));
    let template = match config.and_then(|c| {
        c.get("chat_template")
            .and_then(Json::as_str)
            .map(str::to_string)
    }) {
        Some(t) => Some(t),
        None => std::fs::read_to_string(dir.join("chat_template.jinja")).ok(),
    };
    if let Some(t) = template {
        kv.push(("tokenizer.chat_template".into(), Value::String(t)));
    }
    Ok(Some(kv))
}
