//! The pre-tokenizer of each `tokenizer.ggml.pre` name: its split regexes and the
//! vocabulary flags that llama.cpp sets with it.
//!
//! Follows llama.cpp `src/llama-vocab.cpp` (`llama_vocab::impl::load`, the name to
//! `LLAMA_VOCAB_PRE_TYPE_*` mapping, and `llm_tokenizer_bpe`'s regex lists). The regexes are
//! the models' own pre-tokenizer patterns as llama.cpp writes them (ECMAScript syntax, with
//! `\p{..}` classes); they are applied one after the other, each splitting the pieces the
//! previous one produced (see [`crate::pretokenize`]).

/// The pre-tokenizer and flags for one `tokenizer.ggml.pre` name.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PreSpec {
    /// The regexes, applied in order.
    pub regexes: &'static [&'static str],
    /// `clean_up_tokenization_spaces` for detokenization.
    pub clean_spaces: bool,
    /// Words that are whole vocabulary entries skip the merges.
    pub ignore_merges: bool,
    /// Forces `add_bos` on (the GGUF key `tokenizer.ggml.add_bos_token` still overrides).
    pub add_bos: bool,
    /// The vocabulary has no BOS token, whatever the GGUF says (ChatGLM).
    pub no_bos: bool,
}

/// GPT-2's pattern (llama.cpp has a hand-written splitter for exactly this string).
pub(crate) const GPT2: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3's pattern (hand-written splitter in llama.cpp).
pub(crate) const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's pattern (hand-written splitter in llama.cpp).
pub(crate) const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5's pattern: Qwen2's with combining marks in letter runs (hand-written splitter).
pub(crate) const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const DEFAULT: &[&str] = &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"];
const DEEPSEEK_LLM: &[&str] = &[
    r"[\r\n]",
    r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+",
    r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+",
    r"\s+$",
    r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+",
    r"\p{N}+",
];
const DEEPSEEK3: &[&str] = &[
    r"\p{N}{1,3}",
    r"[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];
const SPARK2_5: &[&str] = &[
    r"\p{N}{1,3}",
    r"[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"##,
    r"\p{N}",
];
const YOUTU: &[&str] = &[
    r"[\x{AC00}-\x{D7A3}\x{3131}-\x{318E}]+|[\x{FF01}\x{2026}\x{201C}\x{201D}\x{2018}\x{2019}\x{2014}\x{FF1A}\x{FF1B}\x{FF0C}\x{3001}-\x{303F}\x{FE30}-\x{FE4F}]+|[\x{3105}-\x{312F}]+|[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];
const DEEPSEEK_CODER: &[&str] = &[
    r"[\r\n]",
    r"\s?\p{L}+",
    r"\s?\p{P}+",
    r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+",
    r"\p{N}",
];
const FALCON: &[&str] = &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"];
const STARCODER: &[&str] = &[r"\p{N}", GPT2];
const PORO: &[&str] = &[r" ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+"];
const VIKING: &[&str] = &[
    r" ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+",
    r"\p{N}",
];
const TEKKEN: &[&str] = &[
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];
const CHAMELEON: &[&str] = &[
    r"<sentinel:[0-9]+>",
    r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    r"([\t\n]|    |  )",
    r"\p{N}",
    r"[\p{P}!-/:-@\[-`{-~]",
    GPT2,
];
const GPT4O: &[&str] = &[
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];
const GRANITE_EMB_MULTI: &[&str] = &[
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];
const JAIS2: &[&str] = &[
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",
];
const BAILINGMOE: &[&str] = &[
    r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
];
const SEED_CODER: &[&str] = &[
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
];
const UFAKZEKA: &[&str] =
    &[r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"];
const LAGUNA: &[&str] = &[r"[^\n]+|[\n]+", QWEN2];
const EXAONE_MOE: &[&str] = &[
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
];
const MINICPM5: &[&str] = &[
    r"\p{N}{1,3}",
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

const fn spec(regexes: &'static [&'static str]) -> PreSpec {
    PreSpec {
        regexes,
        clean_spaces: true,
        ignore_merges: false,
        add_bos: false,
        no_bos: false,
    }
}

impl PreSpec {
    const fn no_clean(mut self) -> Self {
        self.clean_spaces = false;
        self
    }
    const fn ignore_merges(mut self) -> Self {
        self.ignore_merges = true;
        self
    }
    const fn add_bos(mut self) -> Self {
        self.add_bos = true;
        self
    }
    const fn no_bos(mut self) -> Self {
        self.no_bos = true;
        self
    }
}

/// The pre-tokenizer for a byte-level BPE vocabulary whose `tokenizer.ggml.pre` is `name`
/// (an empty name means `default`, as in llama.cpp). `None` for names llama.cpp does not
/// know, and for the few it handles with custom code this crate does not reproduce
/// (`kimi-k2`, `afmoe`, `tiny_aya`, `cohere2moe`, `superbpe`, `gemma4`, `sarvam-moe`,
/// `whitespace`, `granite-embed-multi-311m`).
pub(crate) fn pre_spec(name: &str) -> Option<PreSpec> {
    const LLAMA3_LIST: &[&str] = &[LLAMA3];
    const GPT2_LIST: &[&str] = &[GPT2];
    const QWEN2_LIST: &[&str] = &[QWEN2];
    const QWEN35_LIST: &[&str] = &[QWEN35];
    Some(match name {
        "" | "default" => spec(DEFAULT),
        "minicpm5" => spec(MINICPM5).ignore_merges(),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => spec(LLAMA3_LIST).ignore_merges().add_bos(),
        "deepseek-llm" => spec(DEEPSEEK_LLM).no_clean(),
        "deepseek-coder" => spec(DEEPSEEK_CODER).no_clean(),
        "deepseek-v3" => spec(DEEPSEEK3).no_clean(),
        "spark2_5" => spec(SPARK2_5).no_clean(),
        "youtu" => spec(YOUTU).no_clean().ignore_merges(),
        "falcon" => spec(FALCON),
        "mpt" | "olmo" => spec(GPT2_LIST),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            spec(STARCODER)
        }
        "command-r" | "smollm" => spec(STARCODER).no_clean(),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe"
        | "exaone4" => spec(GPT2_LIST),
        "jais-2" => spec(JAIS2),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" => spec(QWEN2_LIST).no_clean(),
        "qwen35" => spec(QWEN35_LIST).no_clean(),
        "stablelm2" | "megrez" => spec(QWEN2_LIST),
        "dbrx" | "smaug-bpe" => spec(LLAMA3_LIST),
        "poro-chat" => spec(PORO).no_clean(),
        "bloom" | "gpt3-finnish" => spec(PORO),
        "chatglm-bpe" => spec(LLAMA3_LIST).no_bos(),
        "glm4" | "glm5" => spec(LLAMA3_LIST).no_bos().ignore_merges(),
        "viking" => spec(VIKING).no_clean(),
        "jais" => spec(GPT2_LIST),
        "tekken" => spec(TEKKEN).no_clean().ignore_merges().add_bos(),
        "chameleon" => spec(CHAMELEON).no_clean().add_bos(),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => spec(GPT4O).no_clean(),
        "granite-embed-multi-97m" => spec(GRANITE_EMB_MULTI).no_clean().ignore_merges(),
        "trillion" | "granite-docling" => spec(GPT2_LIST).no_clean(),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => spec(BAILINGMOE).no_clean(),
        "seed-coder" => spec(SEED_CODER).no_clean(),
        "hunyuan" | "solar-open" => spec(QWEN2_LIST).no_clean(),
        "hunyuan-dense" | "hy_v4" | "joyai-llm" => spec(DEEPSEEK3).no_clean(),
        "ufakzeka" => spec(UFAKZEKA).no_clean(),
        "grok-2" => spec(QWEN2_LIST).no_clean(),
        "laguna" => spec(LAGUNA).no_clean(),
        "exaone-moe" => spec(EXAONE_MOE).no_clean(),
        _ => return None,
    })
}
